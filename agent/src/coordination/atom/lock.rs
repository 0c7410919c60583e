//! Redlock over one or an odd number of independent Redis servers.
//!
//! An acquisition draws one random value and runs [`ACQUIRE`] on every server at once: per server,
//! all keys of the call are taken atomically, or none. It succeeds as soon as a majority of the
//! servers that may count (see [`crate::coordination::redis`]) granted it, and fails as soon as a
//! majority is out of reach: it never waits for the slowest server. The lock is valid for
//! TTL − elapsed − drift from the start of the attempt; a background task extends it every TTL/3
//! on a majority, and cancels the holder's [`Signal`] when it cannot before the validity ends.
//!
//! Fencing tokens. Every server keeps one counter per component (`{prefix}fence`), incremented by
//! [`ACQUIRE`]. The token is the maximum over the granting majority; when the granting servers
//! disagree, the maximum is written back ([`RAISE`]) to a majority before the token is handed out.
//! So every token handed out is held by a majority, which any later majority intersects: tokens
//! strictly increase across successive holders. A server whose counter is missing (it restarted
//! empty, or is new) grants nothing until its counter is seeded ([`SEED`]) with the maximum read
//! from the other servers that answer, and never below its own clock in microseconds, so even a
//! lone server that restarted keeps its tokens increasing (see `Locks::seed` for the bound).
//!
//! Waiting. [`RELEASE`] publishes the released keys on `{prefix}released`; waiters subscribe on
//! every server and try again when told. Without a message they try again when the holder's key
//! would expire, so a waiter sends a bounded number of commands per TTL and never spins.

use super::keys::Scope;
use super::quorum::{one_holder_has_majority, quorum, to_release, Tally, Verdict, Vote};
use super::waiters::Waiters;
use crate::coordination::redis::{Server, ServerError, Servers};
use crate::metrics::ComponentMetrics;
use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use redis::Script;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// KEYS: the n lock keys, their n waiting markers, then the fence counter. ARGV: value, TTL in
/// ms. Returns {1, token, ''} granted, {0, pttl, holder} held by another, {-1, 0, ''} counter not
/// seeded. A denial sets the key's marker (for two TTLs: a waiter tries again at least once per
/// TTL), so that its release is published; an uncontended release publishes nothing. Markers
/// live under `wait:`, apart from every lock key (`lock:`): no user key names another's marker.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local n = (#KEYS - 1) / 2
for i = 1, n do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= ARGV[1] then
    redis.call('SET', KEYS[n + i], '1', 'PX', 2 * tonumber(ARGV[2]))
    return {0, redis.call('PTTL', KEYS[i]), holder}
  end
end
if redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return {-1, 0, ''}
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return {1, redis.call('INCR', KEYS[#KEYS]), ''}
",
    )
});

/// KEYS: the lock keys. ARGV: value, TTL in ms. Returns 1 when every key was still ours.
static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
",
    )
});

/// KEYS: the n lock keys, then their n waiting markers. ARGV: value, release channel, publish
/// (1/0). Deletes the keys still ours and, if asked and somebody waits for a key (its marker is
/// set), publishes it; returns how many.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local released = 0
local n = #KEYS / 2
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    if ARGV[3] == '1' and redis.call('DEL', KEYS[n + i]) == 1 then
      redis.call('PUBLISH', ARGV[2], KEYS[i])
    end
    released = released + 1
  end
end
return released
",
    )
});

/// KEYS: the fence counter. ARGV: the maximum read from the other servers.
/// Sets the counter, if missing, to max(ARGV[1], this server's clock in µs); returns it.
static SEED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local seed = math.max(tonumber(ARGV[1]), clock)
  redis.call('SET', KEYS[1], string.format('%d', seed))
end
return tonumber(redis.call('GET', KEYS[1]))
",
    )
});

/// KEYS: the fence counter. ARGV: a token. Raises the counter to the token if below.
static RAISE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
",
    )
});

/// Tells a holder whether its lock is still held, and gives its fencing token.
#[derive(Debug, Clone)]
pub struct Signal {
    lost: CancellationToken,
    token: u64,
}

impl Signal {
    pub(crate) fn new(token: u64) -> Self {
        Self {
            lost: CancellationToken::new(),
            token,
        }
    }

    /// A holding whose loss `lost` tells (a local group's lock).
    pub(crate) fn lost_with(token: u64, lost: CancellationToken) -> Self {
        Self { lost, token }
    }

    /// True once the lock was lost: do not start a step that must not overlap.
    pub fn aborted(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the lock is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// The fencing token: larger for every later holder of the key.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn cancel(&self) {
        self.lost.cancel()
    }
}

/// How a holding is released: one implementation per backend.
pub(crate) trait Release: Send {
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A lock being held. Released by [`Held::release`], or on drop (also when a holder panics).
pub struct Held {
    signal: Signal,
    release: Option<Box<dyn Release>>,
    valid_until: Option<Instant>,
}

impl Held {
    pub(crate) fn new(signal: Signal, release: Box<dyn Release>) -> Self {
        Self {
            signal,
            release: Some(release),
            valid_until: None,
        }
    }

    /// How long the lock stays valid from now if no extension succeeds (for the Redis backend;
    /// `None` in-process, where a lock cannot be lost).
    pub fn valid_for(&self) -> Option<Duration> {
        self.valid_until
            .map(|until| until.saturating_duration_since(Instant::now()))
    }

    pub fn signal(&self) -> Signal {
        self.signal.clone()
    }

    pub fn token(&self) -> u64 {
        self.signal.token
    }

    /// Releases the lock and waits until a majority of the servers confirmed (or could not).
    pub async fn release(mut self) {
        if let Some(release) = self.release.take() {
            release.release().await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(release.release());
            }
        }
    }
}

/// The Redis lock engine of one component.
pub struct Locks {
    servers: Arc<Servers>,
    /// `{scope}lock:`: a lock key is this and the user's key.
    prefix: String,
    /// `{scope}wait:`: a key's waiting marker is this and the user's key.
    wait_prefix: String,
    fence: String,
    channel: String,
    ttl: Duration,
    drift: Duration,
    waiters: Arc<Waiters>,
    metrics: ComponentMetrics,
}

enum Attempt {
    Granted {
        token: u64,
        deadline: Instant,
    },
    /// Held by another; try again when released or after this long.
    Busy(Duration),
    /// Not enough servers answered.
    Unavailable(Option<ServerError>),
}

/// What the servers answered one acquisition, each reply turned into a vote.
struct Answers {
    /// The grants that count toward the quorum, with the fencing token each server gave.
    granted: Vec<(usize, u64)>,
    /// Every server that granted, counted or not (all are released on a failure).
    any_grant: Vec<usize>,
    answered: Vec<bool>,
    /// The longest time another holder keeps the lock, as its servers said.
    busy: Option<Duration>,
    holders: Vec<String>,
    /// Servers without the fencing counter (restarted empty): seeded before the next attempt.
    unseeded: Vec<usize>,
    /// Servers the acquisition reached but that did not answer in time: their grant may still
    /// land, so a release is queued behind it.
    timed_out: Vec<usize>,
    error: Option<ServerError>,
}

impl Answers {
    fn new(servers: usize) -> Self {
        Self {
            granted: Vec::new(),
            any_grant: Vec::new(),
            answered: vec![false; servers],
            busy: None,
            holders: Vec::new(),
            unseeded: Vec::new(),
            timed_out: Vec::new(),
            error: None,
        }
    }

    /// Server `index`'s reply to the lock script: granted with a token, held by another for so
    /// long, unseeded, or failed.
    fn record(
        &mut self,
        server: &Server,
        index: usize,
        reply: Result<(i64, i64, String), ServerError>,
    ) -> Vote {
        self.answered[index] = true;
        match reply {
            Ok((1, token, _)) => {
                self.any_grant.push(index);
                if !server.countable() {
                    return Vote::No;
                }
                self.granted.push((index, token.max(0) as u64));
                Vote::Yes
            }
            Ok((0, pttl, holder)) => {
                let left = Duration::from_millis(pttl.max(1) as u64);
                self.busy = Some(self.busy.map_or(left, |b| b.max(left)));
                self.holders.push(holder);
                Vote::No
            }
            Ok((-1, _, _)) => {
                self.unseeded.push(index);
                Vote::No
            }
            Ok(other) => {
                self.error = Some(ServerError::Refused(
                    server.address().to_string(),
                    format!("unexpected reply {other:?} to the lock script"),
                ));
                Vote::Failed
            }
            Err(e) => {
                if matches!(e, ServerError::Timeout(..)) {
                    self.timed_out.push(index);
                }
                self.error = Some(e);
                Vote::Failed
            }
        }
    }

    /// The servers whose acquisition timed out and that `release` leaves out: released behind
    /// it, on the same connection, even while they are silent.
    fn behind(&self, release: &[usize]) -> Vec<usize> {
        self.timed_out
            .iter()
            .copied()
            .filter(|index| !release.contains(index))
            .collect()
    }

    fn unanswered(&self) -> Vec<usize> {
        (0..self.answered.len())
            .filter(|i| !self.answered[*i])
            .collect()
    }
}

impl Locks {
    pub fn new(
        servers: Arc<Servers>,
        scope: &Scope,
        ttl: Duration,
        metrics: ComponentMetrics,
    ) -> Self {
        let prefix = scope.prefix();
        let channel = format!("{prefix}released");
        let waiters = Waiters::start(servers.clone(), channel.clone());
        Self {
            fence: format!("{prefix}fence"),
            prefix: format!("{prefix}lock:"),
            wait_prefix: format!("{prefix}wait:"),
            channel,
            drift: ttl / 100 + Duration::from_millis(2),
            servers,
            ttl,
            waiters,
            metrics,
        }
    }

    /// Waits as long as it takes, then returns the holding.
    pub async fn acquire(this: &Arc<Self>, keys: Vec<String>) -> Held {
        let keys: Vec<String> = keys
            .iter()
            .map(|key| format!("{}{key}", this.prefix))
            .collect();
        let started = Instant::now();
        let mut failures = 0u32;
        loop {
            let wake = this.waiters.listen(&keys);
            // A value per attempt: a failed attempt's late release never touches a later one's keys.
            let value = format!("{:032x}", rand::rng().random::<u128>());
            let retry = match this.attempt(&keys, &value).await {
                Attempt::Granted { token, deadline } => {
                    this.metrics.lock_waited(started.elapsed());
                    return this.hold(keys, value, token, deadline);
                }
                Attempt::Busy(holder_left) => {
                    failures = 0;
                    // The holder's key expires then unless extended; a release wakes us earlier.
                    (holder_left + Duration::from_millis(1)).min(this.ttl)
                }
                Attempt::Unavailable(error) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(20) {
                        if let Some(error) = error {
                            tracing::warn!(%error, "lock: no majority of Redis servers answered; waiting");
                        }
                    }
                    let backoff = Duration::from_millis(25) * 2u32.pow(failures.min(6));
                    backoff.min(this.ttl / 4)
                }
            };
            let jitter = Duration::from_micros(rand::rng().random_range(0..1000));
            tracing::trace!(?retry, "lock: waiting");
            tokio::select! {
                _ = wake.wait() => {}
                _ = sleep(retry + jitter) => {}
            }
        }
    }

    async fn attempt(self: &Arc<Self>, keys: &[String], value: &str) -> Attempt {
        let start = Instant::now();
        let markers = self.markers(keys);
        let mut all: Vec<&str> = keys.iter().chain(&markers).map(String::as_str).collect();
        all.push(&self.fence);
        let ttl = self.ttl.as_millis().to_string();
        let n = self.servers.list.len();

        let mut pending: FuturesUnordered<_> = (0..n)
            .map(|index| {
                let all = &all;
                let ttl = ttl.as_str();
                async move {
                    let server = &self.servers.list[index];
                    let reply = server
                        .invoke::<(i64, i64, String)>(&ACQUIRE, all, &[value, ttl])
                        .await;
                    (index, reply)
                }
            })
            .collect();

        let mut tally = Tally::new(n);
        let mut answers = Answers::new(n);
        while let Some((index, reply)) = pending.next().await {
            let vote = answers.record(&self.servers.list[index], index, reply);
            if tally.add(vote) != Verdict::Continue {
                break;
            }
        }
        drop(pending);
        if tally.verdict() == Verdict::Granted {
            return self.granted(&answers.granted, start, keys, value).await;
        }
        self.not_granted(answers, keys, value).await
    }

    /// A majority granted: the fencing token on a majority and time left, or all given back.
    async fn granted(
        self: &Arc<Self>,
        granted: &[(usize, u64)],
        start: Instant,
        keys: &[String],
        value: &str,
    ) -> Attempt {
        let token = granted.iter().map(|(_, t)| *t).max().unwrap_or_default();
        if self.hold_token_on_majority(granted, token).await {
            let deadline = start + self.ttl.saturating_sub(self.drift);
            if Instant::now() < deadline {
                return Attempt::Granted { token, deadline };
            }
        }
        self.release_on(all_servers(self.servers.list.len()), keys, value)
            .await;
        Attempt::Unavailable(None)
    }

    /// Failed: give back what was granted, and what may still be granted by servers that did
    /// not answer yet (the release queues behind the acquisition on the same connection).
    /// Waiters are woken only when this may have been a split vote: when one other holder was
    /// seen on a majority, its release will wake them; waking them for our partial grants would
    /// have them churn against each other for as long as it holds.
    async fn not_granted(
        self: &Arc<Self>,
        answers: Answers,
        keys: &[String],
        value: &str,
    ) -> Attempt {
        let n = self.servers.list.len();
        let release = to_release(&answers.any_grant, &answers.unanswered());
        let behind = answers.behind(&release);
        if !release.is_empty() || !behind.is_empty() {
            let publish = !one_holder_has_majority(&answers.holders, n);
            let mut pending = self.releases(release, keys, value, publish);
            pending.extend(self.releases_behind(behind, keys, value));
            tokio::spawn(async move { while pending.next().await.is_some() {} });
        }
        for index in answers.unseeded {
            self.seed(index).await;
        }
        match answers.busy {
            Some(left) => Attempt::Busy(left),
            // Was unseeded: retry now.
            None if answers.error.is_none() => Attempt::Busy(Duration::from_millis(1)),
            None => Attempt::Unavailable(answers.error),
        }
    }

    /// Makes sure `token` is on a majority before it is handed out.
    async fn hold_token_on_majority(&self, granted: &[(usize, u64)], token: u64) -> bool {
        let quorum = quorum(self.servers.list.len());
        let already = granted.iter().filter(|(_, t)| *t == token).count();
        if already >= quorum {
            return true;
        }
        let token_text = token.to_string();
        let mut raises: FuturesUnordered<_> = granted
            .iter()
            .filter(|(_, t)| *t != token)
            .map(|(index, _)| {
                let token_text = token_text.as_str();
                async move {
                    self.servers.list[*index]
                        .invoke::<i64>(&RAISE, &[&self.fence], &[token_text])
                        .await
                        .is_ok()
                }
            })
            .collect();
        let mut holding = already;
        while let Some(ok) = raises.next().await {
            holding += usize::from(ok);
            if holding >= quorum {
                return true;
            }
        }
        false
    }

    /// Seeds the fence counter of a server that has none with the maximum of the others that
    /// answer and of its own clock in microseconds. Reading the others is best effort: requiring
    /// enough of them to meet every majority would leave a new component without locks while one
    /// server is down; the clock keeps tokens increasing on its own as long as the servers' clocks
    /// agree within the TTL (a restarted server counts only after a TTL) and fewer than one token
    /// per microsecond is handed out.
    async fn seed(&self, index: usize) {
        let n = self.servers.list.len();
        let reads = (0..n)
            .filter(|other| *other != index)
            .map(|other| async move {
                self.servers.list[other]
                    .query::<Option<u64>>(redis::cmd("GET").arg(&self.fence))
                    .await
            });
        let values = futures::future::join_all(reads).await;
        let max = values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0);
        let answered = values.iter().filter(|v| v.is_ok()).count();
        let server = &self.servers.list[index];
        match server
            .invoke::<u64>(&SEED, &[&self.fence], &[&max.to_string()])
            .await
        {
            Ok(seed) => tracing::debug!(
                server = %server.address(), seed, others_read = answered,
                "lock: fencing counter seeded"
            ),
            Err(error) => tracing::warn!(%error, "lock: seeding the fencing counter failed"),
        }
    }

    fn hold(
        self: &Arc<Self>,
        keys: Vec<String>,
        value: String,
        token: u64,
        deadline: Instant,
    ) -> Held {
        let signal = Signal::new(token);
        let stop = CancellationToken::new();
        let holding = Arc::new(Holding {
            locks: self.clone(),
            keys,
            value,
        });
        tokio::spawn(
            holding
                .clone()
                .extend(deadline, signal.clone(), stop.clone()),
        );
        self.metrics.lock_held(1);
        let mut held = Held::new(signal, Box::new(Releaser { holding, stop }));
        held.valid_until = Some(deadline);
        held
    }

    /// The waiting markers of lock keys.
    fn markers(&self, keys: &[String]) -> Vec<String> {
        keys.iter()
            .map(|key| {
                let user = key.strip_prefix(&self.prefix).unwrap_or(key);
                format!("{}{user}", self.wait_prefix)
            })
            .collect()
    }

    /// Sends the release to `servers` and waits until a majority of all servers answered (or
    /// every one of `servers` did); the rest finish in one background task.
    async fn release_on(self: &Arc<Self>, servers: Vec<usize>, keys: &[String], value: &str) {
        let quorum = quorum(self.servers.list.len());
        let mut pending = self.releases(servers, keys, value, true);
        let mut answered = 0;
        while answered < quorum {
            if pending.next().await.is_none() {
                return;
            }
            answered += 1;
        }
        if !pending.is_empty() {
            tokio::spawn(async move { while pending.next().await.is_some() {} });
        }
    }

    /// One release per server in `servers`, as futures that own what they need.
    fn releases(
        self: &Arc<Self>,
        servers: Vec<usize>,
        keys: &[String],
        value: &str,
        publish: bool,
    ) -> FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let how = if publish {
            ReleaseMode::Publish
        } else {
            ReleaseMode::Quiet
        };
        self.release_each(servers, keys, value, how)
    }

    /// Releases queued behind an acquisition that timed out on each of `servers`
    /// ([`crate::coordination::redis::Server::invoke_behind`]); nothing is published (nobody was
    /// told it waits on these).
    fn releases_behind(
        self: &Arc<Self>,
        servers: Vec<usize>,
        keys: &[String],
        value: &str,
    ) -> FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.release_each(servers, keys, value, ReleaseMode::Behind)
    }

    fn release_each(
        self: &Arc<Self>,
        servers: Vec<usize>,
        keys: &[String],
        value: &str,
        how: ReleaseMode,
    ) -> FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let keys: Arc<[String]> = keys.into();
        let value: Arc<str> = value.into();
        servers
            .into_iter()
            .map(|index| {
                let (this, keys, value) = (self.clone(), keys.clone(), value.clone());
                Box::pin(async move {
                    let markers = this.markers(&keys);
                    let all: Vec<&str> = keys.iter().chain(&markers).map(String::as_str).collect();
                    let server = &this.servers.list[index];
                    let publish = if how == ReleaseMode::Publish { "1" } else { "0" };
                    let args = [&*value, this.channel.as_str(), publish];
                    let sent = match how {
                        ReleaseMode::Behind => server.invoke_behind::<i64>(&RELEASE, &all, &args).await,
                        _ => server.invoke::<i64>(&RELEASE, &all, &args).await,
                    };
                    if let Err(error) = sent {
                        tracing::debug!(%error, "lock: release not confirmed; the key expires by itself");
                    }
                }) as Pin<Box<dyn Future<Output = ()> + Send>>
            })
            .collect()
    }
}

/// How a release goes out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReleaseMode {
    /// Publishes the key to its waiters.
    Publish,
    Quiet,
    /// Queued behind what the server's connection carries, even while it is silent.
    Behind,
}

fn all_servers(n: usize) -> Vec<usize> {
    (0..n).collect()
}

struct Holding {
    locks: Arc<Locks>,
    keys: Vec<String>,
    value: String,
}

impl Holding {
    /// Extends every TTL/3; cancels the signal when a majority is out of reach or the validity
    /// ended without an extension.
    async fn extend(
        self: Arc<Self>,
        mut deadline: Instant,
        signal: Signal,
        stop: CancellationToken,
    ) {
        let locks = &self.locks;
        let period = locks.ttl / 3;
        let mut next = Instant::now() + period;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(deadline) => break,
                _ = sleep_until(next) => {}
            }
            let started = Instant::now();
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(deadline) => break,
                outcome = self.extend_once() => outcome,
            };
            match outcome {
                Some(true) => {
                    deadline = started + locks.ttl.saturating_sub(locks.drift);
                    next = started + period;
                }
                Some(false) => break, // a majority says the keys are no longer ours
                None => next = Instant::now() + (period / 4).max(Duration::from_millis(10)),
            }
        }
        if !stop.is_cancelled() {
            tracing::warn!(keys = ?self.keys, token = signal.token(), "lock lost");
            signal.cancel();
        }
    }

    /// Some(true): extended on a majority; Some(false): a majority is out of reach because servers
    /// denied; None: not enough answers, try again.
    async fn extend_once(&self) -> Option<bool> {
        let locks = &self.locks;
        let all: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let ttl = locks.ttl.as_millis().to_string();
        let n = locks.servers.list.len();
        let mut pending: FuturesUnordered<_> = (0..n)
            .map(|index| {
                let all = &all;
                let ttl = ttl.as_str();
                async move {
                    let server = &locks.servers.list[index];
                    let reply = server
                        .invoke::<i64>(&EXTEND, all, &[&self.value, ttl])
                        .await;
                    (index, reply)
                }
            })
            .collect();
        let mut tally = Tally::new(n);
        while let Some((index, reply)) = pending.next().await {
            let vote = match reply {
                Ok(1) if locks.servers.list[index].countable() => Vote::Yes,
                Ok(_) => Vote::No,
                Err(_) => Vote::Failed,
            };
            match tally.add(vote) {
                Verdict::Continue => {}
                Verdict::Granted => return Some(true),
                Verdict::Denied => return Some(false),
                Verdict::Failed => return None,
            }
        }
        None
    }
}

struct Releaser {
    holding: Arc<Holding>,
    stop: CancellationToken,
}

impl Release for Releaser {
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            self.stop.cancel();
            let holding = &self.holding;
            let locks = &holding.locks;
            locks
                .release_on(
                    all_servers(locks.servers.list.len()),
                    &holding.keys,
                    &holding.value,
                )
                .await;
            locks.metrics.lock_held(-1);
        })
    }
}
