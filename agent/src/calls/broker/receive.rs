//! Receiving events over the broker (DESIGN 18): each receiving component has one durable quorum
//! queue, `toa.<app>.<component>#receivers`, bound to the application's events exchange by every
//! label it receives, with the tasks' bound and delivery limit; at the limit an event goes to
//! `#receivers-dead`, where it waits for `toa-agent requeue`. What an event runs is the
//! receiver's ([`Receive`]); this module takes deliveries, tells it each event, and acknowledges,
//! gives back (after a pause that grows with the deliveries) or dead-letters as it answers.

use super::queues::{self, Declared};
use super::session::{Consuming, Session};
use super::Broker;
use futures::future::BoxFuture;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// An event as a receiver gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// `namespace.name.event`.
    pub label: String,
    /// The object as stored, with its `id` and `VERSION`.
    pub payload: Value,
    /// `label/id/version`: the same on every publication of the event.
    pub id: String,
    /// Which delivery of it this is, from 1.
    pub delivery: u32,
}

/// What became of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Handled (run, or known to have run): acknowledged.
    Done,
    /// Not handled, and it may be later (the program or the store was away): given back.
    Again(String),
    /// Never handled however often it comes (the receiver's request breaks the operation's
    /// contract): dead-lettered at once.
    Dead(String),
}

/// What runs a component's events.
pub trait Receive: Send + Sync {
    fn receive<'a>(&'a self, incoming: &'a Incoming) -> BoxFuture<'a, Verdict>;
}

/// A component that receives events: replayed on every session.
#[derive(Clone)]
pub struct Receiving {
    pub component: String,
    pub labels: Vec<String>,
    pub receiver: Arc<dyn Receive>,
    /// Whether the component's program answers: while it does not, its events go elsewhere.
    pub alive: watch::Receiver<bool>,
    /// `toa_events_dead_lettered_total` of the component.
    pub dead_lettered: Counter,
}

/// The longest pause before an event is given back.
const PAUSE_MAX: Duration = Duration::from_secs(5);

/// The header RabbitMQ's quorum queues count a message's returns in.
const DELIVERY_COUNT: &str = "x-delivery-count";

impl Broker {
    /// Receives `receiving`'s events on this session and every one after it.
    pub async fn receive(&self, receiving: Receiving) -> Result<(), super::BrokerError> {
        let mut all = self.receiving.lock().await;
        if let Some(session) = self.session() {
            match self.receive_on(&session, &receiving).await {
                Ok(()) => {}
                Err(error) if session.is_lost() => {
                    tracing::warn!(%error, "the connection ended while starting to receive; receiving on the next one");
                }
                Err(error) => return Err(error),
            }
        }
        all.push(receiving);
        Ok(())
    }

    /// Declares the queue, binds its labels and consumes it on `session`.
    pub(super) async fn receive_on(
        &self,
        session: &Arc<Session>,
        receiving: &Receiving,
    ) -> Result<(), super::BrokerError> {
        let queue = self.names.receivers(&receiving.component);
        let refused = |e: lapin::Error| super::BrokerError::Refused {
            what: format!("receiving on {queue}"),
            message: e.to_string(),
        };
        let dead = self.names.receivers_dead(&receiving.component);
        queues::declare_dead_quorum(session, &dead)
            .await
            .map_err(refused)?;
        let arguments = queues::receivers_arguments(&self.limits, &dead);
        if let Declared::AsFound(refusal) = queues::declare_shared(session, &queue, arguments)
            .await
            .map_err(refused)?
        {
            tracing::warn!(%queue, %refusal, "the queue exists with other arguments: receiving on it as it is");
        }
        let channel = self.bind(session, &queue, &receiving.labels).await?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(refused)?;
        let taking = Taking {
            session: session.clone(),
            channel,
            queue: queue.clone(),
            receiving: receiving.clone(),
            deliveries: self.limits.deliveries,
            message_limit: self.limits.message as usize,
            draining: self.draining.subscribe(),
        };
        let consumer = taking.consume().await.map_err(refused)?;
        tokio::spawn(take(taking, consumer));
        Ok(())
    }
}

impl Broker {
    /// Binds `queue` to the events exchange by each of `labels`, on a channel it then consumes
    /// on.
    async fn bind(
        &self,
        session: &Session,
        queue: &str,
        labels: &[String],
    ) -> Result<lapin::Channel, super::BrokerError> {
        let exchange = self.names.events();
        let refused = |message: String| super::BrokerError::Refused {
            what: format!("binding {queue} to {exchange}"),
            message,
        };
        super::events::declare(session, &exchange)
            .await
            .map_err(refused)?;
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| refused(e.to_string()))?;
        for label in labels {
            channel
                .queue_bind(
                    queue.into(),
                    exchange.as_str().into(),
                    label.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| refused(e.to_string()))?;
        }
        Ok(channel)
    }
}

/// What a consumer of a receivers' queue works with.
#[derive(Clone)]
struct Taking {
    session: Arc<Session>,
    channel: lapin::Channel,
    queue: String,
    receiving: Receiving,
    deliveries: u32,
    /// The largest event taken, in bytes (`limits.message`).
    message_limit: usize,
    draining: watch::Receiver<bool>,
}

impl Taking {
    /// A consumer of the queue, registered with the session (the drain cancels it).
    async fn consume(&self) -> Result<lapin::Consumer, lapin::Error> {
        let consumer = self
            .channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        self.session.consuming(Consuming {
            channel: self.channel.clone(),
            tag: consumer.tag(),
            queue: self.queue.clone(),
            own: false,
        });
        Ok(consumer)
    }

    fn given_up(&self) -> bool {
        self.session.is_lost() || *self.draining.borrow()
    }
}

/// Takes the queue's deliveries, each on a task of its own, until the consumer ends: with the
/// session, at the drain, or under a living connection (the queue deleted, the broker's
/// consumer timeout), when a new session receives again. While the program is down the
/// consumer steps back (its events go to other replicas) and comes back with it.
async fn take(taking: Taking, mut consumer: lapin::Consumer) {
    let mut alive = taking.receiving.alive.clone();
    loop {
        let stepped_back = loop {
            tokio::select! {
                delivery = consumer.next() => match delivery {
                    Some(Ok(delivery)) => {
                        let taking = taking.clone();
                        tokio::spawn(async move { handle(delivery, &taking).await });
                    }
                    _ => break false,
                },
                _ = alive.wait_for(|alive| !*alive) => break true,
            }
        };
        if !stepped_back {
            break;
        }
        match step_back(&taking, consumer, &mut alive).await {
            Some(again) => consumer = again,
            None => return,
        }
    }
    if !taking.given_up() {
        let component = &taking.receiving.component;
        tracing::warn!(%component, "the receivers' consumer stopped: opening a new session");
        taking.session.lost.cancel();
    }
}

/// Cancels the consumer of a program that is down (what it holds goes back to the broker),
/// waits for the program, and consumes again: the new consumer, or `None` once the session or
/// the process ends meanwhile.
async fn step_back(
    taking: &Taking,
    mut consumer: lapin::Consumer,
    alive: &mut watch::Receiver<bool>,
) -> Option<lapin::Consumer> {
    let queue = &taking.queue;
    tracing::warn!(%queue, "the program is down: its events go to other replicas until it is back");
    let _ = taking
        .channel
        .basic_cancel(consumer.tag(), Default::default())
        .await;
    while let Some(Ok(delivery)) = consumer.next().await {
        give_back(&delivery).await;
    }
    tokio::select! {
        _ = alive.wait_for(|alive| *alive) => {}
        () = taking.session.lost.cancelled() => return None,
    }
    if taking.given_up() {
        return None;
    }
    match taking.consume().await {
        Ok(consumer) => Some(consumer),
        Err(error) => {
            tracing::warn!(%error, %queue, "cannot take events again; the session will be replaced");
            taking.session.lost.cancel();
            None
        }
    }
}

/// Gives `delivery` back at once, for another replica (or this one, later).
async fn give_back(delivery: &Delivery) {
    let again = BasicNackOptions {
        requeue: true,
        ..Default::default()
    };
    if let Err(error) = delivery.acker.nack(again).await {
        tracing::debug!(%error, "an event could not be given back: it comes again with the next connection");
    }
}

/// Runs one delivery once the program answers: acknowledged, given back or dead-lettered as its
/// receiver says. At the drain it is given back unrun.
async fn handle(delivery: Delivery, taking: &Taking) {
    let receiving = &taking.receiving;
    let incoming = match incoming(&delivery, taking.message_limit) {
        Ok(incoming) => incoming,
        Err(reason) => {
            let id = message_id(&delivery);
            return dead(&delivery, receiving, &id, &reason).await;
        }
    };
    let (mut alive, mut draining) = (receiving.alive.clone(), taking.draining.clone());
    tokio::select! {
        _ = alive.wait_for(|alive| *alive) => {}
        _ = draining.wait_for(|draining| *draining) => {}
    }
    if *draining.borrow() {
        return give_back(&delivery).await;
    }
    let deliveries = taking.deliveries;
    match receiving.receiver.receive(&incoming).await {
        Verdict::Done => {
            if let Err(error) = delivery.acker.ack(BasicAckOptions::default()).await {
                tracing::warn!(%error, event = %incoming.id, "an event's acknowledgement was lost: it comes again, and its receiver's record answers it");
            }
        }
        Verdict::Dead(reason) => dead(&delivery, receiving, &incoming.id, &reason).await,
        Verdict::Again(reason) if incoming.delivery >= deliveries => {
            let reason = format!("delivered {deliveries} times (limits.deliveries): {reason}");
            dead(&delivery, receiving, &incoming.id, &reason).await;
        }
        Verdict::Again(reason) => {
            tracing::warn!(event = %incoming.id, delivery = incoming.delivery, %reason, "an event was not handled: it comes again");
            tokio::time::sleep(pause(incoming.delivery)).await;
            give_back(&delivery).await;
        }
    }
}

/// Dead-letters `delivery` (to `#receivers-dead`), counted and logged with the event's id.
async fn dead(delivery: &Delivery, receiving: &Receiving, id: &str, reason: &str) {
    tracing::error!(event = %id, component = %receiving.component, %reason, "an event was dead-lettered: `toa-agent requeue` sends it again");
    receiving.dead_lettered.inc();
    let options = BasicNackOptions {
        requeue: false,
        ..Default::default()
    };
    if let Err(error) = delivery.acker.nack(options).await {
        tracing::warn!(%error, event = %id, "an event could not be dead-lettered: it comes again");
    }
}

/// The pause before the `delivery`th delivery is given back: 100 ms, doubling, at most
/// [`PAUSE_MAX`]; so a program restarting has time to, before the deliveries run out.
pub fn pause(delivery: u32) -> Duration {
    let doubled =
        Duration::from_millis(100).saturating_mul(1 << delivery.min(16).saturating_sub(1));
    doubled.min(PAUSE_MAX)
}

/// The event a delivery carries, or why it is none: any client of the broker user can publish
/// to the exchange, so the message must be an object as stored (`id`, `VERSION`) whose message
/// id is its `label/id/version` (an id its receiver's record is kept by), within `limit` bytes.
/// What is wrong is said without the message's content.
fn incoming(delivery: &Delivery, limit: usize) -> Result<Incoming, String> {
    if delivery.data.len() > limit {
        return Err(format!(
            "the message holds {} bytes, more than the {limit} of limits.message",
            delivery.data.len()
        ));
    }
    let payload: Value = serde_json::from_slice(&delivery.data).map_err(|error| {
        format!(
            "the message is not JSON (at line {}, column {})",
            error.line(),
            error.column()
        )
    })?;
    let headers = delivery.properties.headers().as_ref();
    let label = match header(headers, super::events::LABEL) {
        Some(AMQPValue::LongString(label)) => label.to_string(),
        _ => delivery.routing_key.to_string(),
    };
    let id = payload.get("id").and_then(Value::as_str);
    let version = payload.get("VERSION").and_then(Value::as_u64);
    let (Some(id), Some(version)) = (id, version) else {
        return Err(
            "the message is not an object as stored, with a string id and a whole VERSION"
                .to_owned(),
        );
    };
    if message_id(delivery) != format!("{label}/{id}/{version}") {
        return Err(format!(
            "the message id is not {label}/<its id>/<its VERSION>, which an event's is"
        ));
    }
    let returns = match header(headers, DELIVERY_COUNT) {
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        _ => 0,
    };
    Ok(Incoming {
        label,
        payload,
        id: message_id(delivery),
        delivery: returns.saturating_add(1),
    })
}

fn header<'a>(headers: Option<&'a FieldTable>, name: &str) -> Option<&'a AMQPValue> {
    headers?.inner().get(name)
}

/// The message's id, as the publisher set it (`label/id/version`), at most 256 characters.
fn message_id(delivery: &Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map_or_else(String::new, |id| id.as_str().chars().take(256).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_from_a_tenth_of_a_second_up_to_five() {
        let pauses: Vec<u64> = [1, 2, 3, 6, 7, 40, u32::MAX]
            .into_iter()
            .map(|n| pause(n).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [100, 200, 400, 3200, 5000, 5000, 5000]);
    }
}
