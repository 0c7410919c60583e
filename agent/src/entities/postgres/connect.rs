//! How the pool opens a connection: on the agent's local thread ([`crate::local_thread`]), the
//! socket and the task that reads it both, so that a call served there waits on a connection
//! driven by its own thread, not woken across cores.

use deadpool_postgres::Connect;
use futures::future::BoxFuture;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Error, Socket};

/// Opens connections with `tls` on the local thread.
pub(super) struct OnLocalThread<T> {
    pub(super) tls: T,
}

impl<T> Connect for OnLocalThread<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), Error>> {
        let tls = self.tls.clone();
        let config = config.clone();
        let thread = crate::local_thread::handle();
        // An open the pool stops waiting for (its create timeout, or the caller gone) is
        // aborted there, its socket closed: against a frozen server, opens left running would
        // pile up and all finish their startup at once when it came back.
        Box::pin(crate::local_thread::run_on(thread, async move {
            let (client, connection) = config.connect(tls).await?;
            let reading = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "a connection to the store ended");
                }
            });
            Ok((client, reading))
        }))
    }
}

#[cfg(test)]
mod tests {
    /// The server's process behind the pool's one connection.
    async fn backend(pool: &deadpool_postgres::Pool) -> i32 {
        let client = pool.get().await.expect("the tests' PostgreSQL");
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await;
        row.expect("a pid").get(0)
    }

    #[test]
    fn a_connection_outlives_the_runtime_that_opened_it() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let pool = super::super::pool(&crate::entities::tests::test_storage(), 1).unwrap();
        let first = runtime();
        let opened = first.block_on(backend(&pool));
        // A connection read by a task of the caller's runtime would close with it, and the pool
        // would open another (another backend) for the next caller.
        drop(first);
        let again = runtime().block_on(backend(&pool));
        assert_eq!(again, opened, "the connection was opened again");
    }
}
