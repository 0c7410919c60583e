//! The callee's side: taking calls from a component's shared queue and from this process's own
//! queue on one session, running them on the program, and replying.

use super::headers::{self, DELIVERY};
use super::queues::Declared;
use super::session::{Consuming, Session};
use super::{now_ms, Served};
use crate::calls::contract::START_MARGIN;
use crate::calls::once::{run_once, Once};
use crate::component::client::{CallMeta, Outcome, ProgramError};
use crate::traces::{self, Span};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use toa_context::answer::{Refusal, Reply};

/// The queues one served component takes calls from (see [`super::queues`]).
pub(super) struct Queues {
    pub tasks: String,
    pub arguments: FieldTable,
    pub calls: String,
    pub dead: String,
    pub own: String,
}

/// Which of them a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// This process's own: calls to it by name.
    Own,
    /// The transient queue of ordinary calls: this agent counts their deliveries.
    Calls,
    /// The durable quorum queue of tasks: the broker counts their deliveries.
    Tasks,
}

/// Serves `served` on `session` until the session ends: the shared queues and the dead letters
/// at once, the instance queue as soon as no other process holds the name.
pub(super) async fn serve(
    session: &Arc<Session>,
    served: &Served,
    queues: Queues,
    prefetch: u16,
) -> Result<(), lapin::Error> {
    let Queues {
        tasks,
        arguments,
        calls,
        dead,
        own,
    } = queues;
    super::queues::declare_dead(session, &dead).await?;
    if let Declared::AsFound(refusal) =
        super::queues::declare_shared(session, &tasks, arguments).await?
    {
        tracing::warn!(
            queue = %tasks,
            %refusal,
            "the queue exists with other arguments (another limits.queue or limits.deliveries): serving it as it is; the new ones apply once it is deleted, when no replica uses the old ones"
        );
    }
    let channel = session.connection.create_channel().await?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    consume(session, channel, tasks.clone(), served, Kind::Tasks).await?;
    // Declared as agents have always declared it: transient, without arguments.
    let channel = declare(session, &calls, false, prefetch).await?;
    consume(session, channel, calls.clone(), served, Kind::Calls).await?;
    session
        .declared
        .lock()
        .expect("declared")
        .extend([tasks, calls]);
    let channel = session.connection.create_channel().await?;
    answer_dead(session, channel, dead, served).await?;
    tokio::spawn(take_name_when_free(
        session.clone(),
        served.clone(),
        own,
        prefetch,
    ));
    Ok(())
}

/// Consumes the instance queue once no other process holds the name, trying every second.
async fn take_name_when_free(session: Arc<Session>, served: Served, own: String, prefetch: u16) {
    let mut warned = false;
    while !session.is_lost() && !*served.draining.borrow() {
        match take_name(&session, &own, prefetch).await {
            Ok(channel) => {
                if warned {
                    tracing::info!(queue = %own, "instance name free again: answering under it");
                }
                if let Err(error) =
                    consume(&session, channel, own.clone(), &served, Kind::Own).await
                {
                    tracing::warn!(%error, "cannot consume the instance queue");
                }
                return;
            }
            Err(error) if error.to_string().contains("RESOURCE_LOCKED") => {
                if !warned {
                    tracing::warn!(queue = %own, "Instance name taken: another process holds it; trying again every second");
                    warned = true;
                }
            }
            Err(error) if session.is_lost() => {
                tracing::debug!(%error, "the session ended while taking the instance name");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, queue = %own, "cannot declare the instance queue; trying again")
            }
        }
        tokio::select! {
            () = session.lost.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The instance queue, declared exclusive: the broker refuses it while another process holds it,
/// and deletes it with this process's connection. Not auto-delete: that deleted it, with the calls
/// it held, the moment the drain cancelled its consumer, before they were answered `Addressee`.
async fn take_name(session: &Session, queue: &str, prefetch: u16) -> Result<Channel, lapin::Error> {
    declare(session, queue, true, prefetch).await
}

/// A channel taking `prefetch` calls at a time, with `queue` declared on it.
async fn declare(
    session: &Session,
    queue: &str,
    exclusive: bool,
    prefetch: u16,
) -> Result<Channel, lapin::Error> {
    let channel = session.connection.create_channel().await?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                exclusive,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(channel)
}

/// Consumes `queue` on `channel`. The shared queue's consumer steps back while the program is
/// down (cancelled, so the broker gives its calls to other replicas) and comes back with it; the
/// first consumer is started here, so an error in it is the caller's.
async fn consume(
    session: &Arc<Session>,
    channel: Channel,
    queue: String,
    served: &Served,
    kind: Kind,
) -> Result<(), lapin::Error> {
    let own = kind == Kind::Own;
    let mut consumer = start_consumer(session, &channel, &queue, own).await?;
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let mut alive = served.alive.clone();
        loop {
            let stepped_back = loop {
                tokio::select! {
                    delivery = consumer.next() => match delivery {
                        Some(Ok(delivery)) => handle_apart(&session, &served, delivery, kind),
                        _ => break false,
                    },
                    _ = alive.wait_for(|alive| !*alive), if !own => break true,
                }
            };
            if !stepped_back {
                break;
            }
            tracing::warn!(%queue, "the program is down: its calls go to other replicas until it is back");
            step_back(&session, &channel, &mut consumer).await;
            tokio::select! {
                _ = alive.wait_for(|alive| *alive) => {}
                () = session.lost.cancelled() => return,
            }
            if *served.draining.borrow() {
                return;
            }
            tracing::info!(%queue, "the program is back: taking its calls again");
            consumer = match start_consumer(&session, &channel, &queue, own).await {
                Ok(consumer) => consumer,
                Err(error) => {
                    tracing::warn!(%error, %queue, "cannot take calls again; the session will be replaced");
                    session.check_channels();
                    return;
                }
            };
        }
        // Ended under a living connection (the broker's consumer timeout closed its channel, or
        // the queue was deleted): nothing would take its calls, and an own queue would keep the
        // name from every other process. A new session serves everything again.
        if !session.is_lost() && !*served.draining.borrow() {
            tracing::warn!(%queue, "the consumer stopped: opening a new session");
            session.lost.cancel();
        }
    });
    Ok(())
}

/// Handles `delivery` on a task of its own, in flight until the caller is answered or the call
/// given back, so the drain waits for that too.
fn handle_apart(session: &Arc<Session>, served: &Served, delivery: Delivery, kind: Kind) {
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let number = delivery_number(&delivery, &served, kind).await;
        if kind == Kind::Calls && number > i64::from(served.deliveries) {
            // Redelivered past the limit (its agents died under it): it does not run again.
            let handled = publish_counted(&session, &delivery, &served.dead_queue, number).await;
            return finish(&session, &delivery, handled).await;
        }
        let mut in_flight = None;
        let trace = headers::trace(delivery.properties.headers().as_ref());
        let mut span = Span::start(
            || format!("receive {}", served.component.name),
            traces::Kind::Consumer,
            trace,
        );
        let own = kind == Kind::Own;
        let handled = traces::within(
            span.context(),
            handle(&delivery, &served, own, &mut in_flight),
        )
        .await;
        if let Some(why) = unanswered(&handled) {
            span.fail(|| why.to_owned());
        }
        let handled = give_back(&session, &delivery, handled, &served, (kind, number)).await;
        finish(&session, &delivery, handled).await;
        drop(span);
        drop(in_flight);
    });
}

/// The number of this delivery of an ordinary call: the number it was published with, plus the
/// broker's redeliveries of that publication, counted on Redis where there is one (see
/// [`crate::coordination::atom::redeliveries`]), else one for a redelivery.
async fn delivery_number(delivery: &Delivery, served: &Served, kind: Kind) -> i64 {
    let published = headers::published(delivery.properties.headers().as_ref(), served.deliveries);
    if kind != Kind::Calls || !delivery.redelivered {
        return published + i64::from(delivery.redelivered);
    }
    let id = delivery
        .properties
        .correlation_id()
        .as_ref()
        .map_or("", |id| id.as_str());
    // Kept while the call may still go round: each delivery may take the operation's limit.
    let ttl = served.operation_limit * (served.deliveries + 1);
    match served.redeliveries.count(id, published, ttl).await {
        Ok(Some(redeliveries)) => published + redeliveries,
        Ok(None) => published + 1,
        Err(error) => {
            tracing::warn!(call = %id, %error, "a redelivery could not be counted on Redis: counted as one");
            published + 1
        }
    }
}

/// Cancels the consumer of a queue whose program is down; the deliveries already here are
/// handled as the stream ends: given back (not alive).
async fn step_back(session: &Session, channel: &Channel, consumer: &mut lapin::Consumer) {
    let _ = channel
        .basic_cancel(consumer.tag(), Default::default())
        .await;
    while let Some(Ok(delivery)) = consumer.next().await {
        finish(session, &delivery, Handled::Requeue { started: false }).await;
    }
}

async fn start_consumer(
    session: &Session,
    channel: &Channel,
    queue: &str,
    own: bool,
) -> Result<lapin::Consumer, lapin::Error> {
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    session.consuming(Consuming {
        channel: channel.clone(),
        tag: consumer.tag(),
        queue: queue.to_owned(),
        own,
    });
    Ok(consumer)
}

/// Answers the callers of calls that reached the delivery limit: each gets a failure, and the
/// call is counted and logged with its id and operation (never its input).
async fn answer_dead(
    session: &Arc<Session>,
    channel: Channel,
    queue: String,
    served: &Served,
) -> Result<(), lapin::Error> {
    let mut consumer = start_consumer(session, &channel, &queue, false).await?;
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let id = delivery
                .properties
                .correlation_id()
                .as_ref()
                .map_or_else(String::new, |id| id.to_string());
            let operation = serde_json::from_slice::<Value>(&delivery.data)
                .ok()
                .and_then(|call| call.get("operation")?.as_str().map(str::to_owned))
                .unwrap_or_default();
            let operation: String = operation.chars().take(64).collect();
            tracing::error!(call = %id, operation = ?operation, component = %served.component.name, "a call was delivered limits.deliveries times without an answer: dead-lettered, its caller is told");
            served.dead_lettered.inc();
            let failure = format!(
                "{}.{operation}: the call was delivered {} times and never answered (each time \
                 its process stopped under it); it is not tried again",
                served.component.name, served.deliveries
            );
            finish(&session, &delivery, Handled::Reply(Reply::Failure(failure))).await;
        }
    });
    Ok(())
}

/// Why `handled` is no answer of the program's, for the `receive` span; `None`: it is one (a
/// declared error too).
fn unanswered(handled: &Handled) -> Option<&'static str> {
    match handled {
        Handled::Reply(Reply::Outcome(_)) => None,
        Handled::Reply(Reply::Failure(_)) => Some("failed"),
        Handled::Reply(Reply::Refused(_)) | Handled::Addressee => Some("refused"),
        Handled::Drop => Some("not run"),
        Handled::Requeue { .. } => Some("given back"),
    }
}

/// What becomes of a delivery.
pub(super) enum Handled {
    /// Send this reply (if the caller waits for one), then acknowledge.
    Reply(Reply),
    /// Acknowledge without a reply: the call must not run (its deadline passed).
    Drop,
    /// Give it back to the broker, for another replica; `started`: the program went away under
    /// it (a delivery that counts), else it never started here.
    Requeue { started: bool },
    /// The process is leaving: tell the caller no process holds the name.
    Addressee,
}

/// An ordinary call whose program went away under it is given back counted: published again
/// with its delivery's number in [`DELIVERY`] (the broker counts nothing on a transient queue),
/// or, at `limits.deliveries`, to the dead letters, whose consumer tells its caller. Anything else
/// passes through.
async fn give_back(
    session: &Session,
    delivery: &Delivery,
    handled: Handled,
    served: &Served,
    (kind, number): (Kind, i64),
) -> Handled {
    if kind != Kind::Calls || !matches!(handled, Handled::Requeue { started: true }) {
        return handled;
    }
    let (queue, next) = if number >= i64::from(served.deliveries) {
        (served.dead_queue.as_str(), number)
    } else {
        (delivery.routing_key.as_str(), number + 1)
    };
    publish_counted(session, delivery, queue, next).await
}

/// Publishes `delivery`'s call to `queue` numbered `next` ([`DELIVERY`]); `Drop` once it is (this
/// delivery is done with), else `Requeue`: returned as it is.
async fn publish_counted(
    session: &Session,
    delivery: &Delivery,
    queue: &str,
    next: i64,
) -> Handled {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert(DELIVERY.into(), AMQPValue::LongLongInt(next));
    let properties = delivery.properties.clone().with_headers(headers);
    let published = async {
        session
            .channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &delivery.data,
                properties,
            )
            .await?
            .await
    };
    match published.await {
        // Published again: this delivery is done with.
        Ok(_) => Handled::Drop,
        Err(error) => {
            tracing::warn!(%error, "a call could not be counted and given back: returned as it is");
            Handled::Requeue { started: true }
        }
    }
}

/// Replies and acknowledges (or gives back) a delivery as `handled` says.
pub(super) async fn finish(session: &Session, delivery: &Delivery, handled: Handled) {
    let reply = match handled {
        Handled::Reply(reply) => Some(reply.to_json()),
        Handled::Addressee => Some(Reply::Refused(Refusal::Addressee).to_json()),
        Handled::Drop => None,
        Handled::Requeue { .. } => {
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            if let Err(error) = delivery.acker.nack(requeue).await {
                tracing::warn!(%error, "a call could not be given back to the broker");
            }
            return;
        }
    };
    if let (Some(reply), Some(to)) = (reply, delivery.properties.reply_to().clone()) {
        let mut properties = BasicProperties::default();
        if let Some(id) = delivery.properties.correlation_id().clone() {
            properties = properties.with_correlation_id(id);
        }
        let body = serde_json::to_vec(&reply).expect("JSON");
        if let Err(error) = session
            .plain
            .basic_publish(
                "".into(),
                to,
                BasicPublishOptions::default(),
                &body,
                properties,
            )
            .await
        {
            tracing::warn!(%error, "a reply could not be sent");
        }
    }
    let _ = delivery.acker.ack(BasicAckOptions::default()).await;
}

/// Runs one call, unless it must not run here (its deadline passed, the process drains, or it
/// breaks the component's declarations).
async fn handle(
    delivery: &Delivery,
    served: &Served,
    own: bool,
    in_flight: &mut Option<crate::calls::activity::InFlight>,
) -> Handled {
    let call = match Call::read(delivery, served, own) {
        Ok(call) => call,
        Err(handled) => return handled,
    };
    // From here the call is received: a halt sees it, and the drain waits while it runs. The
    // count starts before the drain is checked, so the drain cannot miss a call that runs.
    *in_flight = Some(served.activity.begin());
    if let Some(handled) = admit(served, own).await {
        return handled;
    }
    // Right before the program: a call whose caller gave up, or gives up before the program
    // could start it ([`START_MARGIN`]), never starts; the program gets what is left.
    let limit = match call.deadline {
        Some(d) if now_ms() + START_MARGIN.as_millis() as i64 >= d => {
            tracing::info!(call = %call.id, "a call's deadline passed, or comes before the program could start it: it does not run");
            return Handled::Drop;
        }
        Some(d) => Duration::from_millis((d - now_ms()) as u64),
        None => served.operation_limit,
    };
    match call.run(served, limit, own).await {
        Ok(result) => call.answer(result, served, own).await,
        Err(handled) => handled,
    }
}

/// A call read from its delivery.
struct Call {
    id: String,
    /// The caller's deadline, in milliseconds since the epoch.
    deadline: Option<i64>,
    redelivered: bool,
    request: Request,
}

impl Call {
    /// The call, or how it is answered when it must not reach the program: past its deadline,
    /// not a call, or breaking the component's declarations (the receiving side checks too:
    /// only a declared operation, with an input its schema takes, on the queue its kind goes to).
    fn read(delivery: &Delivery, served: &Served, own: bool) -> Result<Self, Handled> {
        let deadline = headers::deadline(delivery.properties.headers().as_ref(), now_ms());
        let id = delivery
            .properties
            .correlation_id()
            .as_ref()
            .map_or_else(String::new, |id| id.to_string());
        if deadline.is_some_and(|d| now_ms() >= d) {
            tracing::info!(call = %id, "a call reached this process after its deadline: it does not run");
            return Err(Handled::Drop);
        }
        // Refused before it is parsed (parsing makes several copies), answered, not requeued.
        let size = delivery.data.len();
        if size > served.message_limit {
            tracing::warn!(call = %id, size, "refused a call larger than limits.message");
            return Err(refused(format!(
                "the call is {size} bytes; a call is at most {} (limits.message)",
                served.message_limit
            )));
        }
        let request: Request = serde_json::from_slice(&delivery.data).map_err(|error| {
            tracing::warn!(call = %id, %error, "refused a call that is not {{\"operation\", \"input\"}}");
            refused(format!(
                "expected a JSON call {{\"operation\": name, \"input\": ...}}: {error}"
            ))
        })?;
        let contract = crate::calls::contract::Request {
            input: request.input.clone(),
            instance: own.then(|| served.instance.clone()),
            timeout: None,
            key: request.key.clone(),
            query: request.query.clone(),
            receipt: None,
        };
        let checked = crate::calls::contract::check_contract(
            &served.component,
            &request.operation,
            &contract,
            false,
        );
        if let Err(error) = checked {
            let operation: String = request.operation.chars().take(64).collect();
            tracing::warn!(call = %id, operation = ?operation, "refused a call that breaks the component's declarations");
            return Err(refused(match error {
                crate::calls::contract::CallError::RequestContract(message) => message,
                other => other.to_string(),
            }));
        }
        Ok(Self {
            id,
            deadline,
            redelivered: delivery.redelivered,
            request,
        })
    }

    /// The program's outcome, once per key; `Err`: answered without it.
    async fn run(
        &self,
        served: &Served,
        limit: Duration,
        own: bool,
    ) -> Result<Result<Outcome, ProgramError>, Handled> {
        let meta = CallMeta {
            id: self.id.clone(),
            redelivered: self.redelivered,
            deadline_ms: self.deadline,
        };
        let until = tokio::time::Instant::now() + limit;
        let request = &self.request;
        let objects = served.objects.as_deref();
        let (stored_key, key) =
            crate::calls::once::keys(objects, &request.operation, request.key.as_deref());
        // The program's time counts from when it runs, after any wait for the key's claim.
        // Pinned here: `run_once` holds a pointer to it, not a copy of the program's call path.
        let program = std::pin::pin!(async {
            let run = crate::entities::objects::Run {
                client: &served.client,
                operation: &request.operation,
                input: &request.input,
                query: request.query.as_ref(),
                meta: &meta,
                deadline: tokio::time::Instant::now() + limit,
                key: stored_key,
                receipt: None,
            };
            crate::entities::objects::operate(objects, run, &served.operations).await
        });
        let once = run_once(
            &served.repeats,
            &request.operation,
            key,
            &request.input,
            until,
            served.idempotency,
            program,
        )
        .await;
        match once {
            Once::Ran(result) => Ok(result),
            Once::Repeated(outcome) => {
                tracing::info!(call = %self.id, "a repeat of a call with a key: the first call's outcome, not run again");
                Ok(Ok(outcome))
            }
            Once::Refused(message) => Err(refused(message)),
            // The caller of a call to one process has its `Abandoned` at the same time.
            Once::StillRunning if own => Err(Handled::Drop),
            Once::StillRunning => Err(Handled::Reply(Reply::Failure(format!(
                "{}: the first call with this key still runs",
                request.operation
            )))),
            Once::Unavailable(message) => Err(Handled::Reply(Reply::Failure(message))),
        }
    }

    /// What the caller is told of the program's outcome.
    async fn answer(
        &self,
        result: Result<Outcome, ProgramError>,
        served: &Served,
        own: bool,
    ) -> Handled {
        match result {
            Ok(outcome) => Handled::Reply(Reply::Outcome(outcome)),
            // The program went away under the call (it crashed, its container restarts, or the
            // drain's budget ran out and it was stopped): an ordinary call is given back, and
            // another replica runs it (it may have run in part here: at least once; the delivery
            // limit ends a call that takes every program down). Given back once the consumer
            // stepped back, so it does not come straight back here.
            Err(ProgramError::Unreachable { .. }) if !own => {
                let mut alive = served.alive.clone();
                let stepped_back = alive.wait_for(|alive| !*alive);
                let _ = tokio::time::timeout(Duration::from_millis(1500), stepped_back).await;
                Handled::Requeue { started: true }
            }
            // Cut off by the deadline, or refused by the program's SDK as past it (504): the
            // caller has its `Abandoned` already; no reply.
            Err(error) if error.past_deadline() && self.deadline.is_some_and(|d| now_ms() >= d) => {
                Handled::Drop
            }
            Err(ProgramError::Contract(message)) => refused(message),
            Err(error) => {
                tracing::warn!(call = %self.id, %error, "a call failed in the program");
                Handled::Reply(Reply::Failure(error.to_string()))
            }
        }
    }
}

/// Waits until operations are served; `Some`: the call does not run here (the process drains,
/// or its program is not running).
async fn admit(served: &Served, own: bool) -> Option<Handled> {
    let leaving = || {
        if own {
            Handled::Addressee
        } else {
            Handled::Requeue { started: false }
        }
    };
    let mut draining = served.draining.clone();
    if *draining.borrow() {
        return Some(leaving());
    }
    let mut serving = served.serving.clone();
    tokio::select! {
        _ = serving.wait_for(|on| *on) => {}
        _ = draining.wait_for(|on| *on) => return Some(leaving()),
    }
    if *served.draining.borrow() {
        return Some(leaving());
    }
    if !*served.alive.borrow() {
        if own {
            return Some(Handled::Reply(Reply::Failure(format!(
                "the program of {} is not running",
                served.component.name
            ))));
        }
        return Some(Handled::Requeue { started: false });
    }
    None
}

/// A call as it travels over the broker.
#[derive(serde::Deserialize)]
struct Request {
    operation: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    query: Option<crate::calls::contract::Query>,
}

fn refused(message: String) -> Handled {
    Handled::Reply(Reply::Refused(Refusal::RequestContract(message)))
}
