//! The agent's servers (the local API, the control endpoint, the probes), watched: a server that
//! stops for any reason (its socket failed, its task panicked) stops the process with its name
//! and error. A pod whose probe or control listener died looks alive and answers nothing; a
//! process that exits is restarted by the kubelet.
//!
//! Each server holds at most a given number of connections at once, a connection past them closed
//! at once, except those from the addresses it exempts (the probe port: the node's, so that
//! whoever fills the port the whole cluster may reach never starves the kubelet's probes and
//! hooks); and it closes a connection that has not sent a request's headers within
//! [`HEADER_READ`], a kept-alive one sitting idle included: a client that connects and sends
//! nothing holds its slot for seconds, not for ever. (`axum::serve` sets neither: hyper's header
//! timeout needs a timer, which it does not give.) HTTP/1.1 only, as every client speaks.

use super::ComposeError;
use crate::process::node::Node;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::{AbortHandle, Id, JoinSet};
use tower::ServiceExt;

/// How long a connection may take to send a request's headers, or sit idle between requests.
pub use toa_context::control::HEADER_READ;
/// Connections at once to the local API: the programs' calls, streams and atoms, each call a
/// connection at worst (an SDK that keeps none alive).
pub const LOCAL_API_CONNECTIONS: usize = 4096;
/// Connections at once to the control endpoint: the operator's leader asks one at a time.
pub const CONTROL_CONNECTIONS: usize = 16;
/// Connections at once to the probe port: the kubelet's probes and hooks, a metrics scraper.
pub const PROBE_CONNECTIONS: usize = 32;

/// The running servers. Dropping it aborts them.
#[derive(Default)]
pub struct Servers {
    tasks: JoinSet<(&'static str, String)>,
    names: HashMap<Id, &'static str>,
    handles: HashMap<&'static str, AbortHandle>,
}

impl Servers {
    /// Serves `app` on `listening` until the process stops.
    pub fn serve(&mut self, name: &'static str, listening: Listening, app: axum::Router) {
        self.serve_until(name, listening, app, std::future::pending());
    }

    /// Serves `app` on `listening` until `until` completes, then lets requests in flight finish.
    pub fn serve_until(
        &mut self,
        name: &'static str,
        listening: Listening,
        app: axum::Router,
        until: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (failed, accept_failed) = oneshot::channel();
        let Listening {
            listener,
            connections,
            exempt,
            thread,
        } = listening;
        let listener = Watched {
            listener: Bound::Here(listener),
            failed: Some(failed),
        };
        let listener = match &thread {
            None => listener,
            Some(_) => listener.moving(),
        };
        let cap = Cap {
            connections,
            exempt,
            header_read: HEADER_READ,
        };
        let served = on_its_thread(thread, accept(listener, app, cap, until));
        let handle = self.tasks.spawn(async move {
            let ended = tokio::select! {
                () = served => "stopped serving".to_owned(),
                Ok(error) = accept_failed => format!("accepting connections failed: {error}"),
            };
            (name, ended)
        });
        self.names.insert(handle.id(), name);
        self.handles.insert(name, handle);
    }

    /// Stops one server now.
    pub fn abort(&mut self, server: &'static str) {
        if let Some(handle) = self.handles.remove(server) {
            handle.abort();
        }
    }

    /// Completes when a server stops: which one, and why. Pending while none runs.
    pub async fn died(&mut self) -> ComposeError {
        let (server, message) = match self.tasks.join_next_with_id().await {
            None => std::future::pending().await,
            Some(Ok((_, ended))) => ended,
            Some(Err(error)) => (
                self.names.get(&error.id()).copied().unwrap_or("a server"),
                error.to_string(),
            ),
        };
        ComposeError::Server { server, message }
    }

    /// Waits up to `limit` for `server`, told to stop, to finish; false if it did not.
    pub async fn finished(&mut self, server: &'static str, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            while let Some(ended) = self.tasks.join_next_with_id().await {
                let id = match &ended {
                    Ok((id, _)) => *id,
                    Err(error) => error.id(),
                };
                if self.names.get(&id) == Some(&server) {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }
}

/// A server's socket and its connection cap.
pub struct Listening {
    pub listener: TcpListener,
    /// Connections at once, besides the exempt ones.
    pub connections: usize,
    /// Peers whose connections the cap does not count or close.
    pub exempt: Node,
    /// The runtime that accepts and serves the connections, when not the process's own
    /// ([`crate::local_thread`]): the listener is moved there, so the connections' sockets are
    /// driven by that runtime's thread.
    pub thread: Option<Handle>,
}

impl Listening {
    pub fn new(listener: TcpListener, connections: usize) -> Self {
        Self {
            listener,
            connections,
            exempt: Node::default(),
            thread: None,
        }
    }
}

/// Runs `served` on `thread` when given (stopped when the returned future is dropped), or in
/// place.
async fn on_its_thread(thread: Option<Handle>, served: impl Future<Output = ()> + Send + 'static) {
    let Some(thread) = thread else {
        return served.await;
    };
    // A panic there is this server's, reported by name like one here.
    crate::local_thread::run_on(thread, served).await;
}

/// How many connections, from whom, and how long each may take to send its headers.
struct Cap {
    connections: usize,
    exempt: Node,
    header_read: Duration,
}

/// Accepts every connection and serves each on a task of its own (one past the cap, from a peer
/// not exempt, is closed at once), until `until` completes; then stops listening and waits for
/// the requests in flight (each connection closes after its current request).
async fn accept(
    mut listener: Watched,
    app: axum::Router,
    cap: Cap,
    until: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let Cap {
        connections,
        exempt,
        header_read,
    } = cap;
    let slots = Arc::new(Semaphore::new(connections));
    // The connections' tasks end with this loop when it is dropped (the server aborted), on
    // whichever runtime it runs: the local thread's outlives every server.
    let mut serving = JoinSet::new();
    let graceful = GracefulShutdown::new();
    // HTTP/1.1 only: every client (the SDKs, the operator, the kubelet) speaks it, and a server
    // that first reads to tell HTTP/2 from HTTP/1 (hyper-util's auto) has no header timeout
    // running while it waits for those bytes.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read);
    let mut until = std::pin::pin!(until);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut until => break,
            Some(_) = serving.join_next() => continue,
        };
        let slot = slots.clone().try_acquire_owned().ok();
        if slot.is_none() && !exempt.contains(peer.ip()) {
            tracing::debug!(%peer, connections, "closed a connection past the cap");
            continue;
        }
        // Who connected, for the routes that care (the kubelet's hooks come from the node).
        let app = app
            .clone()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
        let service = TowerToHyperService::new(app);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        serving.spawn(async move {
            let _slot = slot;
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection ended with an error");
            }
        });
    }
    // New clients are refused from now on, not left waiting in the backlog.
    drop(listener);
    graceful.shutdown().await;
}

/// A listener that reports the failure of its socket instead of retrying forever (what axum's
/// own does): an error that says the listening socket itself is broken (shut down, closed, not a
/// socket) ends the server; anything else — a peer's trouble, a network error passed on from the
/// new connection, exhausted descriptors or memory — is retried, as accept(2) asks.
struct Watched {
    listener: Bound,
    failed: Option<oneshot::Sender<io::Error>>,
}

/// A listening socket, registered with the runtime that accepts on it, or on its way to another
/// (registered at its first accept, from that runtime's thread).
enum Bound {
    Here(TcpListener),
    Moving(std::net::TcpListener),
    Broken,
}

impl Watched {
    /// The listener, unregistered, to be accepted on from another runtime.
    fn moving(mut self) -> Self {
        self.listener = match std::mem::replace(&mut self.listener, Bound::Broken) {
            Bound::Here(listener) => match listener.into_std() {
                Ok(listener) => Bound::Moving(listener),
                Err(error) => self.fail(error),
            },
            other => other,
        };
        self
    }

    fn fail(&mut self, error: io::Error) -> Bound {
        if let Some(failed) = self.failed.take() {
            let _ = failed.send(error);
        }
        Bound::Broken
    }

    async fn listener(&mut self) -> &TcpListener {
        if matches!(self.listener, Bound::Moving(_)) {
            self.listener = match std::mem::replace(&mut self.listener, Bound::Broken) {
                Bound::Moving(listener) => match TcpListener::from_std(listener) {
                    Ok(listener) => Bound::Here(listener),
                    Err(error) => self.fail(error),
                },
                other => other,
            };
        }
        match &self.listener {
            Bound::Here(listener) => listener,
            _ => std::future::pending().await,
        }
    }

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener().await.accept().await {
                Ok(accepted) => return accepted,
                Err(error) if broken(&error) => {
                    self.listener = self.fail(error);
                }
                Err(error) => {
                    tracing::debug!(%error, "accepting a connection failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The listening socket itself is unusable: it was shut down or closed under the server.
fn broken(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server of `GET /` answering `ok`, `connections` at a time (127.0.0.2 exempt), with a
    /// header timeout of `header_read`; its address.
    async fn served(connections: usize, header_read: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let watched = Watched {
            listener: Bound::Here(listener),
            failed: None,
        };
        let cap = Cap {
            connections,
            exempt: Node::new(vec!["127.0.0.2".parse().unwrap()], Vec::new()),
            header_read,
        };
        tokio::spawn(accept(watched, app, cap, std::future::pending()));
        address
    }

    /// A connection to `address` from the loopback address `source`.
    async fn connect_from(source: &str, address: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind((source.parse::<std::net::IpAddr>().unwrap(), 0).into())
            .unwrap();
        socket.connect(address).await.unwrap()
    }

    /// `GET /` on `stream`: the answer's first line, or `None` when the server closed it first.
    async fn get(stream: &mut TcpStream) -> Option<String> {
        let request = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        stream.write_all(request).await.ok()?;
        let mut answer = vec![0; 512];
        let read = stream.read(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer[..read]).into_owned();
        text.lines().next().map(str::to_owned)
    }

    #[tokio::test]
    async fn a_connection_that_sends_no_headers_is_closed_after_the_header_timeout() {
        let address = served(4, Duration::from_millis(200)).await;
        let mut silent = TcpStream::connect(address).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut byte)).await;
        assert!(
            matches!(closed, Ok(Ok(0))),
            "{closed:?}: not closed within 5 s"
        );
        // A client that sends its request is answered.
        let mut client = TcpStream::connect(address).await.unwrap();
        assert_eq!(get(&mut client).await.as_deref(), Some("HTTP/1.1 200 OK"));
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_but_the_exempt_are_served() {
        let within = Duration::from_secs(5);
        let address = served(2, Duration::from_secs(60)).await;
        let first = TcpStream::connect(address).await.unwrap();
        let mut second = TcpStream::connect(address).await.unwrap();
        assert_eq!(get(&mut second).await.as_deref(), Some("HTTP/1.1 200 OK"));
        // Both slots are held (kept alive): a third is closed at once, unanswered...
        let mut third = TcpStream::connect(address).await.unwrap();
        let answer = tokio::time::timeout(within, get(&mut third)).await;
        assert_eq!(answer.unwrap(), None, "closed past the cap");
        // ...but one from an exempt address (the node's, on the probe port) is served...
        let mut exempt = connect_from("127.0.0.2", address).await;
        let answer = tokio::time::timeout(within, get(&mut exempt)).await;
        assert_eq!(answer.unwrap().as_deref(), Some("HTTP/1.1 200 OK"));
        // ...and, once a slot is free, anyone again.
        drop(first);
        let served_again = tokio::time::timeout(within, async {
            loop {
                let mut next = TcpStream::connect(address).await.unwrap();
                if let Some(line) = get(&mut next).await {
                    return line;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        assert_eq!(served_again.await.unwrap(), "HTTP/1.1 200 OK");
    }

    /// A handler that says it was reached and never answers.
    async fn held_here(reached: Arc<tokio::sync::Notify>) {
        reached.notify_one();
        std::future::pending::<()>().await;
    }

    #[tokio::test]
    async fn a_server_given_a_thread_serves_its_requests_there() {
        let reached = Arc::new(tokio::sync::Notify::new());
        let held = reached.clone();
        let mut servers = Servers::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route(
                "/",
                axum::routing::get(|| async {
                    std::thread::current().name().unwrap_or("").to_owned()
                }),
            )
            .route(
                "/held",
                axum::routing::get(move || held_here(reached.clone())),
            );
        let listening = Listening {
            thread: Some(crate::local_thread::handle()),
            ..Listening::new(listener, 4)
        };
        servers.serve("local API", listening, app);
        let mut client = TcpStream::connect(address).await.unwrap();
        let request = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        client.write_all(request).await.unwrap();
        let mut answer = vec![0; 512];
        let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut answer))
            .await
            .expect("answered within 5 s")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.ends_with("\r\n\r\ntoa-local"), "{answer}");
        // A request that never ends (as a lock's stream may not)...
        client
            .write_all(b"GET /held HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let within = Duration::from_secs(5);
        let handled = tokio::time::timeout(within, held.notified()).await;
        handled.expect("the held request reached its handler within 5 s");
        // ...ends when the server is stopped: stopped on its thread too, its connections with it.
        servers.abort("local API");
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte));
        assert!(
            matches!(closed.await, Ok(Ok(0) | Err(_))),
            "a request of the stopped server was still open after 5 s"
        );
        // ...and the port is let go.
        let refused = tokio::time::timeout(Duration::from_secs(5), async {
            while TcpStream::connect(address).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        refused
            .await
            .expect("the port was still accepting after 5 s");
    }

    #[tokio::test]
    async fn a_server_whose_socket_is_shut_down_is_reported_by_name() {
        let mut servers = Servers::default();
        let kept = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let failing = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fd = failing.as_raw_fd();
        servers.serve("local API", Listening::new(kept, 4), axum::Router::new());
        // The failing one on a thread of its own: its failure is reported from there too.
        let probes = Listening {
            thread: Some(crate::local_thread::handle()),
            ..Listening::new(failing, 4)
        };
        servers.serve("probe endpoint", probes, axum::Router::new());
        // Served: nothing died.
        let quiet = tokio::time::timeout(Duration::from_millis(300), servers.died()).await;
        assert!(
            quiet.is_err(),
            "a server died on its own: {:?}",
            quiet.err()
        );
        // SAFETY: the descriptor is the listener's, alive in the server task.
        assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RDWR) }, 0);
        let died = tokio::time::timeout(Duration::from_secs(5), servers.died())
            .await
            .expect("the failed server was not reported within 5 s");
        let message = died.to_string();
        assert!(
            message.contains("probe endpoint") && message.contains("accepting connections"),
            "{message}"
        );
    }
}
