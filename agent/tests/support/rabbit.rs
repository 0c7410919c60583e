//! A RabbitMQ node of a test's own (own node name, ports and data directory), which the test may
//! stop, kill and start again; the shared broker on 5672 is never touched.

use super::restartable_port;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NODES: AtomicU32 = AtomicU32::new(0);

pub struct RabbitNode {
    pub port: u16,
    dist_port: u16,
    name: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl RabbitNode {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// A node with these lines of `rabbitmq.conf` (e.g. `max_message_size = 4096`).
    pub fn start_with(config: &str) -> Self {
        let n = NODES.fetch_add(1, Ordering::SeqCst);
        let name = format!("toa-test-{}-{n}@localhost", std::process::id());
        let dir = std::env::temp_dir().join(format!("toa-rabbit-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // No plugins: the shared node's management and Prometheus ports stay its own.
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.join("rabbitmq.conf"), config).unwrap();
        let mut node = Self {
            port: restartable_port(),
            dist_port: restartable_port(),
            name,
            dir,
            child: None,
        };
        node.spawn();
        node
    }

    pub fn url(&self) -> String {
        format!("amqp://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let mut command = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
        command
            .env("HOME", &self.dir)
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: the shell script and the Erlang VM under it are signalled together.
            .process_group(0);
        self.child = Some(command.spawn().expect("rabbitmq-server"));
        self.wait_port(Duration::from_secs(90));
    }

    fn wait_port(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        // A connection whose local port is the port itself connected to itself: nothing listens.
        let listening = |port: u16| {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok_and(|stream| stream.local_addr().is_ok_and(|local| local.port() != port))
        };
        while !listening(self.port) {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} did not open {} within {limit:?}:\n{}",
                self.name,
                self.port,
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&mut self, signal: i32) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling the process group of a child we started.
        unsafe { libc::kill(-(child.id() as i32), signal) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} did not stop",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The VM may outlive the script by a moment: wait until the port is closed.
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} still listens",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A clean stop (the broker closes its connections), then a start on the same port.
    pub fn restart(&mut self) {
        self.signal(libc::SIGTERM);
        self.spawn();
    }

    /// SIGKILL (nothing closed, nothing flushed beyond what the node had confirmed), then a
    /// start on the same port.
    pub fn kill_and_start(&mut self) {
        self.signal(libc::SIGKILL);
        self.spawn();
    }

    /// SIGSTOP: the node stops answering; its connections stay open.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            // SAFETY: signalling the process group of a child we started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGSTOP) };
        }
    }

    pub fn thaw(&self) {
        if let Some(child) = &self.child {
            // SAFETY: as above.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGCONT) };
        }
    }

    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
    }

    pub fn start_again(&mut self) {
        self.spawn();
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.thaw();
        self.signal(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `queue` exists on the broker at `url` (a passive declaration).
pub fn queue_exists(url: &str, queue: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let exists = channel
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await;
        // A process's own queue is exclusive: declaring it from here is refused as locked.
        let exists = match exists {
            Ok(_) => true,
            Err(error) => error.to_string().contains("RESOURCE_LOCKED"),
        };
        let _ = connection.close(200, "done".into()).await;
        exists
    })
}

/// `rabbitmqctl list_queues` of the shared broker (127.0.0.1:5672): a row per queue, its
/// `columns` in order (none if rabbitmqctl does not answer). A classic queue's counts are its
/// own; a quorum queue's are not reported here.
pub fn list_queues(columns: &[&str]) -> Vec<Vec<String>> {
    let Ok(output) = Command::new("rabbitmqctl")
        .args(["-q", "list_queues"])
        .args(columns)
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The queues of one test's application on a broker, deleted when this is dropped.
pub struct Queues {
    url: String,
    prefix: String,
}

impl Queues {
    pub fn of(url: &str, application: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: format!("toa.{application}."),
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        // A node of the test's own goes with its data directory.
        if !self.url.ends_with(":5672") {
            return;
        }
        let names: Vec<String> = list_queues(&["name"])
            .into_iter()
            .filter_map(|mut row| row.pop())
            .filter(|name| name.starts_with(&self.prefix))
            .collect();
        // On a thread of its own: the test may be async, and a runtime cannot block in another.
        let url = self.url.clone();
        let events = format!("{}#events", self.prefix.trim_end_matches('.'));
        let cleanup = std::thread::spawn(move || {
            runtime().block_on(async move {
                let Ok(connection) =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await
                else {
                    return;
                };
                for name in names {
                    // A channel each: deleting an exclusive queue of a live process is refused.
                    if let Ok(channel) = connection.create_channel().await {
                        let _ = channel
                            .queue_delete(name.as_str().into(), Default::default())
                            .await;
                    }
                }
                // The application's events exchange, if any of its agents published.
                if let Ok(channel) = connection.create_channel().await {
                    let _ = channel
                        .exchange_delete(events.as_str().into(), Default::default())
                        .await;
                }
                let _ = connection.close(200, "done".into()).await;
            })
        });
        let _ = cleanup.join();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A call as an agent of any version sends it: `body` published to `queue` with a reply queue,
/// and the reply (within 10 s).
pub fn request(url: &str, queue: &str, body: &str) -> serde_json::Value {
    request_with(url, queue, body, &[])
}

/// [`request`] with integer `headers` of the caller's choosing, as any client of the broker may.
pub fn request_with(
    url: &str,
    queue: &str,
    body: &str,
    headers: &[(&str, i64)],
) -> serde_json::Value {
    use futures::StreamExt;
    use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), AMQPValue::LongLongInt(*value));
    }
    runtime().block_on(async {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        };
        let replies = channel
            .queue_declare("".into(), exclusive, FieldTable::default())
            .await
            .unwrap();
        let no_ack = BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        };
        let mut consumer = channel
            .basic_consume(
                replies.name().clone(),
                "".into(),
                no_ack,
                FieldTable::default(),
            )
            .await
            .unwrap();
        let properties = lapin::BasicProperties::default()
            .with_correlation_id("raw-1".into())
            .with_reply_to(replies.name().clone())
            .with_headers(table);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await
            .unwrap();
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a reply within 10 s")
            .unwrap()
            .unwrap();
        let _ = connection.close(200, "done".into()).await;
        serde_json::from_slice(&delivery.data).unwrap()
    })
}

/// An agent of the version before durable queues, as far as the broker sees it: it declares
/// the component's shared queue non-durable without arguments and answers every call on it with
/// `{"reply": "old"}`, until dropped.
pub struct OldAgent {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Deliveries taken so far.
    pub taken: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl OldAgent {
    pub fn serve(url: &str, queue: &str) -> Self {
        use futures::StreamExt;
        use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions};
        use lapin::types::FieldTable;
        let (url, queue) = (url.to_owned(), queue.to_owned());
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel::<()>();
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = taken.clone();
        let thread = std::thread::spawn(move || {
            runtime().block_on(async move {
                let connection =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                        .await
                        .unwrap();
                let channel = connection.create_channel().await.unwrap();
                channel
                    .queue_declare(
                        queue.as_str().into(),
                        Default::default(),
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let mut consumer = channel
                    .basic_consume(
                        queue.as_str().into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                ready.send(()).unwrap();
                loop {
                    if stopped.try_recv().is_ok() {
                        break;
                    }
                    let next = tokio::time::timeout(Duration::from_millis(100), consumer.next());
                    let Ok(Some(Ok(delivery))) = next.await else {
                        continue;
                    };
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if let Some(to) = delivery.properties.reply_to().clone() {
                        let mut properties = lapin::BasicProperties::default();
                        if let Some(id) = delivery.properties.correlation_id().clone() {
                            properties = properties.with_correlation_id(id);
                        }
                        channel
                            .basic_publish(
                                "".into(),
                                to,
                                BasicPublishOptions::default(),
                                br#"{"reply": "old"}"#,
                                properties,
                            )
                            .await
                            .unwrap();
                    }
                    delivery
                        .acker
                        .ack(BasicAckOptions::default())
                        .await
                        .unwrap();
                }
                let _ = connection.close(200, "done".into()).await;
            });
        });
        is_ready.recv_timeout(Duration::from_secs(10)).unwrap();
        Self {
            stop: Some(stop),
            thread: Some(thread),
            taken,
        }
    }
}

impl Drop for OldAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
