//! Test harness: Redis servers of the test's own (started, killed, frozen and restarted at will,
//! never the shared one), worker processes that record what they did, and checks over records.
//!
//! Records carry `CLOCK_MONOTONIC` nanoseconds, which all processes of one machine share, so
//! intervals from different processes can be compared.

pub mod source;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until `condition` holds, or panics with `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `redis-server` of the test's own on a free port, with nothing persisted.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--dir",
                &std::env::temp_dir().to_string_lossy(),
                "--logfile",
                "",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the test command installs it)");
        let server = Self {
            port,
            child: Some(child),
        };
        wait_until(Duration::from_secs(10), "redis-server to answer", || {
            server.ping()
        });
        server
    }

    pub fn address(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.address())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connection to the test's redis-server")
    }

    fn ping(&self) -> bool {
        redis::Client::open(self.address())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    /// SIGKILL: the server is gone, with everything it held.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the server is frozen; connections stay open and nothing answers.
    pub fn freeze(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Kills the server and starts an empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        *self = Self::start_on(self.port);
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Keys matching `pattern` on this server.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.connection())
            .expect("KEYS")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            signal(child.id() as i32, libc::SIGCONT);
        }
        self.kill();
    }
}

pub fn signal(pid: i32, signal: i32) {
    // SAFETY: sending a signal to a child process we started.
    unsafe { libc::kill(pid, signal) };
}

/// The worker binary built with this crate: beside this executable (a binary of the crate), or
/// beside its `deps/` folder (a test or a benchmark).
pub fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    let dir = exe.parent().expect("target directory");
    [
        dir.join("atom-worker"),
        dir.parent().unwrap_or(dir).join("atom-worker"),
    ]
    .into_iter()
    .find(|path| path.exists())
    .unwrap_or_else(|| {
        panic!(
            "atom-worker is missing beside {}: `cargo test -p toa-tests` and \
             `cargo bench -p toa-tests` build it",
            exe.display()
        )
    })
}

/// A worker process: its stdout's JSON lines are collected as events; stdin takes commands.
pub struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Arc<(Mutex<Vec<Value>>, Condvar)>,
    pub name: String,
}

impl Worker {
    /// Starts the worker with `args` and environment `env`.
    pub fn spawn(name: &str, args: &[&str], env: &[(&str, String)]) -> Self {
        Self::spawn_with(name, Command::new(worker_binary()), args, env)
    }

    /// Starts `command` (the worker, possibly behind a wrapper such as faketime).
    pub fn spawn_with(
        name: &str,
        mut command: Command,
        args: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        );
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("worker starts");
        let stdout = child.stdout.take().expect("stdout");
        let events: Arc<(Mutex<Vec<Value>>, Condvar)> = Arc::default();
        let sink = events.clone();
        let label = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Value>(&line) {
                    Ok(mut event) => {
                        event["worker"] = Value::String(label.clone());
                        sink.0.lock().unwrap().push(event);
                        sink.1.notify_all();
                    }
                    Err(_) => eprintln!("[{label}] {line}"),
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            events,
            name: name.to_owned(),
        }
    }

    pub fn events(&self) -> Vec<Value> {
        self.events.0.lock().unwrap().clone()
    }

    /// Waits for an event for which `matches` holds and returns it.
    pub fn wait_for(&self, limit: Duration, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        let mut events = self.events.0.lock().unwrap();
        loop {
            if let Some(event) = events.iter().find(|e| matches(e)) {
                return event.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "[{}] timed out after {limit:?} waiting for {what}; events: {events:?}",
                self.name
            );
            events = self.events.1.wait_timeout(events, left).unwrap().0;
        }
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("worker reads commands");
        stdin.flush().expect("flush");
    }

    /// Closes stdin (the worker stops gracefully) and waits for the exit.
    pub fn finish(mut self, limit: Duration) -> Vec<Value> {
        self.stdin = None;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "[{}] exited with {status}", self.name);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "[{}] did not exit within {limit:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The reader thread may still be draining the pipe.
        std::thread::sleep(Duration::from_millis(20));
        self.events()
    }

    /// SIGKILL; returns the monotonic time after the process is gone.
    pub fn kill(mut self) -> (u64, Vec<Value>) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let at = monotonic_ns();
        std::thread::sleep(Duration::from_millis(20));
        (at, self.events())
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment that gives a worker `atomicity` over `servers`.
pub fn atomicity_env(
    servers: &[&RedisServer],
    interval_ms: u64,
    ttl_ms: u64,
) -> Vec<(&'static str, String)> {
    vec![
        ("TOA_APPLICATION", "test".to_owned()),
        (
            "TOA_ATOMICITY_REDIS",
            servers
                .iter()
                .map(|s| s.address())
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("TOA_ATOMICITY_INTERVAL", interval_ms.to_string()),
        ("TOA_ATOMICITY_TTL", ttl_ms.to_string()),
    ]
}

/// A held interval, as a worker recorded it.
#[derive(Debug, Clone)]
pub struct Interval {
    pub from: u64,
    pub to: u64,
    pub token: u64,
    pub who: String,
}

/// Holder intervals from `held` events.
pub fn intervals(events: &[Value]) -> Vec<Interval> {
    let mut list: Vec<Interval> = events
        .iter()
        .filter(|e| e["kind"] == "held" && e["lost"] == false)
        .map(|e| Interval {
            from: e["from"].as_u64().unwrap(),
            to: e["to"].as_u64().unwrap(),
            token: e["token"].as_u64().unwrap(),
            who: format!("{}/{}", e["worker"].as_str().unwrap_or("?"), e["task"]),
        })
        .collect();
    list.sort_by_key(|i| i.from);
    list
}

/// Panics unless the intervals are pairwise disjoint and their tokens strictly increase in time.
pub fn assert_exclusive(list: &[Interval]) {
    for pair in list.windows(2) {
        assert!(
            pair[1].from > pair[0].to,
            "two holders at once: {:?} and {:?} overlap by {} ns",
            pair[0],
            pair[1],
            pair[0].to - pair[1].from
        );
        assert!(
            pair[1].token > pair[0].token,
            "fencing tokens did not increase: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// A replica of `application`'s `component` in this process, on `servers` (a pod's settings:
/// never the in-process fallback). `interval` and `ttl` default as in the context.
pub fn replica_on(
    servers: &[&RedisServer],
    application: &str,
    component: &str,
    interval: Option<Duration>,
    ttl: Option<Duration>,
) -> Arc<toa_agent::Atom> {
    let addresses: Vec<String> = servers.iter().map(|s| s.address()).collect();
    replica_at(&addresses, application, component, interval, ttl)
}

/// Three servers of the test's own and a replica on them, once the servers count toward quorums
/// (new servers count after they have been up for a TTL: the delayed-restart rule).
pub async fn three_counted_servers(
    component: &str,
    ttl: Duration,
) -> (Vec<RedisServer>, Arc<toa_agent::Atom>) {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let on: Vec<&RedisServer> = servers.iter().collect();
    let replica = replica_on(&on, "test", component, None, Some(ttl));
    let warm = tokio::time::timeout(Duration::from_secs(10), replica.acquire("warm"))
        .await
        .expect("acquired with every server up")
        .unwrap();
    warm.release().await;
    (servers, replica)
}

/// [`replica_on`] servers given by address (a proxy's, say).
pub fn replica_at(
    addresses: &[String],
    application: &str,
    component: &str,
    interval: Option<Duration>,
    ttl: Option<Duration>,
) -> Arc<toa_agent::Atom> {
    let config = toa_agent::AtomConfig {
        scope: toa_agent::Scope::new(application, component),
        mode: toa_agent::Mode::Pod,
        atomicity: Some(toa_context::Atomicity::new(addresses, interval, ttl).unwrap()),
        credentials: toa_context::Credentials::default(),
        roots: Default::default(),
        instance: format!("replica-{}", std::process::id()),
        group: None,
    };
    Arc::new(toa_agent::Atom::start(config, toa_agent::Metrics::new()).unwrap())
}

/// When the last of `workers` logged its latest assignment (`CLOCK_MONOTONIC` ns): after a
/// change, when every replica had taken its new share.
pub fn last_assigned_at(workers: &[Worker]) -> u64 {
    workers
        .iter()
        .map(|w| {
            w.events()
                .into_iter()
                .rev()
                .find(|e| e["kind"] == "assigned")
                .and_then(|e| e["at"].as_u64())
                .expect("an assignment")
        })
        .max()
        .expect("workers")
}
