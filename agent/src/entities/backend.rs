//! Where a component's objects are kept: in the agent's process (a local run without `storage`)
//! or in PostgreSQL (the context's `storage`), behind the one [`Store`] contract.

use super::memory::Memory;
use super::postgres::{Address, Postgres};
use super::store::{Committed, Found, Record, Recorded, State, Store, StoreError, Write};
use serde_json::Value;
use std::time::Duration;

/// The context's store: its address and credentials, and the application's (shared) name, whose
/// schema holds the objects.
#[derive(Clone)]
pub struct Storage {
    pub address: Address,
    pub application: String,
}

/// Connections per component's pool: a transition holds one only for a statement.
const CONNECTIONS: usize = 8;

pub enum Backend {
    Memory(Memory),
    Postgres(Postgres),
}

impl Backend {
    /// The store of `component`'s objects: PostgreSQL when the context names one, else this
    /// process's memory. `retention`: how long the records of calls applied once are kept
    /// (`limits.once`).
    pub async fn open(
        storage: Option<&Storage>,
        component: &str,
        retention: Duration,
    ) -> Result<Self, StoreError> {
        match storage {
            None => Ok(Self::Memory(Memory::new(retention))),
            Some(storage) => {
                let (address, application) = (&storage.address, &storage.application);
                let opened =
                    Postgres::open(address, application, component, CONNECTIONS, retention).await?;
                Ok(Self::Postgres(opened))
            }
        }
    }
}

impl Store for Backend {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        match self {
            Self::Memory(store) => store.read(id).await,
            Self::Postgres(store) => store.read(id).await,
        }
    }

    async fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
    ) -> Result<Committed, StoreError> {
        match self {
            Self::Memory(store) => store.commit(id, read, write, record).await,
            Self::Postgres(store) => store.commit(id, read, write, record).await,
        }
    }

    async fn recorded(&self, record: &Record) -> Result<Option<Recorded>, StoreError> {
        match self {
            Self::Memory(store) => store.recorded(record).await,
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
            Self::Postgres(store) => store.enumerate(after, limit).await,
        }
    }
}
