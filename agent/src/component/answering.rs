//! The calls a component's program is answering now, by call id, each with the moment the agent
//! stops waiting for it. A lock the program asks for while answering one (the SDKs name the call
//! in the `toa-call` header) is waited for only until then: seed 000 says the wait "counts toward
//! the operation's duration", and work under a lock must never start after its caller was told
//! the call failed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

#[derive(Default)]
pub struct Answering {
    /// Call id → when the agent stops waiting for each run under way (a redelivered call can
    /// briefly run twice; the earliest end is the one that counts).
    calls: Mutex<HashMap<String, Vec<Instant>>>,
}

/// A call being answered, until dropped.
pub struct Answer {
    answering: Arc<Answering>,
    id: String,
    until: Instant,
}

impl Answering {
    /// The program answers call `id` until `until` at the latest.
    pub fn enter(self: &Arc<Self>, id: &str, until: Instant) -> Answer {
        self.calls
            .lock()
            .expect("calls")
            .entry(id.to_owned())
            .or_default()
            .push(until);
        Answer {
            answering: self.clone(),
            id: id.to_owned(),
            until,
        }
    }

    /// When the agent stops waiting for the call `id`, if the program is answering it now.
    pub fn until(&self, id: &str) -> Option<Instant> {
        let calls = self.calls.lock().expect("calls");
        calls.get(id)?.iter().min().copied()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        let mut calls = self.answering.calls.lock().expect("calls");
        if let Some(runs) = calls.get_mut(&self.id) {
            if let Some(at) = runs.iter().position(|until| *until == self.until) {
                runs.swap_remove(at);
            }
            if runs.is_empty() {
                calls.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_call_is_known_while_answered_with_its_earliest_end() {
        let answering = Arc::new(Answering::default());
        let now = Instant::now();
        let first = answering.enter("c1", now + Duration::from_secs(5));
        let second = answering.enter("c1", now + Duration::from_secs(2));
        assert_eq!(answering.until("c1"), Some(now + Duration::from_secs(2)));
        assert_eq!(answering.until("c2"), None);
        drop(second);
        assert_eq!(answering.until("c1"), Some(now + Duration::from_secs(5)));
        drop(first);
        assert_eq!(answering.until("c1"), None, "forgotten once answered");
    }
}
