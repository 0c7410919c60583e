//! The embedded store of a local group: the objects of a component kept by the group's leader
//! ([`crate::coordination::group`]), each method of the [`Store`] contract one request to it.
//! Two local replicas of a component share one copy of each object; what the leader kept goes
//! with it, as the embedded store goes with its process.

use super::memory::Memory;
use super::store::{Committed, Event, Found, Record, Recorded, State, Store, StoreError, Write};
use crate::coordination::group::{Group, StoreService};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// The [`crate::entities::store::Store`] contract's methods and arguments.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreCall {
    Read {
        id: String,
    },
    Commit {
        id: String,
        read: u64,
        write: Write,
        record: Option<(Record, Value)>,
        events: Vec<Event>,
    },
    Claim {
        lease_ms: u64,
        limit: usize,
    },
    Published {
        events: Vec<Event>,
    },
    Waiting,
    Recorded {
        record: Record,
    },
    Record {
        record: Record,
        outcome: Value,
    },
    Enumerate {
        after: Option<String>,
        limit: usize,
    },
}

pub struct Grouped {
    group: Arc<Group>,
    component: String,
    /// How long the records of calls applied once are kept.
    once: Duration,
}

impl Grouped {
    pub fn new(group: Arc<Group>, component: &str, once: Duration) -> Self {
        Self {
            group,
            component: component.to_owned(),
            once,
        }
    }

    async fn call<T: DeserializeOwned>(&self, call: StoreCall) -> Result<T, StoreError> {
        let once_ms = self.once.as_millis() as u64;
        let value = self
            .group
            .store(
                &self.component,
                once_ms,
                serde_json::to_value(call).expect("JSON"),
            )
            .await
            .map_err(|error| StoreError::Unavailable(error.to_string()))?;
        serde_json::from_value(value).map_err(|error| {
            StoreError::Unavailable(format!(
                "the group's leader answered what this store cannot read: {error}"
            ))
        })
    }
}

impl Store for Grouped {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        self.call(StoreCall::Read { id: id.to_owned() }).await
    }

    async fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Committed, StoreError> {
        let record = record.map(|(record, outcome)| (record.clone(), outcome.clone()));
        let call = StoreCall::Commit {
            id: id.to_owned(),
            read,
            write,
            record,
            events: events.to_vec(),
        };
        self.call(call).await
    }

    async fn claim(&self, lease: Duration, limit: usize) -> Result<Vec<Event>, StoreError> {
        let lease_ms = lease.as_millis() as u64;
        self.call(StoreCall::Claim { lease_ms, limit }).await
    }

    async fn published(&self, events: &[Event]) -> Result<(), StoreError> {
        let events = events.to_vec();
        self.call::<Value>(StoreCall::Published { events })
            .await
            .map(drop)
    }

    async fn waiting(&self) -> Result<Option<Duration>, StoreError> {
        let waited: Option<u64> = self.call(StoreCall::Waiting).await?;
        Ok(waited.map(Duration::from_millis))
    }

    async fn recorded(&self, record: &Record) -> Result<Option<Recorded>, StoreError> {
        let record = record.clone();
        self.call(StoreCall::Recorded { record }).await
    }

    async fn record(
        &self,
        record: &Record,
        outcome: &Value,
    ) -> Result<Option<Recorded>, StoreError> {
        let (record, outcome) = (record.clone(), outcome.clone());
        self.call(StoreCall::Record { record, outcome }).await
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        let after = after.map(str::to_owned);
        self.call(StoreCall::Enumerate { after, limit }).await
    }
}

/// What a process serves the group's embedded store with, should it lead: each component's
/// objects in this process's memory, every method of the contract one request.
pub fn service() -> StoreService {
    let stores: Arc<Mutex<HashMap<String, Arc<Memory>>>> = Arc::default();
    Arc::new(move |component: String, once_ms: u64, call: Value| {
        let store = stores
            .lock()
            .expect("stores")
            .entry(component)
            .or_insert_with(|| Arc::new(Memory::new(Duration::from_millis(once_ms))))
            .clone();
        Box::pin(async move {
            let call: StoreCall = serde_json::from_value(call)
                .map_err(|e| format!("a store call this leader cannot read: {e}"))?;
            stored(&store, call).await.map_err(|e| e.to_string())
        })
    })
}

/// Runs one store method on the leader's store.
async fn stored(store: &Memory, call: StoreCall) -> Result<Value, StoreError> {
    let json = |value: serde_json::Result<Value>| value.expect("JSON");
    Ok(match call {
        StoreCall::Read { id } => json(serde_json::to_value(store.read(&id).await?)),
        StoreCall::Commit {
            id,
            read,
            write,
            record,
            events,
        } => {
            let record = record.as_ref().map(|(record, outcome)| (record, outcome));
            let committed = store.commit(&id, read, write, record, &events).await?;
            json(serde_json::to_value(committed))
        }
        StoreCall::Claim { lease_ms, limit } => {
            let lease = Duration::from_millis(lease_ms);
            json(serde_json::to_value(store.claim(lease, limit).await?))
        }
        StoreCall::Published { events } => {
            store.published(&events).await?;
            Value::Null
        }
        StoreCall::Waiting => {
            let waiting = store.waiting().await?;
            json!(waiting.map(|waited| waited.as_millis() as u64))
        }
        StoreCall::Recorded { record } => {
            json(serde_json::to_value(store.recorded(&record).await?))
        }
        StoreCall::Record { record, outcome } => {
            json(serde_json::to_value(store.record(&record, &outcome).await?))
        }
        StoreCall::Enumerate { after, limit } => json(serde_json::to_value(
            store.enumerate(after.as_deref(), limit).await?,
        )),
    })
}
