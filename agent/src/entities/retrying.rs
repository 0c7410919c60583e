//! The calls this process runs as transitions under `concurrency: retry`, by call id: a call
//! such a transition makes (the SDKs name the running call in the `toa-call` header) to an
//! operation that declares `once` is refused before it is sent (seed 003, "once does not
//! help"): a run made again after a lost write makes a new call, which `once` would apply again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Retrying {
    /// Call id → its runs under way (a call is one run at a time; the count keeps a stray
    /// second delivery's end from clearing the first's).
    running: Mutex<HashMap<String, usize>>,
}

/// A transition under `retry` running, until dropped.
pub struct Running {
    retrying: Arc<Retrying>,
    id: String,
}

impl Retrying {
    pub fn enter(self: &Arc<Self>, id: &str) -> Running {
        *self
            .running
            .lock()
            .expect("running")
            .entry(id.to_owned())
            .or_default() += 1;
        Running {
            retrying: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Whether the call `id` runs here as a transition under `retry`.
    pub fn contains(&self, id: &str) -> bool {
        self.running.lock().expect("running").contains_key(id)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.retrying.running.lock().expect("running");
        if let Some(count) = running.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_known_while_any_of_its_runs_is_under_way() {
        let retrying = Arc::new(Retrying::default());
        let first = retrying.enter("c1");
        let second = retrying.enter("c1");
        assert!(retrying.contains("c1") && !retrying.contains("c2"));
        drop(first);
        assert!(retrying.contains("c1"), "the second run is under way");
        drop(second);
        assert!(!retrying.contains("c1"));
    }
}
