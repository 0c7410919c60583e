//! The process's calls, as the halt sees them: how many were made *or received* since the last
//! pause, when the last one ended, and how many are in flight now. A halt stops a composition only
//! once every process is quiet (DESIGN decision 8), so a call that is still running counts as
//! busy whatever the window, and a call's end (not its start) is when quiet begins.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use toa_context::control::Calls as Counts;

/// The live counters, shared by the call router (calls made, and in-process calls received) and
/// the broker's consumers (calls received).
#[derive(Debug, Default)]
pub struct Activity {
    since_pause: AtomicU64,
    last_at_ms: AtomicU64,
    in_flight: AtomicU64,
}

/// One call in flight; its drop ends it.
#[must_use = "the call is in flight until this is dropped"]
pub struct InFlight(Arc<Activity>);

/// Milliseconds since the Unix epoch, as the status reports them (one clock for the runtime:
/// toa-context's `program::now_ms`).
fn now_ms() -> u64 {
    toa_context::program::now_ms().max(0) as u64
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A call starts: it counts, and it is in flight until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.since_pause.fetch_add(1, Ordering::SeqCst);
        self.last_at_ms.store(now_ms(), Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// What the control endpoint reports (`calls` in its status).
    pub fn counts(&self) -> Counts {
        let last = self.last_at_ms.load(Ordering::SeqCst);
        Counts {
            since_pause: self.since_pause.load(Ordering::SeqCst),
            last_at_ms: (last > 0).then_some(last),
            in_flight: self.in_flight.load(Ordering::SeqCst),
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, up to `budget`: how many still are.
    pub async fn settled(&self, budget: std::time::Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + budget;
        while self.in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.in_flight()
    }

    /// The pause: calls count from now. Calls in flight stay in flight.
    pub fn reset(&self) {
        self.since_pause.store(0, Ordering::SeqCst);
        self.last_at_ms.store(0, Ordering::SeqCst);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The end of a call is activity too: quiet starts when the last call ended.
        self.0.last_at_ms.store(now_ms(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_counts_from_its_start_to_its_end_and_a_reset_keeps_it_in_flight() {
        let activity = Activity::new();
        assert_eq!(activity.counts(), Counts::default());
        let first = activity.begin();
        let second = activity.begin();
        let counts = activity.counts();
        assert_eq!((counts.since_pause, counts.in_flight), (2, 2));
        assert!(counts.last_at_ms.is_some());
        activity.reset();
        let counts = activity.counts();
        assert_eq!(
            (counts.since_pause, counts.last_at_ms, counts.in_flight),
            (0, None, 2)
        );
        drop(first);
        let counts = activity.counts();
        assert_eq!(counts.in_flight, 1);
        assert!(
            counts.last_at_ms.is_some(),
            "the end of a call after the pause is activity"
        );
        drop(second);
        assert_eq!(activity.in_flight(), 0);
    }
}
