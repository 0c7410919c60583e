//! A Redis server and a RabbitMQ node of the suite's own, listening on the node's bridge address
//! (pods cannot reach the machine's loopback, where the shared ones listen); killed on drop.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(ip: &str, port: u16, limit: Duration, what: &str, log: &dyn Fn() -> String) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect((ip, port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not open {ip}:{port} within {limit:?}:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct Redis {
    pub ip: String,
    pub port: u16,
    child: Child,
}

impl Redis {
    pub fn start(ip: &str) -> Self {
        let port = free_port(ip);
        let child = Command::new("redis-server")
            .args(["--bind", ip, "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        wait_port(
            ip,
            port,
            Duration::from_secs(20),
            "redis-server",
            &String::new,
        );
        Self {
            ip: ip.to_owned(),
            port,
            child,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.ip, self.port)
    }

    /// `redis-cli ARGS…` against this server.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        crate::cluster::stdout_of(
            Command::new("redis-cli")
                .args(["-h", &self.ip, "-p", &self.port.to_string()])
                .args(args),
        )
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A RabbitMQ node: its own node name, ports and data directory, no plugins; `guest` may connect
/// from the pods' addresses (`loopback_users = none`).
pub struct Rabbit {
    pub ip: String,
    pub port: u16,
    name: String,
    dir: PathBuf,
    child: Child,
}

impl Rabbit {
    pub fn start(ip: &str, dir: PathBuf) -> Self {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.join("rabbitmq.conf"), "loopback_users = none\n").unwrap();
        // The distribution port on loopback, below the ephemeral ports: one picked among them was
        // taken by an outgoing connection before the node bound it (a fresh machine's CI run).
        let dist = crate::cluster::free_ports(crate::cluster::DIST_PORTS, 1);
        let port = free_port(ip);
        // Several nodes may run at once (one per scenario that needs one): each its own name.
        static NODES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NODES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("toa-e2e-{}-{n}@localhost", std::process::id());
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .env("HOME", &dir)
            .env("RABBITMQ_NODENAME", &name)
            .env("RABBITMQ_NODE_IP_ADDRESS", ip)
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: the script and the Erlang VM under it die together.
            .process_group(0)
            .spawn()
            .expect("rabbitmq-server");
        let server_log = dir.join("server.log");
        wait_port(ip, port, Duration::from_secs(120), "RabbitMQ", &|| {
            std::fs::read_to_string(&server_log).unwrap_or_default()
        });
        Self {
            ip: ip.to_owned(),
            port,
            name,
            dir,
            child,
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://{}:{}", self.ip, self.port)
    }

    /// The names of its queues (in the default virtual host).
    pub fn queues(&self) -> Result<Vec<String>, String> {
        self.queues_in("/")
    }

    /// The names of the queues in the virtual host `vhost`.
    pub fn queues_in(&self, vhost: &str) -> Result<Vec<String>, String> {
        let listed = self.ctl(&["-q", "list_queues", "-p", vhost, "name"])?;
        Ok(listed.lines().map(|line| line.trim().to_owned()).collect())
    }

    /// `rabbitmqctl ARGS…` against this node.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        // Not /usr/sbin/rabbitmqctl, which runs as the rabbitmq user with that user's Erlang
        // cookie; this node's cookie is in its HOME.
        crate::cluster::stdout_of(
            Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
                .env("HOME", &self.dir)
                .args(["-n", &self.name])
                .args(args),
        )
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        // SAFETY: signalling the process group of a child this suite started.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An OTLP/HTTP trace receiver of the suite's own (agent/tests/otlp_receiver.py, decoding with
/// the OpenTelemetry project's messages), its spans one JSON line each in a file.
pub struct Traces {
    pub ip: String,
    pub port: u16,
    spans: PathBuf,
    child: Child,
}

impl Traces {
    pub fn start(ip: &str, spans: PathBuf) -> Self {
        let port = free_port(ip);
        let child = Command::new("python3")
            .arg(crate::cluster::repo().join("agent/tests/otlp_receiver.py"))
            .args([&port.to_string(), ip])
            .stdout(std::fs::File::create(&spans).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        wait_port(
            ip,
            port,
            Duration::from_secs(20),
            "the OTLP receiver",
            &|| std::fs::read_to_string(&spans).unwrap_or_default(),
        );
        Self {
            ip: ip.to_owned(),
            port,
            spans,
            child,
        }
    }

    /// The base URL the agents export to.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    /// The spans received so far; a request the receiver could not decode fails the test.
    pub fn spans(&self) -> Vec<serde_json::Value> {
        let spans: Vec<serde_json::Value> = std::fs::read_to_string(&self.spans)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with('{'))
            // The last line may be half written.
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let errors: Vec<&serde_json::Value> =
            spans.iter().filter(|s| s.get("error").is_some()).collect();
        assert!(
            errors.is_empty(),
            "the receiver could not decode: {errors:?}"
        );
        spans
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.spans);
    }
}
