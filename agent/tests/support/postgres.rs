//! A PostgreSQL server of a test's own (own data directory and port), which the test may stop and
//! start again; the shared server on 5432 is never touched. PostgreSQL refuses to run as root: it
//! runs as `postgres`, the user Debian's package makes, and takes that user without a password
//! over its socket and on loopback.
//!
//! Self-contained, so that the end-to-end suite (operator/tests/e2e) includes the same file for a
//! server on the node's bridge, which pods log in to with a password.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const BIN: &str = "/usr/lib/postgresql/15/bin";

static SERVERS: AtomicU32 = AtomicU32::new(0);

pub struct PostgresServer {
    /// The address it listens on.
    pub ip: String,
    pub port: u16,
    dir: PathBuf,
    /// Taking TLS connections only, with this certificate and key.
    tls: Option<(PathBuf, PathBuf)>,
}

/// Runs a PostgreSQL program as `postgres`; its output, or a panic with it when it fails.
fn as_postgres(program: &str, args: &[&str]) -> String {
    let output = Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{BIN}/{program}")])
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "{program} {args:?}: {stdout}{stderr}"
    );
    stdout.into_owned()
}

fn owned_by_postgres(path: &std::path::Path, mode: &str) {
    let path = path.to_str().unwrap();
    let chown = Command::new("chown")
        .args(["postgres:postgres", path])
        .status();
    assert!(chown.unwrap().success());
    assert!(Command::new("chmod")
        .args([mode, path])
        .status()
        .unwrap()
        .success());
}

/// A directory of a server's own, empty, that `postgres` owns.
fn new_dir() -> PathBuf {
    let n = SERVERS.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("toa-pg-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    owned_by_postgres(&dir, "700");
    dir
}

/// A port nobody listens on at `ip` now.
fn free_port_on(ip: &str) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    listener.local_addr().unwrap().port()
}

impl PostgresServer {
    /// On loopback; `postgres` logs in without a password, and a standby may replicate it.
    pub fn start() -> Self {
        let hba = "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n";
        Self::start_with("127.0.0.1", None, hba)
    }

    /// A hot standby streaming from `primary` (a base backup of it, `-R`), on a port of its own;
    /// [`Self::promote`] makes it a primary.
    pub fn standby_of(primary: &Self) -> Self {
        let dir = new_dir();
        let data = dir.join("data");
        let port = primary.port.to_string();
        let source = ["-h", &primary.ip, "-p", &port, "-U", "postgres"];
        let target = ["-D", data.to_str().unwrap(), "-R", "-X", "stream"];
        as_postgres("pg_basebackup", &[&source[..], &target[..]].concat());
        let server = Self {
            ip: primary.ip.clone(),
            port: free_port_on(&primary.ip),
            dir,
            tls: None,
        };
        server.start_again();
        server
    }

    /// Ends recovery: the standby takes writes.
    pub fn promote(&self) {
        let data = self.dir.join("data");
        as_postgres("pg_ctl", &["-D", data.to_str().unwrap(), "-w", "promote"]);
    }

    /// An immediate stop, as a crash: connections are cut, nothing is flushed that was not.
    pub fn crash(&self) {
        let data = self.dir.join("data");
        as_postgres(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Sets a server setting and reloads the configuration.
    pub fn set(&self, setting: &str, value: &str) {
        self.sql(&format!("ALTER SYSTEM SET {setting} = '{value}'"));
        self.sql("SELECT pg_reload_conf()");
    }

    /// A server that takes TLS connections only (`hostssl`; a plain one is rejected), with the
    /// certificate and key given, copied where `postgres` may read them.
    pub fn start_with_tls(certificate: &std::path::Path, key: &std::path::Path) -> Self {
        let hba = "hostssl all all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 reject\n";
        Self::start_with("127.0.0.1", Some((certificate, key)), hba)
    }

    /// On `ip` (the node's bridge), where every connection logs in with a password (see
    /// [`Self::login`]).
    pub fn start_on(ip: &str) -> Self {
        Self::start_with(ip, None, "host all all all scram-sha-256\n")
    }

    fn start_with(ip: &str, tls: Option<(&std::path::Path, &std::path::Path)>, hba: &str) -> Self {
        let dir = new_dir();
        let data = dir.join("data");
        let data_arg = data.to_str().unwrap();
        as_postgres(
            "initdb",
            &["-D", data_arg, "-U", "postgres", "--auth=trust"],
        );
        let tls = tls.map(|(certificate, key)| {
            let (copied, copied_key) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::copy(certificate, &copied).unwrap();
            std::fs::copy(key, &copied_key).unwrap();
            owned_by_postgres(&copied, "600");
            owned_by_postgres(&copied_key, "600");
            (copied, copied_key)
        });
        // The socket, for the test's own statements, always trusts `postgres`.
        std::fs::write(
            data.join("pg_hba.conf"),
            format!("local all all trust\n{hba}"),
        )
        .unwrap();
        let server = Self {
            ip: ip.to_owned(),
            port: free_port_on(ip),
            dir,
            tls,
        };
        server.start_again();
        server
    }

    /// `postgres://127.0.0.1:PORT/postgres`: log in as `postgres`, no password (loopback).
    pub fn address(&self) -> String {
        format!("postgres://{}:{}/postgres", self.ip, self.port)
    }

    /// Makes `role` with `password`, owning a database of its name: the store's address for it.
    pub fn login(&self, role: &str, password: &str) -> String {
        self.sql(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"
        ));
        self.sql(&format!("CREATE DATABASE \"{role}\" OWNER \"{role}\""));
        format!("postgres://{}:{}/{role}", self.ip, self.port)
    }

    /// Runs `statement` as `postgres` in `database` over the server's socket: its output.
    pub fn sql_in(&self, database: &str, statement: &str) -> String {
        let socket = self.dir.display().to_string();
        let port = self.port.to_string();
        as_postgres(
            "psql",
            &[
                "-h", &socket, "-p", &port, "-U", "postgres", "-d", database, "-tAc", statement,
            ],
        )
    }

    fn sql(&self, statement: &str) -> String {
        self.sql_in("postgres", statement)
    }

    pub fn start_again(&self) {
        let mut options = format!(
            "-c listen_addresses={} -p {} -k {}",
            self.ip,
            self.port,
            self.dir.display()
        );
        if let Some((certificate, key)) = &self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                certificate.display(),
                key.display()
            ));
        }
        let (data, log) = (self.dir.join("data"), self.dir.join("server.log"));
        let (data, log) = (data.to_str().unwrap(), log.to_str().unwrap());
        as_postgres(
            "pg_ctl",
            &["-D", data, "-l", log, "-o", &options, "-w", "start"],
        );
    }

    /// SIGSTOP to every process of the server (its postmaster and the postmaster's children):
    /// it holds its connections open and answers nothing, as a frozen machine would.
    pub fn freeze(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// SIGCONT to every process [`Self::freeze`] stopped.
    pub fn thaw(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// `signal` to the postmaster (the first line of its `postmaster.pid`), then to its children,
    /// listed once it has it: a postmaster stopped starts no process the list would miss.
    fn signal_all(&self, signal: i32) {
        let Ok(pid_file) = std::fs::read_to_string(self.dir.join("data/postmaster.pid")) else {
            return;
        };
        let Some(Ok(postmaster)) = pid_file.lines().next().map(|l| l.trim().parse::<i32>()) else {
            return;
        };
        // SAFETY: kill(2) with a process id and a signal number only.
        unsafe { libc::kill(postmaster, signal) };
        let children = std::fs::read_dir("/proc").unwrap().filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: the name may hold spaces, never a `)` past its end.
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            (parent.parse::<i32>().ok()? == postmaster).then_some(pid)
        });
        for pid in children.collect::<Vec<_>>() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// A fast shutdown: connections are ended, the server exits.
    pub fn stop(&self) {
        let data = self.dir.join("data");
        as_postgres(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "fast", "-w", "stop"],
        );
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // A test that failed while the server was frozen: a stopped process ignores the stop.
        self.thaw();
        let data = self.dir.join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", &format!("{BIN}/pg_ctl")])
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
