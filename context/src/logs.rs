//! The binaries' logs (`toa-agent`, `toa-operator`): `tracing` to standard error, at a level and
//! in a format set by flags or `TOA_LOG_LEVEL`/`TOA_LOG_FORMAT` — the chart and a Composition's
//! `spec.logs` set the variables. `RUST_LOG`, when set, is the whole filter instead (one module
//! at `debug`, say). Plain text by default, coloured only on a terminal (a pod's log, and the
//! termination message the kubelet takes from it, stay plain); `json` writes one object a line,
//! its fields at the top level, for a log pipeline to index.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// The variable [`LogArgs::log_level`] is read from.
pub const LEVEL_VAR: &str = "TOA_LOG_LEVEL";
/// The variable [`LogArgs::log_format`] is read from.
pub const FORMAT_VAR: &str = "TOA_LOG_FORMAT";

/// The least severe events logged.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

/// How each event is written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    // Plain comments: a variant's doc would become a description inside the CRD schema's
    // `oneOf`, which a structural schema forbids.
    // One line of text an event.
    #[default]
    Plain,
    // One JSON object a line: `timestamp`, `level`, `target`, `message` and the event's fields.
    Json,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Json => "json",
        }
    }
}

/// The flags both binaries take (global: before or after a subcommand).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// The least severe events logged (`RUST_LOG`, when set, is the whole filter instead).
    #[arg(long, global = true, env = LEVEL_VAR, value_enum, default_value_t = Level::Info)]
    pub log_level: Level,
    /// `plain` text, or `json`: one object a line.
    #[arg(long, global = true, env = FORMAT_VAR, value_enum, default_value_t = Format::Plain)]
    pub log_format: Format,
}

impl LogArgs {
    /// Installs the process's subscriber once; later calls do nothing.
    pub fn init(&self) {
        // An empty RUST_LOG counts as unset (a script that clears it means no filter of its own).
        let asked = std::env::var("RUST_LOG")
            .ok()
            .filter(|filter| !filter.is_empty());
        let filter = asked
            .and_then(|filter| EnvFilter::try_new(filter).ok())
            .unwrap_or_else(|| EnvFilter::new(self.log_level.as_str()));
        let logs = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        let _ = match self.log_format {
            Format::Plain => logs
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .try_init(),
            Format::Json => logs.json().flatten_event(true).try_init(),
        };
    }
}
