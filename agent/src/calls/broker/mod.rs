//! Calls over RabbitMQ (DESIGN decision 5), through `lapin`.
//!
//! Queues (default exchange, routing key = queue name), for application `app` (the shared ones,
//! and who declares them, in [`queues`]):
//! - `toa.app.{component}` (ordinary calls) and `toa.app.{component}#tasks` (tasks, durable),
//!   shared by the component's replicas, and `#dead` for calls at the delivery limit;
//! - `toa.app.{component}@{instance}`: calls to one process, declared *exclusive* by that process,
//!   so only one process holds a name. Another process given the same name logs
//!   `Instance name taken` and keeps trying until the name is free;
//! - a server-named exclusive queue per process for its replies;
//! - `toa.app#events`, a durable topic exchange: events, by label ([`events`]).
//!
//! A call to one process is published `mandatory` with publisher confirms: unroutable means no
//! process holds the name (`Addressee`); no reply before the deadline means `Abandoned`. It carries
//! its deadline twice: as the message's TTL (a call still queued at its deadline is dropped by the
//! broker) and as a header the receiving agent checks when it takes the message, so a call not
//! started before its deadline never runs. Calls still run concurrently, up to [`PREFETCH`] at a
//! time per queue.
//!
//! The connection's heartbeat is [`HEARTBEAT_S`] seconds (`TOA_AMQP_HEARTBEAT`): the broker drops
//! the connection of a process that stopped answering (a lost node) after about that long, and
//! with it the process's own queue, so calls to it are `Abandoned` (queued, never answered) until
//! then and `Addressee` after. When the connection ends (a broker restart, a network failure),
//! calls waiting for a reply end at once (`Abandoned` for a call to one process; an ordinary call
//! fails: it may have run), calls to a process are `Addressee` while the agent reconnects, and
//! ordinary calls wait for the connection. Once back, the agent declares its queues again and
//! answers under its name (see [`session`]).

use crate::calls::activity::Activity;
use crate::calls::contract::CallError;
use crate::component::client::{Outcome, ProgramClient};
use crate::component::Component;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
use serde_json::{json, Value};
use session::{Session, Settings};
use std::sync::{Arc, Weak};
use std::time::Duration;
use toa_context::answer::{Refusal, Reply};
use toa_context::tls::Roots;
use toa_context::{AmqpAddress, Credentials, Limits};
use tokio::sync::watch;

pub use receive::{pause, Incoming, Receive, Receiving, Verdict};
pub use requeue::requeue;

mod events;
mod headers;
mod queues;
mod receive;
mod requeue;
mod serve;
mod session;

/// How many calls one queue's consumer runs at once, unless `TOA_PREFETCH` says otherwise.
pub const PREFETCH: u16 = 32;
/// The AMQP heartbeat in seconds, unless `TOA_AMQP_HEARTBEAT` says otherwise.
pub const HEARTBEAT_S: u16 = 10;
/// The largest AMQP frame, in bytes. lapin keeps 32 frames of buffer each way per connection:
/// the broker's default (128 KiB) costs 8 MB of memory, this 2 MB. Larger messages are split.
const FRAME_MAX: u32 = 32 * 1024;
/// How long an ordinary call or task waits for its component's queue to exist.
const QUEUE_WAIT: Duration = Duration::from_secs(30);
/// How long a call without a deadline (ordinary, task) waits for the broker to confirm it.
const CONFIRM_LIMIT: Duration = Duration::from_secs(30);
/// The longest pause between two attempts to reconnect.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("the broker at {address} is unreachable: {message}")]
    Unreachable { address: String, message: String },
    #[error("the broker refused {what}: {message}")]
    Refused { what: String, message: String },
    #[error("{name} must be a whole number from {min} to {max}, got {value:?}")]
    Setting {
        name: &'static str,
        min: u16,
        max: u16,
        value: String,
    },
}

/// One call as it is sent.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub component: &'a str,
    pub operation: &'a str,
    pub input: &'a Value,
    /// The process a stateful call goes to.
    pub instance: Option<&'a str>,
    /// The idempotency key.
    pub key: Option<&'a str>,
    /// The object it works on.
    pub query: Option<&'a crate::calls::contract::Query>,
    /// Sent without waiting for a reply.
    pub task: bool,
}

/// What a process offers to serve: one component, its program, and what tells whether it can
/// take a call now.
pub struct Offer {
    pub component: Arc<Component>,
    pub client: ProgramClient,
    /// This process's name.
    pub instance: String,
    /// Operations are served (preflight ran).
    pub serving: watch::Receiver<bool>,
    /// The program answers.
    pub alive: watch::Receiver<bool>,
    /// Calls received count here.
    pub activity: Arc<Activity>,
    /// `toa_calls_dead_lettered_total` of the component.
    pub dead_lettered: prometheus_client::metrics::counter::Counter,
    /// The records of calls given a key.
    pub repeats: Arc<crate::coordination::atom::repeats::Repeats>,
    /// The counts of redelivered calls.
    pub redeliveries: Arc<crate::coordination::atom::redeliveries::Redeliveries>,
    /// Its objects, when it declares an entity.
    pub objects: Option<Arc<crate::entities::objects::Objects>>,
    /// Counts and times its operations' runs.
    pub operations: crate::metrics::Operations,
}

/// A component served by this process: replayed on every session.
#[derive(Clone)]
struct Served {
    component: Arc<Component>,
    client: ProgramClient,
    instance: String,
    serving: watch::Receiver<bool>,
    /// Calls received count here: a halt waits for them.
    activity: Arc<Activity>,
    /// True once the drain began: calls not started are given back or refused.
    draining: watch::Receiver<bool>,
    /// Whether the component's program answers: while it does not, its calls go elsewhere.
    alive: watch::Receiver<bool>,
    /// How long the program may take to answer an ordinary call.
    operation_limit: Duration,
    /// How many deliveries a call gets before it is dead-lettered.
    deliveries: u32,
    /// The largest call taken, in bytes (`limits.message`).
    message_limit: usize,
    /// Calls dead-lettered: `toa_calls_dead_lettered_total`.
    dead_lettered: prometheus_client::metrics::counter::Counter,
    repeats: Arc<crate::coordination::atom::repeats::Repeats>,
    redeliveries: Arc<crate::coordination::atom::redeliveries::Redeliveries>,
    objects: Option<Arc<crate::entities::objects::Objects>>,
    operations: crate::metrics::Operations,
    /// How long a key's outcome answers repeats.
    idempotency: Duration,
    /// Where calls at the delivery limit go.
    dead_queue: String,
}

pub struct Broker {
    settings: Settings,
    names: queues::Names,
    limits: Limits,
    prefetch: u16,
    /// The open session; `None` while reconnecting.
    current: watch::Sender<Option<Arc<Session>>>,
    served: tokio::sync::Mutex<Vec<Served>>,
    /// The components receiving events here.
    receiving: tokio::sync::Mutex<Vec<Receiving>>,
    draining: watch::Sender<bool>,
}

/// A call's properties: its id, persistent for a task (kept through a broker restart, as the
/// tasks queue is), where an ordinary call's reply goes, and the caller's deadline (the broker
/// drops the call if it is still queued then).
fn properties(
    id: &str,
    session: &Session,
    task: bool,
    deadline_ms: Option<i64>,
) -> BasicProperties {
    let mut properties = BasicProperties::default().with_correlation_id(id.into());
    properties = if task {
        properties.with_delivery_mode(2)
    } else {
        properties.with_reply_to(session.replies.as_str().into())
    };
    // The table only when there is something to put in it: most calls have no deadline, and
    // without an exporter most have no trace.
    let trace = crate::traces::current();
    if deadline_ms.is_none() && trace.is_none() {
        return properties;
    }
    let mut table = FieldTable::default();
    if let Some(deadline_ms) = deadline_ms {
        table.insert(
            ShortString::from(headers::DEADLINE),
            AMQPValue::LongLongInt(deadline_ms),
        );
        let left = (deadline_ms - now_ms()).max(1);
        properties = properties.with_expiration(left.to_string().into());
    }
    for (name, value) in trace
        .iter()
        .flat_map(toa_context::trace::TraceContext::write)
    {
        table.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
    }
    properties.with_headers(table)
}

/// A reply: refused by the receiving agent (the process was leaving, or the call broke the
/// declarations), the program's outcome, or a failure.
/// A call as it travels: `{"operation", "input", "key"?, "query"?}`.
fn message(
    operation: &str,
    input: &Value,
    key: Option<&str>,
    query: Option<&crate::calls::contract::Query>,
) -> Vec<u8> {
    let mut message = json!({"operation": operation, "input": input});
    if let Some(key) = key {
        message["key"] = json!(key);
    }
    if let Some(query) = query {
        message["query"] = json!(query);
    }
    serde_json::to_vec(&message).expect("JSON")
}

fn read_reply(reply: Value, addressee: impl Fn() -> CallError) -> Result<Outcome, CallError> {
    match Reply::from_json(&reply) {
        Reply::Outcome(outcome) => Ok(outcome),
        // The process was leaving when the call reached it: the call did not run.
        Reply::Refused(Refusal::Addressee) => Err(addressee()),
        Reply::Refused(Refusal::RequestContract(message)) => {
            Err(CallError::RequestContract(message))
        }
        Reply::Failure(failure) => Err(CallError::Failed(failure)),
    }
}

pub use toa_context::program::now_ms;

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The connection's tuning: `TOA_AMQP_HEARTBEAT` and `TOA_PREFETCH` (docs/context.md), read
/// with the rest of the configuration, before anything starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    pub heartbeat: u16,
    pub prefetch: u16,
}

impl Tuning {
    pub fn from_env() -> Result<Self, BrokerError> {
        Ok(Self {
            heartbeat: setting("TOA_AMQP_HEARTBEAT", HEARTBEAT_S, 3600)?,
            prefetch: setting("TOA_PREFETCH", PREFETCH, u16::MAX)?,
        })
    }
}

/// A positive number from the environment, or `default` when the variable is not set.
fn setting(name: &'static str, default: u16, max: u16) -> Result<u16, BrokerError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(value) => value
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or(BrokerError::Setting {
                name,
                min: 1,
                max,
                value,
            }),
    }
}

impl Broker {
    /// Connects as `instance` of `application`, named as on shared servers
    /// ([`toa_context::annotations::shared_name`]: in a pod with its Kubernetes namespace),
    /// which its queues and its connection's name carry.
    pub async fn connect(
        address: &AmqpAddress,
        (credentials, roots): (&Credentials, &Roots),
        application: &str,
        instance: &str,
        limits: &Limits,
        tuning: Tuning,
    ) -> Result<Arc<Self>, BrokerError> {
        let Tuning {
            heartbeat,
            prefetch,
        } = tuning;
        let user = credentials.username.as_deref().unwrap_or("guest");
        let password = credentials
            .password
            .as_ref()
            .map_or("guest", |p| p.expose());
        let settings = Settings {
            uri: format!(
                "{}://{}:{}@{}:{}/{}?heartbeat={heartbeat}&frame_max={FRAME_MAX}",
                if address.tls { "amqps" } else { "amqp" },
                encode(user),
                encode(password),
                address.host,
                address.port,
                encode(&address.vhost)
            ),
            shown: address.to_string(),
            name: format!("toa-agent {application} {instance}"),
            roots: roots.clone(),
        };
        let session = session::Opening::default()
            .next(&settings)
            .await
            .map_err(|error| BrokerError::Unreachable {
                address: settings.shown.clone(),
                message: error.to_string(),
            })?;
        let (current, _) = watch::channel(Some(session));
        let broker = Arc::new(Self {
            settings,
            names: queues::Names::new(application),
            limits: limits.clone(),
            prefetch,
            current,
            served: tokio::sync::Mutex::default(),
            receiving: tokio::sync::Mutex::default(),
            draining: watch::channel(false).0,
        });
        tokio::spawn(keep_connected(Arc::downgrade(&broker)));
        Ok(broker)
    }

    /// Where an ordinary call or task to `component` goes: a call to its calls queue, a task to
    /// its tasks queue once a replica of this version declared it, else (a rollout: only older
    /// replicas run) to the calls queue. With neither yet (the component was never served), it
    /// waits up to [`QUEUE_WAIT`].
    async fn route(
        &self,
        session: &Session,
        component: &str,
        task: bool,
    ) -> Result<String, CallError> {
        let calls = self.names.calls(component);
        let candidates = if task {
            vec![self.names.tasks(component), calls]
        } else {
            vec![calls]
        };
        // Only the first choice is taken from what this session saw: a task must not go to the
        // transient calls queue because an ordinary call found that queue first (issue 25: 100
        // accepted tasks went there and were lost in a broker restart). The fallback, for agents
        // before `#tasks`, is checked anew each time.
        let preferred = &candidates[0];
        if session
            .declared
            .lock()
            .expect("declared")
            .contains(preferred)
        {
            return Ok(preferred.clone());
        }
        let unavailable =
            |message: String| CallError::Unavailable(format!("{}: {message}", self.settings.shown));
        let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
        loop {
            for queue in &candidates {
                if queues::exists(session, queue)
                    .await
                    .map_err(|e| unavailable(e.to_string()))?
                {
                    session
                        .declared
                        .lock()
                        .expect("declared")
                        .insert(queue.clone());
                    return Ok(queue.clone());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(format!(
                    "no replica of {component} has served it yet: its queue {} does not exist \
                     after {} s",
                    candidates[0],
                    QUEUE_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The open session, unless the connection is gone.
    fn session(&self) -> Option<Arc<Session>> {
        self.current
            .borrow()
            .as_ref()
            .filter(|s| !s.is_lost())
            .cloned()
    }

    /// Waits until a session is open.
    async fn next_session(&self) -> Arc<Session> {
        let mut current = self.current.subscribe();
        loop {
            if let Some(session) = self.session() {
                return session;
            }
            if current.changed().await.is_err() {
                // The sender lives as long as `self`.
                unreachable!("the broker's session watch closed while the broker lives");
            }
        }
    }

    /// Sends a call and waits for its reply (not for a task). `timeout` is set for calls to one
    /// process: their deadline, which counts from here (the callee is found) and covers every
    /// wait after it: the publish, the broker's confirm and the reply. A missed deadline is
    /// `Abandoned`, whichever wait it was in.
    pub async fn call(
        &self,
        call: Call<'_>,
        timeout: Option<Duration>,
    ) -> Result<Outcome, CallError> {
        let component = call.component;
        let Some(limit) = timeout else {
            return self.send(call, None).await;
        };
        let deadline_ms = now_ms().saturating_add(limit.as_millis() as i64);
        let sent = self.send(call, Some(deadline_ms));
        let abandoned = || CallError::Abandoned {
            component: component.to_owned(),
            timeout_ms: limit.as_millis() as u64,
        };
        match tokio::time::timeout(limit, sent).await {
            // A failure that comes back at the deadline is the deadline's: the callee's program
            // was cut off by it.
            Ok(Err(CallError::Failed(_))) if now_ms() >= deadline_ms => Err(abandoned()),
            Ok(Err(CallError::Abandoned { .. })) => Err(abandoned()),
            Ok(result) => result,
            Err(_) => Err(abandoned()),
        }
    }

    async fn send(&self, call: Call<'_>, deadline_ms: Option<i64>) -> Result<Outcome, CallError> {
        let Call {
            component,
            operation,
            input,
            instance,
            key,
            query,
            task,
        } = call;
        let addressee = || CallError::Addressee {
            component: component.to_owned(),
            instance: instance.unwrap_or_default().to_owned(),
        };
        let session = match (self.session(), instance) {
            (Some(session), _) => session,
            // Reconnecting: no process holds a name on this broker connection.
            (None, Some(_)) => return Err(addressee()),
            (None, None) => self.next_session().await,
        };
        let mut queue = match instance {
            Some(instance) => self.names.own(component, instance),
            None => self.route(&session, component, task).await?,
        };
        let id = crate::component::client::new_id();
        let body = message(operation, input, key, query);
        let properties = properties(&id, &session, task, deadline_ms);
        let receiver = (!task).then(|| session.expect(&id));
        let _forget = Forget {
            session: &session,
            id: &id,
        };
        let publish = |queue: String, properties: BasicProperties| {
            self.publish(
                &session,
                queue,
                &body,
                properties,
                instance.is_some(),
                addressee,
            )
        };
        let mut confirm = publish(queue.clone(), properties.clone()).await?;
        if instance.is_none() && matches!(confirm, Confirmation::Ack(Some(_))) {
            session.declared.lock().expect("declared").remove(&queue);
            queue = self.route(&session, component, task).await?;
            confirm = publish(queue.clone(), properties).await?;
        }
        self.confirmed(confirm, &queue, instance.is_some(), addressee)?;
        let Some(receiver) = receiver else {
            return Ok(Outcome::Reply(Value::Null));
        };
        let reply = receiver
            .await
            .map_err(|_| self.reply_lost(component, deadline_ms))?;
        read_reply(reply, addressee)
    }

    /// Publishes one call and waits for the broker's confirm. Mandatory for every call: a call
    /// to a process nobody holds is an Addressee; an ordinary call whose queue vanished
    /// (deleted, or the legacy queue gone with its broker) is routed again.
    async fn publish(
        &self,
        session: &Session,
        queue: String,
        body: &[u8],
        properties: BasicProperties,
        named: bool,
        addressee: impl Fn() -> CallError,
    ) -> Result<Confirmation, CallError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let sent = async {
            session
                .channel
                .basic_publish("".into(), queue.as_str().into(), options, body, properties)
                .await?
                .await
        };
        // Without a deadline of its own, a call waits for the broker's confirm this long.
        let sent = tokio::time::timeout(CONFIRM_LIMIT, sent)
            .await
            .map_err(|_| {
                CallError::Unavailable(format!(
                    "{}: the broker did not confirm the call within {} s; it may have been taken",
                    self.settings.shown,
                    CONFIRM_LIMIT.as_secs()
                ))
            })?;
        sent.map_err(|e| {
            // A channel the broker closed ends the session: the next call gets a new one.
            session.check_channels();
            if named && session.is_lost() {
                addressee()
            } else {
                self.failed(&e.to_string())
            }
        })
    }

    /// What the broker's confirm says: taken, or refused (returned unroutable, or nacked).
    fn confirmed(
        &self,
        confirm: Confirmation,
        queue: &str,
        named: bool,
        addressee: impl Fn() -> CallError,
    ) -> Result<(), CallError> {
        match confirm {
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) if !named => {
                Err(self.failed(&format!("the queue {queue} takes no calls")))
            }
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => Err(addressee()),
            // With `reject-publish`, a full queue refuses the message.
            Confirmation::Nack(None) if !named => Err(CallError::Unavailable(format!(
                "the queue {queue} is full (it holds at most limits.queue calls, {} here); \
                 try again later",
                self.limits.queue
            ))),
            Confirmation::Nack(None) => Err(self.failed("the broker did not take the call")),
            _ => Ok(()),
        }
    }

    /// The connection ended before the reply came: it will not come.
    fn reply_lost(&self, component: &str, deadline_ms: Option<i64>) -> CallError {
        match deadline_ms {
            // `call` names the timeout.
            Some(_) => CallError::Abandoned {
                component: component.to_owned(),
                timeout_ms: 0,
            },
            None => self.failed(
                "the connection to the broker ended before the reply came; the call may have run",
            ),
        }
    }

    fn failed(&self, message: &str) -> CallError {
        CallError::Failed(format!("{}: {message}", self.settings.shown))
    }

    /// Takes calls for a component from its queues, on this connection and on every one after
    /// it. Never fails after it started: a name taken by another process is retried.
    pub async fn serve(&self, offer: Offer) -> Result<(), BrokerError> {
        let served = Served {
            dead_queue: self.names.dead(&offer.component.name),
            component: offer.component,
            client: offer.client,
            instance: offer.instance,
            serving: offer.serving,
            activity: offer.activity,
            alive: offer.alive,
            operation_limit: self.limits.operation,
            deliveries: self.limits.deliveries,
            message_limit: self.limits.message as usize,
            dead_lettered: offer.dead_lettered,
            repeats: offer.repeats,
            redeliveries: offer.redeliveries,
            objects: offer.objects,
            operations: offer.operations,
            idempotency: self.limits.idempotency,
            draining: self.draining.subscribe(),
        };
        let mut all = self.served.lock().await;
        if let Some(session) = self.session() {
            match self.serve_on(&session, &served).await {
                Ok(()) => {}
                // The connection went meanwhile (RabbitMQ 3.10 may even drop it when a quorum
                // queue is consumed the moment it was declared): the next session serves it.
                Err(error) if session.is_lost() => {
                    tracing::warn!(%error, "the connection ended while starting to serve; serving on the next one");
                }
                Err(error) => return Err(error),
            }
        }
        all.push(served);
        Ok(())
    }

    /// The drain's part on the broker (docs/calls.md, "Stopping"): this process's names are
    /// given up first (its queues deleted, so a call naming it is `Addressee` at once, and calls
    /// already delivered are answered `Addressee`), the shared queues' consumers cancelled (calls
    /// delivered but not started go back to the broker, for other replicas), then the calls
    /// running here are waited for, up to `budget`. Returns how many still run.
    pub async fn drain(&self, activity: &Activity, budget: Duration) -> u64 {
        self.draining.send_replace(true);
        if let Some(session) = self.session() {
            let consumers = session.consumers();
            for consumer in consumers.iter().filter(|c| c.own) {
                give_up_name(&session, consumer).await;
            }
            for consumer in consumers.iter().filter(|c| !c.own) {
                let cancelled = consumer
                    .channel
                    .basic_cancel(consumer.tag.clone(), Default::default())
                    .await;
                if let Err(error) = cancelled {
                    tracing::warn!(%error, queue = %consumer.queue, "cannot stop taking calls");
                }
            }
        }
        activity.settled(budget).await
    }

    /// Serves and receives on a new session what the last one did.
    async fn replay(&self, session: &Arc<Session>) -> Result<(), BrokerError> {
        for one in self.served.lock().await.iter() {
            self.serve_on(session, one).await?;
        }
        for one in self.receiving.lock().await.iter() {
            self.receive_on(session, one).await?;
        }
        Ok(())
    }

    async fn serve_on(&self, session: &Arc<Session>, served: &Served) -> Result<(), BrokerError> {
        let name = &served.component.name;
        let queues = serve::Queues {
            tasks: self.names.tasks(name),
            arguments: queues::arguments(&self.limits, &self.names.dead(name)),
            calls: self.names.calls(name),
            dead: self.names.dead(name),
            own: self.names.own(name, &served.instance),
        };
        let what = format!("serving {}", queues.calls);
        serve::serve(session, served, queues, self.prefetch)
            .await
            .map_err(|e| BrokerError::Refused {
                what,
                message: e.to_string(),
            })
    }
}

/// Watches the session; when its connection ends, opens the next one (backing off up to
/// [`RECONNECT_MAX`]) and serves every served component on it again.
async fn keep_connected(broker: Weak<Broker>) {
    loop {
        let Some(session) = broker.upgrade().and_then(|b| b.current.borrow().clone()) else {
            return;
        };
        session.lost.cancelled().await;
        // Lost for a closed channel, the connection may still be open: close it, so its
        // queues (this process's name) go and the next session can take them.
        if session.connection.status().connected() {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                session.connection.close(200, "a new session".into()),
            )
            .await;
        }
        drop(session);
        let Some(this) = broker.upgrade() else { return };
        this.current.send_replace(None);
        tracing::warn!(
            broker = %this.settings.shown,
            "the connection to the broker ended: calls to named processes are Addressee and waiting calls are abandoned; reconnecting"
        );
        let mut pause = Duration::from_millis(100);
        let mut opening = session::Opening::default();
        loop {
            match opening.next(&this.settings).await {
                Ok(session) if *this.draining.borrow() => {
                    // Draining: calls out only; nothing is served any more.
                    this.current.send_replace(Some(session));
                    break;
                }
                Ok(session) => {
                    let replayed = this.replay(&session).await;
                    match replayed {
                        Ok(()) => {
                            this.current.send_replace(Some(session));
                            tracing::info!(broker = %this.settings.shown, "reconnected to the broker");
                            break;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "reconnected, but cannot serve; trying again")
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, broker = %this.settings.shown, "the broker is still unreachable")
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }
}

/// Stops consuming this process's own queue, answers what it still holds `Addressee`, and
/// deletes it: from then on a call naming the process is unroutable, so `Addressee` at once. The
/// queue is deleted only while empty (`if-empty`, checked by the broker): a call that arrives
/// after the last sweep makes the delete fail, and the sweep runs again, so no call is deleted
/// with the queue unanswered (it was: its caller waited for its whole timeout).
async fn give_up_name(session: &Session, consumer: &session::Consuming) {
    let queue = consumer.queue.as_str();
    if let Err(error) = consumer
        .channel
        .basic_cancel(consumer.tag.clone(), Default::default())
        .await
    {
        tracing::warn!(%error, %queue, "cannot stop taking calls under this name");
    }
    for _ in 0..GIVE_UP_SWEEPS {
        // A refused delete closes its channel: each sweep has its own.
        let channel = match session.connection.create_channel().await {
            Ok(channel) => channel,
            Err(error) => {
                tracing::warn!(%error, %queue, "cannot give up this name");
                return;
            }
        };
        answer_leftovers(session, &channel, queue).await;
        let options = lapin::options::QueueDeleteOptions {
            if_empty: true,
            ..Default::default()
        };
        match channel.queue_delete(queue.into(), options).await {
            Ok(_) => return,
            Err(error) if error.to_string().contains("PRECONDITION_FAILED") => {}
            Err(error) => {
                tracing::warn!(%error, %queue, "cannot give up this name");
                return;
            }
        }
    }
    tracing::warn!(%queue, "calls keep arriving under this name; it is deleted with what it holds");
    if let Ok(channel) = session.connection.create_channel().await {
        let _ = channel.queue_delete(queue.into(), Default::default()).await;
    }
}

/// How many times the name's queue is swept before it is deleted whatever it holds.
const GIVE_UP_SWEEPS: usize = 20;

/// Answers `Addressee` to every call the queue holds.
async fn answer_leftovers(session: &Session, channel: &lapin::Channel, queue: &str) {
    loop {
        match channel
            .basic_get(queue.into(), lapin::options::BasicGetOptions::default())
            .await
        {
            Ok(Some(message)) => {
                serve::finish(session, &message.delivery, serve::Handled::Addressee).await
            }
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, %queue, "cannot answer the calls left under this name");
                return;
            }
        }
    }
}

/// Removes a call's waiter however the call ends (also when the caller gives up).
struct Forget<'a> {
    session: &'a Session,
    id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.session.forget(self.id);
    }
}
