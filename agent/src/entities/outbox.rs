//! Events leave through the outbox (DESIGN 18; seed 003: "Leave a consequence to an event,
//! which is published once, for the run that was stored").
//!
//! A stored write's events are rows the store writes in the write's transaction
//! ([`super::store::Store::commit`]), leased to the committing process for [`LEASE`]. That
//! process publishes them right after the commit ([`Outbox::sent`]) and marks them published
//! once the broker confirmed them. A process that stops between the commit and the publication
//! (a crash, a broker that did not take them) leaves them to the relay: every replica runs one
//! ([`Outbox::relay`]), which claims rows whose lease ran out, so nothing is lost and nothing
//! waits on one process. An event is published at least once: a publisher slower than its
//! lease may see a relay publish it too, and receivers tell copies apart by
//! [`Event::message_id`] (the label, the object's id and version).
//!
//! Where events go: the context's broker (one topic exchange per application, the label as the
//! routing key), or without one this process's own bus, from which the receivers of the
//! components it runs take them.

use super::backend::Backend;
use super::store::{Event, Store, LEASE};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How often the relay looks for events whose lease ran out.
const RELAY_EVERY: Duration = Duration::from_secs(1);
/// The most events the relay claims at once.
const CLAIM_LIMIT: usize = 100;

/// What publishes an event and confirms it: the broker (`crate::calls::broker`, which uses
/// this module, so it is named by this trait).
pub trait Publish: Send + Sync {
    fn publish<'a>(
        &'a self,
        event: &'a Event,
    ) -> futures::future::BoxFuture<'a, Result<(), String>>;
}

/// Where published events go.
#[derive(Clone)]
pub enum Sink {
    /// The context's broker.
    Broker(Arc<dyn Publish>),
    /// This process's bus (no broker): its receivers take them.
    Local(tokio::sync::broadcast::Sender<Event>),
}

impl Sink {
    async fn publish(&self, event: &Event) -> Result<(), String> {
        match self {
            Self::Broker(broker) => broker.publish(event).await,
            // Taken by the receivers listening now; none listening is no loss (as on the
            // broker, a receiver sees what is published after it listens).
            Self::Local(bus) => {
                let _ = bus.send(event.clone());
                Ok(())
            }
        }
    }
}

/// One component's outbox: its store's rows, and where they are published.
pub struct Outbox {
    component: String,
    store: Arc<Backend>,
    sink: OnceLock<Sink>,
    /// A test's hook (`TOA_TEST_HOLD_EVENTS=1`): this process does not publish what it stores,
    /// as one that stops between the commit and the publication; its relay still runs.
    hold: bool,
}

impl Outbox {
    pub fn new(component: &str, store: Arc<Backend>) -> Self {
        Self {
            component: component.to_owned(),
            store,
            sink: OnceLock::new(),
            hold: std::env::var("TOA_TEST_HOLD_EVENTS").is_ok_and(|v| v == "1"),
        }
    }

    /// Where events go from now on; until then they wait for the relay.
    pub fn connect(&self, sink: Sink) {
        let _ = self.sink.set(sink);
    }

    /// The events of a write just stored: published now, off the caller's path.
    pub fn sent(self: &Arc<Self>, events: Vec<Event>) {
        if self.hold || self.sink.get().is_none() {
            return;
        }
        let outbox = self.clone();
        tokio::spawn(async move { outbox.publish(&events).await });
    }

    /// Publishes `events` in order, and marks those the sink took; the first refused stops it
    /// (the rest wait for the relay, after their lease).
    async fn publish(&self, events: &[Event]) -> usize {
        let Some(sink) = self.sink.get() else {
            return 0;
        };
        let mut taken = 0;
        for event in events {
            if let Err(error) = sink.publish(event).await {
                tracing::warn!(component = %self.component, event = %event.message_id(), %error, "an event was not published: the relay publishes it after its lease");
                break;
            }
            taken += 1;
        }
        if taken > 0 {
            if let Err(error) = self.store.published(&events[..taken]).await {
                // Published and not marked: the relay publishes them again after their lease,
                // a copy receivers recognise.
                tracing::warn!(component = %self.component, %error, "published events were not marked published");
            }
        }
        taken
    }

    /// Every [`RELAY_EVERY`]: claims the events whose lease ran out and publishes them, and
    /// tells `waiting` how long the oldest unpublished one has waited. Runs until the process
    /// stops.
    pub async fn relay(self: Arc<Self>, waiting: crate::metrics::Waiting) {
        let mut every = tokio::time::interval(RELAY_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if self.sink.get().is_none() {
                continue;
            }
            match self.store.claim(LEASE, CLAIM_LIMIT).await {
                Ok(due) if !due.is_empty() => {
                    let published = self.publish(&due).await;
                    tracing::info!(component = %self.component, claimed = due.len(), published, "relayed events their committer did not publish");
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(component = %self.component, %error, "the relay could not claim events now")
                }
            }
            if let Ok(age) = self.store.waiting().await {
                waiting.set(age.map_or(0.0, |age| age.as_secs_f64()));
            }
        }
    }
}
