//! The contract of a store of one component's objects. Every store (the in-process
//! [`super::memory::Memory`], PostgreSQL) keeps it, and one conformance suite checks it.

use serde_json::{Map, Value};
use std::future::Future;

/// An object's properties, without `id`, `VERSION`, `DISCARD` or `DELETE`, which are never stored.
pub type State = Map<String, Value>;

/// What is stored under an id.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Put(State),
    Delete,
}

/// A commit's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Written at this version (the one read, plus one).
    Stored { version: u64 },
    /// Somebody wrote first: the object is at `current` now, and nothing was written.
    Lost { current: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

pub trait Store: Send + Sync {
    fn read(&self, id: &str) -> impl Future<Output = Result<Found, StoreError>> + Send;

    /// Writes `write` at version `read + 1` if the object is still at `read` (0: never written);
    /// otherwise writes nothing and says where the object is.
    fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
    ) -> impl Future<Output = Result<Committed, StoreError>> + Send;

    /// Up to `limit` live objects with ids after `after` (from the first without), by id.
    fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, State, u64)>, StoreError>> + Send;
}
