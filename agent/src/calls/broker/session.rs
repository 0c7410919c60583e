//! One connection to the broker and what lives and dies with it: the channel calls and replies
//! are published on (with publisher confirms), this process's reply queue, the calls waiting for
//! a reply there, and the shared queues declared on it. A session ends when its connection does
//! (the broker restarted, the network failed, or the broker's heartbeat gave up on this process);
//! [`super::Broker`] then opens the next one.

use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, Event};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toa_context::answer::Reply;
use toa_context::tls::Roots;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// What a session is opened with.
#[derive(Clone)]
pub(super) struct Settings {
    /// Holds the password: never logged (errors name `shown`).
    pub uri: String,
    pub shown: String,
    /// What an `amqps://` connection trusts.
    pub roots: Roots,
    /// The connection's name on the broker (`toa-agent <application> <instance>`): operators
    /// find a process's connection by it.
    pub name: String,
}

pub(super) struct Session {
    pub connection: Connection,
    /// Calls are published here, with publisher confirms.
    pub channel: Channel,
    /// Replies are published here, without confirms: a lost reply is the caller's `Abandoned`.
    pub plain: Channel,
    /// Events are published here, with confirms: a channel of their own, so that the broker
    /// closing it (an exchange it refuses) never takes the calls' channel down.
    pub events: Channel,
    pub replies: String,
    /// Calls waiting for their reply, by correlation id. Dropped with the session, which tells
    /// every waiting caller that its reply will never come.
    pending: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// Shared queues (and the events exchange) declared on this connection: declaring costs a
    /// round trip.
    pub declared: Mutex<HashSet<String>>,
    /// Cancelled once the connection is gone.
    pub lost: CancellationToken,
    /// The consumers of this process's calls on this connection: the drain cancels them.
    consumers: Mutex<Vec<Consuming>>,
}

/// A consumer of calls: a shared queue's, or this process's own (`own`).
#[derive(Clone)]
pub(super) struct Consuming {
    pub channel: Channel,
    pub tag: lapin::types::ShortString,
    pub queue: String,
    pub own: bool,
}

/// Connects to the broker. `amqps://` checks the broker's certificate against the CA file
/// (added to the public roots); `amqp://` ignores the TLS configuration.
async fn connect(
    settings: &Settings,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    let tls = lapin::tcp::OwnedTLSConfig {
        identity: None,
        cert_chain: settings.roots.pem().map(str::to_owned),
    };
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_with_config(settings.uri.as_str(), properties, tls, runtime).await
}

/// How long opening a session may take. A broker can accept the TCP connection and never answer
/// (frozen, or still booting): without a bound the agent's start, or its reconnect, waited for
/// it forever.
pub(super) const OPEN_LIMIT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub(super) enum OpenError {
    #[error(transparent)]
    Refused(#[from] lapin::Error),
    #[error("it accepted the connection but did not finish opening it within {0:?}")]
    Unanswered(Duration),
    #[error("opening the session failed: {0}")]
    Failed(String),
}

/// Opening sessions, one attempt at a time. An attempt past [`OPEN_LIMIT`] is not dropped but
/// kept for the next call: lapin holds its I/O thread and socket until the broker answers or
/// closes, so a new attempt every time would pile them up for as long as a broker stays frozen.
#[derive(Default)]
pub(super) struct Opening(Option<tokio::task::JoinHandle<Result<Arc<Session>, lapin::Error>>>);

impl Opening {
    /// The next session within [`OPEN_LIMIT`]: the attempt still under way, or a new one.
    pub async fn next(&mut self, settings: &Settings) -> Result<Arc<Session>, OpenError> {
        let mut attempt = self
            .0
            .take()
            .unwrap_or_else(|| tokio::spawn(Session::open(settings.clone())));
        match tokio::time::timeout(OPEN_LIMIT, &mut attempt).await {
            Ok(Ok(opened)) => Ok(opened?),
            Ok(Err(failed)) => Err(OpenError::Failed(failed.to_string())),
            Err(_) => {
                self.0 = Some(attempt);
                Err(OpenError::Unanswered(OPEN_LIMIT))
            }
        }
    }
}

/// A channel of `connection` with publisher confirms.
async fn confirming(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

impl Session {
    async fn open(settings: Settings) -> Result<Arc<Self>, lapin::Error> {
        let settings = &settings;
        let properties =
            ConnectionProperties::default().with_connection_name(settings.name.as_str().into());
        let connection = connect(settings, properties).await?;
        let lost = CancellationToken::new();
        watch_connection(&connection, lost.clone());
        let channel = confirming(&connection).await?;
        let plain = connection.create_channel().await?;
        let events = confirming(&connection).await?;
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
            .await?
            .name()
            .as_str()
            .to_owned();
        let consumer_channel = connection.create_channel().await?;
        let consumer = consumer_channel
            .basic_consume(
                replies.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let session = Arc::new(Self {
            connection,
            channel,
            plain,
            events,
            replies,
            pending: Mutex::default(),
            declared: Mutex::default(),
            lost,
            consumers: Mutex::default(),
        });
        let lost = session.lost.clone();
        tokio::spawn(answer_callers(
            Arc::downgrade(&session),
            lost,
            consumer_channel,
            consumer,
        ));
        Ok(session)
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || !self.connection.status().connected()
    }

    /// Ends the session when the broker closed one of its channels (a refused declaration or
    /// publish closes the channel every call shares): the broker opens the next one.
    pub fn check_channels(&self) {
        if !self.channel.status().connected() || !self.plain.status().connected() {
            tracing::warn!(
                "the broker closed a channel this process publishes on: opening a new session"
            );
            self.lost.cancel();
        }
    }

    /// Registers a call waiting for its reply; the receiver fails when the session ends first.
    pub fn expect(&self, id: &str) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        let mut pending = self.pending.lock().expect("pending");
        // Registered after the session ended: nobody will clear it, so drop it at once.
        if !self.lost.is_cancelled() {
            pending.insert(id.to_owned(), tx);
        }
        rx
    }

    /// Records a queue's consumer (replacing an earlier one of that queue).
    pub fn consuming(&self, consumer: Consuming) {
        let mut consumers = self.consumers.lock().expect("consumers");
        consumers.retain(|c| c.queue != consumer.queue);
        consumers.push(consumer);
    }

    pub fn consumers(&self) -> Vec<Consuming> {
        self.consumers.lock().expect("consumers").clone()
    }

    pub fn forget(&self, id: &str) -> Option<oneshot::Sender<Value>> {
        self.pending.lock().expect("pending").remove(id)
    }
}

/// Ends the session (`lost`) when the connection fails. A channel's error (a name taken, say) is
/// an event too: only the connection's counts.
fn watch_connection(connection: &Connection, lost: CancellationToken) {
    let mut events = connection.events_listener();
    let status = connection.status().clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = lost.cancelled() => return,
                event = events.next() => match event {
                    Some(Event::Error(error)) if !status.connected() => {
                        tracing::warn!(%error, "the connection to the broker failed");
                        lost.cancel();
                        return;
                    }
                    Some(_) => {}
                    None => {
                        lost.cancel();
                        return;
                    }
                },
            }
        }
    });
}

/// Hands each reply to its waiting caller. It holds the session weakly: a session nobody uses
/// any more ends.
async fn answer_callers(
    weak: std::sync::Weak<Session>,
    lost: CancellationToken,
    _channel: Channel,
    mut consumer: lapin::Consumer,
) {
    loop {
        let delivery = tokio::select! {
            () = lost.cancelled() => break,
            delivery = consumer.next() => delivery,
        };
        let Some(Ok(delivery)) = delivery else { break };
        let Some(session) = weak.upgrade() else { break };
        let Some(id) = delivery.properties.correlation_id().as_ref() else {
            continue;
        };
        let reply = serde_json::from_slice(&delivery.data)
            .unwrap_or_else(|_| Reply::Failure("a reply that is not JSON".to_owned()).to_json());
        if let Some(caller) = session.forget(id.as_str()) {
            let _ = caller.send(reply);
        }
    }
    // However the consumer ended, the session is over: its waiting callers learn it.
    lost.cancel();
    if let Some(session) = weak.upgrade() {
        session.pending.lock().expect("pending").clear();
    }
}
