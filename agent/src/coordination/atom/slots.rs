//! Slots: heartbeats to the first Redis server (or a local group's leader), the membership they keep, and the listeners of
//! `onassigned`. The decisions are in [`super::assignment`]; this module does the I/O.
//!
//! Redis keys (prefix `toa:{app}:{component}:slots:`): `members`, a sorted set of member → expiry
//! (server time); `view`, the sorted members last seen; `epoch`, incremented on every change of the
//! view; `changed`, the server time of that change. One script per heartbeat does it all, on the
//! server's clock.

use super::assignment::{Assignment, Assignor, View};
use super::keys::Scope;
use crate::coordination::group::{Group, GroupError};
use crate::coordination::redis::{ServerError, Servers};
use crate::metrics::ComponentMetrics;
use rand::Rng;
use redis::Script;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};

/// KEYS: members, view, epoch, changed. ARGV: member, membership TTL (ms), withdraw (0/1).
/// Returns {epoch, changed, now, members...}.
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)
local view = table.concat(members, ' ')
if redis.call('GET', KEYS[2]) ~= view or redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[2], view)
  redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[4], now)
end
local keep = ttl * 10
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], keep) end
local reply = {tonumber(redis.call('GET', KEYS[3])), tonumber(redis.call('GET', KEYS[4])), now}
for i = 1, #members do reply[#reply + 1] = members[i] end
return reply
",
    )
});

type Listener = dyn Fn(Option<Assignment>) + Send + Sync;

/// The last id given out, and the listeners by id.
type Registry = (u64, Vec<(u64, Arc<Listener>)>);

/// The listeners of `onassigned`, and the value they were last given.
pub(crate) struct Listeners {
    registry: Mutex<Registry>,
    /// Held while listeners are called, so each sees changes in order; the last value delivered.
    delivered: Mutex<Option<Assignment>>,
}

/// An `onassigned` listener; dropping it, or [`Listening::off`], removes it.
#[must_use = "dropping the handle removes the listener"]
pub struct Listening {
    id: u64,
    listeners: Weak<Listeners>,
}

impl Listening {
    pub fn off(self) {}
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(listeners) = self.listeners.upgrade() {
            listeners
                .registry
                .lock()
                .expect("listeners")
                .1
                .retain(|(id, _)| *id != self.id);
        }
    }
}

impl Listeners {
    fn new(initial: Option<Assignment>) -> Arc<Self> {
        Arc::new(Self {
            registry: Mutex::new((0, Vec::new())),
            delivered: Mutex::new(initial),
        })
    }

    /// Registers `listener` and calls it with the assignment as it stands. Returns the handle and
    /// whether the listener panicked.
    fn add(self: &Arc<Self>, listener: Box<Listener>) -> (Listening, bool) {
        let listener: Arc<Listener> = listener.into();
        let delivered = self.delivered.lock().expect("delivery");
        let id = {
            let mut registry = self.registry.lock().expect("listeners");
            registry.0 += 1;
            let id = registry.0;
            registry.1.push((id, listener.clone()));
            id
        };
        let panicked = call(&listener, *delivered);
        drop(delivered);
        (
            Listening {
                id,
                listeners: Arc::downgrade(self),
            },
            panicked,
        )
    }

    /// Calls every listener with `value` if it differs from the last delivered. Returns whether
    /// one panicked.
    fn deliver(&self, value: Option<Assignment>) -> bool {
        let mut delivered = self.delivered.lock().expect("delivery");
        if *delivered == value {
            return false;
        }
        *delivered = value;
        let listeners: Vec<Arc<Listener>> = self
            .registry
            .lock()
            .expect("listeners")
            .1
            .iter()
            .map(|(_, l)| l.clone())
            .collect();
        let mut panicked = false;
        for listener in listeners {
            panicked |= call(&listener, value);
        }
        panicked
    }
}

fn call(listener: &Arc<Listener>, value: Option<Assignment>) -> bool {
    let panicked = catch_unwind(AssertUnwindSafe(|| listener(value))).is_err();
    if panicked {
        tracing::error!("an onassigned listener panicked: this replica owns nothing from now on");
    }
    panicked
}

/// A fixed assignment: every slot in a local run, none in a pod without atomicity.
pub struct Fixed {
    value: Mutex<Option<Assignment>>,
    listeners: Arc<Listeners>,
    metrics: ComponentMetrics,
}

impl Fixed {
    pub fn new(value: Option<Assignment>, metrics: ComponentMetrics) -> Self {
        metrics.slots_owned(value.map(|a| (a.i, a.n)));
        Self {
            value: Mutex::new(value),
            listeners: Listeners::new(value),
            metrics,
        }
    }

    pub fn current(&self) -> Option<Assignment> {
        *self.value.lock().expect("fixed slots")
    }

    pub fn listen(&self, listener: Box<Listener>) -> Listening {
        let (listening, panicked) = self.listeners.add(listener);
        if panicked {
            self.fail();
        }
        listening
    }

    /// Owns nothing from now on.
    pub fn fail(&self) {
        *self.value.lock().expect("fixed slots") = None;
        self.metrics.slots_owned(None);
        self.listeners.deliver(None);
    }
}

/// Slots coordinated through Redis.
pub struct Slots {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

/// Where heartbeats go.
enum Beat {
    /// The first Redis server, keys: members, view, epoch, changed.
    Redis {
        servers: Arc<Servers>,
        keys: [String; 4],
    },
    /// The leader of the local group, which runs the same script in its process.
    Group { group: Arc<Group>, prefix: String },
}

struct Shared {
    beat: Beat,
    member: String,
    interval: Duration,
    assignor: Mutex<Assignor>,
    listeners: Arc<Listeners>,
    withdraw: Notify,
    withdrawn: Notify,
    metrics: ComponentMetrics,
}

impl Slots {
    pub fn start(
        servers: Arc<Servers>,
        scope: &Scope,
        instance: &str,
        interval: Duration,
        metrics: ComponentMetrics,
    ) -> Self {
        let prefix = format!("{}slots:", scope.prefix());
        let keys = ["members", "view", "epoch", "changed"].map(|k| format!("{prefix}{k}"));
        Self::beating(Beat::Redis { servers, keys }, instance, interval, metrics)
    }

    /// Slots whose membership the local group's leader keeps.
    pub fn in_group(
        group: Arc<Group>,
        scope: &Scope,
        instance: &str,
        metrics: ComponentMetrics,
    ) -> Self {
        let prefix = format!("{}slots:", scope.prefix());
        let beat = Beat::Group { group, prefix };
        Self::beating(
            beat,
            instance,
            crate::coordination::group::INTERVAL,
            metrics,
        )
    }

    fn beating(beat: Beat, instance: &str, interval: Duration, metrics: ComponentMetrics) -> Self {
        let member = format!("{instance}#{:08x}", rand::rng().random::<u32>());
        let shared = Arc::new(Shared {
            beat,
            assignor: Mutex::new(Assignor::new(member.clone(), interval * 2)),
            member,
            interval,
            listeners: Listeners::new(None),
            withdraw: Notify::new(),
            withdrawn: Notify::new(),
            metrics,
        });
        shared.metrics.slots_owned(None);
        let task = tokio::spawn(shared.clone().run());
        Self { shared, task }
    }

    pub fn current(&self) -> Option<Assignment> {
        self.shared
            .assignor
            .lock()
            .expect("assignor")
            .current(Instant::now())
    }

    pub fn listen(&self, listener: Box<Listener>) -> Listening {
        let (listening, panicked) = self.shared.listeners.add(listener);
        if panicked {
            self.fail();
        }
        listening
    }

    /// Owns nothing from now on, and leaves the membership so the others take the slots.
    pub fn fail(&self) {
        self.shared.assignor.lock().expect("assignor").withdraw();
        self.shared.withdraw.notify_one();
    }

    /// Leaves the membership now and stops heartbeating.
    pub async fn withdraw(&self) {
        let done = self.shared.withdrawn.notified();
        self.shared.assignor.lock().expect("assignor").withdraw();
        self.shared.withdraw.notify_one();
        if !self.task.is_finished() {
            let _ = tokio::time::timeout(self.shared.interval, done).await;
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            let next = self
                .assignor
                .lock()
                .expect("assignor")
                .next_change(Instant::now());
            tokio::select! {
                _ = tick.tick() => {
                    let ok = self.heartbeat(false).await;
                    if ok == failing {
                        failing = !ok;
                        if failing {
                            tracing::warn!("slots: heartbeat failed; this replica owns nothing until Redis answers");
                        } else {
                            tracing::info!("slots: heartbeats answered again");
                        }
                    }
                }
                _ = sleep_until(next.unwrap_or_else(|| Instant::now() + self.interval)), if next.is_some() => {}
                _ = self.withdraw.notified() => {
                    self.assignor.lock().expect("assignor").withdraw();
                    self.publish();
                    self.heartbeat(true).await;
                    self.withdrawn.notify_waiters();
                    return;
                }
            }
            if self.publish() {
                // A listener panicked: withdraw from the membership so the others take our slots.
                self.withdraw.notify_one();
            }
        }
    }

    /// Delivers the current assignment to the listeners if it changed; true if one panicked.
    fn publish(&self) -> bool {
        let current = self
            .assignor
            .lock()
            .expect("assignor")
            .current(Instant::now());
        self.metrics.slots_owned(current.map(|a| (a.i, a.n)));
        let panicked = self.listeners.deliver(current);
        if panicked {
            self.assignor.lock().expect("assignor").withdraw();
        }
        panicked
    }

    async fn heartbeat(&self, withdraw: bool) -> bool {
        let sent = Instant::now();
        let reply = self
            .beat
            .send(&self.member, self.interval * 2, withdraw)
            .await;
        let received = Instant::now();
        let mut assignor = self.assignor.lock().expect("assignor");
        match reply {
            Ok(view) => {
                assignor.on_heartbeat(sent, received, &view);
                true
            }
            Err(error) => {
                tracing::debug!(%error, "slots: heartbeat failed");
                assignor.on_failure();
                false
            }
        }
    }
}

impl Beat {
    async fn send(
        &self,
        member: &str,
        ttl: Duration,
        withdraw: bool,
    ) -> Result<View, HeartbeatError> {
        match self {
            Self::Redis { servers, keys } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let ttl = ttl.as_millis().to_string();
                let withdraw = if withdraw { "1" } else { "0" };
                let values = servers
                    .first()
                    .invoke::<Vec<redis::Value>>(&HEARTBEAT, &keys, &[member, &ttl, withdraw])
                    .await?;
                parse_view(&values)
            }
            Self::Group { group, prefix } => {
                Ok(group.heartbeat(prefix, member, ttl, withdraw).await?)
            }
        }
    }
}

/// Why a heartbeat told nothing (logged; the assignment lapses).
#[derive(Debug, thiserror::Error)]
enum HeartbeatError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Group(#[from] GroupError),
    #[error("short heartbeat reply")]
    Short,
    #[error(transparent)]
    Reply(#[from] redis::ParsingError),
}

fn parse_view(values: &[redis::Value]) -> Result<View, HeartbeatError> {
    use redis::FromRedisValue;
    let number = |index: usize| -> Result<u64, HeartbeatError> {
        let value = values.get(index).ok_or(HeartbeatError::Short)?;
        Ok(u64::from_redis_value_ref(value)?)
    };
    let members = values[3.min(values.len())..]
        .iter()
        .map(String::from_redis_value_ref)
        .collect::<Result<_, _>>()?;
    Ok(View {
        epoch: number(0)?,
        changed: number(1)?,
        now: number(2)?,
        members,
    })
}
