//! The group's frames: one JSON object per line over loopback TCP. A member's first line is its
//! [`Hello`]; then [`Request`]s, each answered by one [`Reply`] with its id (a lock's when it is
//! granted, in any order), except [`Op::Release`], which is not answered.

use crate::coordination::membership::View;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The longest line either side reads: a call's answer or an object of `limits.message` (16 MiB
/// by default), escaped once more, fits.
pub const MAX_LINE: u64 = 64 * 1024 * 1024;

#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    pub token: String,
    /// The member process's name, for the leader's logs.
    pub instance: String,
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
    let mut line = Vec::new();
    let read = (&mut *reader)
        .take(MAX_LINE + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {MAX_LINE} bytes, or cut short"),
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
