//! The application context: the annotations of `context.toa.yaml` that the agent and the operator
//! both read.
//!
//! Layout:
//! - [`environment`]: environment chains (`staging:production`) and the resolution of `key@env` keys;
//! - [`address`]: Redis and broker addresses, which never carry credentials;
//! - [`annotations`]: the typed model ([`Context`]) and the table of its settings
//!   ([`annotations::SETTINGS`]), read from YAML or from environment variables;
//! - [`spec`]: the annotations' wire form, which a Composition's `spec.context` carries;
//! - [`credentials`]: secrets read from the environment or from mounted files, never printed;
//! - [`manifest`]: a component's manifest;
//! - [`configuration`]: a component's configuration, its manifest's schema and the context's values;
//! - [`schema`]: the JSON Schemas users declare, compiled within bounds of size, depth and regex;
//! - [`placeholders`]: secrets in a configuration (`$NAME`), whose values it never holds;
//! - [`control`]: the operator↔agent contract: ports, paths, the control status, and the
//!   credentials both derive from a pod's control token;
//! - [`program`]: the program's contract: its environment, the paths it serves, the call's metadata;
//! - [`query`]: which object a call works on (`{"id", "version"}`) and what an id may be;
//! - [`answer`]: what a call answers (reply, the operation's error; between agents a failure or
//!   a refusal), written and read in one place;
//! - [`agent_args`]: the agent's command line, written by the operator and parsed by the agent;
//! - [`tls`]: what TLS connections to Redis and the broker trust;
//! - [`network`]: address ranges the kubelet's hooks may come from;
//! - [`logs`]: both binaries' log level and format.

pub mod address;
pub mod agent_args;
pub mod annotations;
pub mod answer;
pub mod configuration;
pub mod control;
pub mod credentials;
pub mod environment;
pub mod logs;
pub mod manifest;
pub mod network;
pub mod placeholders;
pub mod program;
pub mod query;
pub mod schema;
pub mod spec;
pub mod tls;
pub mod trace;

pub use address::{AmqpAddress, RedisAddress};
pub use annotations::{Addressed, Atomicity, Context, Limits, ProcessVars, Vars};
pub use configuration::{configure, Secrets};
pub use credentials::{Credentials, Secret};
pub use environment::Environment;
pub use manifest::{Manifest, ManifestError, Operation, RunCommand};

/// Why a context was refused. Every message names the key and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// An even number of Redis addresses: Redlock needs a majority of one or an odd number.
    #[error("Atomicity takes an odd number of addresses, {0} given.")]
    EvenAddresses(usize),
    /// Any other refused value.
    #[error("`{key}`: {message}")]
    Invalid { key: String, message: String },
    /// The document is not YAML at all.
    #[error("context is not valid YAML: {0}")]
    Yaml(String),
}

impl ContextError {
    pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}
