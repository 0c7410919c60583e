//! A RabbitMQ node of a test's own (own node name, ports and data directory), which the test may
//! stop, kill and start again; the shared broker on 5672 is never touched.

use super::free_port;
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
            port: free_port(),
            dist_port: free_port(),
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
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
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
