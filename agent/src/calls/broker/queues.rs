//! The queues of an application on the broker, and who declares them how.
//!
//! For application `app` and component `c`:
//! - `toa.app.c#tasks`: the shared queue of tasks. A durable *quorum* queue (it survives a broker
//!   restart, and it counts deliveries), with persistent messages, at most `limits.queue` tasks
//!   (`reject-publish`: a caller past the bound is refused, nothing is dropped), and a delivery
//!   limit (`limits.deliveries`) after which a task is dead-lettered to `toa.app.c#dead`. Only an
//!   agent that serves `c` declares it, with these arguments; callers check that it exists (a
//!   passive declaration on a channel of its own) and never declare it, so no two declarations
//!   can disagree and close the channel every call shares.
//! - `toa.app.c`: the shared queue of ordinary calls, transient as it always was: a call whose
//!   caller waits lives as long as the caller's connection does (a broker restart ends the wait
//!   anyway, "it may have run"), so it does not pay for the disk. The agent counts a call's
//!   deliveries itself (a header), and sends it to `#dead` at the limit. Agents before `#tasks`
//!   publish tasks here too: it is served all the same, so old and new agents answer each
//!   other's calls during a rollout.
//! - `toa.app.c#dead`: durable; calls and tasks that reached the delivery limit. The agents
//!   serving `c` answer each one's caller (if it waits) with a failure, and count it.
//! - `toa.app.c@instance`: one process's calls (exclusive to it).
//! - `toa.app.c#receivers`: the events `c` receives, bound to `toa.app#events` by their labels;
//!   declared by `c`'s agents with the tasks' arguments, dead-lettering to
//!   `toa.app.c#receivers-dead`, which only `toa-agent requeue` reads ([`super::receive`]).
//!
//! The `#tasks` name is the plan for changing the queue's *kind* of arguments: a new kind gets a
//! new name, served beside the old one during the rollout. A changed *value* (a new
//! `limits.queue`) meets the existing queue: the agent serves it as it is and says so; the new
//! bound applies once the queue is deleted (docs/calls.md, "Queues").

use super::session::Session;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use toa_context::Limits;

/// The names of one application's queues.
pub(super) struct Names {
    prefix: String,
}

impl Names {
    pub fn new(application: &str) -> Self {
        Self {
            prefix: format!("toa.{application}."),
        }
    }

    pub fn tasks(&self, component: &str) -> String {
        format!("{}{component}#tasks", self.prefix)
    }

    pub fn calls(&self, component: &str) -> String {
        format!("{}{component}", self.prefix)
    }

    pub fn dead(&self, component: &str) -> String {
        format!("{}{component}#dead", self.prefix)
    }

    /// The queue of the events `component` receives (quorum, as tasks).
    pub fn receivers(&self, component: &str) -> String {
        format!("{}{component}#receivers", self.prefix)
    }

    /// Where its events go at the delivery limit, until they are requeued.
    pub fn receivers_dead(&self, component: &str) -> String {
        format!("{}{component}#receivers-dead", self.prefix)
    }

    /// The application's events exchange (a topic exchange; routing keys are labels).
    pub fn events(&self) -> String {
        format!("{}#events", self.prefix.trim_end_matches('.'))
    }

    pub fn own(&self, component: &str, instance: &str) -> String {
        format!("{}{component}@{instance}", self.prefix)
    }
}

/// The shared queue's arguments.
pub(super) fn arguments(limits: &Limits, dead: &str) -> FieldTable {
    let mut table = FieldTable::default();
    let mut set = |key: &str, value: AMQPValue| {
        table.insert(ShortString::from(key), value);
    };
    let text = |text: &str| AMQPValue::LongString(LongString::from(text));
    set("x-queue-type", text("quorum"));
    set("x-max-length", AMQPValue::LongLongInt(limits.queue.into()));
    set("x-overflow", text("reject-publish"));
    // The broker counts returns: `deliveries` deliveries are the first and deliveries − 1
    // returns.
    set(
        "x-delivery-limit",
        AMQPValue::LongLongInt(i64::from(limits.deliveries) - 1),
    );
    set("x-dead-letter-exchange", text(""));
    set("x-dead-letter-routing-key", text(dead));
    table
}

/// How many more deliveries than `limits.deliveries` the broker allows an event: the agent
/// dead-letters at the limit itself (logged, counted); the broker's own limit, which counts
/// returns at reconnections too and tells nobody, is the backstop for a process that dies on
/// the event.
pub(super) const RECEIVERS_MARGIN: i64 = 5;

/// The receivers' queue's arguments: the tasks', with the margin over the delivery limit, and
/// dead letters kept at least once (the broker holds one until the dead letters confirm it).
pub(super) fn receivers_arguments(limits: &Limits, dead: &str) -> FieldTable {
    let mut table = arguments(limits, dead);
    table.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongLongInt(i64::from(limits.deliveries) - 1 + RECEIVERS_MARGIN),
    );
    table.insert(
        ShortString::from("x-dead-letter-strategy"),
        AMQPValue::LongString(LongString::from("at-least-once")),
    );
    table
}

/// How the shared queue was found.
pub(super) enum Declared {
    /// With our arguments.
    AsAsked,
    /// It existed with other arguments: served as it is. The broker's refusal.
    AsFound(String),
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Declares the shared queue with `arguments`, on a channel of its own (a refusal closes it).
pub(super) async fn declare_shared(
    session: &Session,
    queue: &str,
    arguments: FieldTable,
) -> Result<Declared, lapin::Error> {
    let channel = session.connection.create_channel().await?;
    match channel
        .queue_declare(queue.into(), durable(), arguments)
        .await
    {
        Ok(_) => {
            let _ = channel.close(200, "declared".into()).await;
            Ok(Declared::AsAsked)
        }
        Err(error) if error.to_string().contains("PRECONDITION_FAILED") => {
            Ok(Declared::AsFound(error.to_string()))
        }
        Err(error) => Err(error),
    }
}

/// Declares the dead-letter queue.
pub(super) async fn declare_dead(session: &Session, queue: &str) -> Result<(), lapin::Error> {
    let channel = session.connection.create_channel().await?;
    channel
        .queue_declare(queue.into(), durable(), FieldTable::default())
        .await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// Declares a dead-letter queue as a quorum queue (replicated, and a target the at-least-once
/// dead-lettering confirms into).
pub(super) async fn declare_dead_quorum(
    session: &Session,
    queue: &str,
) -> Result<(), lapin::Error> {
    let channel = session.connection.create_channel().await?;
    let mut quorum = FieldTable::default();
    quorum.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    channel
        .queue_declare(queue.into(), durable(), quorum)
        .await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// Whether `queue` exists: a passive declaration on a channel of its own (a missing queue closes
/// the channel it is asked on).
pub(super) async fn exists(session: &Session, queue: &str) -> Result<bool, lapin::Error> {
    let channel = session.connection.create_channel().await?;
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    match channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
    {
        Ok(_) => {
            let _ = channel.close(200, "checked".into()).await;
            Ok(true)
        }
        Err(error) if error.to_string().contains("NOT_FOUND") => Ok(false),
        Err(error) => Err(error),
    }
}
