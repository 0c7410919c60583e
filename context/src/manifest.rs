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
    /// The objects the component's transitions, assignments and observations work on (DESIGN 17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<Entity>,
    /// The events the entity's stored changes publish (DESIGN 18), by name:
    /// `events: { approved: {} }` publishes `namespace.name.approved` on every stored change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub events: BTreeMap<String, Event>,
    /// The events the component receives, by label, and the operation each runs (DESIGN 18):
    /// `receivers: { store.orders.approved: notify }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub receivers: BTreeMap<String, Receiver>,
}

/// What a received event runs: an operation of the component, as `label: operation` or
/// `label: { operation, latest? }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Receiver {
    Operation(String),
    Declared(ReceiverDeclaration),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverDeclaration {
    pub operation: String,
    /// Runs only for an event newer than the newest it ran for, per object (the versions it
    /// applied are kept with its writes): a transition or an assignment only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub latest: bool,
}

impl Receiver {
    /// The operation it runs.
    pub fn operation(&self) -> &str {
        match self {
            Self::Operation(operation) | Self::Declared(ReceiverDeclaration { operation, .. }) => {
                operation
            }
        }
    }

    /// Whether it runs only for events newer than it ran for (`latest: true`).
    pub fn latest(&self) -> bool {
        matches!(
            self,
            Self::Declared(ReceiverDeclaration { latest: true, .. })
        )
    }
}

/// An event's name: a lowercase letter, then letters, digits or '_' (at most 63).
fn event_name_fits(text: &str) -> bool {
    text.len() <= 63
        && text.starts_with(|c: char| c.is_ascii_lowercase())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An event a component declares. Nothing to set yet: every stored change of its entity
/// publishes it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {}

/// A component's entity, as seed 003 writes it:
///
/// ```yaml
/// entity:
///   associated: true          # one object per id a caller names, `blank` until written
///   properties:
///     available: { type: integer, minimum: 0 }
///   blank:
///     available: 0
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entity {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub associated: bool,
    /// Property name → JSON Schema.
    pub properties: serde_json::Map<String, serde_json::Value>,
    /// What a new object holds; checked against `properties`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub blank: serde_json::Map<String, serde_json::Value>,
}

impl Entity {
    /// The schema of one object: its properties, and only those.
    pub fn schema(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": self.properties,
            "additionalProperties": false,
        })
    }
}

/// What an operation does (`type:`). The program's module says it too (the function's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Effect,
    Computation,
    /// Reads the object (with an entity), never writes.
    Observation,
    /// Writes the given fields, never reads, never conflicts.
    Assignment,
    /// Reads the object, the program decides, the agent writes what it leaves.
    Transition,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Effect => "effect",
            Self::Computation => "computation",
            Self::Observation => "observation",
            Self::Assignment => "assignment",
            Self::Transition => "transition",
        }
    }
}

/// What a transition does when another call wrote its object meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// Read again and run again (the default).
    Retry,
    /// Fail the call: `CONFLICT`.
    None,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    /// `effect`, `computation`, `observation`, `assignment`, `transition`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// A transition's answer to a lost write; `retry` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// Applied once however often it is delivered (transitions and assignments).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
    /// `true`: a call must name its object (`query`); `false`: must not; absent: may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<bool>,
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

/// The inherited operations' names (the seeds': `context.local.observe`, `...transit`).
pub const OBSERVE: &str = "observe";
pub const ENUMERATE: &str = "enumerate";
pub const TRANSIT: &str = "transit";
pub const ASSIGN: &str = "assign";
pub const DELETE: &str = "delete";

/// Whether `name` is an inherited operation's: the agent serves it when the program has no
/// module for it.
pub fn is_inherited(name: &str) -> bool {
    [OBSERVE, ENUMERATE, TRANSIT, ASSIGN, DELETE].contains(&name)
}

/// The most objects one `enumerate` answers.
pub const ENUMERATE_LIMIT: u64 = 1_000;

/// `enumerate`'s input: how many objects (1 to 1,000, 100 when absent) after which id.
fn enumerate_input() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "limit": { "type": "integer", "minimum": 1, "maximum": ENUMERATE_LIMIT },
            "after": { "type": "string", "minLength": 1, "maxLength": 64 },
        },
        "additionalProperties": false,
    })
}

impl Operation {
    /// What the operation `name` is, when its program does not say: its `type`; else what its
    /// name inherits (`transit` and `delete` are transitions, `assign` an assignment, `observe`
    /// and `enumerate` observations); else a transition when it declares `concurrency`; else an
    /// effect.
    pub fn kind(&self, name: &str) -> Kind {
        if let Some(kind) = self.kind {
            return kind;
        }
        match name {
            TRANSIT | DELETE => Kind::Transition,
            ASSIGN => Kind::Assignment,
            OBSERVE | ENUMERATE => Kind::Observation,
            _ if self.concurrency.is_some() => Kind::Transition,
            _ => Kind::Effect,
        }
    }

    /// What the operation `name` declares fits its kind and whether the component has an entity.
    fn validate_against(&self, name: &str, entity: bool) -> Result<(), String> {
        let field = |key: &str| format!("`operations.{name}.{key}`");
        let kind = self.kind.map_or("undeclared", Kind::name);
        if self.concurrency.is_some() && !matches!(self.kind, None | Some(Kind::Transition)) {
            return Err(format!(
                "{}: only a transition has concurrency; {name} is declared {kind}",
                field("concurrency")
            ));
        }
        if self.once && !matches!(self.kind, None | Some(Kind::Transition | Kind::Assignment)) {
            return Err(format!(
                "{}: only a transition or an assignment is applied once; {name} is declared {kind}",
                field("once")
            ));
        }
        if entity {
            return Ok(());
        }
        if matches!(self.kind, Some(Kind::Transition | Kind::Assignment)) {
            return Err(format!(
                "{}: {name} is declared {kind}, which writes the component's entity, and the component declares none",
                field("type")
            ));
        }
        for (declared, key) in [
            (self.concurrency.is_some(), "concurrency"),
            (self.once, "once"),
            (self.query.is_some(), "query"),
        ] {
            if declared {
                return Err(format!("{}: the component declares no entity", field(key)));
            }
        }
        Ok(())
    }
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
        self.validate_entity()?;
        self.validate_events()?;
        self.validate_receivers()?;
        self.validate_pulses()
    }

    /// The entity's schema and blank, and what operations may declare of it: `concurrency` on
    /// transitions, `once` on transitions and assignments, `query` and those kinds only with an
    /// entity.
    fn validate_entity(&self) -> Result<(), String> {
        for (name, operation) in &self.operations {
            operation.validate_against(name, self.entity.is_some())?;
        }
        let Some(entity) = &self.entity else {
            return Ok(());
        };
        if let Some(name) = entity
            .properties
            .keys()
            .find(|name| ["id", "VERSION", "DISCARD", "DELETE"].contains(&name.as_str()))
        {
            return Err(format!(
                "`entity.properties.{name}`: id, VERSION, DISCARD and DELETE are the entry's own \
                 fields, never stored: name the property otherwise"
            ));
        }
        let schema = entity.schema();
        let validator = crate::schema::compile(&schema)
            .map_err(|error| format!("`entity.properties`: {error}"))?;
        let blank = serde_json::Value::Object(entity.blank.clone());
        if let Some(error) = validator.iter_errors(&blank).next() {
            return Err(format!(
                "`entity.blank`: {error} (at {})",
                error.instance_path()
            ));
        }
        Ok(())
    }

    /// Events need an entity, whose stored changes they publish; their names are a lowercase
    /// letter, then letters, digits or '_' (at most 63): the last part of a label
    /// (`namespace.name.event`), which is a routing key on the broker.
    fn validate_events(&self) -> Result<(), String> {
        let Some(name) = self.events.keys().next() else {
            return Ok(());
        };
        if self.entity.is_none() {
            return Err(format!(
                "`events.{name}`: the component declares no entity, whose stored changes an \
                 event publishes"
            ));
        }
        match self.events.keys().find(|name| !event_name_fits(name)) {
            Some(name) => Err(format!(
                "`events`: expected an event's name to be a lowercase letter, then letters, \
                 digits or '_' (at most 63), got {name:?}"
            )),
            None => Ok(()),
        }
    }

    /// A receiver's label names a component and one of its events (`namespace.name.event`, as
    /// published), and its operation is one the component declares that may act on it: not an
    /// observation, which writes nothing.
    fn validate_receivers(&self) -> Result<(), String> {
        for (label, receiver) in &self.receivers {
            let fits = label.rsplit_once('.').is_some_and(|(component, event)| {
                label.len() <= 255
                    && event_name_fits(event)
                    && component.split('.').all(|part| {
                        part.starts_with(|c: char| c.is_ascii_lowercase())
                            && part
                                .bytes()
                                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    })
            });
            if !fits {
                return Err(format!(
                    "`receivers`: expected an event's label, namespace.name.event as the \
                     publishing component declares it, got {label:?}"
                ));
            }
            let operation = receiver.operation();
            let Some(declared) = self.operations.get(operation) else {
                return Err(format!(
                    "`receivers.{label}`: the component declares no operation {operation:?} to \
                     run"
                ));
            };
            if let Some(kind @ (Kind::Observation | Kind::Computation)) = declared.kind {
                return Err(format!(
                    "`receivers.{label}`: {operation} is {} {}, which changes nothing; a \
                     receiver runs a transition, an assignment or an effect",
                    if kind == Kind::Observation { "an" } else { "a" },
                    kind.name()
                ));
            }
        }
        Ok(())
    }

    /// The labels of the events the component publishes: `namespace.name.event`.
    pub fn event_labels(&self) -> Vec<String> {
        self.events
            .keys()
            .map(|name| self.event_label(name))
            .collect()
    }

    /// The label of the component's event `name`: `namespace.name.event`.
    pub fn event_label(&self, name: &str) -> String {
        format!("{}.{name}", self.full_name())
    }

    /// The operations a component with an entity has without declaring them: `observe` (one
    /// object by its id) and `enumerate` (a page of objects, by id). A declaration of either
    /// name is taken as written.
    pub fn inherit(&mut self) {
        if self.entity.is_none() {
            return;
        }
        self.operations
            .entry(OBSERVE.to_owned())
            .or_insert_with(|| Operation {
                kind: Some(Kind::Observation),
                query: Some(true),
                ..Operation::default()
            });
        self.operations
            .entry(ENUMERATE.to_owned())
            .or_insert_with(|| Operation {
                kind: Some(Kind::Observation),
                query: Some(false),
                input: Some(enumerate_input()),
                ..Operation::default()
            });
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

    /// seed 003's `fulfilment.stock`, as the seed writes it.
    const STOCK: &str = "
namespace: fulfilment
name: stock
entity:
  associated: true
  properties:
    available: { type: integer, minimum: 0 }
  blank:
    available: 0
operations:
  reserve:
    concurrency: retry
    query: true
    input: { type: object, properties: { quantity: { type: integer, minimum: 1 } }, required: [quantity] }
    errors: [OUT_OF_STOCK]
  transit:
    concurrency: retry
    input: { type: object, properties: { available: { type: integer, minimum: 0 } }, additionalProperties: false }
";

    #[test]
    fn seed_003s_stock_is_read_as_declared_with_its_inherited_operations() {
        let mut manifest = Manifest::parse(STOCK, "stock.yaml").unwrap();
        let entity = manifest.entity.as_ref().unwrap();
        assert!(entity.associated);
        assert_eq!(entity.blank["available"], 0);
        let reserve = &manifest.operations["reserve"];
        assert_eq!(
            (reserve.concurrency, reserve.query),
            (Some(Concurrency::Retry), Some(true))
        );
        // `reserve` says it is a transition by its concurrency; `transit` by its name.
        assert_eq!(reserve.kind("reserve"), Kind::Transition);
        assert_eq!(
            manifest.operations["transit"].kind("transit"),
            Kind::Transition
        );
        manifest.inherit();
        let observe = &manifest.operations[OBSERVE];
        assert_eq!(
            (observe.kind(OBSERVE), observe.query),
            (Kind::Observation, Some(true))
        );
        assert_eq!(manifest.operations[ENUMERATE].query, Some(false));
        // Without an entity nothing is inherited, and a name means nothing.
        let mut plain = Manifest::parse("name: c\noperations: { assign: {} }\n", "m").unwrap();
        plain.inherit();
        assert_eq!(plain.operations.len(), 1);
        assert_eq!(Operation::default().kind("mail"), Kind::Effect);
    }

    #[test]
    fn what_an_operation_declares_must_fit_its_kind_and_the_entity() {
        let refused = |yaml: &str| Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        let with_entity = |operation: &str| {
            format!("name: c\nentity: {{ properties: {{ n: {{ type: integer, minimum: 0 }} }}, blank: {{ n: 0 }} }}\noperations: {{ op: {operation} }}\n")
        };
        assert_eq!(
            refused(&with_entity("{ type: effect, concurrency: none }")),
            "m.yaml: `operations.op.concurrency`: only a transition has concurrency; op is declared effect"
        );
        assert_eq!(
            refused(&with_entity("{ type: observation, once: true }")),
            "m.yaml: `operations.op.once`: only a transition or an assignment is applied once; op is declared observation"
        );
        assert!(refused(&with_entity("{ type: change }")).contains("unknown variant `change`"));
        assert!(refused(&with_entity("{ concurrency: sometimes }"))
            .contains("unknown variant `sometimes`"));
        // Without an entity: no transition, no assignment, nothing of an object.
        assert_eq!(
            refused("name: c\noperations: { op: { type: transition } }\n"),
            "m.yaml: `operations.op.type`: op is declared transition, which writes the component's entity, and the component declares none"
        );
        assert_eq!(
            refused("name: c\noperations: { op: { query: true } }\n"),
            "m.yaml: `operations.op.query`: the component declares no entity"
        );
        // An observation without an entity keeps its meaning.
        assert!(
            Manifest::parse("name: c\noperations: { op: { type: observation } }\n", "m").is_ok()
        );
    }

    #[test]
    fn an_entitys_properties_cannot_take_the_entrys_own_names() {
        let yaml = "name: c\nentity: { properties: { VERSION: { type: integer } } }\n";
        assert_eq!(
            Manifest::parse(yaml, "m.yaml").unwrap_err().to_string(),
            "m.yaml: `entity.properties.VERSION`: id, VERSION, DISCARD and DELETE are the entry's own fields, never stored: name the property otherwise"
        );
    }

    #[test]
    fn an_entitys_blank_must_fit_its_properties() {
        let yaml = "name: c\nentity: { properties: { n: { type: integer, minimum: 0 } }, blank: { n: -1 } }\n";
        let error = Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        assert!(
            error.starts_with("m.yaml: `entity.blank`: -1 is less than the minimum of 0"),
            "{error}"
        );
        let yaml = "name: c\nentity: { properties: { n: { type: integer } }, blank: { m: 1 } }\n";
        let error = Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        assert!(
            error.starts_with("m.yaml: `entity.blank`:") && error.contains('m'),
            "{error}"
        );
    }

    #[test]
    fn events_need_an_entity_and_names_that_make_a_label() {
        let yaml = "name: orders\nnamespace: store\nentity: { properties: { n: { type: integer } } }\nevents: { approved: {}, cancelled: {} }\n";
        let manifest = Manifest::parse(yaml, "m.yaml").unwrap();
        assert_eq!(
            manifest.event_labels(),
            ["store.orders.approved", "store.orders.cancelled"]
        );
        let refused = |yaml: &str| Manifest::parse(yaml, "m.yaml").unwrap_err().to_string();
        assert_eq!(
            refused("name: c\nevents: { approved: {} }\n"),
            "m.yaml: `events.approved`: the component declares no entity, whose stored changes an event publishes"
        );
        let named = |event: &str| {
            refused(&format!(
                "name: c\nentity: {{ properties: {{ n: {{ type: integer }} }} }}\nevents: {{ {event}: {{}} }}\n"
            ))
        };
        assert!(named("Approved").contains("got \"Approved\""));
        assert!(named("'a.b'").contains("got \"a.b\""));
        let unknown = "name: c\nentity: { properties: { n: { type: integer } } }\nevents: { approved: { when: x } }\n";
        assert!(
            refused(unknown).contains("unknown field `when`"),
            "{}",
            refused(unknown)
        );
    }

    #[test]
    fn receivers_name_a_label_and_an_operation_that_acts() {
        let head =
            "name: ledger\noperations: { record: { type: effect }, look: { type: observation } }\n";
        let manifest = Manifest::parse(
            &format!("{head}receivers: {{ store.orders.approved: record, orders.cancelled: {{ operation: record, latest: true }} }}\n"),
            "m.yaml",
        )
        .unwrap();
        let operations: Vec<&str> = manifest
            .receivers
            .values()
            .map(Receiver::operation)
            .collect();
        assert_eq!(operations, ["record", "record"]);
        let latest: Vec<bool> = manifest.receivers.values().map(Receiver::latest).collect();
        assert_eq!(
            latest,
            [true, false],
            "by label: orders.cancelled, store.orders.approved"
        );
        let refused = |receivers: &str| {
            Manifest::parse(&format!("{head}receivers: {receivers}\n"), "m.yaml")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused("{ store.orders.approved: send }"),
            "m.yaml: `receivers.store.orders.approved`: the component declares no operation \"send\" to run"
        );
        assert!(refused("{ store.orders.approved: look }").contains("look is an observation"));
        let computing = Manifest::parse(
            "name: c\noperations: { sum: { type: computation } }\nreceivers: { a.b: sum }\n",
            "m.yaml",
        );
        assert!(computing
            .unwrap_err()
            .to_string()
            .contains("sum is a computation"));
        for label in [
            "approved",
            "Store.orders.approved",
            "store.orders.",
            "store..x",
        ] {
            assert!(
                refused(&format!("{{ '{label}': record }}")).contains(&format!("got {label:?}")),
                "{label}"
            );
        }
        assert!(refused("{ a.b: { operation: record, when: x } }").contains("receivers"));
    }
}
