//! The in-process store: a local `compose` without `storage` keeps its objects here, with the
//! semantics of the PostgreSQL store (versions, compare-and-set, tombstones, the records of calls
//! applied once, the outbox of events), so the README's first command needs nothing installed.
//! Gone with the process, events not yet published included.

use super::store::{
    Committed, Event, Found, Record, Recorded, State, Store, StoreError, Write, LEASE,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

pub struct Memory {
    /// Objects and records under one lock: a commit writes both or neither.
    held: Mutex<Held>,
    /// How long a record is kept (`limits.once`).
    retention: Duration,
}

#[derive(Default)]
struct Held {
    objects: BTreeMap<String, Found>,
    /// By operation and key: what the record says, and when it was made.
    records: HashMap<(String, String), (Recorded, Instant)>,
    /// Records made since expired ones were last swept out.
    made: usize,
    /// Events not yet published, by when they were stored: each with its lease's end. A
    /// published one leaves at once (nothing outlives the process to look it up).
    outbox: Vec<(Event, Instant, Instant)>,
}

/// Records made between two sweeps of the expired ones.
const SWEEP_EVERY: usize = 4096;

impl Memory {
    pub fn new(retention: Duration) -> Self {
        Self {
            held: Mutex::default(),
            retention,
        }
    }
}

impl Default for Memory {
    /// With `limits.once`'s default.
    fn default() -> Self {
        Self::new(Duration::from_secs(7 * 24 * 3600))
    }
}

impl Held {
    /// The record, if it is younger than `retention`.
    /// The record kept under `record`'s key within the retention, if it answers `record` (a
    /// watermark at its version or past it; any other record).
    fn kept(&self, record: &Record, retention: Duration) -> Option<Recorded> {
        self.found(record, retention)
            .filter(|recorded| record.answered_by(recorded))
    }

    /// The record kept under `record`'s key within the retention, whatever it says.
    fn found(&self, record: &Record, retention: Duration) -> Option<Recorded> {
        let key = (record.operation.clone(), record.key.clone());
        let (recorded, made) = self.records.get(&key)?;
        (made.elapsed() < retention).then(|| recorded.clone())
    }

    fn keep(&mut self, record: &Record, outcome: &Value, retention: Duration) {
        self.made += 1;
        if self.made >= SWEEP_EVERY {
            self.made = 0;
            self.records
                .retain(|_, (_, made)| made.elapsed() < retention);
        }
        let recorded = Recorded {
            hash: record.hash.clone(),
            outcome: outcome.clone(),
        };
        let key = (record.operation.clone(), record.key.clone());
        self.records.insert(key, (recorded, Instant::now()));
    }
}

impl Store for Memory {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        let held = self.held.lock().expect("held");
        Ok(held.objects.get(id).cloned().unwrap_or(Found::Missing))
    }

    async fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Committed, StoreError> {
        let mut held = self.held.lock().expect("held");
        if let Some(recorded) = record.and_then(|(record, _)| held.kept(record, self.retention)) {
            return Ok(Committed::Repeated(recorded));
        }
        let current = held.objects.get(id).map_or(0, Found::version);
        if current != read {
            return Ok(Committed::Lost { current });
        }
        let version = read + 1;
        let stored = match write {
            Write::Put(state) => Found::Live { state, version },
            Write::Delete => Found::Deleted { version },
        };
        held.objects.insert(id.to_owned(), stored);
        if let Some((record, outcome)) = record {
            held.keep(record, outcome, self.retention);
        }
        let now = Instant::now();
        let leased = events.iter().map(|event| (event.clone(), now, now + LEASE));
        held.outbox.extend(leased);
        Ok(Committed::Stored { version })
    }

    async fn recorded(&self, record: &Record) -> Result<Option<Recorded>, StoreError> {
        let held = self.held.lock().expect("held");
        Ok(held.found(record, self.retention))
    }

    async fn record(
        &self,
        record: &Record,
        outcome: &Value,
    ) -> Result<Option<Recorded>, StoreError> {
        let mut held = self.held.lock().expect("held");
        if let Some(recorded) = held.kept(record, self.retention) {
            return Ok(Some(recorded));
        }
        held.keep(record, outcome, self.retention);
        Ok(None)
    }

    async fn claim(&self, lease: Duration, limit: usize) -> Result<Vec<Event>, StoreError> {
        let mut held = self.held.lock().expect("held");
        let now = Instant::now();
        let due = held.outbox.iter_mut().filter(|(_, _, until)| *until <= now);
        Ok(due
            .take(limit)
            .map(|(event, _, until)| {
                *until = now + lease;
                event.clone()
            })
            .collect())
    }

    async fn published(&self, events: &[Event]) -> Result<(), StoreError> {
        let mut held = self.held.lock().expect("held");
        held.outbox.retain(|(kept, _, _)| !events.contains(kept));
        Ok(())
    }

    async fn waiting(&self) -> Result<Option<Duration>, StoreError> {
        let held = self.held.lock().expect("held");
        Ok(held.outbox.first().map(|(_, at, _)| at.elapsed()))
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        let held = self.held.lock().expect("held");
        let from = after.map_or(Bound::Unbounded, |id| Bound::Excluded(id.to_owned()));
        let live =
            held.objects
                .range((from, Bound::Unbounded))
                .filter_map(|(id, found)| match found {
                    Found::Live { state, version } => Some((id.clone(), state.clone(), *version)),
                    _ => None,
                });
        Ok(live.take(limit).collect())
    }
}
