//! The in-process store: a local `compose` without `storage` keeps its objects here, with the
//! semantics of the PostgreSQL store (versions, compare-and-set, tombstones), so the README's
//! first command needs nothing installed. Gone with the process.

use super::store::{Committed, Found, State, Store, StoreError, Write};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

#[derive(Default)]
pub struct Memory {
    objects: Mutex<BTreeMap<String, Found>>,
}

impl Store for Memory {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        let objects = self.objects.lock().expect("objects");
        Ok(objects.get(id).cloned().unwrap_or(Found::Missing))
    }

    async fn commit(&self, id: &str, read: u64, write: Write) -> Result<Committed, StoreError> {
        let mut objects = self.objects.lock().expect("objects");
        let current = objects.get(id).map_or(0, Found::version);
        if current != read {
            return Ok(Committed::Lost { current });
        }
        let version = read + 1;
        let stored = match write {
            Write::Put(state) => Found::Live { state, version },
            Write::Delete => Found::Deleted { version },
        };
        objects.insert(id.to_owned(), stored);
        Ok(Committed::Stored { version })
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        let objects = self.objects.lock().expect("objects");
        let from = after.map_or(Bound::Unbounded, |id| Bound::Excluded(id.to_owned()));
        let live = objects
            .range((from, Bound::Unbounded))
            .filter_map(|(id, found)| match found {
                Found::Live { state, version } => Some((id.clone(), state.clone(), *version)),
                _ => None,
            });
        Ok(live.take(limit).collect())
    }
}
