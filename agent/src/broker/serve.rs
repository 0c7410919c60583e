//! The callee's side: taking calls from a component's shared queue and from this process's own
//! queue on one session, running them on the program, and replying.

use super::session::Session;
use super::{now_ms, Served, DEADLINE};
use crate::component::client::Outcome;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
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
    consume(session, channel, shared, served).await?;
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let mut warned = false;
        while !session.is_lost() {
            match take_name(&session, &own, prefetch).await {
                Ok(channel) => {
                    if warned {
                        tracing::info!(queue = %own, "instance name free again: answering under it");
                    }
                    if let Err(error) = consume(&session, channel, own.clone(), &served).await {
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
) -> Result<(), lapin::Error> {
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (session, served) = (session.clone(), served.clone());
    tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let (session, served) = (session.clone(), served.clone());
            tokio::spawn(async move {
                let reply = handle(&delivery, &served).await;
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
            });
        }
        if !session.is_lost() {
            tracing::warn!(%queue, "the consumer stopped");
        }
    });
    Ok(())
}

/// Runs one call; `None` when it must not run (its deadline passed).
async fn handle(delivery: &lapin::message::Delivery, served: &Served) -> Option<Value> {
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
        return None;
    }
    let request: Value = match serde_json::from_slice(&delivery.data) {
        Ok(request) => request,
        Err(error) => {
            return Some(
                json!({"failure": format!("expected a JSON call, got bytes that are not JSON: {error}")}),
            )
        }
    };
    let Some(operation) = request.get("operation").and_then(Value::as_str) else {
        return Some(json!({"failure": "expected {\"operation\": name, \"input\": ...}"}));
    };
    // From here the call is received: a halt sees it, and waits while it runs.
    let _in_flight = served.activity.begin();
    let _ = served.serving.clone().wait_for(|on| *on).await;
    let limit = deadline.map_or(Duration::from_secs(60), |d| {
        Duration::from_millis((d - now_ms()).max(1) as u64)
    });
    Some(
        match served
            .client
            .operate(
                operation,
                request.get("input").unwrap_or(&Value::Null),
                limit,
            )
            .await
        {
            Ok(Outcome::Reply(reply)) => json!({"reply": reply}),
            Ok(Outcome::Error { code, message }) => {
                json!({"error": {"code": code, "message": message}})
            }
            Err(error) => json!({"failure": error.to_string()}),
        },
    )
}
