//! A component as the agent runs it: its manifest, its program (a process in any language that
//! serves HTTP on loopback) and the checks made before anything reaches it.
//!
//! The program is started with:
//!
//! | variable | meaning |
//! |---|---|
//! | `TOA_PORT` | the port on 127.0.0.1 the program serves its HTTP on |
//! | `TOA_AGENT` | the agent's local API, e.g. `http://127.0.0.1:7090` |
//! | `TOA_COMPONENT` | the component's full name, e.g. `store.catalog` |
//! | `TOA_INSTANCE` | the process's name |
//! | `TOA_AGENT_TOKEN` | the component's token for its routes on the local API (in a pod, the file `TOA_AGENT_TOKEN_FILE` names holds it) |
//!
//! and serves `POST /lifecycle/{command}` for the run commands its manifest exports, and
//! `POST /operations/{name}` with `{"input": ...}`, answering `{"reply": ...}` or
//! `{"error": {"code": "...", "message": "..."}}`. See docs/component-protocol.md.

pub mod client;
pub mod program;
pub mod schema;

use client::ProgramClient;
use program::Program;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use toa_context::{Manifest, RunCommand};

/// Why a component could not be loaded, started or run.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error("{0}")]
    Manifest(#[from] toa_context::ManifestError),
    #[error("{path}: cannot read the manifest: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{component}: `operations.{operation}.input` is not a valid JSON Schema: {message}")]
    Schema {
        component: String,
        operation: String,
        message: String,
    },
    #[error(
        "{component}: no `program` in the manifest: a local run needs the command that starts it"
    )]
    NoProgram { component: String },
    #[error("{component}: the program did not start: {message}")]
    Start { component: String, message: String },
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
}

impl Component {
    /// Reads `dir/manifest.toa.yaml` and compiles its input schemas.
    pub fn load(dir: &Path) -> Result<Self, ComponentError> {
        let path = dir.join("manifest.toa.yaml");
        let text = std::fs::read_to_string(&path).map_err(|error| ComponentError::Read {
            path: path.display().to_string(),
            error,
        })?;
        let manifest = Manifest::parse(&text, &path.display().to_string())?;
        Self::new(manifest, dir.to_path_buf())
    }

    pub fn new(manifest: Manifest, dir: PathBuf) -> Result<Self, ComponentError> {
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
        })
    }

    /// Starts the program and waits until it serves.
    /// Attaches to the program serving 127.0.0.1:`port` (started by someone else).
    pub async fn attach(&self, port: u16) -> Result<(Program, ProgramClient), ComponentError> {
        let program = Program::attach(&self.name, port).await?;
        Ok((program, ProgramClient::new(&self.name, port)))
    }

    pub async fn start(
        &self,
        agent: &str,
        instance: &str,
        token: Option<&str>,
    ) -> Result<(Program, ProgramClient), ComponentError> {
        let command = self
            .manifest
            .program
            .as_ref()
            .ok_or_else(|| ComponentError::NoProgram {
                component: self.name.clone(),
            })?;
        let program =
            Program::start(&self.name, &self.dir, command, agent, instance, token).await?;
        let client = ProgramClient::new(&self.name, program.port());
        Ok((program, client))
    }

    pub fn exports(&self, command: RunCommand) -> bool {
        self.manifest.exports(command)
    }
}
