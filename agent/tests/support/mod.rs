//! What the compose tests share: a `toa-agent compose` process and calls to it.
#![allow(dead_code)] // each test file uses part of it

pub mod postgres;
pub mod rabbit;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A free port for a server a test starts: below the kernel's ephemeral ports, so that no
/// outgoing connection of another test takes it between this check and the server's bind (a CI
/// run saw an agent's probe port taken so), from a range apart from [`restartable_port`]'s and the
/// operator's end-to-end suite's. Each port is reserved for this test process's life by a lock
/// on a file of its own, so two test processes never pick one port together.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;
    const FIRST: u32 = 30000;
    const SPAN: u32 = 2700;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("toa-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let start = std::process::id() % SPAN;
    for _ in 0..SPAN {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::SeqCst)) % SPAN) as u16;
        let Ok(file) = std::fs::File::create(dir.join(port.to_string())) else {
            continue;
        };
        // Released when this process exits, however it exits.
        if file.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock().unwrap().push(file);
            return port;
        }
    }
    panic!("no free port in {FIRST}-{}", FIRST + SPAN)
}

/// A free port for a server a test stops and starts again on it: below the kernel's ephemeral
/// ports (32768-60999), so no outgoing connection takes it while the server is down, and no
/// probe of it connects to itself (a connection from an ephemeral port to the same port, with
/// nothing listening, succeeds: a CI run saw a broker "up" that was not). Apart from the ports
/// the operator's end-to-end suite picks (12000-20000, 21000-29000).
pub fn restartable_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 29000 + (std::process::id() % 500) as u16 * 2;
    for _ in 0..1000 {
        let port = 29000 + (start - 29000 + NEXT.fetch_add(1, Ordering::SeqCst)) % 1000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 29000-30000")
}

/// Removes cargo's variables for this test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`) from a process
/// that may run cargo (a manifest's `program: [cargo, run, …]`). Build scripts watch some of them
/// (ring's `CARGO_MANIFEST_DIR`): a nested cargo that saw them reran ring's and rebuilt everything
/// above it, and so did the next top-level build, 1–2 min of every CI run.
pub fn without_cargos_variables(command: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
            command.env_remove(key.as_ref());
        }
    }
    command
}

pub struct Composition {
    child: Child,
    pub agent: String,
    log: PathBuf,
}

impl Composition {
    pub fn start(components: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_at(free_port(), components, env)
    }

    /// Starts with the local API on `port`.
    pub fn start_at(port: u16, components: &[&str], env: &[(&str, &str)]) -> Self {
        let log = std::env::temp_dir().join(format!("toa-compose-{port}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_toa-agent"));
        without_cargos_variables(&mut command)
            .current_dir(root())
            .arg("compose")
            .args(components)
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        command
            .env("RUST_LOG", "info")
            // Each test's composition alone, whatever runs beside it; the group's tests say
            // TOA_ALONE=false.
            .env("TOA_ALONE", "true")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (key, value) in env {
            command.env(key, value);
        }
        Self {
            child: command.spawn().unwrap(),
            agent: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log().contains("Composition complete") {
            assert!(
                !self.is_zombie(),
                "the agent exited before it was ready:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "no `Composition complete` in 30 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn call(&self, target: &str, request: &str) -> (bool, Value) {
        let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args(["call", target, request, "--agent", &self.agent])
            .output()
            .unwrap();
        (
            output.status.success(),
            serde_json::from_slice(&output.stdout).unwrap_or(Value::Null),
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process exited (and whether successfully), without waiting.
    /// Exited and not yet reaped (its `/proc` state is `Z`): seen without `&mut`.
    fn is_zombie(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .map(|stat| {
                // The state follows the command name, which is in parentheses.
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    pub fn exited(&mut self) -> Option<bool> {
        self.child
            .try_wait()
            .unwrap()
            .map(|status| status.success())
    }

    /// SIGTERM, without waiting: the drain begins.
    pub fn signal_term(&self) {
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// SIGTERM, then the exit status within `limit`.
    pub fn terminate(mut self, limit: Duration) -> (bool, String) {
        self.signal_term();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), self.log());
            }
            assert!(
                Instant::now() < deadline,
                "compose did not stop within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Composition {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a composition expected to stop by itself may run in [`compose_once`].
const ONCE_LIMIT: Duration = Duration::from_secs(90);

/// `toa-agent compose` on components expected to stop by themselves (a start refused, a run
/// that ends): its output. One that still runs after [`ONCE_LIMIT`] is killed and the test
/// fails naming it, rather than holding the suite until nextest's limit.
pub fn compose_once(components: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toa-agent"));
    without_cargos_variables(&mut command)
        .current_dir(root())
        .arg("compose")
        .args(components)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("TOA_ALONE", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    // Read while it runs: a full pipe would stop it.
    let drained = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.map(|mut pipe| pipe.read_to_end(&mut bytes));
            bytes
        })
    };
    let stdout = drained(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drained(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + ONCE_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            panic!("compose {components:?} still ran after {ONCE_LIMIT:?}; expected it to stop by itself:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

impl Composition {
    /// SIGKILL: the agent dies without draining (its programs get SIGTERM from the kernel).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET over a plain TCP socket: the status code.
pub fn http_status(url: &str) -> u16 {
    http_get(url).0
}

/// The status of a GET, or `None` while nothing accepts connections on its port.
pub fn http_get_or_none(url: &str) -> Option<u16> {
    let address = url.strip_prefix("http://")?.split('/').next()?;
    std::net::TcpStream::connect(address).ok()?;
    Some(http_get(url).0)
}

/// A GET over a plain TCP socket: the status code and the whole response (head and body).
pub fn http_get(url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let (ip, port) = host.rsplit_once(':').unwrap();
    request(ip, port.parse().unwrap(), "GET", &path, "")
}

/// A request with no body over a plain TCP socket, with extra header lines (each ending in
/// CRLF): the status code and the whole response.
pub fn request(ip: &str, port: u16, method: &str, path: &str, headers: &str) -> (u16, String) {
    let stream = std::net::TcpStream::connect((ip, port)).unwrap();
    request_on(stream, ip, method, path, headers, "")
}

/// [`request`] to loopback from the loopback address `source` (any of 127.0.0.0/8).
pub fn request_from(source: &str, port: u16, path: &str) -> (u16, String) {
    let socket = socket_from(source);
    let address: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = runtime.block_on(socket.connect(address)).unwrap();
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    request_on(stream, "127.0.0.1", "GET", path, "", "")
}

fn socket_from(source: &str) -> tokio::net::TcpSocket {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    let source: std::net::IpAddr = source.parse().unwrap();
    socket.bind((source, 0).into()).unwrap();
    socket
}

/// A JSON POST of `body` to `url` (`http://127.0.0.1:port/path`) over a plain TCP socket: the
/// status code and the whole response.
pub fn post(url: &str, body: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let (ip, port) = host.rsplit_once(':').unwrap();
    let stream = std::net::TcpStream::connect((ip, port.parse().unwrap())).unwrap();
    let json = "Content-Type: application/json\r\n";
    request_on(stream, ip, "POST", &format!("/{path}"), json, body)
}

/// A call through the local API at `agent`: `POST /v1/call/{component}/{operation}` with `body`
/// and extra header lines (each ending in CRLF): the status and the JSON answer.
pub fn call_with(agent: &str, target: &str, headers: &str, body: &str) -> (u16, Value) {
    let (component, operation) = target.rsplit_once('.').unwrap();
    let rest = agent.strip_prefix("http://").unwrap();
    let (ip, port) = rest.rsplit_once(':').unwrap();
    let stream = std::net::TcpStream::connect((ip, port.parse().unwrap())).unwrap();
    let headers = format!("Content-Type: application/json\r\n{headers}");
    let path = format!("/v1/call/{component}/{operation}");
    let (status, response) = request_on(stream, ip, "POST", &path, &headers, body);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The wall clock, in seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn request_on(
    mut stream: std::net::TcpStream,
    ip: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {ip}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response)
}

impl Composition {
    /// SIGSTOP: the agent stops answering, its connections stay open (a lost node).
    pub fn freeze(&self) {
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
    }

    pub fn thaw(&self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
    }
}

/// The JSON lines a test component recorded (none while the file does not exist).
pub fn events(record: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The names of the events a test component recorded, in order.
pub fn event_names(record: &std::path::Path) -> Vec<String> {
    events(record)
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect()
}

pub fn count(events: &[Value], name: &str) -> usize {
    events.iter().filter(|e| e["event"] == name).count()
}

/// A request to the control endpoint, with the token if given: (status, body).
pub fn control(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let authorization = token.map(|t| format!("Bearer {t}"));
    control_with(port, method, path, authorization.as_deref(), body)
}

/// A request to the control endpoint with this `Authorization` header, if any: (status, body).
pub fn control_with(
    port: u16,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    // The body may be chunked: take the JSON object inside.
    let json = body
        .find('{')
        .map(|start| &body[start..=body.rfind('}').unwrap()])
        .unwrap_or("null");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// A context of its own (its own application, so its own queues) naming the broker at `amqp`:
/// the file, the application's name, and a guard that deletes the application's queues from
/// the broker when dropped (they are durable: they would outlive the test).
pub fn broker_context(name: &str, amqp: &str) -> (PathBuf, String, rabbit::Queues) {
    broker_context_with(name, amqp, "")
}

/// [`broker_context`] with more lines of context (e.g. `limits:` and its keys).
pub fn broker_context_with(
    name: &str,
    amqp: &str,
    more: &str,
) -> (PathBuf, String, rabbit::Queues) {
    let application = format!("{name}-{}", std::process::id());
    let path = std::env::temp_dir().join(format!("toa-context-{application}.yaml"));
    std::fs::write(&path, format!("name: {application}\namqp: {amqp}\n{more}")).unwrap();
    let queues = rabbit::Queues::of(amqp, &application);
    (path, application, queues)
}

impl Composition {
    /// A process that only calls: the recorder component, named `caller`, in the application of
    /// `context`; ready when returned. It records its run commands to `record`.
    pub fn caller(context: &std::path::Path, record: &std::path::Path) -> Self {
        let composition = Composition::start(
            &[
                "agent/tests/components/recorder",
                "--context",
                context.to_str().unwrap(),
            ],
            &[
                ("TOA_INSTANCE", "caller"),
                ("TEST_RECORD", record.to_str().unwrap()),
            ],
        );
        composition.wait_ready();
        composition
    }

    /// Calls until `accept` takes the answer, within `limit`; the answer and the time it took.
    pub fn call_until(
        &self,
        target: &str,
        request: &str,
        limit: Duration,
        accept: impl Fn(&Value) -> bool,
    ) -> (Value, Duration) {
        let started = Instant::now();
        loop {
            let (_, answer) = self.call(target, request);
            if accept(&answer) {
                return (answer, started.elapsed());
            }
            assert!(
                started.elapsed() < limit,
                "{target} {request}: still {answer} after {limit:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Connects the test terminals' `terminal` on the process `holder`: ordinary calls land on
    /// any replica, so it calls until that one took it.
    pub fn connect_terminal(&self, holder: &str, terminal: &str) {
        self.call_until(
            "test.terminals.connect",
            &format!("{{ input: {{ terminal: {terminal} }} }}"),
            Duration::from_secs(15),
            |answer| answer["reply"]["holder"] == holder,
        );
    }
}
