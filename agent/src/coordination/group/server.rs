//! The leader's side: what the members of a local group share — locks, slots' membership,
//! meters' debts, and expiring values (the stash, the records of repeated calls) — kept in this
//! process and served on a Unix socket in the user's own directory to members proving they hold
//! the group's token; and it relays calls between them.
//!
//! The embedded store's objects, records and outbox, per component, are kept here too: two
//! local replicas never keep two copies of one object.
//!
//! Calls: each member offers the components it runs; a call is handed to the process it names,
//! or to the next of those serving the component in turn, and its answer handed back.
//!
//! A member's connection is its session: when it ends (the process stopped or was killed), its
//! locks are released, its waits dropped and its members leave the membership at once. A member
//! pings every second; one silent for [`SILENT`] (stopped with SIGSTOP, or frozen) is taken for
//! gone, its session ended the same way: a frozen process holds no lock for longer. Once it runs
//! again it joins anew, and its reclaims are refused: its holders are told their locks were lost.
//!
//! A leader that takes over from another starts empty: for a grace period it grants only
//! reclaims (a member's holdings from the previous leader, sent first on reconnecting) and keeps
//! every other lock request waiting, so a lock held across the change is never granted twice.

use super::wire::{self, CallAnswer, Challenge, Hello, Op, Proof, Reply, Request, Side};
use super::StoreService;
use crate::coordination::debts::Debts;
use crate::coordination::expiring::Expiring;
use crate::coordination::membership::{now_ms, Membership, Session};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a connection may take over its handshake.
const HELLO: Duration = Duration::from_secs(5);
/// How many connections may be in their handshake at once: more are closed unread. Only the
/// user's own processes reach the socket; this bounds what a runaway one can make the leader hold.
const HANDSHAKES: usize = 256;
/// How long a member may be silent (it pings every [`super::PING`]) before its session ends.
pub const SILENT: Duration = Duration::from_secs(5);

type Reader = BufReader<OwnedReadHalf>;

struct Waiter {
    session: Session,
    id: u64,
    keys: Vec<String>,
}

/// A call handed to a member, until it answers.
struct Delivery {
    caller: Session,
    id: u64,
    target: Session,
}

/// What a member serves.
struct Offer {
    instance: String,
    components: Vec<String>,
    receivers: BTreeMap<String, Vec<String>>,
}

#[derive(Default)]
struct State {
    next_session: Session,
    sessions: HashMap<Session, mpsc::UnboundedSender<String>>,
    /// Key → the holding (session, request id).
    held: HashMap<String, (Session, u64)>,
    /// (session, request id) → its keys.
    holdings: BTreeMap<(Session, u64), Vec<String>>,
    waiting: Vec<Waiter>,
    fence: u64,
    views: HashMap<String, Membership>,
    debts: Debts,
    values: Expiring,
    offers: BTreeMap<Session, Offer>,
    /// Component → how many calls were handed out for it: the next member in turn.
    turns: HashMap<String, usize>,
    deliveries: HashMap<u64, Delivery>,
    next_delivery: u64,
}

pub struct Server {
    token: String,
    grace_until: Instant,
    /// The first epoch of any view: the server's start in ms, so epochs grow across leaders.
    first_epoch: u64,
    /// No leader came before: no member can own slots from an earlier view.
    fresh: bool,
    state: Mutex<State>,
    /// Cancelled when this process stops leading: every session ends.
    stopped: CancellationToken,
    /// Keeps the embedded store's objects for the group.
    store: Option<StoreService>,
}

impl Server {
    /// Serves on the Unix socket `socket` (a dead leader's is replaced: the caller holds the
    /// group's lock); `grace`: how long only reclaims are granted.
    pub async fn start(
        token: String,
        grace: Duration,
        store: Option<StoreService>,
        socket: &Path,
    ) -> std::io::Result<(Arc<Self>, JoinHandle<()>)> {
        match std::fs::remove_file(socket) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        let start = now_ms();
        let server = Arc::new(Self {
            token,
            grace_until: Instant::now() + grace,
            first_epoch: start,
            fresh: grace.is_zero(),
            state: Mutex::new(State {
                fence: start * 1000,
                // Apart from any earlier leader's, whose answers may still arrive.
                next_delivery: start * 1000,
                ..State::default()
            }),
            stopped: CancellationToken::new(),
            store,
        });
        if !grace.is_zero() {
            let server = server.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(server.grace_until).await;
                server.grant();
            });
        }
        let serving = server.clone();
        let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
        let task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = serving.stopped.cancelled() => return,
                };
                match accepted {
                    Ok((stream, _)) => match handshakes.clone().try_acquire_owned() {
                        Ok(permit) => {
                            tokio::spawn(serving.clone().session(stream, permit));
                        }
                        Err(_) => tracing::warn!(
                            "local group: {HANDSHAKES} connections are in their handshake; another is closed"
                        ),
                    },
                    Err(error) => {
                        tracing::warn!(%error, "local group: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok((server, task))
    }

    /// Stops serving: every member's connection ends.
    pub fn stop(&self) {
        self.stopped.cancel();
    }

    /// How many members are connected besides the session `own` (the leader's own member's).
    pub fn others(&self, own: Option<Session>) -> usize {
        let state = self.state.lock().expect("group");
        state.sessions.keys().filter(|s| Some(**s) != own).count()
    }

    /// Whether `own` offers `component` and no other session does: every call to it would be
    /// handed to `own`.
    pub fn alone_offering(&self, own: Session, component: &str) -> bool {
        let state = self.state.lock().expect("group");
        let mut offering = state
            .offers
            .iter()
            .filter(|(_, offer)| offer.components.iter().any(|c| c == component));
        matches!((offering.next(), offering.next()), (Some((session, _)), None) if *session == own)
    }

    /// A new session, answered through `sender`.
    fn open(&self, sender: mpsc::UnboundedSender<String>) -> Session {
        let mut state = self.state.lock().expect("group");
        state.next_session += 1;
        let session = state.next_session;
        state.sessions.insert(session, sender);
        session
    }

    /// The handshake ([`wire`]): the member's hello once it proved it holds the token, or why
    /// not (told to the member).
    async fn handshake(
        &self,
        read: &mut Reader,
        write: &mut OwnedWriteHalf,
    ) -> Result<Hello, String> {
        let closed = || "closed during the handshake".to_owned();
        let line = wire::read_line_within(read, wire::MAX_HANDSHAKE_LINE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(closed)?;
        let hello: Hello = serde_json::from_str(&line).map_err(|_| "not a member's hello")?;
        if hello.protocol != wire::PROTOCOL {
            return Err(format!(
                "the leader speaks the group's protocol {}, this member {}: run one build of the agent, or this process with --alone",
                wire::PROTOCOL, hello.protocol
            ));
        }
        let nonce = wire::random_hex(16);
        let challenge = Challenge {
            pid: std::process::id(),
            proof: wire::prove(&self.token, Side::Leader, &hello.nonce, &nonce),
            nonce,
        };
        write
            .write_all(wire::line(&challenge).as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let line = wire::read_line_within(read, wire::MAX_HANDSHAKE_LINE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(closed)?;
        let proof: Proof = serde_json::from_str(&line).map_err(|_| "not a member's proof")?;
        if !wire::proven(
            &proof.proof,
            &self.token,
            Side::Member,
            &hello.nonce,
            &challenge.nonce,
        ) {
            return Err("not a member: a wrong token".into());
        }
        Ok(hello)
    }

    /// The member's hello once its handshake passed in time; a refusal is told and logged.
    async fn admit(
        &self,
        read: &mut Reader,
        write: &mut OwnedWriteHalf,
        handshaking: OwnedSemaphorePermit,
    ) -> Option<Hello> {
        let hello = tokio::time::timeout(HELLO, self.handshake(read, write)).await;
        drop(handshaking);
        match hello.unwrap_or_else(|_| Err(format!("no handshake within {HELLO:?}"))) {
            Ok(hello) => Some(hello),
            Err(message) => {
                tracing::warn!(%message, "local group: a connection was refused");
                let refused = Reply::Error { id: 0, message };
                let _ = write.write_all(wire::line(&refused).as_bytes()).await;
                None
            }
        }
    }

    async fn session(self: Arc<Self>, stream: UnixStream, handshaking: OwnedSemaphorePermit) {
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let Some(hello) = self.admit(&mut read, &mut write, handshaking).await else {
            return;
        };
        let (sender, mut outgoing) = mpsc::unbounded_channel::<String>();
        let session = self.open(sender.clone());
        tracing::info!(member = %hello.instance, "local group: a member joined");
        let welcome = Reply::Ok {
            id: 0,
            value: json!({ "pid": std::process::id(), "session": session }),
        };
        let _ = sender.send(wire::line(&welcome));
        let writer = tokio::spawn(async move {
            while let Some(line) = outgoing.recv().await {
                if write.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        loop {
            let line = tokio::select! {
                line = tokio::time::timeout(SILENT, wire::read_line(&mut read)) => line,
                () = self.stopped.cancelled() => break,
            };
            let line = match line {
                Ok(Ok(Some(line))) => line,
                Ok(Ok(None)) => break,
                Err(_) => {
                    tracing::warn!(member = %hello.instance, silent = ?SILENT, "local group: a member fell silent (stopped or frozen); its session ends and its locks are released");
                    break;
                }
                Ok(Err(error)) => {
                    tracing::warn!(member = %hello.instance, %error, "local group: a member's connection failed");
                    break;
                }
            };
            match serde_json::from_str::<Request>(&line) {
                Ok(request) => {
                    if let Some(reply) = self.handle(session, request) {
                        let _ = sender.send(wire::line(&reply));
                    }
                }
                Err(error) => {
                    // A frame this leader cannot read (another version of the agent): said, and
                    // the session goes on.
                    let message = format!("a request this leader cannot read: {error}");
                    let _ = sender.send(wire::line(&Reply::Error { id: 0, message }));
                }
            }
        }
        self.close(session);
        writer.abort();
        tracing::info!(member = %hello.instance, "local group: a member left");
    }

    fn handle(&self, session: Session, request: Request) -> Option<Reply> {
        let id = request.id;
        let mut state = self.state.lock().expect("group");
        let value = match request.op {
            Op::Ping => return None,
            Op::Lock { keys, reclaim } => return self.lock(state, (session, id), keys, reclaim),
            Op::Release { lock } => {
                state
                    .waiting
                    .retain(|w| (w.session, w.id) != (session, lock));
                if state.give_back(session, lock) {
                    drop(state);
                    self.grant();
                }
                return None;
            }
            Op::Heartbeat {
                prefix,
                member,
                ttl_ms,
                withdraw,
            } => {
                let (first_epoch, fresh) = (self.first_epoch, self.fresh);
                // The first view of a group no leader came before replaces no other: it counts
                // as settled already (a process alone owns its slots at once).
                let membership = state
                    .views
                    .entry(prefix)
                    .or_insert_with(|| Membership::new(fresh));
                let view = membership.beat(session, member, ttl_ms, withdraw, first_epoch);
                wire::view_value(&view)
            }
            Op::Meter { keys, deltas } => json!(state.debts.charge(&keys, &deltas)),
            Op::Get { key } => json!(state.values.get(&key)),
            Op::Set { key, value, ttl_ms } => {
                state.values.set(&key, value, Duration::from_millis(ttl_ms));
                Value::Null
            }
            Op::Claim { key, value, ttl_ms } => {
                json!(state
                    .values
                    .claim(&key, value, Duration::from_millis(ttl_ms)))
            }
            Op::Delete { key } => json!(state.values.remove(&key)),
            Op::Store {
                component,
                once_ms,
                call,
            } => {
                let store = self.store.as_ref();
                state.serve_store(store, (session, id), (component, once_ms, call));
                return None;
            }
            calls => return state.relay(session, id, calls),
        };
        Some(Reply::Ok { id, value })
    }

    /// A lock request: a reclaim granted at once or lost; any other waits its turn.
    fn lock(
        &self,
        mut state: std::sync::MutexGuard<'_, State>,
        (session, id): (Session, u64),
        keys: Vec<String>,
        reclaim: bool,
    ) -> Option<Reply> {
        if reclaim {
            // Only while no ordinary request was granted: past the grace period (or on a leader
            // that never had one) the keys may have been held and given back meanwhile.
            let late = Instant::now() >= self.grace_until;
            if late || keys.iter().any(|key| state.held.contains_key(key)) {
                return Some(Reply::Lost { id });
            }
            let token = state.take(session, id, keys);
            return Some(Reply::Ok {
                id,
                value: json!(token),
            });
        }
        state.waiting.push(Waiter { session, id, keys });
        drop(state);
        self.grant();
        None
    }

    /// Grants every waiting lock whose keys are all free, in the order asked (none in the grace
    /// period).
    fn grant(&self) {
        if Instant::now() < self.grace_until {
            return;
        }
        let mut state = self.state.lock().expect("group");
        let waiting = std::mem::take(&mut state.waiting);
        for waiter in waiting {
            if waiter.keys.iter().any(|key| state.held.contains_key(key)) {
                state.waiting.push(waiter);
                continue;
            }
            let token = state.take(waiter.session, waiter.id, waiter.keys);
            let granted = Reply::Ok {
                id: waiter.id,
                value: json!(token),
            };
            state.send(waiter.session, &granted);
        }
    }

    /// A session ended: its holdings released, its waits dropped, its members gone.
    fn close(&self, session: Session) {
        let mut state = self.state.lock().expect("group");
        state.sessions.remove(&session);
        state.waiting.retain(|w| w.session != session);
        let ids: Vec<u64> = state
            .holdings
            .range((session, 0)..=(session, u64::MAX))
            .map(|((_, id), _)| *id)
            .collect();
        for id in ids {
            state.give_back(session, id);
        }
        state.offers.remove(&session);
        let lost: Vec<u64> = state
            .deliveries
            .iter()
            .filter(|(_, d)| d.target == session || d.caller == session)
            .map(|(delivery, _)| *delivery)
            .collect();
        // A leader that stops tells no one: its members count what they were waiting for as
        // gone themselves, as they must when it is killed.
        let stopping = self.stopped.is_cancelled();
        for delivery in lost {
            let delivery = state.deliveries.remove(&delivery).expect("listed");
            if delivery.target == session && !stopping {
                let gone = Reply::Ok {
                    id: delivery.id,
                    value: json!(CallAnswer::Gone),
                };
                state.send(delivery.caller, &gone);
            }
        }
        let now = now_ms();
        for membership in state.views.values_mut() {
            membership.members.retain(|_, (_, of)| *of != session);
            membership.renew(now, self.first_epoch);
        }
        drop(state);
        self.grant();
    }
}

impl State {
    /// What members serve, the calls and events handed between them.
    fn relay(&mut self, session: Session, id: u64, op: Op) -> Option<Reply> {
        match op {
            Op::Offer {
                instance,
                components,
                receivers,
            } => {
                let offer = Offer {
                    instance,
                    components,
                    receivers,
                };
                self.offers.insert(session, offer);
            }
            Op::Publish { label, event } => self.hand_out_event(&label, &event),
            Op::Call {
                component,
                instance,
                call,
            } => return self.hand_out(session, id, component, instance.as_deref(), call),
            Op::Answer { delivery, answer } => {
                // Only from the member it was handed to: numbers of another leader's deliveries
                // may come late on a new connection.
                let handed_here = self.deliveries.get(&delivery).map(|d| d.target) == Some(session);
                if let Some(delivery) = self.deliveries.remove(&delivery).filter(|_| handed_here) {
                    let reply = Reply::Ok {
                        id: delivery.id,
                        value: answer,
                    };
                    self.send(delivery.caller, &reply);
                }
                return None;
            }
            _ => unreachable!("the other requests are handled before"),
        }
        Some(Reply::Ok {
            id,
            value: Value::Null,
        })
    }

    /// Runs a store method on the component's store, answering when it is done.
    fn serve_store(
        &mut self,
        store: Option<&StoreService>,
        (session, id): (Session, u64),
        (component, once_ms, call): (String, u64, Value),
    ) {
        let sender = self.sessions.get(&session).cloned();
        let run = store.map(|store| store(component, once_ms, call));
        tokio::spawn(async move {
            let answer = match run {
                Some(run) => run.await,
                None => Err("this leader keeps no store".to_owned()),
            };
            let reply = match answer {
                Ok(value) => Reply::Ok { id, value },
                Err(message) => Reply::Error { id, message },
            };
            if let Some(sender) = sender {
                let _ = sender.send(wire::line(&reply));
            }
        });
    }

    fn send(&self, session: Session, reply: &Reply) {
        if let Some(sender) = self.sessions.get(&session) {
            let _ = sender.send(wire::line(reply));
        }
    }

    /// Hands `event` to one member per component receiving its label, in turn.
    fn hand_out_event(&mut self, label: &str, event: &Value) {
        let mut receiving: BTreeMap<&str, Vec<Session>> = BTreeMap::new();
        for (session, offer) in &self.offers {
            for (component, labels) in &offer.receivers {
                if labels.iter().any(|l| l == label) {
                    receiving.entry(component).or_default().push(*session);
                }
            }
        }
        let mut handed = Vec::new();
        for (component, sessions) in receiving {
            let turn = self.turns.entry(format!("{component} events")).or_default();
            *turn = turn.wrapping_add(1);
            handed.push((sessions[*turn % sessions.len()], component.to_owned()));
        }
        for (session, component) in handed {
            let event = event.clone();
            self.send(session, &Reply::Event { component, event });
        }
    }

    /// Picks the member to run a call: the one named, else the next in turn of those serving
    /// the component. Answers the caller at once when that is itself or nobody.
    fn hand_out(
        &mut self,
        caller: Session,
        id: u64,
        component: String,
        instance: Option<&str>,
        call: Value,
    ) -> Option<Reply> {
        let serving: Vec<Session> = self
            .offers
            .iter()
            .filter(|(_, offer)| offer.components.contains(&component))
            .filter(|(_, offer)| instance.is_none_or(|name| offer.instance == name))
            .map(|(session, _)| *session)
            .collect();
        let target = match serving.len() {
            0 => None,
            n => {
                let turn = self.turns.entry(component.clone()).or_default();
                *turn = turn.wrapping_add(1);
                Some(serving[*turn % n])
            }
        };
        let answer = match target {
            None => CallAnswer::Nobody,
            Some(target) if target == caller => CallAnswer::Here,
            Some(target) => {
                self.next_delivery += 1;
                let delivery = self.next_delivery;
                let deliver = Reply::Deliver {
                    delivery,
                    component,
                    call,
                };
                self.send(target, &deliver);
                let handed = Delivery { caller, id, target };
                self.deliveries.insert(delivery, handed);
                return None;
            }
        };
        Some(Reply::Ok {
            id,
            value: json!(answer),
        })
    }

    fn take(&mut self, session: Session, id: u64, keys: Vec<String>) -> u64 {
        for key in &keys {
            self.held.insert(key.clone(), (session, id));
        }
        self.holdings.insert((session, id), keys);
        self.fence += 1;
        self.fence
    }

    /// Releases a holding; whether there was one.
    fn give_back(&mut self, session: Session, id: u64) -> bool {
        let Some(keys) = self.holdings.remove(&(session, id)) else {
            return false;
        };
        for key in keys {
            self.held.remove(&key);
        }
        true
    }
}
