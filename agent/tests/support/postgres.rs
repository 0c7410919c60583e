//! A PostgreSQL server of a test's own (own data directory and port), which the test may stop and
//! start again; the shared server on 5432 is never touched. PostgreSQL refuses to run as root: it
//! runs as `postgres`, the user Debian's package makes, and takes that user without a password on
//! loopback.

use super::free_port;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const BIN: &str = "/usr/lib/postgresql/15/bin";

static SERVERS: AtomicU32 = AtomicU32::new(0);

pub struct PostgresServer {
    pub port: u16,
    dir: PathBuf,
    /// Taking TLS connections only, with this certificate and key.
    tls: Option<(PathBuf, PathBuf)>,
}

/// Runs a PostgreSQL program as `postgres`; panics with its output when it fails.
fn as_postgres(program: &str, args: &[&str]) {
    let output = Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{BIN}/{program}")])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PostgresServer {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A server that takes TLS connections only (`hostssl`; a plain one is rejected), with the
    /// certificate and key given, copied where `postgres` may read them.
    pub fn start_with_tls(certificate: &std::path::Path, key: &std::path::Path) -> Self {
        Self::start_with(Some((certificate.to_owned(), key.to_owned())))
    }

    fn start_with(tls: Option<(PathBuf, PathBuf)>) -> Self {
        let n = SERVERS.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("toa-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let owned = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(owned.success());
        let data = dir.join("data");
        as_postgres(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
            ],
        );
        let tls = tls.map(|(certificate, key)| {
            let (copied, copied_key) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::copy(certificate, &copied).unwrap();
            std::fs::copy(key, &copied_key).unwrap();
            for file in [&copied, &copied_key] {
                let path = file.to_str().unwrap();
                assert!(Command::new("chown").args(["postgres:postgres", path]).status().unwrap().success());
                assert!(Command::new("chmod").args(["600", path]).status().unwrap().success());
            }
            let hba = "hostssl all all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 reject\nlocal all all trust\n";
            std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
            (copied, copied_key)
        });
        let server = Self {
            port: free_port(),
            dir,
            tls,
        };
        server.start_again();
        server
    }

    /// `postgres://127.0.0.1:PORT/postgres`: log in as `postgres`, no password.
    pub fn address(&self) -> String {
        format!("postgres://127.0.0.1:{}/postgres", self.port)
    }

    pub fn start_again(&self) {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {}",
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
        let data = self.dir.join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", &format!("{BIN}/pg_ctl")])
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
