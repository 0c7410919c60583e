//! Events on the broker (DESIGN 18): one durable topic exchange per application,
//! `toa.<app>#events`, declared by the first process that publishes on a connection. An event
//! is published persistent, with its label as the routing key, its identity as the message id
//! (`label/id/version`) and the object's id, version and label as headers, and counts as sent once the
//! broker confirmed it. With no queue bound (no receiver yet) the broker drops it: a receiver
//! sees the events published after its queue exists.

use super::session::Session;
use super::{Broker, CONFIRM_LIMIT};
use crate::entities::store::Event;
use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation, ExchangeKind};

/// The headers naming an event's object and version.
pub const OBJECT: &str = "toa-object";
pub const VERSION: &str = "toa-version";
/// The header naming an event's label: the routing key is the label only on the way from the
/// exchange (a dead-lettered event is requeued under its queue's name).
pub const LABEL: &str = "toa-label";

impl Broker {
    /// Publishes `event`; `Ok` once the broker confirmed it.
    pub async fn publish_event(&self, event: &Event) -> Result<(), String> {
        let session = self.session().ok_or_else(|| {
            format!(
                "{}: the connection is being made again",
                self.settings.shown
            )
        })?;
        let exchange = self.names.events();
        declare(&session, &exchange).await?;
        let body = serde_json::to_vec(&event.payload).expect("JSON");
        let sent = async {
            session
                .events
                .basic_publish(
                    exchange.as_str().into(),
                    event.label.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties(event),
                )
                .await?
                .await
        };
        match tokio::time::timeout(CONFIRM_LIMIT, sent).await {
            Err(_) => Err(format!(
                "the broker did not confirm it within {} s",
                CONFIRM_LIMIT.as_secs()
            )),
            Ok(Err(error)) => {
                session.check_channels();
                Err(error.to_string())
            }
            Ok(Ok(Confirmation::Nack(_))) => Err("the broker refused it".to_owned()),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// The events exchange, declared once per session (a declaration is a round trip).
pub(super) async fn declare(session: &Session, exchange: &str) -> Result<(), String> {
    if session
        .declared
        .lock()
        .expect("declared")
        .contains(exchange)
    {
        return Ok(());
    }
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    session
        .events
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            options,
            FieldTable::default(),
        )
        .await
        .map_err(|error| format!("the exchange {exchange}: {error}"))?;
    let mut declared = session.declared.lock().expect("declared");
    declared.insert(exchange.to_owned());
    Ok(())
}

/// An event's properties: persistent, its identity as the message id, its object and version
/// as headers.
fn properties(event: &Event) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(OBJECT),
        AMQPValue::LongString(event.object.as_str().into()),
    );
    headers.insert(
        ShortString::from(VERSION),
        AMQPValue::LongLongInt(event.version as i64),
    );
    headers.insert(
        ShortString::from(LABEL),
        AMQPValue::LongString(event.label.as_str().into()),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(event.message_id().into())
        .with_headers(headers)
}

impl crate::entities::outbox::Publish for Broker {
    fn publish<'a>(
        &'a self,
        event: &'a Event,
    ) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(self.publish_event(event))
    }
}
