//! `toa-agent requeue COMPONENT`: the events dead-lettered for a receiving component
//! (`#receivers-dead`) sent back to its receivers' queue, each removed from the dead letters only
//! once the broker confirmed it in the queue, so none is lost if the command stops midway (one
//! may then be in both, and its receiver's record answers the copy).

use super::{Broker, BrokerError};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;

/// The headers the broker wrote when it dead-lettered or counted a message: the requeued one
/// starts afresh without them.
const BROKERS: [&str; 4] = [
    "x-death",
    "x-delivery-count",
    "x-first-death-exchange",
    "x-first-death-queue",
];

/// The routing key a dead-lettered message first came with (`x-death[0].routing-keys[0]`).
fn first_routing_key(headers: Option<&FieldTable>) -> Option<String> {
    let Some(AMQPValue::FieldArray(deaths)) = headers?.inner().get("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
        return None;
    };
    let Some(AMQPValue::FieldArray(keys)) = death.inner().get("routing-keys") else {
        return None;
    };
    match keys.as_slice().first() {
        Some(AMQPValue::LongString(key)) => Some(key.to_string()),
        _ => None,
    }
}

/// The broker refused `what` (an operation, naming its queue).
fn refused(what: String, error: lapin::Error) -> BrokerError {
    BrokerError::Refused {
        what,
        message: error.to_string(),
    }
}

/// Moves what `component`'s dead letters hold now (not what arrives meanwhile) back to its
/// receivers' queue; how many moved.
pub async fn requeue(broker: &Broker, component: &str) -> Result<u64, BrokerError> {
    let dead = broker.names.receivers_dead(component);
    let queue = broker.names.receivers(component);
    let session = broker.session().ok_or_else(|| BrokerError::Unreachable {
        address: broker.settings.shown.clone(),
        message: "the connection ended".to_owned(),
    })?;
    let channel = session
        .connection
        .create_channel()
        .await
        .map_err(|e| refused(format!("a channel for {dead}"), e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| refused(format!("confirms for {dead}"), e))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let found = channel
        .queue_declare(dead.as_str().into(), passive, FieldTable::default())
        .await
        .map_err(|e| refused(format!("finding {dead}"), e))?;
    let moving = move_all(&channel, &dead, &queue, found.message_count()).await;
    // The acks are only written, not answered: a process that ends now may leave the last of
    // them unsent, and the broker puts that event back in the dead letters although it moved.
    // The channel's close is answered after the broker read every frame before it; so it is
    // closed after a failure midway too, and what moved before it stays moved.
    let closed = channel.close(200, "requeued".into()).await;
    let moved = moving?;
    closed.map_err(|e| BrokerError::Refused {
        what: format!("closing the channel on {dead}"),
        message: format!(
            "{e}; the {moved} moved are in {queue}, and some may also still be in the dead \
             letters (a copy is answered by its receiver's record)"
        ),
    })?;
    Ok(moved)
}

/// Moves up to `count` messages of `dead` to `queue`, one at a time; how many moved.
async fn move_all(
    channel: &lapin::Channel,
    dead: &str,
    queue: &str,
    count: u32,
) -> Result<u64, BrokerError> {
    let mut moved = 0;
    for _ in 0..count {
        let Some(message) = channel
            .basic_get(dead.into(), BasicGetOptions::default())
            .await
            .map_err(|e| refused(format!("reading {dead}"), e))?
        else {
            break;
        };
        move_one(channel, message.delivery, queue, moved).await?;
        moved += 1;
    }
    Ok(moved)
}

/// Publishes `delivery` to `queue` without the broker's headers, and removes it from the dead
/// letters once the broker confirmed it; `moved`: how many moved before it (for the error).
async fn move_one(
    channel: &lapin::Channel,
    delivery: lapin::message::Delivery,
    queue: &str,
    moved: u64,
) -> Result<(), BrokerError> {
    let refused = |e| refused(format!("requeueing to {queue}"), e);
    let mut headers = FieldTable::default();
    for (name, value) in delivery.properties.headers().iter().flat_map(|h| h.inner()) {
        if !BROKERS.contains(&name.as_str()) {
            headers.insert(name.clone(), value.clone());
        }
    }
    // An event of an agent before the label header: its label was the routing key it came
    // with, which the broker wrote in `x-death`.
    if !headers.inner().contains_key(super::events::LABEL) {
        if let Some(label) = first_routing_key(delivery.properties.headers().as_ref()) {
            headers.insert(
                super::events::LABEL.into(),
                AMQPValue::LongString(label.into()),
            );
        }
    }
    let properties = delivery.properties.clone().with_headers(headers);
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirmed = channel
        .basic_publish("".into(), queue.into(), options, &delivery.data, properties)
        .await
        .map_err(refused)?
        .await
        .map_err(refused)?;
    if !matches!(&confirmed, Confirmation::Ack(None)) {
        let keep = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let _ = delivery.acker.nack(keep).await;
        return Err(BrokerError::Refused {
            what: format!("requeueing to {queue}"),
            message: format!(
                "the broker did not take the event (the queue is missing or full); {moved} moved \
                 before it"
            ),
        });
    }
    delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .map(|_| ())
        .map_err(refused)
}
