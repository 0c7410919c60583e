//! The embedded, in-process backend of a local run without `atomicity` started `--alone`: locks
//! never wait on another process, meters count in this process, and one replica owns every slot.
//! (Without `--alone` the processes of one application form a group: [`crate::coordination::group`].)

use super::lock::{Held, Release, Signal};
use crate::coordination::debts::Debts;
use crate::metrics::ComponentMetrics;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio::time::Instant;

struct LockState {
    held: HashSet<String>,
    token: u64,
}

/// In-process locks: all keys of a call taken together, waiters woken on release.
pub struct LocalLocks {
    state: Arc<Mutex<LockState>>,
    released: Arc<Notify>,
    metrics: ComponentMetrics,
}

impl LocalLocks {
    pub fn new(metrics: ComponentMetrics) -> Self {
        Self {
            state: Arc::new(Mutex::new(LockState {
                held: HashSet::new(),
                token: 0,
            })),
            released: Arc::new(Notify::new()),
            metrics,
        }
    }

    pub async fn acquire(&self, keys: Vec<String>) -> Held {
        let started = Instant::now();
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut state = self.state.lock().expect("local locks");
                if keys.iter().all(|key| !state.held.contains(key)) {
                    state.held.extend(keys.iter().cloned());
                    state.token += 1;
                    self.metrics.lock_waited(started.elapsed());
                    self.metrics.lock_held(1);
                    let release = LocalRelease {
                        state: self.state.clone(),
                        released: self.released.clone(),
                        keys,
                        metrics: self.metrics.clone(),
                    };
                    return Held::new(Signal::new(state.token), Box::new(release));
                }
            }
            released.await;
        }
    }
}

struct LocalRelease {
    state: Arc<Mutex<LockState>>,
    released: Arc<Notify>,
    keys: Vec<String>,
    metrics: ComponentMetrics,
}

impl Release for LocalRelease {
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut state = self.state.lock().expect("local locks");
        for key in &self.keys {
            state.held.remove(key);
        }
        drop(state);
        self.metrics.lock_held(-1);
        self.released.notify_waiters();
        Box::pin(async {})
    }
}

/// In-process meters.
pub struct LocalMeter {
    debts: Mutex<Debts>,
    metrics: ComponentMetrics,
}

impl LocalMeter {
    pub fn new(metrics: ComponentMetrics) -> Self {
        Self {
            debts: Mutex::default(),
            metrics,
        }
    }

    pub fn charge(&self, keys: &[String], deltas: &[u64]) -> Vec<u64> {
        self.metrics.meter_called();
        self.debts.lock().expect("local meter").charge(keys, deltas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::time::Duration;

    fn metrics() -> ComponentMetrics {
        Metrics::new().component("test", "local")
    }

    #[tokio::test(start_paused = true)]
    async fn local_meter_drains_one_ms_per_ms() {
        let meter = LocalMeter::new(metrics());
        let key = vec!["k".to_owned()];
        assert_eq!(meter.charge(&key, &[6000]), vec![6000]);
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert_eq!(meter.charge(&key, &[0]), vec![5000]);
        assert_eq!(meter.charge(&key, &[6000]), vec![11000]);
        tokio::time::advance(Duration::from_millis(20_000)).await;
        assert_eq!(meter.charge(&key, &[0]), vec![0]);
    }

    #[tokio::test]
    async fn local_locks_exclude_and_hand_over() {
        let locks = Arc::new(LocalLocks::new(metrics()));
        let first = locks.acquire(vec!["a".into(), "b".into()]).await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.acquire(vec!["b".into()]).await.token() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "b is held: the waiter must wait");
        let other = locks.acquire(vec!["c".into()]).await; // an unrelated key does not wait
        let token = first.token();
        first.release().await;
        let next = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(next > token && other.token() > token);
    }
}
