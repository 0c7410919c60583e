//! The group's frames: one JSON object per line over the leader's Unix socket.
//!
//! A connection opens with a handshake in which each side proves it holds the group's token
//! without sending it: the member's [`Hello`] (with a nonce), the leader's [`Challenge`] (its own
//! nonce and its proof), the member's [`Proof`], and the leader's welcome (a [`Reply::Ok`] with
//! id 0). A member never talks to a process that cannot prove the token — whatever took the port
//! of a leader that died — and nothing a listener learns from a handshake opens another.
//!
//! Then [`Request`]s, each answered by one [`Reply`] with its id (a lock's when it is granted, in
//! any order), except [`Op::Release`], [`Op::Answer`] and [`Op::Ping`], which are not answered.

use crate::coordination::membership::View;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;
use std::collections::BTreeMap;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The longest line either side reads: a call's answer or an object of `limits.message` (16 MiB
/// by default), escaped once more, fits.
pub const MAX_LINE: u64 = 64 * 1024 * 1024;
/// The longest handshake line: a leader reads no more from a connection not yet proven.
pub const MAX_HANDSHAKE_LINE: u64 = 4096;
/// The frames' version: a leader refuses a member speaking another (another build of the agent).
pub const PROTOCOL: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    /// The member process's name, for the leader's logs.
    pub instance: String,
    pub nonce: String,
}

/// The leader's answer to a [`Hello`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Challenge {
    pub pid: u32,
    pub nonce: String,
    /// [`prove`] of the leader's side.
    pub proof: String,
}

/// The member's answer to a [`Challenge`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Proof {
    pub proof: String,
}

/// Which side of a handshake proves.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    Leader,
    Member,
}

/// What proves `side` holds `token`: an HMAC-SHA256 of both nonces under the token, labelled
/// with the side so one side's proof never passes for the other's.
pub fn prove(token: &str, side: Side, member_nonce: &str, leader_nonce: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    let label: &[u8] = match side {
        Side::Leader => b"toa group leader\n",
        Side::Member => b"toa group member\n",
    };
    for part in [
        label,
        member_nonce.as_bytes(),
        b"\n",
        leader_nonce.as_bytes(),
    ] {
        mac.update(part);
    }
    hex(&mac.finalize().into_bytes())
}

/// Whether `proof` is [`prove`]'s, compared in time independent of where they differ.
pub fn proven(
    proof: &str,
    token: &str,
    side: Side,
    member_nonce: &str,
    leader_nonce: &str,
) -> bool {
    toa_context::control::same_key(proof, &prove(token, side, member_nonce, leader_nonce))
}

/// `bytes` random bytes in hex: tokens and nonces.
pub fn random_hex(bytes: usize) -> String {
    hex(&(0..bytes).map(|_| rand::random::<u8>()).collect::<Vec<_>>())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub op: Op,
}

/// Keys come prefixed with their scope ([`crate::coordination::atom::Scope::prefix`]), as in
/// Redis, so components and applications never meet.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Answered once every key is free and taken (`reclaim`: at once, or [`Reply::Lost`] — a
    /// holding kept through a change of leader).
    Lock { keys: Vec<String>, reclaim: bool },
    /// Gives up the lock request `lock`, granted or still waiting. Not answered.
    Release { lock: u64 },
    /// The member is alive (sent every [`PING`](super::PING)); a member silent for longer than
    /// the leader waits is taken for stopped. Not answered.
    Ping,
    /// Slots' heartbeat: the membership's [`View`].
    Heartbeat {
        prefix: String,
        member: String,
        ttl_ms: u64,
        withdraw: bool,
    },
    /// `meter`: the debts reached.
    Meter { keys: Vec<String>, deltas: Vec<u64> },
    /// The live value or null.
    Get { key: String },
    Set {
        key: String,
        value: String,
        ttl_ms: u64,
    },
    /// The live value, or null having set it.
    Claim {
        key: String,
        value: String,
        ttl_ms: u64,
    },
    /// Whether a live value was removed.
    Delete { key: String },
    /// What this member serves (sent again to every new leader): its process's name and
    /// components; none once it drains.
    Offer {
        instance: String,
        components: Vec<String>,
        /// Component → the labels of the events it receives here.
        #[serde(default)]
        receivers: BTreeMap<String, Vec<String>>,
    },
    /// An event a component published (`label` its label): handed to one member per component
    /// receiving it, in turn. Answered once handed out.
    Publish { label: String, event: Value },
    /// A call for a replica of `component` (of the process `instance`, when named): answered
    /// [`CallAnswer::Here`] when the leader picks the caller itself, else with the answer of the
    /// member it picked.
    Call {
        component: String,
        instance: Option<String>,
        call: Value,
    },
    /// The answer to the delivery `delivery` ([`Reply::Deliver`]). Not answered.
    Answer { delivery: u64, answer: Value },
    /// One method of the store of `component`'s objects, which the leader keeps (records kept
    /// for `once_ms`) with the store service it was given: the method's result.
    Store {
        component: String,
        once_ms: u64,
        call: Value,
    },
}

/// What a [`Op::Call`] is answered with, besides the callee's own answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallAnswer {
    /// Run it here: the leader picked the caller's own process.
    Here,
    /// No member serves the component (or none is the process named).
    Nobody,
    /// The member that took it stopped before answering.
    Gone,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok {
        id: u64,
        value: Value,
    },
    /// A reclaimed lock someone else holds now.
    Lost {
        id: u64,
    },
    Error {
        id: u64,
        message: String,
    },
    /// An event for `component`'s receivers here ([`Op::Publish`]).
    Event {
        component: String,
        event: Value,
    },
    /// A call for this member to run ([`Op::Call`]); its answer goes back as [`Op::Answer`].
    Deliver {
        delivery: u64,
        component: String,
        call: Value,
    },
}

/// A heartbeat's answer on the wire.
pub fn view_value(view: &View) -> Value {
    serde_json::to_value(view).expect("JSON")
}

/// The next line (without its newline), `None` at the end; a line over [`MAX_LINE`] is an error.
pub async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Option<String>> {
    read_line_within(reader, MAX_LINE).await
}

/// The next line of at most `max` bytes (without its newline), `None` at the end.
pub async fn read_line_within<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: u64,
) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let read = (&mut *reader)
        .take(max + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {max} bytes, or cut short"),
        ));
    }
    line.pop();
    String::from_utf8(line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// `value` as one line.
pub fn line<T: Serialize>(value: &T) -> String {
    let mut text = serde_json::to_string(value).expect("JSON");
    text.push('\n');
    text
}
