//! Calls over RabbitMQ (DESIGN decision 5), through `lapin`.
//!
//! Queues (default exchange, routing key = queue name), for application `app`:
//! - `toa.app.{component}`: ordinary calls, shared by the component's replicas. A caller declares
//!   it too, so a call to a component not running yet waits in it for the component to appear;
//! - `toa.app.{component}@{instance}`: calls to one process, declared *exclusive* by that process,
//!   so only one process holds a name. Another process given the same name logs
//!   `Instance name taken` and keeps trying until the name is free;
//! - a server-named exclusive queue per process for its replies.
//!
//! A call to one process is published `mandatory` with publisher confirms: unroutable means no
//! process holds the name (`Addressee`); no reply before the deadline means `Abandoned`. It carries
//! its deadline twice: as the message's TTL (a call still queued at its deadline is dropped by the
//! broker) and as a header the receiving agent checks when it takes the message, so a call not
//! started before its deadline never runs. Calls still run concurrently, up to [`PREFETCH`] at a
//! time per queue. The connection's heartbeat is [`HEARTBEAT_S`] seconds: a lost node is noticed
//! then.

use crate::calls::CallError;
use crate::component::client::{Outcome, ProgramClient};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toa_context::{AmqpAddress, Credentials};
use tokio::sync::{oneshot, watch};

/// How many calls one queue's consumer runs at once, unless `TOA_PREFETCH` says otherwise.
pub const PREFETCH: u16 = 32;

fn prefetch() -> u16 {
    std::env::var("TOA_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(PREFETCH)
}
/// The AMQP heartbeat, in seconds.
pub const HEARTBEAT_S: u16 = 10;
const DEADLINE: &str = "toa-deadline";

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("the broker at {address} is unreachable: {message}")]
    Unreachable { address: String, message: String },
    #[error("the broker refused {what}: {message}")]
    Refused { what: String, message: String },
}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>;

pub struct Broker {
    channel: Channel,
    _connection: Connection,
    replies: String,
    pending: Pending,
    prefix: String,
    address: String,
    /// Shared queues this process declared already: declaring costs a round trip.
    declared: Mutex<std::collections::HashSet<String>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

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

impl Broker {
    pub async fn connect(
        address: &AmqpAddress,
        credentials: &Credentials,
        application: &str,
    ) -> Result<Arc<Self>, BrokerError> {
        let user = credentials.username.as_deref().unwrap_or("guest");
        let password = credentials
            .password
            .as_ref()
            .map_or("guest", |p| p.expose());
        // The URI holds the password: it is built here and never logged (errors name `address`).
        let uri = format!(
            "amqp://{}:{}@{}:{}/{}?heartbeat={HEARTBEAT_S}",
            encode(user),
            encode(password),
            address.host,
            address.port,
            encode(&address.vhost)
        );
        let shown = address.to_string();
        let unreachable = |error: lapin::Error| BrokerError::Unreachable {
            address: shown.clone(),
            message: error.to_string(),
        };
        let connection = Connection::connect(&uri, ConnectionProperties::default())
            .await
            .map_err(unreachable)?;
        let channel = connection.create_channel().await.map_err(unreachable)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unreachable)?;
        let replies = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(unreachable)?
            .name()
            .as_str()
            .to_owned();
        let pending: Pending = Arc::default();
        let consumer_channel = connection.create_channel().await.map_err(unreachable)?;
        let mut consumer = consumer_channel
            .basic_consume(
                replies.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(unreachable)?;
        let waiting = pending.clone();
        tokio::spawn(async move {
            let _channel = consumer_channel;
            while let Some(Ok(delivery)) = consumer.next().await {
                let Some(id) = delivery
                    .properties
                    .correlation_id()
                    .as_ref()
                    .map(|id| id.as_str().to_owned())
                else {
                    continue;
                };
                let reply = serde_json::from_slice(&delivery.data)
                    .unwrap_or_else(|_| json!({"failure": "a reply that is not JSON"}));
                if let Some(caller) = waiting.lock().expect("pending").remove(&id) {
                    let _ = caller.send(reply);
                }
            }
            tracing::warn!("the reply consumer stopped: waiting calls are abandoned");
        });
        Ok(Arc::new(Self {
            channel,
            _connection: connection,
            replies,
            pending,
            prefix: format!("toa.{application}."),
            address: address.to_string(),
            declared: Mutex::default(),
        }))
    }

    pub fn queue(&self, component: &str, instance: Option<&str>) -> String {
        match instance {
            Some(instance) => format!("{}{component}@{instance}", self.prefix),
            None => format!("{}{component}", self.prefix),
        }
    }

    async fn declare_shared(&self, channel: &Channel, queue: &str) -> Result<(), BrokerError> {
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .map(|_| ())
            .map_err(|e| BrokerError::Refused {
                what: format!("the queue {queue}"),
                message: e.to_string(),
            })
    }

    /// Sends a call and waits for its reply (not for a task). `timeout` is set for calls to one
    /// process: their deadline.
    pub async fn call(
        &self,
        component: &str,
        operation: &str,
        input: &Value,
        instance: Option<&str>,
        timeout: Option<Duration>,
        task: bool,
    ) -> Result<Outcome, CallError> {
        let queue = self.queue(component, instance);
        let failed = |message: String| CallError::Failed(format!("{}: {message}", self.address));
        if instance.is_none() && !self.declared.lock().expect("declared").contains(&queue) {
            self.declare_shared(&self.channel, &queue)
                .await
                .map_err(|e| failed(e.to_string()))?;
            self.declared
                .lock()
                .expect("declared")
                .insert(queue.clone());
        }
        let id = format!("{:032x}", rand::random::<u128>());
        let body =
            serde_json::to_vec(&json!({"operation": operation, "input": input})).expect("JSON");
        let mut properties = BasicProperties::default().with_correlation_id(id.as_str().into());
        let receiver = if task {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            self.pending.lock().expect("pending").insert(id.clone(), tx);
            properties = properties.with_reply_to(self.replies.as_str().into());
            Some(rx)
        };
        let _forget = Forget {
            pending: self.pending.clone(),
            id: id.clone(),
        };
        if let Some(timeout) = timeout {
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from(DEADLINE),
                AMQPValue::LongLongInt(now_ms() + timeout.as_millis() as i64),
            );
            properties = properties
                .with_expiration(timeout.as_millis().to_string().into())
                .with_headers(headers);
        }
        // Mandatory for every call: a call to a process nobody holds is an Addressee; an ordinary
        // call whose shared queue vanished (a broker restarted empty) declares it and goes again.
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let publish = |properties: BasicProperties| async {
            self.channel
                .basic_publish("".into(), queue.as_str().into(), options, &body, properties)
                .await
                .map_err(|e| failed(e.to_string()))?
                .await
                .map_err(|e| failed(e.to_string()))
        };
        let mut confirm = publish(properties.clone()).await?;
        if instance.is_none() && matches!(confirm, Confirmation::Ack(Some(_))) {
            self.declare_shared(&self.channel, &queue)
                .await
                .map_err(|e| failed(e.to_string()))?;
            confirm = publish(properties).await?;
        }
        match confirm {
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) if instance.is_none() => {
                return Err(failed(format!("the queue {queue} takes no calls")))
            }
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                return Err(CallError::Addressee {
                    component: component.to_owned(),
                    instance: instance.unwrap_or_default().to_owned(),
                })
            }
            Confirmation::Nack(None) => {
                return Err(failed("the broker did not take the call".into()))
            }
            _ => {}
        }
        let Some(receiver) = receiver else {
            return Ok(Outcome::Reply(Value::Null));
        };
        let reply =
            match timeout {
                Some(limit) => tokio::time::timeout(limit, receiver).await.map_err(|_| {
                    CallError::Abandoned {
                        component: component.to_owned(),
                        timeout_ms: limit.as_millis() as u64,
                    }
                })?,
                None => receiver.await,
            }
            .map_err(|_| failed("the reply channel closed".into()))?;
        decode_reply(reply)
    }

    /// Takes calls for `callee` from its shared queue and from this process's own queue, until the
    /// process stops. Never fails after it started: a name taken by another process is retried.
    pub async fn serve(
        self: &Arc<Self>,
        component: &str,
        client: ProgramClient,
        instance: &str,
        serving: watch::Receiver<bool>,
    ) -> Result<(), BrokerError> {
        let channel =
            self._connection
                .create_channel()
                .await
                .map_err(|e| BrokerError::Refused {
                    what: "a channel".into(),
                    message: e.to_string(),
                })?;
        channel
            .basic_qos(prefetch(), BasicQosOptions::default())
            .await
            .map_err(|e| BrokerError::Refused {
                what: "prefetch".into(),
                message: e.to_string(),
            })?;
        let shared = self.queue(component, None);
        self.declare_shared(&channel, &shared).await?;
        self.consume(channel, shared, client.clone(), serving.clone())
            .await?;
        let this = self.clone();
        let own = self.queue(component, Some(instance));
        tokio::spawn(async move {
            let mut warned = false;
            loop {
                match this.take_name(&own).await {
                    Ok(channel) => {
                        if warned {
                            tracing::info!(queue = %own, "instance name free again: answering under it");
                        }
                        if let Err(error) = this
                            .consume(channel, own.clone(), client.clone(), serving.clone())
                            .await
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
                    Err(error) => {
                        tracing::warn!(%error, queue = %own, "cannot declare the instance queue; trying again")
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Ok(())
    }

    async fn take_name(&self, queue: &str) -> Result<Channel, lapin::Error> {
        let channel = self._connection.create_channel().await?;
        channel
            .basic_qos(prefetch(), BasicQosOptions::default())
            .await?;
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(channel)
    }

    async fn consume(
        self: &Arc<Self>,
        channel: Channel,
        queue: String,
        client: ProgramClient,
        serving: watch::Receiver<bool>,
    ) -> Result<(), BrokerError> {
        let mut consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| BrokerError::Refused {
                what: format!("consuming {queue}"),
                message: e.to_string(),
            })?;
        let this = self.clone();
        tokio::spawn(async move {
            let _channel = channel;
            while let Some(Ok(delivery)) = consumer.next().await {
                let (this, client, mut serving) = (this.clone(), client.clone(), serving.clone());
                tokio::spawn(async move {
                    let reply = this.handle(&delivery, &client, &mut serving).await;
                    if let (Some(reply), Some(to)) = (reply, delivery.properties.reply_to().clone())
                    {
                        let mut properties = BasicProperties::default();
                        if let Some(id) = delivery.properties.correlation_id().clone() {
                            properties = properties.with_correlation_id(id);
                        }
                        let body = serde_json::to_vec(&reply).expect("JSON");
                        if let Err(error) = this
                            .channel
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
            tracing::warn!(%queue, "the consumer stopped");
        });
        Ok(())
    }

    /// Runs one call; `None` when it must not run (its deadline passed).
    async fn handle(
        &self,
        delivery: &lapin::message::Delivery,
        client: &ProgramClient,
        serving: &mut watch::Receiver<bool>,
    ) -> Option<Value> {
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
        let _ = serving.wait_for(|on| *on).await;
        let limit = deadline.map_or(Duration::from_secs(60), |d| {
            Duration::from_millis((d - now_ms()).max(1) as u64)
        });
        Some(
            match client
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
}

fn decode_reply(reply: Value) -> Result<Outcome, CallError> {
    if let Some(value) = reply.get("reply") {
        return Ok(Outcome::Reply(value.clone()));
    }
    if let Some(error) = reply.get("error") {
        if let Some(code) = error.get("code").and_then(Value::as_str) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned);
            return Ok(Outcome::Error {
                code: code.to_owned(),
                message,
            });
        }
    }
    Err(CallError::Failed(
        reply
            .get("failure")
            .and_then(Value::as_str)
            .unwrap_or("a malformed reply")
            .to_owned(),
    ))
}

/// Removes a call's waiter however the call ends (also when the caller gives up).
struct Forget {
    pending: Pending,
    id: String,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.pending.lock().expect("pending").remove(&self.id);
    }
}
