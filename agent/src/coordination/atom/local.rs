//! The embedded, in-process backend of a local run without `atomicity`: locks never wait on
//! another process, meters count in this process, and one replica owns every slot.

use super::lock::{Held, Release, Signal};
use crate::metrics::ComponentMetrics;
use std::collections::{HashMap, HashSet};
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

/// In-process meters: debt per key with the time it was last computed.
pub struct LocalMeter {
    debts: Mutex<HashMap<String, (u64, Instant)>>,
    metrics: ComponentMetrics,
}

impl LocalMeter {
    pub fn new(metrics: ComponentMetrics) -> Self {
        Self {
            debts: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    pub fn charge(&self, keys: &[String], deltas: &[u64]) -> Vec<u64> {
        self.metrics.meter_called();
        let now = Instant::now();
        let mut debts = self.debts.lock().expect("local meter");
        debts.retain(|_, (debt, at)| (now - *at).as_millis() < u128::from(*debt));
        keys.iter()
            .zip(deltas)
            .map(|(key, delta)| {
                let (debt, at) = debts.get(key).copied().unwrap_or((0, now));
                let drained = (now - at).as_millis().min(u128::from(debt)) as u64;
                let reached = debt - drained + delta;
                if reached > 0 {
                    debts.insert(key.clone(), (reached, now));
                }
                reached
            })
            .collect()
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
