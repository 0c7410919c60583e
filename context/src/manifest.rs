//! A component's manifest (`manifest.toa.yaml`): its name, its operations and what its program
//! exports. Read by the agent (to run and call the component) and by the operator (so that every
//! caller knows every component's declarations).
//!
//! ```yaml
//! name: catalog
//! namespace: store
//! program: [python3, catalog.py]   # local runs: how to start the program, in its directory
//! lifecycle: [preflight, dispose]  # the run commands the program exports
//! state: ~                         # the component keeps per-process state
//! operations:
//!   appraise:
//!     type: effect
//!     input: { type: object, properties: { customer: { type: string } }, required: [customer] }
//!     errors: [TOO_MANY_REQUESTS]
//!   charge:
//!     stateful: true               # called on one named process
//! pulses:
//!   drain: 1000                    # call `drain` on every replica every 1000 ms
//! configuration:                   # a JSON Schema; the context gives the values
//!   type: object
//!   properties: { batch: { type: integer, default: 50 } }
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The run commands, in the order of a component's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunCommand {
    Preflight,
    Settle,
    Ready,
    Pause,
    Resume,
    Dispose,
}

impl RunCommand {
    /// Every run command, in the order of a component's life.
    pub const ALL: [RunCommand; 6] = [
        Self::Preflight,
        Self::Settle,
        Self::Ready,
        Self::Pause,
        Self::Resume,
        Self::Dispose,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Preflight => "preflight",
            Self::Settle => "settle",
            Self::Ready => "ready",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Dispose => "dispose",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The command that starts the program in a local run, relative to the component's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lifecycle: Vec<RunCommand>,
    /// `state: ~` declares per-process state; its value carries nothing.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub state: Option<serde_json::Value>,
    #[serde(default)]
    pub operations: BTreeMap<String, Operation>,
    /// Operation name → interval in milliseconds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pulses: BTreeMap<String, u64>,
    /// A JSON Schema of the component's configuration, with defaults ([`crate::configuration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    /// `effect`, `computation`, … (informative here).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Called on one named process (`instance`), not on any replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stateful: bool,
    /// A JSON Schema the input must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    /// The codes of the errors the operation may answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// Why a manifest was refused; names the component (or the file) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct ManifestError {
    pub origin: String,
    pub message: String,
}

/// `Some` whenever the key is there, even as `~`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl Manifest {
    /// Parses and validates; `origin` (a path, say) names the manifest in errors.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, ManifestError> {
        let manifest: Self = serde_yaml::from_str(yaml).map_err(|error| ManifestError {
            origin: origin.to_owned(),
            message: error.to_string(),
        })?;
        manifest.validate().map_err(|message| ManifestError {
            origin: origin.to_owned(),
            message,
        })?;
        Ok(manifest)
    }

    /// `namespace.name`, or `name` without a namespace.
    pub fn full_name(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{namespace}.{}", self.name),
            None => self.name.clone(),
        }
    }

    pub fn exports(&self, command: RunCommand) -> bool {
        self.lifecycle.contains(&command)
    }

    /// Checks the manifest part by part: names, the configuration's schema, the run commands and
    /// program, the operations, the pulses.
    fn validate(&self) -> Result<(), String> {
        self.validate_names()?;
        if let Some(schema) = &self.configuration {
            crate::schema::compile(schema).map_err(|error| format!("`configuration`: {error}"))?;
        }
        self.validate_program()?;
        self.validate_operations()?;
        self.validate_pulses()
    }

    fn validate_names(&self) -> Result<(), String> {
        let label = |text: &str| {
            !text.is_empty()
                && text.len() <= 63
                && text.starts_with(|c: char| c.is_ascii_lowercase())
                && text
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !label(&self.name) {
            return Err(format!(
                "`name`: expected a lowercase letter then lowercase letters, digits or '-' (at most 63), got {:?}",
                self.name
            ));
        }
        if let Some(namespace) = &self.namespace {
            if !label(namespace) {
                return Err(format!(
                    "`namespace`: expected a lowercase letter then lowercase letters, digits or '-' (at most 63), got {namespace:?}"
                ));
            }
        }
        Ok(())
    }

    fn validate_program(&self) -> Result<(), String> {
        if self.exports(RunCommand::Pause) && !self.exports(RunCommand::Resume) {
            return Err(format!(
                "component {} exports pause and no resume: a component that pauses must take back in resume what pause released",
                self.full_name()
            ));
        }
        if let Some(program) = &self.program {
            if program.is_empty() || program[0].is_empty() {
                return Err(
                    "`program`: expected a command and its arguments, as [python3, main.py]".into(),
                );
            }
        }
        Ok(())
    }

    fn validate_operations(&self) -> Result<(), String> {
        for (name, operation) in &self.operations {
            if !name.starts_with(|c: char| c.is_ascii_lowercase())
                || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(format!("`operations.{name}`: expected a name of letters, digits and '_', starting with a lowercase letter"));
            }
            if let Some(schema) = &operation.input {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(format!("`operations.{name}.input`: expected a JSON Schema (an object), got {schema}"));
                }
                crate::schema::compile(schema)
                    .map_err(|error| format!("`operations.{name}.input`: {error}"))?;
            }
        }
        Ok(())
    }

    fn validate_pulses(&self) -> Result<(), String> {
        for (name, interval) in &self.pulses {
            match self.operations.get(name) {
                None => return Err(format!("`pulses.{name}`: expected the name of one of the component's operations")),
                Some(operation) if operation.stateful => {
                    return Err(format!("`pulses.{name}`: a pulse calls an ordinary operation on every replica; {name} is stateful"))
                }
                Some(_) if *interval == 0 => return Err(format!("`pulses.{name}`: expected a positive interval in milliseconds")),
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = "
name: catalog
namespace: store
program: [python3, catalog.py]
lifecycle: [preflight, pause, resume, dispose]
state: ~
operations:
  appraise:
    type: effect
    input: { type: object, properties: { customer: { type: string } }, required: [customer] }
    errors: [TOO_MANY_REQUESTS]
  charge:
    stateful: true
pulses:
  appraise: 1000
";

    #[test]
    fn reads_a_manifest() {
        let manifest = Manifest::parse(CATALOG, "catalog/manifest.toa.yaml").unwrap();
        assert_eq!(manifest.full_name(), "store.catalog");
        assert!(manifest.exports(RunCommand::Pause) && !manifest.exports(RunCommand::Settle));
        assert!(manifest.operations["charge"].stateful);
        assert_eq!(
            manifest.operations["appraise"].errors,
            vec!["TOO_MANY_REQUESTS"]
        );
        assert_eq!(manifest.pulses["appraise"], 1000);
        assert!(manifest.state.is_some(), "`state: ~` declares state");
        assert!(Manifest::parse("name: c\n", "m").unwrap().state.is_none());
    }

    #[test]
    fn declared_schemas_are_held_to_the_bounds_naming_the_field() {
        let deep = (0..16).fold("{ type: string }".to_owned(), |inner, _| {
            format!("{{ properties: {{ a: {inner} }} }}")
        });
        let yaml = format!("name: c\noperations:\n  echo:\n    input: {deep}\n");
        let error = Manifest::parse(&yaml, "m.yaml").unwrap_err().to_string();
        assert_eq!(
            error,
            "m.yaml: `operations.echo.input`: the schema nests deeper than 32 levels"
        );
        let yaml = "name: c\nconfiguration: { pattern: '\\w{12000}' }\n";
        let error = Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        assert!(
            error.starts_with("m.yaml: `configuration`: not a valid JSON Schema:"),
            "{error}"
        );
    }

    #[test]
    fn refusals_name_the_manifest_and_the_problem() {
        let refused = |yaml: &str| Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        assert_eq!(
            refused("name: c\nlifecycle: [pause]\n"),
            "m.yaml: component c exports pause and no resume: a component that pauses must take back in resume what pause released"
        );
        assert!(refused("name: c\nlifecycle: [start]\n").contains("unknown variant `start`"));
        assert!(refused("name: c\nopertions: {}\n").contains("unknown field `opertions`"));
        assert!(refused("name: C\n").contains("`name`: expected a lowercase letter"));
        assert_eq!(
            refused("name: c\npulses: { drain: 5 }\n"),
            "m.yaml: `pulses.drain`: expected the name of one of the component's operations"
        );
        assert!(
            refused("name: c\noperations: { a: { stateful: true } }\npulses: { a: 5 }\n")
                .contains("is stateful")
        );
        assert!(refused("name: c\noperations: { a: { input: 5 } }\n")
            .contains("expected a JSON Schema"));
        assert!(refused("name: c\nprogram: []\n").contains("`program`"));
    }
}
