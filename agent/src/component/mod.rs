//! A component as the agent runs it: its manifest, its program (a process in any language that
//! serves HTTP on loopback) and the checks made before anything reaches it.
//!
//! The program is started with the environment of [`toa_context::program`] (its table is the one
//! list of the variables), serves `POST /lifecycle/{command}` for the run commands its manifest
//! exports, and `POST /operations/{name}` with `{"input": ..., "call": {...}}`, answering as
//! [`toa_context::answer`] says. See docs/component-protocol.md.

pub mod answering;
pub mod client;
mod hop;
pub mod program;
pub mod schema;
pub mod sdk;

use client::ProgramClient;
use program::Program;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use toa_context::{Manifest, RunCommand, Secret};

/// How often a program is started on a new port when the one it was given turns out to be
/// another's ([`Component::start`]).
const START_TRIES: u32 = 3;

/// How long a program started on another's port has to stop (it has usually exited already,
/// its port taken).
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why a component could not be loaded, started or run.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error("{0}")]
    Manifest(#[from] toa_context::ManifestError),
    #[error("{path}: cannot read the manifest: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{component}: `operations.{operation}.input`: {message}")]
    Schema {
        component: String,
        operation: String,
        message: toa_context::schema::SchemaError,
    },
    #[error(
        "{component}: no `program` in the manifest, and no modules in operations/, rc/, \
         receivers/ or events/ to tell an SDK by: a local run needs the command that starts it"
    )]
    NoProgram { component: String },
    #[error("{component}: the program did not start: {message}")]
    Start { component: String, message: String },
    #[error("{component}: the program does not match its manifest: {message}")]
    Mismatch { component: String, message: String },
    /// The context's values for the component, or its manifest's defaults, refused.
    #[error("{0}")]
    Configuration(String),
    #[error("{component}: {command} failed: {message}")]
    RunCommand {
        component: String,
        command: &'static str,
        message: String,
    },
}

/// A loaded component.
pub struct Component {
    pub manifest: Manifest,
    pub name: String,
    pub dir: PathBuf,
    pub schemas: HashMap<String, schema::InputSchema>,
    /// What the program gets as `TOA_CONFIGURATION` (JSON): `{}` until [`Self::configure`].
    pub configuration: String,
    /// The variables holding the values of the configuration's secrets, and the values.
    pub secrets: Vec<(String, Secret)>,
    /// Why a manifest without `program` has none either from its modules (both SDKs' modules):
    /// said when the program is started, so that what reads only the manifest (`storage ddl`,
    /// the types, a pod's declarations) still can.
    pub unprogrammed: Option<String>,
}

impl Component {
    /// Reads `dir/manifest.toa.yaml` and compiles its input schemas.
    pub fn load(dir: &Path) -> Result<Self, ComponentError> {
        let path = dir.join("manifest.toa.yaml");
        let text = std::fs::read_to_string(&path).map_err(|error| ComponentError::Read {
            path: path.display().to_string(),
            error,
        })?;
        let mut manifest = Manifest::parse(&text, &path.display().to_string())?;
        let mut unprogrammed = None;
        if manifest.program.is_none() {
            // A seed's manifest has no `program`: its modules say which SDK runs it.
            match sdk::program_of(dir) {
                Ok(program) => manifest.program = program,
                Err(message) => unprogrammed = Some(message),
            }
            if let Some(program) = &manifest.program {
                tracing::info!(component = %manifest.full_name(), ?program, "no `program` in the manifest: its modules' SDK runs it");
            }
        }
        let mut component = Self::new(manifest, dir.to_path_buf())?;
        component.unprogrammed = unprogrammed;
        Ok(component)
    }

    pub fn new(mut manifest: Manifest, dir: PathBuf) -> Result<Self, ComponentError> {
        manifest.inherit();
        let name = manifest.full_name();
        let mut schemas = HashMap::new();
        for (operation, declaration) in &manifest.operations {
            if let Some(input) = &declaration.input {
                let compiled = schema::InputSchema::compile(input).map_err(|message| {
                    ComponentError::Schema {
                        component: name.clone(),
                        operation: operation.clone(),
                        message,
                    }
                })?;
                schemas.insert(operation.clone(), compiled);
            }
        }
        Ok(Self {
            manifest,
            name,
            dir,
            schemas,
            configuration: "{}".to_owned(),
            secrets: Vec::new(),
            unprogrammed: None,
        })
    }

    /// Takes the context's values for this component (`None`: the defaults), checked against
    /// the manifest's `configuration` schema; the values of its secrets come from the agent's
    /// environment (`$MAIL_KEY`: the variable `MAIL_KEY`).
    pub fn configure(&mut self, given: Option<&serde_json::Value>) -> Result<(), ComponentError> {
        let lookup = |name: &str| std::env::var(name).ok();
        let value =
            toa_context::configure(&self.manifest, given, toa_context::Secrets::Known(&lookup))
                .map_err(ComponentError::Configuration)?;
        self.secrets = toa_context::placeholders::placeholders(&value)
            .into_iter()
            .filter_map(|p| {
                let secret = Secret::new(lookup(&p.name)?);
                Some((toa_context::placeholders::variable(&p.name), secret))
            })
            .collect();
        self.configuration = value.to_string();
        Ok(())
    }

    /// Starts the program and waits until it serves.
    /// Attaches to the program serving 127.0.0.1:`port` (started by someone else).
    pub async fn attach(
        &self,
        port: u16,
        token: Option<&str>,
    ) -> Result<(Program, ProgramClient), ComponentError> {
        let program = Program::attach(&self.name, port).await?;
        Ok((
            program,
            ProgramClient::new(&self.name, port)
                .with_token(token)
                .with_errors(&self.manifest),
        ))
    }

    /// Starts the program, telling it `instance` and its `token`, and withholding the agent's
    /// environment's variables named in `withheld` (every component's secrets).
    pub async fn start(
        &self,
        agent: &str,
        (instance, token, withheld): (&str, Option<&str>, &[String]),
    ) -> Result<(Program, ProgramClient), ComponentError> {
        let command = self
            .manifest
            .program
            .as_ref()
            .ok_or_else(|| match &self.unprogrammed {
                Some(message) => ComponentError::Start {
                    component: self.name.clone(),
                    message: message.clone(),
                },
                None => ComponentError::NoProgram {
                    component: self.name.clone(),
                },
            })?;
        let environment = || program::Environment {
            agent,
            instance,
            token,
            configuration: &self.configuration,
            secrets: &self.secrets,
            withheld,
        };
        let mut tries = 1;
        loop {
            let program = Program::start(&self.name, &self.dir, command, environment()).await?;
            let client = ProgramClient::new(&self.name, program.port())
                .with_token(token)
                .with_errors(&self.manifest);
            // The free port the program was given may be given to another agent's program in
            // the moment before this one binds it: the one that binds second exits, and its
            // agent, finding the port served, would send every call to the other program.
            // Only a program that knows the token tells them apart; the later `describe`
            // reports any other failure.
            match client.describe().await {
                Err(refused @ client::ProgramError::Refused { .. }) => {
                    program.stop(STOP_GRACE).await;
                    if tries == START_TRIES {
                        return Err(ComponentError::Start {
                            component: self.name.clone(),
                            message: refused.to_string(),
                        });
                    }
                    tracing::warn!(component = %self.name, %refused, "starting the program again on another port");
                    tries += 1;
                }
                _ => return Ok((program, client)),
            }
        }
    }

    /// The variables this component's secrets were read from (`NAME` for `TOA_SECRET_NAME`).
    pub fn secret_sources(&self) -> impl Iterator<Item = String> + '_ {
        self.secrets.iter().filter_map(|(variable, _)| {
            let name = variable.strip_prefix(toa_context::placeholders::PREFIX)?;
            Some(name.to_owned())
        })
    }

    pub fn exports(&self, command: RunCommand) -> bool {
        self.manifest.exports(command)
    }

    /// The kind of the operation `name`: the program's word (which the manifest's `type`, where
    /// given, must agree with, or the start fails naming both), else the manifest's.
    pub fn kind_of(
        &self,
        name: &str,
        declared: &toa_context::manifest::Operation,
        description: Option<&client::Description>,
    ) -> Result<toa_context::manifest::Kind, ComponentError> {
        let said = description.and_then(|d| d.kinds.get(name).copied());
        match (declared.kind, said) {
            (Some(declared), Some(said)) if declared != said => Err(ComponentError::Mismatch {
                component: self.name.clone(),
                message: format!(
                    "`operations.{name}.type` is {}, and its module exports a {}",
                    declared.name(),
                    said.name()
                ),
            }),
            (_, Some(said)) => Ok(said),
            (_, None) => Ok(declared.kind(name)),
        }
    }

    /// Checks every operation's kind ([`Self::kind_of`]), with or without an entity.
    pub fn check_kinds(
        &self,
        description: Option<&client::Description>,
    ) -> Result<(), ComponentError> {
        for (name, declared) in &self.manifest.operations {
            self.kind_of(name, declared, description)?;
        }
        Ok(())
    }

    /// Warns of each operation the program has a module for and the manifest does not declare:
    /// no one can call it (a module of a name misspelt, or a declaration forgotten).
    pub fn warn_undeclared(&self, description: Option<&client::Description>) {
        let served = description.map_or(&[][..], |d| d.operations.as_slice());
        for operation in served
            .iter()
            .filter(|name| !self.manifest.operations.contains_key(*name))
        {
            tracing::warn!(component = %self.name, %operation, "the program has a module for an operation the manifest does not declare: it cannot be called until it is declared");
        }
    }

    /// Checks that every event whose condition the program keeps (`events/<name>` modules) is
    /// one the manifest declares: a condition of an event never published is a mismatch,
    /// naming it.
    pub fn conditioned(
        &self,
        description: Option<&client::Description>,
    ) -> Result<(), ComponentError> {
        let conditions = description.map_or(&[][..], |d| d.conditions.as_slice());
        match conditions
            .iter()
            .find(|name| !self.manifest.events.contains_key(*name))
        {
            Some(name) => Err(ComponentError::Mismatch {
                component: self.name.clone(),
                message: format!(
                    "it has a condition module for the event {name:?} (events/{name}), which \
                     the manifest's events do not name"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The labels whose receiver's request the program makes (`receivers/<label>` modules),
    /// each one the manifest receives: an adaptation of an event the component does not
    /// receive is a mismatch, naming it.
    pub fn adapted(
        &self,
        description: Option<&client::Description>,
    ) -> Result<Vec<String>, ComponentError> {
        let adapted = description.map_or(&[][..], |d| d.receivers.as_slice());
        match adapted
            .iter()
            .find(|label| !self.manifest.receivers.contains_key(*label))
        {
            Some(label) => Err(ComponentError::Mismatch {
                component: self.name.clone(),
                message: format!(
                    "it has a receiver module for {label:?}, which the manifest's receivers do \
                     not name"
                ),
            }),
            None => Ok(adapted.to_vec()),
        }
    }

    /// The run commands to run for a program that says what it serves, checked against the
    /// manifest: every declared operation served; the run commands the manifest lists, when it
    /// lists any, exactly those exported; `pause` only with `resume`. Without a description, the
    /// manifest's list.
    pub fn commands(
        &self,
        description: Option<&client::Description>,
    ) -> Result<Vec<RunCommand>, ComponentError> {
        let Some(description) = description else {
            return Ok(self.manifest.lifecycle.clone());
        };
        let mismatch = |message: String| ComponentError::Mismatch {
            component: self.name.clone(),
            message,
        };
        let mut exported = Vec::new();
        for name in &description.commands {
            let command = RunCommand::ALL
                .into_iter()
                .find(|command| command.name() == name)
                .ok_or_else(|| {
                    mismatch(format!(
                        "it exports a run command {name:?}; run commands are preflight, settle, \
                         ready, pause, resume and dispose"
                    ))
                })?;
            exported.push(command);
        }
        let missing: Vec<&str> = self
            .manifest
            .operations
            .keys()
            .filter(|name| !description.operations.contains(name))
            .filter(|name| {
                let entity = self.manifest.entity.is_some();
                !(entity && toa_context::manifest::is_inherited(name))
            })
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(mismatch(format!(
                "the manifest declares {missing:?} and the program has no module for them"
            )));
        }
        let listed = &self.manifest.lifecycle;
        if !listed.is_empty() && listed.iter().any(|c| !exported.contains(c))
            || !listed.is_empty() && exported.iter().any(|c| !listed.contains(c))
        {
            let names = |list: &[RunCommand]| list.iter().map(|c| c.name()).collect::<Vec<_>>();
            return Err(mismatch(format!(
                "the manifest lists the run commands {:?}, the program exports {:?}",
                names(listed),
                names(&exported)
            )));
        }
        if exported.contains(&RunCommand::Pause) && !exported.contains(&RunCommand::Resume) {
            return Err(mismatch(
                "it exports `pause` and no `resume`: resume takes again what pause released"
                    .to_owned(),
            ));
        }
        Ok(exported)
    }
}

#[cfg(test)]
mod tests {
    use super::client::Description;
    use super::*;

    fn component(manifest: &str) -> Component {
        Component {
            manifest: serde_yaml::from_str(manifest).unwrap(),
            name: "shop.mail".into(),
            dir: PathBuf::from("."),
            schemas: HashMap::new(),
            configuration: "{}".into(),
            secrets: Vec::new(),
            unprogrammed: None,
        }
    }

    /// A manifest without `program` over both SDKs' modules loads (what reads only manifests,
    /// `storage ddl` among them, still can) and fails when its program is started, naming one
    /// module of each kind.
    #[tokio::test]
    async fn both_sdks_modules_without_a_program_load_and_fail_at_start() {
        let dir = std::env::temp_dir().join(format!("toa-mixed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("operations")).unwrap();
        let manifest = "name: mixed\nnamespace: shop\noperations:\n  a: {}\n";
        std::fs::write(dir.join("manifest.toa.yaml"), manifest).unwrap();
        std::fs::write(dir.join("operations/a.ts"), "").unwrap();
        std::fs::write(dir.join("operations/b.py"), "").unwrap();
        let component = Component::load(&dir).expect("loads: only its start needs a program");
        let refused = component
            .start("http://127.0.0.1:1", ("i", None, &[]))
            .await;
        let message = refused.err().expect("refused at start").to_string();
        assert!(message.contains("operations/a.ts"), "{message}");
        assert!(message.contains("operations/b.py"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Component `shop.port`, whose program records each start (its pid and port) in `runs`
    /// and answers 401, as a process that does not know the agent's token, on its first
    /// `refusing` starts.
    fn refusing(refusing: usize) -> (Component, PathBuf) {
        let dir = std::env::temp_dir().join(format!("toa-port-{}-{refusing}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let runs = dir.join("runs");
        let manifest = format!(
            "name: port\nnamespace: shop\nprogram: [python3, program.py, {}, '{refusing}']\noperations:\n  a: {{}}\n",
            runs.display()
        );
        std::fs::write(dir.join("manifest.toa.yaml"), manifest).unwrap();
        let program = r#"
import http.server, os, sys
port = int(os.environ["TOA_PORT"])
with open(sys.argv[1], "a") as runs:
    runs.write(f"{os.getpid()} {port}\n")
refuse = len(open(sys.argv[1]).read().splitlines()) <= int(sys.argv[2])
class Program(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(401 if refuse else 404)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Program).serve_forever()
"#;
        std::fs::write(dir.join("program.py"), program).unwrap();
        (Component::load(&dir).unwrap(), runs)
    }

    /// Each start's pid and port, from the program's record.
    fn runs(path: &Path) -> Vec<(i32, u16)> {
        let runs = std::fs::read_to_string(path).unwrap();
        let run = |line: &str| {
            let (pid, port) = line.split_once(' ').unwrap();
            (pid.parse().unwrap(), port.parse().unwrap())
        };
        runs.lines().map(run).collect()
    }

    /// Two agents starting at once may give their programs one free port: the second to bind
    /// exits, and its agent finds the port served by the other's, which refuses its token. Its
    /// own program is stopped and started again on another port; a port that is never
    /// the program's fails the start after three, naming it.
    #[tokio::test]
    async fn a_program_whose_port_another_serves_is_started_again_on_another() {
        let (component, started_record) = refusing(1);
        let (program, _) = component
            .start("http://127.0.0.1:1", ("i", Some("t"), &[]))
            .await
            .unwrap();
        let started = runs(&started_record);
        assert_eq!(started.len(), 2, "{started:?}");
        assert_eq!(started[1].1, program.port());
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(started[0].0, 0) } == 0;
        assert!(!alive, "the first program, refusing, was stopped");
        program.stop(STOP_GRACE).await;

        let (component, record) = refusing(5);
        let refused = component
            .start("http://127.0.0.1:1", ("i", Some("t"), &[]))
            .await;
        let message = refused.err().expect("refused at start").to_string();
        assert!(
            message.contains("refused the agent's token (401)"),
            "{message}"
        );
        assert_eq!(runs(&record).len(), 3, "three starts, then the failure");
        for record in [&record, &started_record] {
            let _ = std::fs::remove_dir_all(record.parent().unwrap());
        }
    }

    fn said(commands: &[&str], operations: &[&str]) -> Description {
        Description {
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
            operations: operations.iter().map(|o| (*o).to_owned()).collect(),
            kinds: Default::default(),
            receivers: Vec::new(),
            conditions: Vec::new(),
        }
    }

    #[test]
    fn a_program_that_says_what_it_serves_gets_its_own_run_commands_checked() {
        let seed = component("name: mail\nnamespace: shop\noperations:\n  send: {}\n");
        // The seeds' manifests list no run commands: the program's modules say them.
        let commands = seed.commands(Some(&said(&["preflight", "dispose"], &["send"])));
        assert_eq!(
            commands.unwrap(),
            [RunCommand::Preflight, RunCommand::Dispose]
        );
        assert_eq!(seed.commands(None).unwrap(), []);
        let errors = [
            (
                said(&[], &[]),
                "declares [\"send\"] and the program has no module",
            ),
            (
                said(&["pause"], &["send"]),
                "exports `pause` and no `resume`",
            ),
            (said(&["stop"], &["send"]), "run command \"stop\""),
        ];
        for (description, expected) in errors {
            let error = seed.commands(Some(&description)).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(error.starts_with("shop.mail: "), "{error}");
        }
        let listed = component(
            "name: mail\nnamespace: shop\nlifecycle: [preflight, dispose]\noperations:\n  send: {}\n",
        );
        let error = listed
            .commands(Some(&said(&["preflight"], &["send"])))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("lists the run commands [\"preflight\", \"dispose\"], the program exports [\"preflight\"]"),
            "{error}"
        );
        assert_eq!(
            listed.commands(None).unwrap(),
            [RunCommand::Preflight, RunCommand::Dispose]
        );
    }
}
