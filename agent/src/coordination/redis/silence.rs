//! Whether one Redis server answers, as far as this process knows, so that a server that stopped
//! answering (frozen, overloaded, cut off without a reset) is not sent command after command that
//! each wait out the timeout and pile up on its connection.
//!
//! * A command sent and then dropped unanswered (a lock decided by the other servers stops
//!   waiting for the slowest) marks the server as owing an answer; any later answer on the same
//!   connection clears the mark, since a connection's answers come in order.
//! * A mark older than the timeout makes the server *suspect*: a `PING` asks, and commands still
//!   go meanwhile. An answer within the timeout clears the suspicion (the server was only slower
//!   than the others).
//! * No answer to that `PING`, or a command that itself timed out, makes it *silent*: commands
//!   fail at once until the `PING` is answered. Every [`patience`](Silence::patience) without an
//!   answer, a fresh connection is tried; once one answers (the address may lead to a restarted
//!   or moved server), the next command connects anew.
//! * A connection that fails, or a probe that stopped reporting, also means: connect anew.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::time::Instant;

const ANSWERING: u8 = 0;
const SUSPECT: u8 = 1;
const SILENT: u8 = 2;
const RECONNECT: u8 = 3;
const NONE: u64 = u64::MAX;

/// What to do before a command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Before {
    Send,
    /// Silent: fail at once.
    Refuse,
    /// Drop the connection and connect anew, then send.
    Reconnect,
}

/// A command on its way: when it was sent, on which connection.
#[derive(Clone, Copy)]
pub(super) struct Ticket {
    sent: u64,
    generation: u64,
}

pub(super) struct Silence {
    address: String,
    timeout: Duration,
    shared: Arc<Shared>,
}

struct Shared {
    state: AtomicU8,
    /// When the oldest command dropped unanswered was sent, or [`NONE`].
    owed_since: AtomicU64,
    /// Bumped at every disconnection: marks of an old connection do not count against a new one.
    generation: AtomicU64,
    /// The probe's last sign of life, while one runs.
    probed_at: AtomicU64,
}

/// A monotonic instant as microseconds since this process first asked.
fn micros(at: Instant) -> u64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    at.saturating_duration_since(*START).as_micros() as u64
}

impl Silence {
    pub fn new(address: String, timeout: Duration) -> Self {
        Self {
            address,
            timeout,
            shared: Arc::new(Shared {
                state: AtomicU8::new(ANSWERING),
                owed_since: AtomicU64::new(NONE),
                generation: AtomicU64::new(0),
                probed_at: AtomicU64::new(0),
            }),
        }
    }

    /// How long the probe waits on a silent connection before it tries a fresh one.
    pub fn patience(&self) -> Duration {
        (self.timeout * 20).max(Duration::from_secs(5))
    }

    /// Before each command; `connection` is the current one, to probe on if it comes to that.
    pub fn before(&self, connection: Option<&MultiplexedConnection>, client: &Client) -> Before {
        let shared = &self.shared;
        match shared.state.load(Ordering::Acquire) {
            ANSWERING => {
                let owed = shared.owed_since.load(Ordering::Acquire);
                let waited = micros(Instant::now()).saturating_sub(owed);
                if owed != NONE && waited > self.timeout.as_micros() as u64 {
                    self.probe(SUSPECT, connection, client);
                }
                Before::Send
            }
            SUSPECT => Before::Send,
            SILENT => {
                let probed = shared.probed_at.load(Ordering::Acquire);
                let quiet = micros(Instant::now()).saturating_sub(probed);
                if quiet > 2 * (self.patience() + self.timeout).as_micros() as u64 {
                    // The probe stopped reporting (its runtime went away): start over.
                    shared.state.store(RECONNECT, Ordering::Release);
                    return self.before(connection, client);
                }
                Before::Refuse
            }
            _ => {
                let took = shared.state.compare_exchange(
                    RECONNECT,
                    ANSWERING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if took.is_ok() {
                    Before::Reconnect
                } else {
                    Before::Send
                }
            }
        }
    }

    pub fn sent(&self) -> Ticket {
        Ticket {
            sent: micros(Instant::now()),
            generation: self.shared.generation.load(Ordering::Acquire),
        }
    }

    /// The command got an answer: so did every one sent before it on its connection.
    pub fn answered(&self, ticket: Ticket) {
        let _ = self
            .shared
            .owed_since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                (owed != NONE && owed <= ticket.sent).then_some(NONE)
            });
    }

    /// The command's caller stopped waiting before an answer came.
    pub fn dropped(&self, ticket: Ticket) {
        if ticket.generation == self.shared.generation.load(Ordering::Acquire) {
            self.shared
                .owed_since
                .fetch_min(ticket.sent, Ordering::AcqRel);
        }
    }

    /// The command waited the whole timeout for `connection`: silent now.
    pub fn timed_out(&self, connection: Option<&MultiplexedConnection>, client: &Client) {
        self.probe(SILENT, connection, client);
    }

    /// The connection is gone: whatever it owed will not come.
    pub fn disconnected(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.owed_since.store(NONE, Ordering::Release);
        let _ = self.shared.state.compare_exchange(
            SUSPECT,
            ANSWERING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Moves to `to` (suspect or silent) and starts a probe unless one runs.
    fn probe(&self, to: u8, connection: Option<&MultiplexedConnection>, client: &Client) {
        let shared = &self.shared;
        let Some(connection) = connection.cloned() else {
            // Nothing to probe: the next command connects anew.
            shared.owed_since.store(NONE, Ordering::Release);
            return;
        };
        match shared
            .state
            .compare_exchange(ANSWERING, to, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(SUSPECT) if to == SILENT => {
                // The running probe stays; commands fail at once from now on.
                let _ = shared.state.compare_exchange(
                    SUSPECT,
                    SILENT,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                tracing::warn!(server = %self.address, timeout = ?self.timeout,
                    "Redis server did not answer; commands to it fail at once until it answers");
                return;
            }
            Err(_) => return,
        }
        if to == SILENT {
            tracing::warn!(server = %self.address, timeout = ?self.timeout,
                "Redis server did not answer; commands to it fail at once until it answers");
        }
        shared
            .probed_at
            .store(micros(Instant::now()), Ordering::Release);
        tokio::spawn(probe(
            shared.clone(),
            self.address.clone(),
            connection,
            client.clone(),
            self.timeout,
            self.patience(),
        ));
    }
}

/// Asks the server with a `PING` on its connection until it answers.
async fn probe(
    shared: Arc<Shared>,
    address: String,
    mut connection: MultiplexedConnection,
    client: Client,
    timeout: Duration,
    patience: Duration,
) {
    let ping = redis::cmd("PING");
    let mut answer = std::pin::pin!(ping.query_async::<redis::Value>(&mut connection));
    let mut wait = timeout;
    let next = loop {
        shared
            .probed_at
            .store(micros(Instant::now()), Ordering::Release);
        match tokio::time::timeout(wait, &mut answer).await {
            // Answered: so was everything sent before the PING.
            Ok(Ok(_)) => {
                if shared.state.load(Ordering::Acquire) == SILENT {
                    tracing::info!(server = %address, "Redis server answers again");
                }
                shared.owed_since.store(NONE, Ordering::Release);
                break ANSWERING;
            }
            Ok(Err(_)) => break RECONNECT, // the connection failed: connect anew
            Err(_) => {
                if wait == timeout {
                    // Suspect no more: silent.
                    if shared.state.swap(SILENT, Ordering::AcqRel) == SUSPECT {
                        tracing::warn!(server = %address, ?timeout,
                            "Redis server did not answer; commands to it fail at once until it answers");
                    }
                    wait = patience;
                } else if fresh_connection_answers(&client, timeout).await {
                    tracing::warn!(server = %address, ?patience,
                        "Redis server silent on its connection, but a new one answers; connecting anew");
                    break RECONNECT;
                }
            }
        }
    };
    shared.state.store(next, Ordering::Release);
}

async fn fresh_connection_answers(client: &Client, timeout: Duration) -> bool {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let attempt = async {
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING")
            .query_async::<redis::Value>(&mut connection)
            .await
    };
    matches!(tokio::time::timeout(timeout * 2, attempt).await, Ok(Ok(_)))
}
