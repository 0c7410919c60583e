//! Where a component's objects are kept: in the agent's process (a local run without `storage`),
//! by the leader of its local group (the same, shared by the group's processes), or in PostgreSQL (the context's `storage`), behind the one [`Store`] contract.

use super::grouped::Grouped;
use super::memory::Memory;
use super::postgres::{Address, Postgres};
use super::store::{Committed, Event, Found, Record, Recorded, State, Store, StoreError, Write};
use crate::coordination::group::Group;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The context's store: its address and credentials, and the application's (shared) name, whose
/// schema holds the objects.
#[derive(Clone)]
pub struct Storage {
    pub address: Address,
    pub application: String,
}

/// How long the store keeps what it keeps for a while: the records of calls applied once
/// (`limits.once`) and the events published (`limits.events`).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub once: Duration,
    pub events: Duration,
}

/// Both for as long: the tests' stores.
impl From<Duration> for Retention {
    fn from(both: Duration) -> Self {
        Self {
            once: both,
            events: both,
        }
    }
}

impl Retention {
    pub fn of(limits: &toa_context::Limits) -> Self {
        Self {
            once: limits.once,
            events: limits.events,
        }
    }
}

/// Connections per component's pool: a transition holds one only for a statement.
const CONNECTIONS: usize = 8;

pub enum Backend {
    Memory(Memory),
    /// The embedded store of a local group, kept by its leader.
    Grouped(Grouped),
    /// Boxed: it holds its pool and statements, ten times the in-process store's handle.
    Postgres(Box<Postgres>),
}

impl Backend {
    /// The store of `component`'s objects: PostgreSQL when the context names one, else this
    /// process's memory. `retention`: how long the records of calls applied once are kept
    /// (`limits.once`).
    pub async fn open(
        storage: Option<&Storage>,
        component: &str,
        retention: impl Into<Retention>,
    ) -> Result<Self, StoreError> {
        let retention = retention.into();
        match storage {
            None => Ok(Self::Memory(Memory::new(retention.once))),
            Some(storage) => {
                let (address, application) = (&storage.address, &storage.application);
                let opened =
                    Postgres::open(address, application, component, CONNECTIONS, retention).await?;
                Ok(Self::Postgres(Box::new(opened)))
            }
        }
    }
}

impl Backend {
    /// The embedded store of `component`'s objects in a local group: its leader keeps them.
    pub fn in_group(group: Arc<Group>, component: &str, retention: impl Into<Retention>) -> Self {
        Self::Grouped(Grouped::new(group, component, retention.into().once))
    }
}

impl Store for Backend {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        match self {
            Self::Memory(store) => store.read(id).await,
            Self::Grouped(store) => store.read(id).await,
            Self::Postgres(store) => store.read(id).await,
        }
    }

    async fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Committed, StoreError> {
        match self {
            Self::Memory(store) => store.commit(id, read, write, record, events).await,
            Self::Grouped(store) => store.commit(id, read, write, record, events).await,
            Self::Postgres(store) => store.commit(id, read, write, record, events).await,
        }
    }

    async fn claim(&self, lease: Duration, limit: usize) -> Result<Vec<Event>, StoreError> {
        match self {
            Self::Memory(store) => store.claim(lease, limit).await,
            Self::Grouped(store) => store.claim(lease, limit).await,
            Self::Postgres(store) => store.claim(lease, limit).await,
        }
    }

    async fn published(&self, events: &[Event]) -> Result<(), StoreError> {
        match self {
            Self::Memory(store) => store.published(events).await,
            Self::Grouped(store) => store.published(events).await,
            Self::Postgres(store) => store.published(events).await,
        }
    }

    async fn waiting(&self) -> Result<Option<Duration>, StoreError> {
        match self {
            Self::Memory(store) => store.waiting().await,
            Self::Grouped(store) => store.waiting().await,
            Self::Postgres(store) => store.waiting().await,
        }
    }

    async fn recorded(&self, record: &Record) -> Result<Option<Recorded>, StoreError> {
        match self {
            Self::Memory(store) => store.recorded(record).await,
            Self::Grouped(store) => store.recorded(record).await,
            Self::Postgres(store) => store.recorded(record).await,
        }
    }

    async fn record(
        &self,
        record: &Record,
        outcome: &Value,
    ) -> Result<Option<Recorded>, StoreError> {
        match self {
            Self::Memory(store) => store.record(record, outcome).await,
            Self::Grouped(store) => store.record(record, outcome).await,
            Self::Postgres(store) => store.record(record, outcome).await,
        }
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        match self {
            Self::Memory(store) => store.enumerate(after, limit).await,
            Self::Grouped(store) => store.enumerate(after, limit).await,
            Self::Postgres(store) => store.enumerate(after, limit).await,
        }
    }
}
