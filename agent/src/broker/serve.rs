//! The callee's side: taking calls from a component's shared queue and from this process's own
//! queue on one session, running them on the program, and replying.

use super::session::{Consuming, Session};
use super::{now_ms, Served, DEADLINE};
use crate::component::client::{Outcome, ProgramError};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Serves `served` on `session` until the session ends: the shared queue at once, the instance
/// queue as soon as no other process holds the name.
pub(super) async fn serve(
    session: &Arc<Session>,
    served: &Served,
    shared: String,
    own: String,
    prefetch: u16,
) -> Result<(), lapin::Error> {
    let channel = declare(session, &shared, false, prefetch).await?;
    consume(session, channel, shared, served, false).await?;
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let mut warned = false;
        while !session.is_lost() && !*served.draining.borrow() {
            match take_name(&session, &own, prefetch).await {
                Ok(channel) => {
                    if warned {
                        tracing::info!(queue = %own, "instance name free again: answering under it");
                    }
                    if let Err(error) = consume(&session, channel, own.clone(), &served, true).await
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
    });
    Ok(())
}

/// The instance queue, declared exclusive: the broker refuses it while another process holds it.
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
                auto_delete: exclusive,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(channel)
}

async fn consume(
    session: &Arc<Session>,
    channel: Channel,
    queue: String,
    served: &Served,
    own: bool,
) -> Result<(), lapin::Error> {
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    session.consuming(Consuming {
        channel: channel.clone(),
        tag: consumer.tag(),
        queue: queue.clone(),
        own,
    });
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let (session, served) = (session.clone(), served.clone());
            tokio::spawn(async move {
                let handled = handle(&delivery, &served, own).await;
                finish(&session, &delivery, handled).await;
            });
        }
        if !session.is_lost() && !*served.draining.borrow() {
            tracing::warn!(%queue, "the consumer stopped");
        }
    });
    Ok(())
}

/// What becomes of a delivery.
pub(super) enum Handled {
    /// Send this reply (if the caller waits for one), then acknowledge.
    Reply(Value),
    /// Acknowledge without a reply: the call must not run (its deadline passed).
    Drop,
    /// Give it back to the broker, for another replica: it never started here.
    Requeue,
    /// The process is leaving: tell the caller no process holds the name.
    Addressee,
}

/// Replies and acknowledges (or gives back) a delivery as `handled` says.
pub(super) async fn finish(session: &Session, delivery: &Delivery, handled: Handled) {
    let reply = match handled {
        Handled::Reply(reply) => Some(reply),
        Handled::Addressee => Some(json!({"refused": "Addressee"})),
        Handled::Drop => None,
        Handled::Requeue => {
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

/// Runs one call, unless it must not run here (its deadline passed, or the process drains).
async fn handle(delivery: &Delivery, served: &Served, own: bool) -> Handled {
    let deadline =
        delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| match h.inner().get(DEADLINE) {
                Some(AMQPValue::LongLongInt(ms)) => Some(*ms),
                _ => None,
            });
    if deadline.is_some_and(|d| now_ms() >= d) {
        tracing::info!("a call reached this process after its deadline: it does not run");
        return Handled::Drop;
    }
    let request: Value = match serde_json::from_slice(&delivery.data) {
        Ok(request) => request,
        Err(error) => {
            return Handled::Reply(
                json!({"failure": format!("expected a JSON call, got bytes that are not JSON: {error}")}),
            )
        }
    };
    let Some(operation) = request.get("operation").and_then(Value::as_str) else {
        return Handled::Reply(
            json!({"failure": "expected {\"operation\": name, \"input\": ...}"}),
        );
    };
    // From here the call is received: a halt sees it, and the drain waits while it runs. The
    // count starts before the drain is checked, so the drain cannot miss a call that runs.
    let _in_flight = served.activity.begin();
    let leaving = || {
        if own {
            Handled::Addressee
        } else {
            Handled::Requeue
        }
    };
    let mut draining = served.draining.clone();
    if *draining.borrow() {
        return leaving();
    }
    let mut serving = served.serving.clone();
    tokio::select! {
        _ = serving.wait_for(|on| *on) => {}
        _ = draining.wait_for(|on| *on) => return leaving(),
    }
    if *served.draining.borrow() {
        return leaving();
    }
    let limit = deadline.map_or(Duration::from_secs(60), |d| {
        Duration::from_millis((d - now_ms()).max(1) as u64)
    });
    match served
        .client
        .operate(
            operation,
            request.get("input").unwrap_or(&Value::Null),
            limit,
        )
        .await
    {
        Ok(Outcome::Reply(reply)) => Handled::Reply(json!({"reply": reply})),
        Ok(Outcome::Error { code, message }) => {
            Handled::Reply(json!({"error": {"code": code, "message": message}}))
        }
        // The drain's budget ran out and the program was stopped under the call: it is given
        // back, and another replica runs it (it may have run in part here: at least once).
        Err(ProgramError::Unreachable { .. }) if *served.draining.borrow() && !own => {
            Handled::Requeue
        }
        Err(error) => Handled::Reply(json!({"failure": error.to_string()})),
    }
}
