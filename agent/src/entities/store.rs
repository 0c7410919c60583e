//! The contract of a store of one component's objects. Every store (the in-process
//! [`super::memory::Memory`], PostgreSQL) keeps it, and one conformance suite checks it.

use serde_json::{Map, Value};
use std::future::Future;

/// An object's properties, without `id`, `VERSION`, `DISCARD` or `DELETE`, which are never stored.
pub type State = Map<String, Value>;

/// How long the process that stored a write has to publish its events before another
/// replica's relay may claim them (and how long a relay's claim lasts).
pub const LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// What is stored under an id.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Found {
    /// Never written: version 0.
    Missing,
    Live {
        state: State,
        version: u64,
    },
    /// Deleted. The tombstone keeps its version, so a caller who saw an older one cannot write
    /// the object back.
    Deleted {
        version: u64,
    },
}

impl Found {
    pub fn version(&self) -> u64 {
        match self {
            Self::Missing => 0,
            Self::Live { version, .. } | Self::Deleted { version } => *version,
        }
    }
}

/// What a commit writes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Write {
    Put(State),
    Delete,
}

/// A commit's outcome.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Committed {
    /// Written at this version (the one read, plus one).
    Stored { version: u64 },
    /// Somebody wrote first: the object is at `current` now, and nothing was written.
    Lost { current: u64 },
    /// The call's record was there already: another delivery of the call (or another call with
    /// its key) was applied; nothing was written.
    Repeated(Recorded),
}

/// The record of a call applied once: an operation declaring `once` (keyed by the call's id,
/// the same on every delivery), or a caller's `key` on an operation that writes. It is written
/// in the same transaction as the call's write, so that a repeat finds it exactly when the
/// write was stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub operation: String,
    /// `call:<id>` or `key:<key>`: a caller's key never meets a call's id.
    pub key: String,
    /// What the input hashes to: a key given again with another input is refused.
    pub hash: String,
    /// A receiver's `latest` watermark: `key` names an event's object (`latest:<label>/<id>`)
    /// and `hash` the event's version ([`Record::watermark`]). A record there with an older
    /// version is replaced with the write; one at this version or a newer one (within the
    /// retention) writes nothing, as a repeat does.
    pub latest: bool,
}

/// How a received event's run is recorded with its write (DESIGN 18): its key names the event
/// (`Inbox`: a copy finds the record, whatever its request) or the event's object (`Latest`: a
/// watermark at the event's version).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    Inbox,
    Latest(u64),
}

impl Record {
    /// The inbox record of the event `id`: any run of a copy finds it, whatever request a
    /// receiver's adaptation made this time.
    pub fn inbox(operation: &str, id: &str) -> Self {
        Self {
            operation: operation.to_owned(),
            key: format!("event:{id}"),
            hash: "event".to_owned(),
            latest: false,
        }
    }

    /// The watermark of `operation` for the events of `source` (`label/id`) at `version`.
    pub fn watermark(operation: &str, source: &str, version: u64) -> Self {
        Self {
            operation: operation.to_owned(),
            key: format!("latest:{source}"),
            // Zero-padded, so that comparing the texts compares the versions.
            hash: format!("{version:020}"),
            latest: true,
        }
    }

    /// Whether what `recorded` keeps answers this record: the same call kept, or a watermark at
    /// this version or past it.
    pub fn answered_by(&self, recorded: &Recorded) -> bool {
        !self.latest || recorded.hash >= self.hash
    }
}

/// What a record keeps: the hash of the input it was made with, and the call's outcome as the
/// caller got it (`{"reply": …}` or `{"error": …}`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    pub hash: String,
    pub outcome: Value,
}

/// An event a stored write publishes (DESIGN 18): its row is written to the outbox in the
/// write's transaction, so that it exists exactly when the write was stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Event {
    /// `namespace.name.event`: the routing key on the broker.
    pub label: String,
    /// The object's id.
    pub object: String,
    /// The version the write stored.
    pub version: u64,
    /// The object as stored, with its `id` and `VERSION` (a deletion: `DELETED: true` beside
    /// them instead of properties).
    pub payload: Value,
}

impl Event {
    /// The events `labels` publish for a write of `id` at `version`.
    #[cfg(test)]
    pub fn of(labels: &[String], id: &str, version: u64, write: &Write) -> Vec<Self> {
        if labels.is_empty() {
            return Vec::new();
        }
        Self::all(labels, id, version, Self::payload(id, version, write))
    }

    /// What an event of a write of `id` at `version` carries: the object as stored, with its
    /// `id` and `VERSION` (a deletion: `DELETED: true` beside them instead of properties).
    pub fn payload(id: &str, version: u64, write: &Write) -> Value {
        let mut payload = match write {
            Write::Put(state) => state.clone(),
            Write::Delete => Map::from_iter([("DELETED".to_owned(), Value::Bool(true))]),
        };
        payload.insert("id".to_owned(), Value::from(id));
        payload.insert("VERSION".to_owned(), Value::from(version));
        Value::Object(payload)
    }

    /// The events `labels` publish, each carrying `payload` (see [`Event::payload`]).
    pub fn all(labels: &[String], id: &str, version: u64, payload: Value) -> Vec<Self> {
        labels
            .iter()
            .map(|label| Self {
                label: label.clone(),
                object: id.to_owned(),
                version,
                payload: payload.clone(),
            })
            .collect()
    }

    /// The same on every publication of this event: a receiver tells copies apart by it.
    pub fn message_id(&self) -> String {
        format!("{}/{}/{}", self.label, self.object, self.version)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

pub trait Store: Send + Sync {
    fn read(&self, id: &str) -> impl Future<Output = Result<Found, StoreError>> + Send;

    /// Writes `write` at version `read + 1` if the object is still at `read` (0: never written);
    /// otherwise writes nothing and says where the object is. With a record, the record and the
    /// write are stored together or not at all, and a record there already (within the
    /// retention) writes nothing: [`Committed::Repeated`]. So are `events` (the outbox's rows
    /// of the write, leased to this process for [`LEASE`]: it publishes them itself).
    fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> impl Future<Output = Result<Committed, StoreError>> + Send;

    /// Up to `limit` events not published whose lease ran out (their committer did not publish
    /// them: it stopped, or the broker did not take them), leased now to this process for
    /// `lease`: no other claims them meanwhile.
    fn claim(
        &self,
        lease: std::time::Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// Marks `events` published (the broker confirmed them); they are deleted after
    /// `limits.events`.
    fn published(&self, events: &[Event]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How long the oldest event not yet published has waited, if there is one.
    fn waiting(
        &self,
    ) -> impl Future<Output = Result<Option<std::time::Duration>, StoreError>> + Send;

    /// What the record of a call says, if it is kept (younger than the retention).
    fn recorded(
        &self,
        record: &Record,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send;

    /// Keeps the outcome of a call that wrote nothing (`DISCARD`, the operation's own error) as
    /// its record; `Some`: the record was there already, and is what it says.
    fn record(
        &self,
        record: &Record,
        outcome: &Value,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send;

    /// Up to `limit` live objects with ids after `after` (from the first without), by id.
    fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, State, u64)>, StoreError>> + Send;
}

/// Where in `value` a string (or a key) holds U+0000, as a JSON pointer: PostgreSQL's JSONB
/// cannot keep it, so no store does (objects, and the outcomes records keep).
pub fn nul_at(value: &Value, at: String) -> Option<String> {
    match value {
        Value::String(text) => text.contains('\0').then_some(at),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_at(item, format!("{at}/{i}"))),
        Value::Object(fields) => fields.iter().find_map(|(key, field)| {
            let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
            if key.contains('\0') {
                return Some(here);
            }
            nul_at(field, here)
        }),
        _ => None,
    }
}
