//! A local group: the processes of one application on one machine, run by one user, coordinating
//! as replicas do in a cluster, with nothing installed. Seed 000's second terminal: start the
//! same components again and the slots divide, locks exclude across both, meters add up, the
//! stash and the records of repeated calls are shared.
//!
//! The first process to take the group's lock file ([`place`]) leads: it serves the shared state
//! on a Unix socket in the user's own directory ([`server`]) to every member, itself included,
//! over one connection each ([`Group`]). The group is the application's name with the context file's absolute path, or
//! `TOA_LOCAL_GROUP`; `--alone` (`TOA_ALONE`) keeps a process out of any.
//!
//! When the leader stops or is killed, the kernel releases its lock file; a member takes it,
//! serves, and the others reconnect. They first reclaim the locks they hold (granted before any
//! new lock during a grace period), so no lock has two holders across the change; slots lapse
//! while a member's heartbeats fail and come back after the view settles, as with Redis. What
//! the leader kept for a while — meters' debts, the stash, the records of repeats — goes with it:
//! the stash is what every replica should see, not what must survive (seed 001).

mod place;
mod server;
mod wire;

pub use place::Place;

use crate::coordination::membership::View;
use futures::future::BoxFuture;
use serde_json::Value;
use server::Server;
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
pub use wire::CallAnswer;
use wire::{Challenge, Hello, Op, Proof, Reply, Request, Side};

/// How long a first join may try before the process refuses to start.
const JOIN: Duration = Duration::from_secs(10);
/// How long a request other than a lock waits for its answer.
const ANSWER: Duration = Duration::from_secs(2);
/// How long a new leader grants only reclaims.
const GRACE: Duration = Duration::from_secs(2);
/// The slots' heartbeat interval in a group: a second replica owns its share in about 2 s.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How often a member tells the leader it is alive ([`server::SILENT`] ends a silent one).
const PING: Duration = Duration::from_secs(1);
/// A member that did not run for this long (stopped, frozen) takes its session for ended: the
/// leader may have ended it, given its locks to others and its calls to other processes.
const STOPPED: Duration = Duration::from_secs(4);

#[derive(Debug, Clone, thiserror::Error)]
pub enum GroupError {
    #[error("local group: {0}")]
    Place(String),
    #[error("local group {group:?}: its first process (pid {pid}) serves at {address}, which does not answer as a member of the group ({reason}); start this process with --alone to run it apart")]
    Unreachable {
        group: String,
        pid: u32,
        address: String,
        reason: String,
    },
    #[error("local group {0:?}: no leader wrote its address within {JOIN:?}")]
    NoLeader(String),
    #[error("local group: the leader did not answer within {ANSWER:?} (it may be changing)")]
    Unavailable,
    #[error("local group: the leader refused: {0}")]
    Refused(String),
    /// The connection to the leader ended before the answer came: whether the request took
    /// effect (an event was handed out, a meter charged) is unknown, so it is not sent again.
    #[error("local group: the connection to the leader ended before it answered (the leader changed, or this process was stopped); whether the request took effect is unknown")]
    Interrupted,
}

/// A lock granted: its fencing token, and what tells the holder the lock was lost.
type Granted = (u64, CancellationToken);

enum Waiting {
    Value(oneshot::Sender<Result<Value, GroupError>>),
    Lock(oneshot::Sender<Result<Granted, GroupError>>),
}

struct Pending {
    op: Op,
    waiting: Waiting,
    /// Written to a connection (maybe one that ended since).
    sent: bool,
}

/// A lock this process holds through the group: reclaimed from a new leader.
struct Holding {
    keys: Vec<String>,
    lost: CancellationToken,
}

/// Leading: the lock file (held while open) and the server.
struct Leading {
    _lock: File,
    server: Arc<Server>,
    task: JoinHandle<()>,
}

struct Shared {
    place: Place,
    instance: String,
    next: AtomicU64,
    pending: Mutex<BTreeMap<u64, Pending>>,
    held: Mutex<BTreeMap<u64, Holding>>,
    /// Request ids to send now; releases to tell the leader.
    wake: mpsc::UnboundedSender<Wake>,
    leading: Mutex<Option<Leading>>,
    /// This member's session with the leader it is connected to (0: none yet).
    session: AtomicU64,
    /// The embedded store's service, for when this process leads.
    store: Option<StoreService>,
    /// What this process serves, told to every leader it joins.
    offer: Mutex<Option<Op>>,
    /// Runs the calls delivered here.
    runner: std::sync::OnceLock<Runner>,
    /// Takes the events delivered here.
    events: std::sync::OnceLock<EventRunner>,
    /// Component → the labels its receivers here take (once they listen).
    receivers: Mutex<BTreeMap<String, Vec<String>>>,
}

enum Wake {
    Send(u64),
    Release(u64),
    /// A delivered call's answer, or this member's offer changed.
    Frame(Box<Op>),
}

/// Runs a call the leader delivered to this process: the answer to hand back.
pub type Runner = Arc<dyn Fn(String, Value) -> BoxFuture<'static, Value> + Send + Sync>;
/// Hands an event to the receivers of a component of this process.
pub type EventRunner = Arc<dyn Fn(String, Value) + Send + Sync>;
/// Runs one method of a component's store for the group (`component`, how long records are kept
/// in ms, the method as JSON): what a leader serves the embedded store with.
pub type StoreService =
    Arc<dyn Fn(String, u64, Value) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// This process's membership of its local group.
pub struct Group {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Group {
    /// Joins (or founds) the group at `place`; fails loudly when its leader cannot be reached.
    /// `store`: what this process serves the embedded store with, should it lead.
    pub async fn join(
        place: Place,
        instance: &str,
        store: Option<StoreService>,
    ) -> Result<Self, GroupError> {
        let (wake, woken) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            place,
            instance: instance.to_owned(),
            next: AtomicU64::new(1),
            pending: Mutex::default(),
            held: Mutex::default(),
            wake,
            leading: Mutex::default(),
            session: AtomicU64::new(0),
            store,
            offer: Mutex::default(),
            runner: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
            receivers: Mutex::default(),
        });
        let connection = tokio::time::timeout(JOIN, shared.connect(true))
            .await
            .map_err(|_| GroupError::NoLeader(shared.place.name.clone()))??;
        let task = tokio::spawn(shared.clone().run(connection, woken));
        Ok(Self { shared, task })
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.shared.place.name
    }

    /// Whether this process leads.
    pub fn leads(&self) -> bool {
        self.shared.leading.lock().expect("leading").is_some()
    }

    /// Whether a call to `component` would come back to this process anyway: it leads, and it
    /// is the only member offering the component. The caller then runs the call here without
    /// the round trip through its own socket (a local run alone, the common case).
    pub fn only_here(&self, component: &str) -> bool {
        let own = self.shared.session.load(Ordering::Relaxed);
        let leading = self.shared.leading.lock().expect("leading");
        leading
            .as_ref()
            .is_some_and(|leading| own != 0 && leading.server.alone_offering(own, component))
    }

    /// Waits until every key is free, then holds them: the holding's id, its fencing token, and
    /// what is cancelled should the lock be lost (a new leader gave it to another). An error
    /// only when the leader refuses the request.
    pub async fn acquire(
        &self,
        keys: Vec<String>,
    ) -> Result<(u64, u64, CancellationToken), GroupError> {
        let (sender, granted) = oneshot::channel();
        let id = self.shared.ask(
            Op::Lock {
                keys,
                reclaim: false,
            },
            Waiting::Lock(sender),
        );
        // Dropped before granted (the caller gave up): the request is withdrawn.
        let mut guard = Withdraw {
            shared: Some(&self.shared),
            id,
        };
        let granted = granted
            .await
            .expect("the group's task outlives its requests");
        guard.shared = None;
        granted.map(|(token, lost)| (id, token, lost))
    }

    /// Releases (or withdraws) the holding `id`.
    pub fn release(&self, id: u64) {
        self.shared.release(id);
    }

    /// A handle that releases the holding `id` when asked, from anywhere.
    pub fn releaser(&self, id: u64) -> Releaser {
        Releaser {
            shared: Arc::downgrade(&self.shared),
            id,
        }
    }

    pub async fn heartbeat(
        &self,
        prefix: &str,
        member: &str,
        ttl: Duration,
        withdraw: bool,
    ) -> Result<View, GroupError> {
        let op = Op::Heartbeat {
            prefix: prefix.to_owned(),
            member: member.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
            withdraw,
        };
        let value = self.request(op).await?;
        serde_json::from_value(value).map_err(|e| GroupError::Refused(e.to_string()))
    }

    pub async fn meter(&self, keys: Vec<String>, deltas: Vec<u64>) -> Result<Vec<u64>, GroupError> {
        let value = self.request(Op::Meter { keys, deltas }).await?;
        serde_json::from_value(value).map_err(|e| GroupError::Refused(e.to_string()))
    }

    pub async fn get(&self, key: String) -> Result<Option<String>, GroupError> {
        let value = self.request(Op::Get { key }).await?;
        serde_json::from_value(value).map_err(|e| GroupError::Refused(e.to_string()))
    }

    pub async fn set(&self, key: String, value: String, ttl_ms: u64) -> Result<(), GroupError> {
        self.request(Op::Set { key, value, ttl_ms }).await.map(drop)
    }

    pub async fn claim(
        &self,
        key: String,
        value: String,
        ttl_ms: u64,
    ) -> Result<Option<String>, GroupError> {
        let value = self.request(Op::Claim { key, value, ttl_ms }).await?;
        serde_json::from_value(value).map_err(|e| GroupError::Refused(e.to_string()))
    }

    pub async fn delete(&self, key: String) -> Result<bool, GroupError> {
        let value = self.request(Op::Delete { key }).await?;
        serde_json::from_value(value).map_err(|e| GroupError::Refused(e.to_string()))
    }

    /// Offers this process's components for calls from the others (none: it takes no more), run
    /// by `runner`.
    pub fn offer(&self, components: Vec<String>, runner: Runner) {
        let _ = self.shared.runner.set(runner);
        let offer = Op::Offer {
            instance: self.shared.instance.clone(),
            components,
            receivers: self.shared.receivers.lock().expect("receivers").clone(),
        };
        *self.shared.offer.lock().expect("offer") = Some(offer.clone());
        let _ = self.shared.wake.send(Wake::Frame(Box::new(offer)));
    }

    /// The components' receivers here take the group's events from now on: `receivers` names the
    /// labels of each, `runner` hands an event over.
    pub fn receive(&self, receivers: BTreeMap<String, Vec<String>>, runner: EventRunner) {
        let _ = self.shared.events.set(runner);
        *self.shared.receivers.lock().expect("receivers") = receivers;
        let mut offer = self.shared.offer.lock().expect("offer");
        if let Some(Op::Offer { receivers, .. }) = offer.as_mut() {
            *receivers = self.shared.receivers.lock().expect("receivers").clone();
            let _ = self
                .shared
                .wake
                .send(Wake::Frame(Box::new(offer.clone().expect("an offer"))));
        }
    }

    /// Publishes `event` to the group: handed to one process per component receiving it.
    pub async fn publish(&self, label: &str, event: Value) -> Result<(), GroupError> {
        let label = label.to_owned();
        self.request(Op::Publish { label, event }).await.map(drop)
    }

    /// Takes no more calls or events from the others (a drain began).
    pub fn withdraw_offer(&self) {
        self.shared.receivers.lock().expect("receivers").clear();
        if let Some(runner) = self.shared.runner.get() {
            self.offer(Vec::new(), runner.clone());
        }
    }

    /// Hands a call to a replica of `component` (in the process `instance`, when named): the
    /// answer of the member that ran it, or [`CallAnswer`] as JSON. Waits up to `wait`.
    pub async fn call(
        &self,
        component: &str,
        instance: Option<&str>,
        call: Value,
        wait: Duration,
    ) -> Result<Value, GroupError> {
        let op = Op::Call {
            component: component.to_owned(),
            instance: instance.map(str::to_owned),
            call,
        };
        self.request_within(op, wait).await
    }

    /// One method of the store of `component`'s objects, kept by the leader.
    pub async fn store(
        &self,
        component: &str,
        once_ms: u64,
        call: Value,
    ) -> Result<Value, GroupError> {
        let op = Op::Store {
            component: component.to_owned(),
            once_ms,
            call,
        };
        self.request(op).await
    }

    /// Leaves: a leader that was the last member clears the address (a clean end of the group).
    pub fn leave(&self) {
        self.task.abort();
        if let Some(leading) = self.shared.leading.lock().expect("leading").take() {
            let own = Some(self.shared.session.load(Ordering::Relaxed));
            if leading.server.others(own) == 0 {
                self.shared.place.clear();
            }
            leading.server.stop();
            leading.task.abort();
        }
    }

    async fn request(&self, op: Op) -> Result<Value, GroupError> {
        self.request_within(op, ANSWER).await
    }

    async fn request_within(&self, op: Op, wait: Duration) -> Result<Value, GroupError> {
        let (sender, answer) = oneshot::channel();
        let id = self.shared.ask(op, Waiting::Value(sender));
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(answer)) => answer,
            _ => {
                self.shared.pending.lock().expect("pending").remove(&id);
                Err(GroupError::Unavailable)
            }
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("name", &self.name()).finish()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Releases a holding from a [`crate::coordination::atom::lock::Held`].
pub struct Releaser {
    shared: std::sync::Weak<Shared>,
    id: u64,
}

impl Releaser {
    pub fn release(self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.release(self.id);
        }
    }
}

/// Withdraws a lock request whose asker gave up: a grant that came meanwhile is released (a
/// grant is recorded as held under the pending requests' lock, so one of the two sees it).
struct Withdraw<'a> {
    shared: Option<&'a Arc<Shared>>,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared {
            shared.pending.lock().expect("pending").remove(&self.id);
            shared.release(self.id);
        }
    }
}

type Connection = (BufReader<OwnedReadHalf>, OwnedWriteHalf);

impl Shared {
    fn ask(&self, op: Op, waiting: Waiting) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().expect("pending").insert(
            id,
            Pending {
                op,
                waiting,
                sent: false,
            },
        );
        let _ = self.wake.send(Wake::Send(id));
        id
    }

    fn release(&self, id: u64) {
        self.held.lock().expect("held").remove(&id);
        let _ = self.wake.send(Wake::Release(id));
    }

    /// Keeps one connection to the leader, taking the lead when it is free, for the process's
    /// life.
    async fn run(
        self: Arc<Self>,
        mut connection: Connection,
        mut woken: mpsc::UnboundedReceiver<Wake>,
    ) {
        loop {
            let error = self.serve(connection, &mut woken).await;
            // The next leader numbers its sessions anew: until this process joins it, the old
            // number could be another member's there (`only_here` would take its offer for ours).
            self.session.store(0, Ordering::Relaxed);
            tracing::warn!(group = %self.place.name, %error, "local group: the connection to the leader ended; joining the next one");
            connection = loop {
                match self.connect(false).await {
                    Ok(connection) => break connection,
                    Err(error) => {
                        tracing::warn!(%error, "local group: no leader yet");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
        }
    }

    /// Sends what waits (reclaims first), then the requests as they come and the answers as
    /// they arrive, until the connection fails.
    async fn serve(
        &self,
        (mut read, mut write): Connection,
        woken: &mut mpsc::UnboundedReceiver<Wake>,
    ) -> String {
        // Lines are read by a task of their own: a read raced against the wakes below would drop
        // a line read in part whenever a wake won (read_until is not cancel-safe).
        let (line_sender, mut incoming) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                let line = wire::read_line(&mut read).await;
                let end = !matches!(line, Ok(Some(_)));
                if line_sender.send(line).is_err() || end {
                    return;
                }
            }
        });
        let _reader = tokio_util::task::AbortOnDropHandle::new(reader);
        let (lines, sent) = self.resent();
        if let Err(error) = write.write_all(lines.as_bytes()).await {
            return error.to_string();
        }
        let mut ping = tokio::time::interval(PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ran = tokio::time::Instant::now();
        loop {
            // The ping wakes this loop every second: a longer gap is time this process did not
            // run. Nothing read meanwhile is acted on (a call handed here may have gone to
            // another process since), and no lock is reclaimed.
            if let Some(gap) = self.stopped(&mut ran) {
                return gap;
            }
            let request = tokio::select! {
                _ = ping.tick() => Request { id: 0, op: Op::Ping },
                wake = woken.recv() => {
                    let Some(wake) = wake else { return "stopped".into() };
                    match self.request_for(wake, &sent) {
                        Some(request) => request,
                        None => continue,
                    }
                }
                line = incoming.recv() => {
                    match line {
                        Some(Ok(Some(line))) => self.answer(&line),
                        Some(Ok(None)) | None => return "closed by the leader".into(),
                        Some(Err(error)) => return error.to_string(),
                    }
                    continue;
                }
            };
            if let Err(error) = write.write_all(wire::line(&request).as_bytes()).await {
                return error.to_string();
            }
        }
    }

    /// What to send for `wake`; `None` for a request sent already (`sent`) or given up.
    fn request_for(&self, wake: Wake, sent: &std::collections::HashSet<u64>) -> Option<Request> {
        Some(match wake {
            Wake::Send(id) if sent.contains(&id) => return None,
            Wake::Send(id) => {
                let mut pending = self.pending.lock().expect("pending");
                let pending = pending.get_mut(&id)?;
                pending.sent = true;
                Request {
                    id,
                    op: pending.op.clone(),
                }
            }
            Wake::Release(lock) => Request {
                id: 0,
                op: Op::Release { lock },
            },
            Wake::Frame(op) => Request { id: 0, op: *op },
        })
    }

    /// `Some` (why) when this process did not run for [`STOPPED`] since `ran`: its holdings are
    /// told lost. Else `ran` moves to now.
    fn stopped(&self, ran: &mut tokio::time::Instant) -> Option<String> {
        let gap = ran.elapsed();
        *ran = tokio::time::Instant::now();
        if gap < STOPPED {
            return None;
        }
        for (_, holding) in std::mem::take(&mut *self.held.lock().expect("held")) {
            holding.lost.cancel();
        }
        Some(format!(
            "this process did not run for {gap:?} (stopped or frozen): its session is taken for ended and its locks for lost"
        ))
    }

    /// What a new connection sends first: the offer, the reclaims of the locks held, every
    /// request still waiting for its answer (and their ids, whose wakes are skipped).
    ///
    /// Except the requests sent already whose effect could be applied twice, to the same leader
    /// (a meter charged, a record claimed) or beyond its state: a call is answered
    /// [`CallAnswer::Gone`] (an ordinary one is handed out again, at least once, as a broker
    /// redelivers), an event, a store method, a meter or a claim [`GroupError::Interrupted`].
    fn resent(&self) -> (String, std::collections::HashSet<u64>) {
        let unknown: Vec<(u64, bool)> = self
            .pending
            .lock()
            .expect("pending")
            .iter()
            .filter(|(_, pending)| pending.sent)
            .filter_map(|(id, pending)| match pending.op {
                Op::Call { .. } => Some((*id, true)),
                Op::Publish { .. } | Op::Store { .. } | Op::Meter { .. } | Op::Claim { .. } => {
                    Some((*id, false))
                }
                _ => None,
            })
            .collect();
        for (id, call) in unknown {
            let answer = match call {
                true => Ok(serde_json::json!(CallAnswer::Gone)),
                false => Err(GroupError::Interrupted),
            };
            self.settle(id, answer);
        }
        let mut lines = String::new();
        if let Some(offer) = self.offer.lock().expect("offer").clone() {
            lines.push_str(&wire::line(&Request { id: 0, op: offer }));
        }
        for (id, holding) in self.held.lock().expect("held").iter() {
            let op = Op::Lock {
                keys: holding.keys.clone(),
                reclaim: true,
            };
            lines.push_str(&wire::line(&Request { id: *id, op }));
        }
        let mut sent = std::collections::HashSet::new();
        for (id, pending) in self.pending.lock().expect("pending").iter_mut() {
            pending.sent = true;
            let op = pending.op.clone();
            lines.push_str(&wire::line(&Request { id: *id, op }));
            sent.insert(*id);
        }
        (lines, sent)
    }

    fn answer(&self, line: &str) {
        let reply = match serde_json::from_str::<Reply>(line) {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(%error, "local group: an answer this process cannot read");
                return;
            }
        };
        match reply {
            Reply::Lost { id } => {
                if let Some(holding) = self.held.lock().expect("held").remove(&id) {
                    tracing::warn!(keys = ?holding.keys, "local group: a lock held through the previous leader was taken meanwhile; its holder is told it is lost");
                    holding.lost.cancel();
                }
            }
            Reply::Error { id: 0, message } => {
                tracing::warn!(%message, "local group: the leader could not read a request");
            }
            Reply::Deliver {
                delivery,
                component,
                call,
            } => self.run_delivered(delivery, component, call),
            Reply::Event { component, event } => match self.events.get() {
                Some(runner) => runner(component, event),
                None => {
                    tracing::warn!(%component, "local group: an event for receivers that do not listen yet is dropped")
                }
            },
            Reply::Ok { id, value } => self.settle(id, Ok(value)),
            Reply::Error { id, message } => self.settle(id, Err(GroupError::Refused(message))),
        }
    }

    /// Runs a call the leader handed here; its answer goes back.
    fn run_delivered(&self, delivery: u64, component: String, call: Value) {
        let wake = self.wake.clone();
        let Some(runner) = self.runner.get().cloned() else {
            let answer = serde_json::json!(CallAnswer::Gone);
            let _ = wake.send(Wake::Frame(Box::new(Op::Answer { delivery, answer })));
            return;
        };
        tokio::spawn(async move {
            let answer = runner(component, call).await;
            let _ = wake.send(Wake::Frame(Box::new(Op::Answer { delivery, answer })));
        });
    }

    /// Hands an answer to whoever waits for it.
    fn settle(&self, id: u64, answer: Result<Value, GroupError>) {
        if self.held.lock().expect("held").contains_key(&id) {
            return; // a reclaim granted: the holding goes on
        }
        let mut pending = self.pending.lock().expect("pending");
        let Some(asked) = pending.remove(&id) else {
            drop(pending);
            if matches!(answer, Ok(Value::Number(_))) {
                // A lock granted after its asker gave up.
                let _ = self.wake.send(Wake::Release(id));
            }
            return;
        };
        let (sender, keys) = match (asked.waiting, asked.op) {
            (Waiting::Value(sender), _) => {
                drop(pending);
                let _ = sender.send(answer);
                return;
            }
            (Waiting::Lock(sender), Op::Lock { keys, .. }) => (sender, keys),
            (Waiting::Lock(_), _) => unreachable!("a lock's waiting is asked with Op::Lock"),
        };
        let token = answer.and_then(|value| {
            value
                .as_u64()
                .ok_or_else(|| GroupError::Refused(format!("a lock granted with {value}")))
        });
        let granted = token.map(|token| {
            let lost = CancellationToken::new();
            let holding = Holding {
                keys,
                lost: lost.clone(),
            };
            // Still under the pending requests' lock: a withdrawal waits for this and releases it.
            self.held.lock().expect("held").insert(id, holding);
            (token, lost)
        });
        drop(pending);
        let taken = granted.is_ok();
        if sender.send(granted).is_err() && taken {
            self.release(id);
        }
    }

    /// Leads if the lead is free, then connects to the leader and says hello.
    async fn connect(&self, first: bool) -> Result<Connection, GroupError> {
        let mut last = None;
        loop {
            self.lead_if_free().await?;
            if let Some(address) = self.place.read() {
                match hello(&address, &self.instance).await {
                    Ok((connection, session)) => {
                        if let Some(leader) = &last {
                            tracing::info!(group = %self.place.name, leader, "local group: joined after retrying");
                        }
                        self.session.store(session, Ordering::Relaxed);
                        return Ok(connection);
                    }
                    Err(reason) => {
                        let leading = self.leading.lock().expect("leading").is_some();
                        if first && !leading && reason.starts_with("refused:") {
                            return Err(GroupError::Unreachable {
                                group: self.place.name.clone(),
                                pid: address.pid,
                                address: address.socket.display().to_string(),
                                reason,
                            });
                        }
                        last = Some(format!("{} ({reason})", address.socket.display()));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes the lead if no live process holds it: serves, and writes the address for the others.
    async fn lead_if_free(&self) -> Result<(), GroupError> {
        if self.leading.lock().expect("leading").is_some() {
            return Ok(());
        }
        let Some(lock) = self.place.try_lead()? else {
            return Ok(());
        };
        // A previous leader's address: its members may hold locks to reclaim.
        let grace = if self.place.read().is_some() {
            GRACE
        } else {
            Duration::ZERO
        };
        let token = wire::random_hex(32);
        let socket = self.place.socket.clone();
        let (server, task) = Server::start(token.clone(), grace, self.store.clone(), &socket)
            .await
            .map_err(|e| GroupError::Place(format!("serving on {}: {e}", socket.display())))?;
        let pid = std::process::id();
        self.place.write(&place::Address { socket, token, pid })?;
        tracing::info!(group = %self.place.name, socket = %self.place.socket.display(), grace_ms = grace.as_millis() as u64, "local group: this process leads");
        *self.leading.lock().expect("leading") = Some(Leading {
            _lock: lock,
            server,
            task,
        });
        Ok(())
    }
}

/// Connects to `address` and is welcomed once both sides proved they hold the token ([`wire`]):
/// the connection and this member's session; or why not (`refused:` when something answered that
/// is not the group's leader, or refused).
async fn hello(address: &place::Address, instance: &str) -> Result<(Connection, u64), String> {
    let stream = tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(&address.socket))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let nonce = wire::random_hex(16);
    let hello = Hello {
        protocol: wire::PROTOCOL,
        instance: instance.to_owned(),
        nonce: nonce.clone(),
    };
    send(&mut write, &hello).await?;
    let challenge = match handshake_line(&mut read).await? {
        HandshakeLine::Answer(Reply::Error { message, .. }) => {
            return Err(format!("refused: {message}"))
        }
        line => line.parse::<Challenge>()?,
    };
    let token = &address.token;
    if !wire::proven(
        &challenge.proof,
        token,
        Side::Leader,
        &nonce,
        &challenge.nonce,
    ) {
        return Err("refused: what answers there cannot prove it holds the group's token".into());
    }
    let proof = wire::prove(token, Side::Member, &nonce, &challenge.nonce);
    send(&mut write, &Proof { proof }).await?;
    match handshake_line(&mut read).await? {
        HandshakeLine::Answer(Reply::Ok { id: 0, value }) => {
            let session = value["session"].as_u64().unwrap_or_default();
            Ok(((read, write), session))
        }
        HandshakeLine::Answer(Reply::Error { message, .. }) => Err(format!("refused: {message}")),
        _ => Err("refused: an answer that is not a welcome".into()),
    }
}

async fn send<T: serde::Serialize>(write: &mut OwnedWriteHalf, frame: &T) -> Result<(), String> {
    let line = wire::line(frame);
    write
        .write_all(line.as_bytes())
        .await
        .map_err(|e| e.to_string())
}

/// A line of the leader's handshake: a [`Reply`] when it reads as one, else its text.
enum HandshakeLine {
    Answer(Reply),
    Text(String),
}

impl HandshakeLine {
    fn parse<T: serde::de::DeserializeOwned>(self) -> Result<T, String> {
        let text = match self {
            Self::Text(text) => text,
            Self::Answer(_) => return Err("refused: an answer out of the handshake's order".into()),
        };
        serde_json::from_str(&text).map_err(|_| "refused: not the group's handshake".to_owned())
    }
}

async fn handshake_line(read: &mut BufReader<OwnedReadHalf>) -> Result<HandshakeLine, String> {
    let line = wire::read_line_within(read, wire::MAX_HANDSHAKE_LINE);
    let line = tokio::time::timeout(Duration::from_secs(2), line)
        .await
        .map_err(|_| "refused: no answer within 2 s".to_owned())?
        .map_err(|e| format!("refused: {e}"))?
        .ok_or_else(|| "closed during the handshake".to_owned())?;
    Ok(match serde_json::from_str::<wire::Reply>(&line) {
        Ok(reply) => HandshakeLine::Answer(reply),
        Err(_) => HandshakeLine::Text(line),
    })
}

#[cfg(test)]
mod tests;
