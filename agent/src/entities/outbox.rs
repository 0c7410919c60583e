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
use tokio::time::Instant;

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
    /// The local group (no broker): its leader hands each to one process per receiving
    /// component.
    Group(Arc<crate::coordination::group::Group>),
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
            Self::Group(group) => {
                let payload = serde_json::to_value(event).expect("JSON");
                let published = group.publish(&event.label, payload).await;
                published.map_err(|e| e.to_string())
            }
        }
    }
}

/// One component's outbox: its store's rows, and where they are published.
pub struct Outbox {
    component: String,
    store: Arc<Backend>,
    /// Where events go, and the gauge of how long the oldest unpublished one waited: known once
    /// the process connected.
    sink: OnceLock<(Sink, crate::metrics::Waiting)>,
    /// Events published, to mark so in the store: one statement for all that came meanwhile,
    /// not one per write.
    marks: OnceLock<tokio::sync::mpsc::UnboundedSender<Event>>,
    /// A test's hook (`TOA_TEST_HOLD_EVENTS=1`): this process publishes nothing, neither what
    /// it stores nor by its relay, as one that stopped right after its commits.
    hold: bool,
}

impl Outbox {
    pub fn new(component: &str, store: Arc<Backend>) -> Self {
        Self {
            component: component.to_owned(),
            store,
            sink: OnceLock::new(),
            marks: OnceLock::new(),
            hold: std::env::var("TOA_TEST_HOLD_EVENTS").is_ok_and(|v| v == "1"),
        }
    }

    /// Where events go from now on, and the gauge the relay keeps; until then they wait for
    /// the relay.
    pub fn connect(&self, sink: Sink, waiting: crate::metrics::Waiting) {
        let (marks, marked) = tokio::sync::mpsc::unbounded_channel();
        if self.marks.set(marks).is_ok() {
            tokio::spawn(mark(self.store.clone(), self.component.clone(), marked));
        }
        let _ = self.sink.set((sink, waiting));
    }

    /// The events of a write just stored: published now, off the caller's path, within half
    /// their lease (what is left then waits for a relay, after the lease: never two publishers
    /// at once).
    pub fn sent(self: &Arc<Self>, events: Vec<Event>) {
        if self.hold || self.sink.get().is_none() {
            return;
        }
        let outbox = self.clone();
        let until = Instant::now() + LEASE / 2;
        tokio::spawn(async move { outbox.publish(&events, until).await });
    }

    /// Publishes `events` until `until`, and marks those the sink took. One the sink refuses
    /// waits for a relay after its lease; the others go on.
    async fn publish(&self, events: &[Event], until: Instant) -> usize {
        let Some((sink, _)) = self.sink.get() else {
            return 0;
        };
        let mut taken = 0;
        for event in events {
            if Instant::now() >= until {
                break;
            }
            match sink.publish(event).await {
                Ok(()) => {
                    taken += 1;
                    if let Some(marks) = self.marks.get() {
                        let _ = marks.send(event.clone());
                    }
                }
                Err(error) => {
                    tracing::warn!(component = %self.component, event = %event.message_id(), %error, "an event was not published: a relay publishes it after its lease");
                }
            }
        }
        taken
    }

    /// Whether this process's relay may claim events: not while it holds them (the test's
    /// hook), and not from a shared store into this process's bus (or its local group), which
    /// no other process hears (a local run with `storage` and no broker would take events from processes on a
    /// broker).
    fn relays(&self) -> bool {
        let local = matches!(self.sink.get(), Some((Sink::Local(_) | Sink::Group(_), _)));
        let shared = matches!(*self.store, Backend::Postgres(_));
        !(self.hold || local && shared)
    }

    /// Every [`RELAY_EVERY`] (at once again while whole batches are published): claims the events
    /// whose lease ran out and publishes them within half the lease it took, and sets the gauge
    /// of how long the oldest unpublished one has waited. Runs until aborted (a pause, the
    /// process's end): a claim cut short leaves its events to the next relay, after their lease.
    pub async fn relay(self: Arc<Self>) {
        let mut every = tokio::time::interval(RELAY_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some((_, waiting)) = self.sink.get() else {
                continue;
            };
            while self.relays() && self.relay_once().await == CLAIM_LIMIT {}
            if let Ok(age) = self.store.waiting().await {
                waiting.set(age.map_or(0.0, |age| age.as_secs_f64()));
            }
        }
    }

    /// One claim and its publication: how many events were published (a full batch: there may
    /// be more).
    async fn relay_once(&self) -> usize {
        let claimed = Instant::now();
        match self.store.claim(LEASE, CLAIM_LIMIT).await {
            Ok(due) if !due.is_empty() => {
                let published = self.publish(&due, claimed + LEASE / 2).await;
                tracing::info!(component = %self.component, claimed = due.len(), published, "relayed events their committer did not publish");
                published
            }
            Ok(_) => 0,
            Err(error) => {
                tracing::warn!(component = %self.component, %error, "the relay could not claim events now");
                0
            }
        }
    }
}

/// The most events one statement marks published.
const MARK_BATCH: usize = 1_000;

/// Marks the events published as they come, all that came meanwhile in one statement.
async fn mark(
    store: Arc<Backend>,
    component: String,
    mut marked: tokio::sync::mpsc::UnboundedReceiver<Event>,
) {
    let mut batch = Vec::new();
    while marked.recv_many(&mut batch, MARK_BATCH).await > 0 {
        if let Err(error) = store.published(&batch).await {
            // Published and not marked: a relay publishes them again after their lease, a copy
            // receivers recognise by its message id.
            tracing::warn!(%component, %error, count = batch.len(), "published events were not marked published");
        }
        batch.clear();
    }
}
