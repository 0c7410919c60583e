//! Connections to the 1..N independent Redis servers of `atomicity`, with what Redlock needs to
//! know about each: whether it restarted recently.
//!
//! A server counts toward a quorum only once its uptime exceeds the longest lock TTL (Redlock's
//! delayed restart): a server that restarted empty forgot the locks it held, and counting it at once
//! could give a second holder a majority. Every (re)connection reads `INFO server` (`run_id`,
//! `uptime_in_seconds`), and a restart always breaks the connection, so no restart goes unseen.
//! A server first seen with a short uptime is treated the same way: it may have restarted just
//! before this process looked.
//!
//! A server that stops answering is left alone until it answers again ([`silence`]).

mod silence;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, FromRedisValue, IntoConnectionInfo, Script, ScriptInvocation,
};
use silence::{Before, Silence};
use std::sync::Mutex;
use std::time::Duration;
use toa_context::tls::Roots;
use toa_context::{Credentials, RedisAddress};
use tokio::time::Instant;

/// Why a command did not get an answer from one server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    #[error("{0} did not answer in {1:?}")]
    Timeout(String, Duration),
    #[error("{0} is unreachable: {1}")]
    Unreachable(String, String),
    #[error("{0} refused the command: {1}")]
    Refused(String, String),
    #[error("{0} did not answer in time; commands to it fail at once until it answers a probe")]
    Silent(String),
}

/// One Redis server.
pub struct Server {
    address: RedisAddress,
    client: Client,
    timeout: Duration,
    /// How long after a (re)start the server stays out of quorums.
    quarantine: Duration,
    state: Mutex<State>,
    connecting: tokio::sync::Mutex<()>,
    silence: Silence,
}

/// One command on its way: dropped before its answer (its caller stopped waiting), the server
/// owes an answer since it was sent.
struct Outstanding<'a> {
    silence: &'a Silence,
    ticket: silence::Ticket,
    answered: bool,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if self.answered {
            self.silence.answered(self.ticket);
        } else {
            self.silence.dropped(self.ticket);
        }
    }
}

#[derive(Default)]
struct State {
    connection: Option<MultiplexedConnection>,
    run_id: Option<String>,
    /// When the server becomes countable again.
    countable_at: Option<Instant>,
}

impl Server {
    /// Prepares the client; connects lazily, so an unreachable server never prevents a start.
    pub fn new(
        address: &RedisAddress,
        (credentials, roots): (&Credentials, &Roots),
        timeout: Duration,
        quarantine: Duration,
    ) -> Result<Self, ServerError> {
        let refused =
            |error: redis::RedisError| ServerError::Refused(address.to_string(), error.to_string());
        let mut info = address
            .to_string()
            .into_connection_info()
            .map_err(refused)?;
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &credentials.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &credentials.password {
            settings = settings.set_password(password.expose());
        }
        info = info.set_redis_settings(settings);
        // `rediss://` checks the server's certificate against the CA file, or the public roots.
        let client = match roots.pem().filter(|_| address.tls) {
            Some(pem) => {
                let certificates = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.as_bytes().to_vec()),
                };
                Client::build_with_tls(info, certificates)
            }
            None => Client::open(info),
        };
        Ok(Self {
            address: address.clone(),
            client: client.map_err(refused)?,
            timeout,
            quarantine,
            state: Mutex::new(State::default()),
            connecting: tokio::sync::Mutex::new(()),
            silence: Silence::new(address.to_string(), timeout),
        })
    }

    pub fn address(&self) -> &RedisAddress {
        &self.address
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the server may count toward a quorum now: connected, and up for longer than the
    /// quarantine.
    pub fn countable(&self) -> bool {
        let state = self.state.lock().expect("server state");
        state.connection.is_some() && state.countable_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Runs `script` with `keys` and `args`, connecting first when needed.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, ServerError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        self.invoke_prepared(&invocation).await
    }

    /// Runs `script` on the connection the server has now, even while it is silent, and never
    /// connects anew: a release that must queue behind a command already sent on that
    /// connection (an acquisition that timed out may still be granted when the server wakes;
    /// the release, behind it on the same connection, takes it back). Waits at most the
    /// timeout for the answer; the command stays queued.
    pub async fn invoke_behind<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, ServerError> {
        let Some(mut connection) = self.current() else {
            return Err(ServerError::Unreachable(
                self.address.to_string(),
                "no connection to queue behind".to_owned(),
            ));
        };
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        match tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection)).await {
            Err(_) => Err(self.timed_out()),
            Ok(result) => self.outcome(result),
        }
    }

    /// Runs a script invocation the caller built.
    pub async fn invoke_prepared<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, ServerError> {
        self.run(|mut connection| async move { invocation.invoke_async(&mut connection).await })
            .await
    }

    /// Runs a plain command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, ServerError> {
        self.run(|mut connection| async move { cmd.query_async(&mut connection).await })
            .await
    }

    /// A dedicated pub/sub connection (pub/sub cannot share the multiplexed one).
    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, ServerError> {
        tokio::time::timeout(
            self.timeout.max(Duration::from_secs(1)),
            self.client.get_async_pubsub(),
        )
        .await
        .map_err(|_| ServerError::Timeout(self.address.to_string(), self.timeout))?
        .map_err(|error| ServerError::Unreachable(self.address.to_string(), error.to_string()))
    }

    async fn run<T, F, Fut>(&self, call: F) -> Result<T, ServerError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match self.silence.before(self.current().as_ref(), &self.client) {
            Before::Send => {}
            Before::Refuse => return Err(ServerError::Silent(self.address.to_string())),
            Before::Reconnect => self.disconnect(),
        }
        let deadline = Instant::now() + self.timeout;
        let connection = match tokio::time::timeout_at(deadline, self.connection()).await {
            Err(_) => return Err(self.timed_out()),
            Ok(connection) => connection?,
        };
        let mut outstanding = Outstanding {
            silence: &self.silence,
            ticket: self.silence.sent(),
            answered: false,
        };
        match tokio::time::timeout_at(deadline, call(connection.clone())).await {
            Err(_) => {
                drop(outstanding);
                self.silence.timed_out(Some(&connection), &self.client);
                Err(self.timed_out())
            }
            Ok(result) => {
                outstanding.answered = true;
                self.outcome(result)
            }
        }
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.state.lock().expect("server state").connection.clone()
    }

    fn outcome<T>(&self, result: redis::RedisResult<T>) -> Result<T, ServerError> {
        match result {
            Ok(value) => Ok(value),
            Err(error)
                if error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_unrecoverable_error() =>
            {
                self.disconnect();
                Err(ServerError::Unreachable(
                    self.address.to_string(),
                    error.to_string(),
                ))
            }
            Err(error) if error.is_timeout() => Err(self.timed_out()),
            Err(error) => Err(ServerError::Refused(
                self.address.to_string(),
                error.to_string(),
            )),
        }
    }

    fn timed_out(&self) -> ServerError {
        ServerError::Timeout(self.address.to_string(), self.timeout)
    }

    fn disconnect(&self) {
        let mut state = self.state.lock().expect("server state");
        state.connection = None;
        state.countable_at = None;
        self.silence.disconnected();
    }

    async fn connection(&self) -> Result<MultiplexedConnection, ServerError> {
        if let Some(connection) = self.state.lock().expect("server state").connection.clone() {
            return Ok(connection);
        }
        // One connection attempt at a time; the others wait for its result.
        let _guard = self.connecting.lock().await;
        if let Some(connection) = self.state.lock().expect("server state").connection.clone() {
            return Ok(connection);
        }
        let unreachable = |error: redis::RedisError| {
            ServerError::Unreachable(self.address.to_string(), error.to_string())
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        let mut connection = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(unreachable)?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut connection)
            .await
            .map_err(unreachable)?;
        let (run_id, uptime) = parse_info(&info).ok_or_else(|| {
            ServerError::Refused(
                self.address.to_string(),
                "INFO server has no run_id or uptime".into(),
            )
        })?;
        let mut state = self.state.lock().expect("server state");
        let wait = self.quarantine.saturating_sub(uptime);
        match &state.run_id {
            Some(previous) if *previous != run_id => tracing::warn!(
                server = %self.address, uptime_s = uptime.as_secs(),
                "Redis server restarted; it counts toward lock quorums again in {wait:?}"
            ),
            _ if !wait.is_zero() => tracing::info!(
                server = %self.address, uptime_s = uptime.as_secs(),
                "Redis server started recently; it counts toward lock quorums in {wait:?}"
            ),
            _ => {}
        }
        state.run_id = Some(run_id);
        state.countable_at = Some(Instant::now() + wait);
        state.connection = Some(connection.clone());
        Ok(connection)
    }
}

/// `run_id` and a lower bound of the uptime. Redis reports `uptime_in_seconds` as the difference
/// of two whole wall-clock seconds (now and the start, both truncated), so a server started 100 ms
/// ago may say 1: the true uptime is more than the reported one minus a second, and that is what
/// is taken (counting a restarted server a second early could give a second holder a majority).
fn parse_info(info: &str) -> Option<(String, Duration)> {
    let mut run_id = None;
    let mut uptime = None;
    for line in info.lines() {
        if let Some(value) = line.strip_prefix("run_id:") {
            run_id = Some(value.trim().to_owned());
        } else if let Some(value) = line.strip_prefix("uptime_in_seconds:") {
            uptime = value
                .trim()
                .parse::<u64>()
                .ok()
                .map(|seconds| Duration::from_secs(seconds.saturating_sub(1)));
        }
    }
    Some((run_id?, uptime?))
}

/// The servers of one `atomicity` annotation.
pub struct Servers {
    pub list: Vec<Server>,
}

impl Servers {
    /// The servers at `addresses`, logged in with `login` (credentials, and what `rediss://`
    /// trusts).
    pub fn new(
        addresses: &[RedisAddress],
        login: (&Credentials, &Roots),
        timeout: Duration,
        quarantine: Duration,
    ) -> Result<Self, ServerError> {
        let list = addresses
            .iter()
            .map(|address| Server::new(address, login, timeout, quarantine))
            .collect::<Result<_, _>>()?;
        Ok(Self { list })
    }

    /// The server slots and meter use.
    pub fn first(&self) -> &Server {
        &self.list[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_run_id_and_uptime() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(
            parse_info(info),
            Some(("abc123".into(), Duration::from_secs(41)))
        );
        // Started at 12.9 s, asked at 13.1 s: Redis says 1; it may have been up for 0.2 s.
        let just_restarted = "run_id:def\r\nuptime_in_seconds:1\r\n";
        assert_eq!(
            parse_info(just_restarted),
            Some(("def".into(), Duration::ZERO))
        );
        assert_eq!(parse_info("redis_version:7\r\n"), None);
    }
}
