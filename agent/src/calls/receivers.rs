//! A component's receivers (DESIGN 18): the event `label` runs the operation the manifest binds
//! to it (`receivers: { store.orders.approved: notify }`) with the request the program's
//! adaptation makes of the event (`receivers/<label>` exporting `request(payload)`), or
//! `{ input: <the event> }` without one. Events are delivered at least once; an operation that
//! writes to the component's store (a transition, an assignment) keeps the event's id as its
//! record, in the write's transaction (the inbox), so a copy of the event is answered by the
//! record and runs nothing.
//!
//! The same receivers take events from the broker ([`crate::calls::broker::receive`]) and, in a
//! local run without one, from the process's bus ([`listen_locally`]) or its local group's
//! leader ([`deliver`]).

use crate::calls::broker::{Incoming, Receive, Verdict};
use crate::calls::contract::{CallError, Request};
use crate::calls::router::Calls;
use crate::component::client::{Outcome, ProgramClient};
use crate::component::Component;
use crate::coordination::atom::repeats::input_hash;
use crate::entities::objects::STALE;
use crate::entities::store::{Event, Receipt};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// The receivers of one component of this process.
pub struct Receivers {
    component: Arc<Component>,
    calls: Arc<Calls>,
    client: ProgramClient,
    /// The labels whose request the program makes.
    adapted: HashSet<String>,
    /// How long an adaptation may take.
    limit: Duration,
}

/// The codes an operation answers when the store could not take the write now: the event comes
/// again.
const PASSING: [&str; 3] = ["UNAVAILABLE", "CONTENDED", "CONFLICT"];

impl Receivers {
    pub fn new(
        component: Arc<Component>,
        calls: Arc<Calls>,
        client: ProgramClient,
        adapted: &[String],
        limit: Duration,
    ) -> Self {
        Self {
            component,
            calls,
            client,
            adapted: adapted.iter().cloned().collect(),
            limit,
        }
    }

    /// The labels the component receives.
    pub fn labels(&self) -> Vec<String> {
        self.component.manifest.receivers.keys().cloned().collect()
    }

    /// Runs `incoming` on its operation: what becomes of it.
    pub async fn run(&self, incoming: &Incoming) -> Verdict {
        let component = &self.component.name;
        let Some(receiver) = self.component.manifest.receivers.get(&incoming.label) else {
            return Verdict::Dead(format!("{component} receives no {}", incoming.label));
        };
        let operation = receiver.operation();
        let mut request = match self.request(incoming).await {
            Ok(request) => request,
            Err(verdict) => return verdict,
        };
        if receiver.latest() {
            match watermark(incoming) {
                Ok((source, version)) => {
                    request.key = Some(source);
                    request.receipt = Some(Receipt::Latest(version));
                }
                Err(reason) => return Verdict::Dead(reason),
            }
        }
        let inbox = inbox_key(&incoming.id);
        let answered = self
            .calls
            .receive(component, operation, request, &inbox)
            .await;
        verdict(&format!("{component}.{operation}"), incoming, answered)
    }

    /// The request the event makes: the adaptation's, else `{ input: <the event> }`.
    async fn request(&self, incoming: &Incoming) -> Result<Request, Verdict> {
        let made = if self.adapted.contains(&incoming.label) {
            self.client
                .adapt(&incoming.label, &incoming.payload, self.limit)
                .await
                .map_err(|error| match error {
                    crate::component::client::ProgramError::Contract(message) => {
                        Verdict::Dead(message)
                    }
                    other => Verdict::Again(other.to_string()),
                })?
        } else {
            json!({ "input": incoming.payload })
        };
        parse_request(made).map_err(|message| {
            Verdict::Dead(format!(
                "{}: the receiver of {} made a request that is not one: {message}",
                self.component.name, incoming.label
            ))
        })
    }
}

/// A request as an adaptation returns it: `input`, `query` and `instance` (a `key` or `timeout`
/// is the receiver's to set, not the adaptation's).
fn parse_request(made: Value) -> Result<Request, String> {
    if let Some(field) = made.as_object().and_then(|fields| {
        fields
            .keys()
            .find(|k| !["input", "query", "instance"].contains(&k.as_str()))
    }) {
        return Err(format!(
            "unknown field `{field}`, expected input, query or instance"
        ));
    }
    serde_json::from_value(made).map_err(|e| e.to_string())
}

/// What becomes of an event its `target`'s operation answered so.
fn verdict(target: &str, incoming: &Incoming, answered: Result<Outcome, CallError>) -> Verdict {
    match answered {
        Ok(Outcome::Reply(_)) => Verdict::Done,
        Ok(Outcome::Error { code, .. }) if code == STALE => {
            tracing::debug!(event = %incoming.id, %target, "an event older than the one applied: not run");
            Verdict::Done
        }
        Ok(Outcome::Error { code, message }) if PASSING.contains(&code.as_str()) => {
            let message = message.unwrap_or_default();
            Verdict::Again(format!("{target} answered {code}: {message}"))
        }
        Ok(Outcome::Error { code, message }) => {
            // The operation's own answer: the event was handled, as the operation decided.
            tracing::info!(event = %incoming.id, %target, %code, ?message, "a receiver's operation answered an error of its own");
            Verdict::Done
        }
        Err(
            error @ (CallError::RequestContract(_)
            | CallError::Unrepeatable { .. }
            | CallError::UnknownComponent(_)),
        ) => Verdict::Dead(format!("{target}: {error}")),
        Err(error) => Verdict::Again(format!("{target}: {error}")),
    }
}

/// A `latest` receiver's watermark of an event: its object (`label/id`, as a key: hashed past a
/// key's length) and its version, from the event as published.
fn watermark(incoming: &Incoming) -> Result<(String, u64), String> {
    let id = incoming.payload.get("id").and_then(Value::as_str);
    let version = incoming.payload.get("VERSION").and_then(Value::as_u64);
    let (Some(id), Some(version)) = (id, version) else {
        return Err(format!(
            "{}: a `latest` receiver orders events by their object's id and VERSION, and this \
             one has no string id or no whole VERSION",
            incoming.id
        ));
    };
    let source = format!("{}/{id}", incoming.label);
    let source = if source.chars().count() <= crate::calls::once::MAX_KEY - "latest:".len() {
        source
    } else {
        format!("#{}", input_hash(&Value::from(source)))
    };
    Ok((source, version))
}

/// What names an event's record: its id, or the id's hash when `event:<id>` would be longer
/// than a key may be.
fn inbox_key(id: &str) -> String {
    if id.chars().count() + "event:".len() <= crate::calls::once::MAX_KEY {
        id.to_owned()
    } else {
        format!("#{}", input_hash(&Value::from(id)))
    }
}

impl Receive for Receivers {
    fn receive<'a>(&'a self, incoming: &'a Incoming) -> BoxFuture<'a, Verdict> {
        Box::pin(self.run(incoming))
    }
}

/// In a local run without a broker: takes the process's events off its bus and runs those
/// `receivers` receive, each until it is done, at most `deliveries` times. The bus is in memory:
/// what it holds goes with the process (docs/events.md).
pub fn listen_locally(
    mut bus: tokio::sync::broadcast::Receiver<Event>,
    receivers: Arc<Receivers>,
    deliveries: u32,
) {
    let labels: HashSet<String> = receivers.labels().into_iter().collect();
    tokio::spawn(async move {
        loop {
            let event = match bus.recv().await {
                Ok(event) => event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::error!(missed, component = %receivers.component.name, "the process's bus dropped events this receiver was behind on");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if labels.contains(&event.label) {
                let receivers = receivers.clone();
                tokio::spawn(async move { deliver(&receivers, &event, deliveries).await });
            }
        }
    });
}

/// Runs `event` on its receiver, again while it asks to come again (up to `deliveries`).
pub(crate) async fn deliver(receivers: &Receivers, event: &Event, deliveries: u32) {
    let mut incoming = Incoming {
        label: event.label.clone(),
        payload: event.payload.clone(),
        id: event.message_id(),
        delivery: 1,
    };
    loop {
        let reason = match receivers.run(&incoming).await {
            Verdict::Done => return,
            Verdict::Again(reason) if incoming.delivery < deliveries => {
                tracing::warn!(event = %incoming.id, delivery = incoming.delivery, %reason, "an event was not handled: it comes again");
                tokio::time::sleep(crate::calls::broker::pause(incoming.delivery)).await;
                incoming.delivery += 1;
                continue;
            }
            Verdict::Again(reason) => format!("delivered {deliveries} times: {reason}"),
            Verdict::Dead(reason) => reason,
        };
        tracing::error!(event = %incoming.id, component = %receivers.component.name, %reason, "an event was given up on (a local run keeps no dead letters)");
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adaptation_makes_input_query_and_instance_only() {
        let request = parse_request(json!({"input": {"n": 1}, "query": {"id": "o1"}})).unwrap();
        assert_eq!(request.input, json!({"n": 1}));
        assert_eq!(request.query.unwrap().id.as_deref(), Some("o1"));
        let addressed = parse_request(json!({"instance": "t1"})).unwrap();
        assert_eq!(addressed.instance.as_deref(), Some("t1"));
        let keyed = parse_request(json!({"input": 1, "key": "k"})).unwrap_err();
        assert!(keyed.contains("unknown field `key`"), "{keyed}");
        assert!(parse_request(json!({"instance": 5})).is_err());
    }

    #[test]
    fn an_inbox_key_is_the_events_id_within_a_keys_length() {
        assert_eq!(
            inbox_key("store.orders.approved/o1/3"),
            "store.orders.approved/o1/3"
        );
        let long = "x".repeat(300);
        let key = inbox_key(&long);
        assert!(key.starts_with('#') && key.chars().count() + 6 <= crate::calls::once::MAX_KEY);
        assert_ne!(key, inbox_key(&"x".repeat(299)));
    }
}
