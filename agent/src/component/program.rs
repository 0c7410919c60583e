//! The component's program as a child process of the agent (local runs).

use super::ComponentError;
use std::path::Path;
use std::time::Duration;
use toa_context::program;
use tokio::process::{Child, Command};

/// How long a program may take to serve its port.
const START_LIMIT: Duration = Duration::from_secs(30);

/// The component's program: a child of the agent (local runs), or a process someone else
/// started and the agent attaches to (a pod, where it runs in its own container).
pub struct Program {
    child: Option<Child>,
    port: u16,
}

/// The program to run for `name`: a bare name (no `/`) found in `node_modules/.bin` of the
/// component's directory or one above it, as npm scripts find it (`program: [toa-node]` runs the
/// TypeScript SDK a project installed); otherwise `name` itself, looked up on `PATH`.
fn resolve(dir: &Path, name: &str) -> std::path::PathBuf {
    if !name.contains('/') {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
        for ancestor in dir.ancestors() {
            let candidate = ancestor.join("node_modules").join(".bin").join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    name.into()
}

/// What a started program is told, beside its port and name.
pub struct Environment<'a> {
    /// The local API's address.
    pub agent: &'a str,
    pub instance: &'a str,
    /// The component's local API token.
    pub token: Option<&'a str>,
    /// `TOA_CONFIGURATION`, JSON.
    pub configuration: &'a str,
    /// `TOA_SECRET_{NAME}` variables and their values.
    pub secrets: &'a [(String, toa_context::Secret)],
    /// Variables of the agent's environment the program does not inherit: every component's
    /// secrets, under the names the agent read them from.
    pub withheld: &'a [String],
}

impl Environment<'_> {
    /// Sets the program's variables ([`toa_context::program`]). The program inherits the
    /// environment the agent started with, minus what is the agent's: every `TOA_*` variable
    /// (the context, the broker's and Redis's credentials, tuning; the program's own are set
    /// below) and every component's secrets.
    fn apply(&self, command: &mut Command, name: &str, port: u16) {
        let inherited = std::env::vars_os().map(|(variable, _)| variable);
        self.apply_over(inherited, command, name, port);
    }

    /// [`Self::apply`] over the `inherited` variables' names.
    fn apply_over(
        &self,
        inherited: impl Iterator<Item = std::ffi::OsString>,
        command: &mut Command,
        name: &str,
        port: u16,
    ) {
        for variable in inherited {
            let agents = variable
                .to_str()
                .is_some_and(|v| v.starts_with("TOA_") || self.withheld.iter().any(|w| w == v));
            if agents {
                command.env_remove(variable);
            }
        }
        let environment = program::Environment {
            port,
            agent: self.agent.to_owned(),
            component: name.to_owned(),
            instance: program::Source::Text(self.instance.to_owned()),
            token: match self.token {
                Some(token) => program::Token::Value(token.to_owned()),
                None => program::Token::None,
            },
            configuration: self.configuration.to_owned(),
        };
        for (variable, secret) in self.secrets {
            command.env(variable, secret.expose());
        }
        for (variable, source) in environment.vars() {
            // A local run has no pod: its instance is always given as text.
            if let program::Source::Text(value) = source {
                command.env(variable, value);
            }
        }
    }
}

/// Waits until the program it started serves 127.0.0.1:`port`, at most [`START_LIMIT`]; why not.
async fn serving(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + START_LIMIT;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!(
                "it exited with {status} before serving 127.0.0.1:{port}"
            ));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "it did not serve 127.0.0.1:{port} within {START_LIMIT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Passes the program's output on, each line prefixed with its component's name
/// (`store.catalog | …`): a local run's programs share one terminal, and without it their lines
/// cannot be told apart. Its standard output to the agent's, its standard error to the agent's;
/// each line in one write, so that lines of two programs never mix. A thread per stream (the
/// writes block, which no runtime worker should), ending when the program closes it.
fn prefixed(name: &str, stdout: std::io::PipeReader, stderr: std::io::PipeReader) {
    use std::io::{BufRead, Write};
    fn pass(prefix: String, from: std::io::PipeReader, to: fn() -> Box<dyn Write>) {
        let spawned = std::thread::Builder::new().name(prefix.clone());
        let _ = spawned.spawn(move || {
            let mut reader = std::io::BufReader::new(from);
            let mut line = Vec::new();
            while matches!(reader.read_until(b'\n', &mut line), Ok(read) if read > 0) {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n'); // the last line, unterminated
                }
                let mut whole = prefix.clone().into_bytes();
                whole.extend_from_slice(&line);
                let _ = to().write_all(&whole);
                line.clear();
            }
        });
    }
    let prefix = format!("{name} | ");
    pass(prefix.clone(), stdout, || {
        Box::new(std::io::stdout().lock())
    });
    pass(prefix, stderr, || Box::new(std::io::stderr().lock()));
}

/// How long an attached program may take to serve its port (a container may start slowly).
const ATTACH_LIMIT: Duration = Duration::from_secs(300);

impl Program {
    pub async fn start(
        name: &str,
        dir: &Path,
        command: &[String],
        environment: Environment<'_>,
    ) -> Result<Self, ComponentError> {
        let failed = |message: String| ComponentError::Start {
            component: name.to_owned(),
            message,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| failed(format!("no free port: {e}")))?
            .port();
        let mut command_line = Command::new(resolve(dir, &command[0]));
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to send SIGTERM to the
        // program when the agent dies, so a killed agent leaves no program behind.
        unsafe {
            command_line.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        environment.apply(&mut command_line, name, port);
        let piped = std::io::pipe().and_then(|out| Ok((out, std::io::pipe()?)));
        let ((stdout, out), (stderr, err)) = piped.map_err(|e| failed(format!("no pipe: {e}")))?;
        let mut child = command_line
            .args(&command[1..])
            .current_dir(dir)
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("{:?} in {}: {e}", command.join(" "), dir.display())))?;
        // The command keeps the pipes' writing ends: without it, the program's exit ends them.
        drop(command_line);
        prefixed(name, stdout, stderr);
        serving(&mut child, port).await.map_err(failed)?;
        Ok(Self {
            child: Some(child),
            port,
        })
    }

    /// Waits until a program started by someone else serves 127.0.0.1:`port`.
    pub async fn attach(name: &str, port: u16) -> Result<Self, ComponentError> {
        let deadline = tokio::time::Instant::now() + ATTACH_LIMIT;
        let mut told = false;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(Self { child: None, port });
            }
            if !told {
                tracing::info!(
                    component = name,
                    port,
                    "waiting for the program to serve its port"
                );
                told = true;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ComponentError::Start {
                    component: name.to_owned(),
                    message: format!("nothing served 127.0.0.1:{port} within {ATTACH_LIMIT:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Started by someone else (a pod's component container), not by this agent.
    pub fn attached(&self) -> bool {
        self.child.is_none()
    }

    /// Asks the program to stop (SIGTERM), then kills it after `grace`. An attached program is
    /// not the agent's to stop.
    pub async fn stop(self, grace: Duration) {
        let Some(mut child) = self.child else { return };
        if let Some(pid) = child.id() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{resolve, Command, Environment};
    use std::ffi::OsStr;

    #[test]
    fn a_program_inherits_the_agents_environment_minus_the_agents_own() {
        let secrets = [(
            "TOA_SECRET_MAIL_KEY".to_owned(),
            toa_context::Secret::new("k-value"),
        )];
        let withheld = ["MAIL_KEY".to_owned(), "ORDERS_KEY".to_owned()];
        let environment = Environment {
            agent: "http://127.0.0.1:7090",
            instance: "p1",
            token: None,
            configuration: r#"{"key":"$MAIL_KEY"}"#,
            secrets: &secrets,
            withheld: &withheld,
        };
        // Removed, not inherited: every component's secret under its own name, everything of
        // the agent's (`TOA_*` but the program's own, set anew).
        let agents = [
            "MAIL_KEY",
            "ORDERS_KEY",
            "TOA_AMQP_PASSWORD",
            "TOA_APPLICATION",
            "TOA_CONTROL_TOKEN",
            "TOA_SECRET_ORDERS_KEY",
        ];
        let inherited = ["PATH", "HOME"]
            .into_iter()
            .chain(agents)
            .map(std::ffi::OsString::from);
        let mut command = Command::new("true");
        environment.apply_over(inherited, &mut command, "shop.mail", 4000);
        let envs: Vec<(&OsStr, Option<&OsStr>)> = command.as_std().get_envs().collect();
        let of = |name: &str| envs.iter().find(|(key, _)| *key == name).map(|(_, v)| *v);
        assert_eq!(of("TOA_SECRET_MAIL_KEY"), Some(Some(OsStr::new("k-value"))));
        for gone in agents {
            assert_eq!(of(gone), Some(None), "{gone}");
        }
        assert_eq!(of("PATH"), None, "inherited as it is");
        assert_eq!(of("TOA_PORT"), Some(Some(OsStr::new("4000"))));
        assert_eq!(
            of("TOA_CONFIGURATION"),
            Some(Some(OsStr::new(r#"{"key":"$MAIL_KEY"}"#)))
        );
    }

    #[test]
    fn a_bare_name_is_found_in_node_modules_bin_above_the_component() {
        let root = std::env::temp_dir().join(format!("toa-resolve-{}", std::process::id()));
        let component = root.join("components").join("store.orders");
        std::fs::create_dir_all(&component).unwrap();
        std::fs::create_dir_all(root.join("node_modules/.bin")).unwrap();
        std::fs::write(root.join("node_modules/.bin/toa-node"), "").unwrap();
        assert_eq!(
            resolve(&component, "toa-node"),
            root.join("node_modules/.bin/toa-node")
        );
        assert_eq!(
            resolve(&component, "python3"),
            std::path::PathBuf::from("python3")
        );
        assert_eq!(
            resolve(&component, "./run"),
            std::path::PathBuf::from("./run")
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
