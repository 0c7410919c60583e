//! `lock`, `slots`, `onassigned`, `meter` and the stash: coordination across the replicas of one
//! component.
//!
//! [`Atom`] is the façade a component (or the HTTP API) uses. Behind it stands one of three
//! backends, chosen once at start:
//! - Redis ([`lock`], [`slots`], [`meter`]), when the context has `atomicity`;
//! - a local group's leader ([`crate::coordination::group`]), for a local run without
//!   `atomicity`: the processes of one application on one machine coordinate through it;
//! - in-process ([`local`]), for a local run without `atomicity` started `--alone` (one replica
//!   owns everything);
//! - none, in a pod without `atomicity`: `slots` answers none, `lock` and `meter` fail with
//!   [`AtomError::RequiresAtomicity`].
//!
//! A configured Redis that cannot be reached never falls back to the in-process backend.

pub(crate) mod assignment;
pub(crate) mod keys;
pub(crate) mod local;
pub(crate) mod lock;
pub mod meter;
pub(crate) mod quorum;
pub(crate) mod redeliveries;
pub(crate) mod repeats;
pub(crate) mod slots;
pub mod stash;
mod waiters;

use crate::coordination::group::Group;
use crate::coordination::redis::{ServerError, Servers};
use crate::metrics::ComponentMetrics;
use crate::metrics::Metrics;
pub use assignment::Assignment;
pub use keys::{IntoKeys, Scope};
pub use lock::{Held, Signal};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use toa_context::tls::Roots;
use toa_context::{Atomicity, Credentials};

/// Why a primitive refused or failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AtomError {
    #[error("{0} requires atomicity: add `atomicity: {{ redis: redis://host }}` to the context")]
    RequiresAtomicity(&'static str),
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("keys: expected at most {max} keys in one call, got {0}", max = keys::MAX_KEYS)]
    TooManyKeys(usize),
    #[error("meter: {0}")]
    InvalidMeter(String),
    #[error("stash: {0}")]
    InvalidStash(String),
    #[error(transparent)]
    Group(#[from] crate::coordination::group::GroupError),
    #[error("Redis is unavailable: {0}")]
    Unavailable(#[from] ServerError),
    #[error("Redis answered something unexpected: {0}")]
    Protocol(String),
}

/// Where the process runs, which decides what happens without `atomicity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A local run: without `atomicity`, coordinate in-process.
    Local,
    /// A pod: without `atomicity`, there is nothing to coordinate with.
    Pod,
}

/// What an [`Atom`] needs to start.
#[derive(Debug, Clone)]
pub struct AtomConfig {
    pub scope: Scope,
    pub mode: Mode,
    pub atomicity: Option<Atomicity>,
    pub credentials: Credentials,
    /// What `rediss://` connections trust.
    pub roots: Roots,
    /// The process's name, shown in logs; membership uses it plus a random suffix, so two
    /// processes given one name never share slots.
    pub instance: String,
    /// A local run's group, unless it runs alone (`--alone`).
    pub group: Option<Arc<Group>>,
}

/// The coordination primitives of one component in one process.
pub struct Atom {
    backend: Backend,
    repeats: Arc<repeats::Repeats>,
    redeliveries: Arc<redeliveries::Redeliveries>,
    stash: stash::Stash,
}

enum Backend {
    Redis {
        locks: Arc<lock::Locks>,
        slots: slots::Slots,
        meter: meter::Meter,
    },
    Group {
        group: Arc<Group>,
        prefix: String,
        slots: slots::Slots,
        metrics: ComponentMetrics,
    },
    Local {
        locks: local::LocalLocks,
        meter: local::LocalMeter,
        slots: slots::Fixed,
    },
    Disabled {
        slots: slots::Fixed,
    },
}

impl Backend {
    /// Coordination through Redis: heartbeats and release subscriptions start now.
    fn redis(
        servers: Arc<Servers>,
        atomicity: &Atomicity,
        config: &AtomConfig,
        metrics: ComponentMetrics,
    ) -> Self {
        let scope = &config.scope;
        let locks = Arc::new(lock::Locks::new(
            servers.clone(),
            scope,
            atomicity.ttl,
            metrics.clone(),
        ));
        let slots = slots::Slots::start(
            servers.clone(),
            scope,
            &config.instance,
            atomicity.interval,
            metrics.clone(),
        );
        let meter = meter::Meter::new(servers, scope, metrics);
        Self::Redis {
            locks,
            slots,
            meter,
        }
    }

    /// Coordination through the local group's leader.
    fn in_group(group: Arc<Group>, config: &AtomConfig, metrics: ComponentMetrics) -> Self {
        let scope = &config.scope;
        let slots = slots::Slots::in_group(group.clone(), scope, &config.instance, metrics.clone());
        Self::Group {
            group,
            prefix: scope.prefix(),
            slots,
            metrics,
        }
    }
}

impl Atom {
    /// Starts the backend: for Redis, the heartbeats and the release subscriptions. Never waits for
    /// Redis to answer.
    pub fn start(config: AtomConfig, metrics: Arc<Metrics>) -> Result<Self, AtomError> {
        let labels = metrics.component(&config.scope.application, &config.scope.component);
        let mut repeats = repeats::Repeats::Disabled;
        let mut redeliveries = redeliveries::Redeliveries::Unshared;
        let mut stash = stash::Stash::Disabled;
        let backend = match (&config.atomicity, config.mode) {
            (Some(atomicity), _) => {
                let timeout = server_timeout(atomicity);
                let servers = Arc::new(Servers::new(
                    &atomicity.redis,
                    (&config.credentials, &config.roots),
                    timeout,
                    atomicity.ttl,
                )?);
                repeats = repeats::Repeats::redis(servers.clone(), &config.scope);
                redeliveries = redeliveries::Redeliveries::redis(servers.clone(), &config.scope);
                stash = stash::Stash::redis(servers.clone(), &config.scope);
                Backend::redis(servers, atomicity, &config, labels)
            }
            (None, Mode::Local) if config.group.is_some() => {
                let group = config.group.clone().expect("a group");
                repeats = repeats::Repeats::group(group.clone(), &config.scope);
                stash = stash::Stash::group(group.clone(), &config.scope);
                Backend::in_group(group, &config, labels)
            }
            (None, Mode::Local) => {
                repeats = repeats::Repeats::local();
                stash = stash::Stash::local();
                Backend::Local {
                    locks: local::LocalLocks::new(labels.clone()),
                    meter: local::LocalMeter::new(labels.clone()),
                    slots: slots::Fixed::new(Some(Assignment::alone()), labels),
                }
            }
            (None, Mode::Pod) => Backend::Disabled {
                slots: slots::Fixed::new(None, labels),
            },
        };
        Ok(Self {
            backend,
            repeats: Arc::new(repeats),
            redeliveries: Arc::new(redeliveries),
            stash,
        })
    }

    /// The stash's value under `key` (see [`stash`]).
    pub async fn stash_get(&self, key: String) -> Result<Option<serde_json::Value>, AtomError> {
        let key = keys::validate(vec![key])?.remove(0);
        self.stash.get(&key).await
    }

    /// Keeps `value` under `key` in the stash for `ttl_ms`.
    pub async fn stash_set(
        &self,
        key: String,
        value: &serde_json::Value,
        ttl_ms: u64,
    ) -> Result<(), AtomError> {
        let key = keys::validate(vec![key])?.remove(0);
        self.stash.set(&key, value, ttl_ms).await
    }

    /// Removes `key` from the stash; whether a value was there.
    pub async fn stash_delete(&self, key: String) -> Result<bool, AtomError> {
        let key = keys::validate(vec![key])?.remove(0);
        self.stash.delete(&key).await
    }

    /// The counts of redelivered ordinary calls (see [`redeliveries`]).
    pub fn redeliveries(&self) -> Arc<redeliveries::Redeliveries> {
        self.redeliveries.clone()
    }

    /// The records of calls given an idempotency key (see [`repeats`]).
    pub fn repeats(&self) -> Arc<repeats::Repeats> {
        self.repeats.clone()
    }

    /// Runs `f` while no other replica of the component holds any of `keys`, waiting as long as it
    /// takes. Returns what `f` returns. The lock is released when `f` returns, and also when it
    /// panics or its future is dropped. `f` receives a [`Signal`] that tells it the lock was lost.
    pub async fn lock<K, F, Fut, T>(&self, keys: K, f: F) -> Result<T, AtomError>
    where
        K: IntoKeys,
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = T>,
    {
        let held = self.acquire(keys).await?;
        let output = f(held.signal()).await;
        held.release().await;
        Ok(output)
    }

    /// Takes the lock and returns the holding; dropping it, or [`Held::release`], releases it.
    /// The lower-level form of [`Atom::lock`], for holders whose critical section is not a closure
    /// (the HTTP API's streaming lock).
    pub async fn acquire<K: IntoKeys>(&self, keys: K) -> Result<Held, AtomError> {
        let keys = keys::validate(keys.into_keys())?;
        match &self.backend {
            Backend::Redis { locks, .. } => Ok(lock::Locks::acquire(locks, keys).await),
            Backend::Group {
                group,
                prefix,
                metrics,
                ..
            } => {
                let started = tokio::time::Instant::now();
                let keys = keys
                    .iter()
                    .map(|key| format!("{prefix}lock:{key}"))
                    .collect();
                let (id, token, lost) = group.acquire(keys).await?;
                let signal = Signal::lost_with(token, lost);
                metrics.lock_waited(started.elapsed());
                metrics.lock_held(1);
                let release = GroupRelease {
                    releaser: Some(group.releaser(id)),
                    metrics: metrics.clone(),
                };
                Ok(Held::new(signal, Box::new(release)))
            }
            Backend::Local { locks, .. } => Ok(locks.acquire(keys).await),
            Backend::Disabled { .. } => Err(AtomError::RequiresAtomicity("lock")),
        }
    }

    /// The slots of `total` this replica owns now, or `None` while it owns nothing.
    pub fn slots(&self, total: u32) -> Option<Vec<u32>> {
        self.assignment().map(|assignment| assignment.slots(total))
    }

    /// This replica's share, `{i, n}`, or `None` while it owns nothing.
    pub fn assignment(&self) -> Option<Assignment> {
        match &self.backend {
            Backend::Redis { slots, .. } | Backend::Group { slots, .. } => slots.current(),
            Backend::Local { slots, .. } | Backend::Disabled { slots } => slots.current(),
        }
    }

    /// Calls `listener` at once with the current assignment and again on every change. Dropping
    /// the returned handle (or calling [`Listening::off`]) removes the listener. A listener that
    /// panics leaves this replica owning nothing from then on.
    pub fn onassigned<F>(&self, listener: F) -> slots::Listening
    where
        F: Fn(Option<Assignment>) + Send + Sync + 'static,
    {
        match &self.backend {
            Backend::Redis { slots, .. } | Backend::Group { slots, .. } => {
                slots.listen(Box::new(listener))
            }
            Backend::Local { slots, .. } | Backend::Disabled { slots } => {
                slots.listen(Box::new(listener))
            }
        }
    }

    /// Adds each delta (milliseconds, 0 to read) to the debt under the matching key and returns the
    /// debts reached. Debts drain one millisecond per millisecond.
    pub async fn meter<K: IntoKeys>(&self, keys: K, deltas: &[u64]) -> Result<Vec<u64>, AtomError> {
        let keys = keys::validate(keys.into_keys())?;
        if keys.len() != deltas.len() {
            return Err(AtomError::InvalidMeter(format!(
                "expected one delta per key, got {} keys and {} deltas",
                keys.len(),
                deltas.len()
            )));
        }
        if let Some((index, delta)) = deltas
            .iter()
            .enumerate()
            .find(|(_, delta)| **delta > meter::MAX_DELTA_MS)
        {
            return Err(AtomError::InvalidMeter(format!(
                "deltas[{index}]: expected at most {} ms (a year), got {delta}; nothing was charged",
                meter::MAX_DELTA_MS
            )));
        }
        match &self.backend {
            Backend::Redis { meter, .. } => meter.charge(&keys, deltas).await,
            Backend::Group {
                group,
                prefix,
                metrics,
                ..
            } => {
                metrics.meter_called();
                let keys = keys
                    .iter()
                    .map(|key| format!("{prefix}meter:{key}"))
                    .collect();
                Ok(group.meter(keys, deltas.to_vec()).await?)
            }
            Backend::Local { meter, .. } => Ok(meter.charge(&keys, deltas)),
            Backend::Disabled { .. } => Err(AtomError::RequiresAtomicity("meter")),
        }
    }

    /// Whether `what` (`lock` or `meter`) can work here at all: not in a pod without atomicity.
    pub fn available(&self, what: &'static str) -> Result<(), AtomError> {
        match &self.backend {
            Backend::Disabled { .. } => Err(AtomError::RequiresAtomicity(what)),
            _ => Ok(()),
        }
    }

    /// A listener failed outside this process (a component's, over HTTP): like a panicking
    /// listener, this replica owns nothing from now on.
    pub fn listener_failed(&self) {
        match &self.backend {
            Backend::Redis { slots, .. } | Backend::Group { slots, .. } => slots.fail(),
            Backend::Local { slots, .. } | Backend::Disabled { slots } => slots.fail(),
        }
    }

    /// Leaves the membership at once (so the others take this replica's slots without waiting for
    /// its heartbeat to expire) and stops the background tasks.
    pub async fn shutdown(&self) {
        if let Backend::Redis { slots, .. } | Backend::Group { slots, .. } = &self.backend {
            slots.withdraw().await;
        }
    }
}

/// Releases a lock held through the local group.
struct GroupRelease {
    releaser: Option<crate::coordination::group::Releaser>,
    metrics: ComponentMetrics,
}

impl lock::Release for GroupRelease {
    fn release(mut self: Box<Self>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        if let Some(releaser) = self.releaser.take() {
            releaser.release();
            self.metrics.lock_held(-1);
        }
        Box::pin(async {})
    }
}

/// How long one Redis command may take: a small share of the lock TTL (Redlock wants it well below
/// the TTL) and of the heartbeat interval, within [50 ms, 1 s].
fn server_timeout(atomicity: &Atomicity) -> Duration {
    (atomicity.ttl / 10)
        .min(atomicity.interval / 2)
        .clamp(Duration::from_millis(50), Duration::from_secs(1))
}
