//! The agent's servers (the local API, the control endpoint, the probes), watched: a server that
//! stops for any reason (its socket failed, its task panicked) stops the process with its name
//! and error. A pod whose probe or control listener died looks alive and answers nothing; a
//! process that exits is restarted by the kubelet.

use super::ComposeError;
use std::collections::HashMap;
use std::future::IntoFuture;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, Id, JoinSet};

/// The running servers. Dropping it aborts them.
#[derive(Default)]
pub struct Servers {
    tasks: JoinSet<(&'static str, String)>,
    names: HashMap<Id, &'static str>,
    handles: HashMap<&'static str, AbortHandle>,
}

impl Servers {
    /// Serves `app` on `listener` until the process stops.
    pub fn serve(&mut self, name: &'static str, listener: TcpListener, app: axum::Router) {
        self.serve_until(name, listener, app, std::future::pending());
    }

    /// Serves `app` until `until` completes, then lets requests in flight finish.
    pub fn serve_until(
        &mut self,
        name: &'static str,
        listener: TcpListener,
        app: axum::Router,
        until: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (failed, accept_failed) = oneshot::channel();
        let listener = Watched {
            listener,
            failed: Some(failed),
        };
        let served = axum::serve(listener, app).with_graceful_shutdown(until);
        let handle = self.tasks.spawn(async move {
            let ended = tokio::select! {
                served = served.into_future() => match served {
                    Ok(()) => "stopped serving".to_owned(),
                    Err(error) => error.to_string(),
                },
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

/// A listener that reports the failure of its socket instead of retrying forever (what axum's
/// own does): an error that says the listening socket itself is broken (shut down, closed, not a
/// socket) ends the server; anything else — a peer's trouble, a network error passed on from the
/// new connection, exhausted descriptors or memory — is retried, as accept(2) asks.
struct Watched {
    listener: TcpListener,
    failed: Option<oneshot::Sender<io::Error>>,
}

impl axum::serve::Listener for Watched {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok(accepted) => return accepted,
                Err(error) if broken(&error) => {
                    if let Some(failed) = self.failed.take() {
                        let _ = failed.send(error);
                    }
                    std::future::pending::<()>().await;
                }
                Err(error) => {
                    tracing::debug!(%error, "accepting a connection failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
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

    #[tokio::test]
    async fn a_server_whose_socket_is_shut_down_is_reported_by_name() {
        let mut servers = Servers::default();
        let kept = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let failing = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fd = failing.as_raw_fd();
        servers.serve("local API", kept, axum::Router::new());
        servers.serve("probe endpoint", failing, axum::Router::new());
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
