//! The typed context: `name`, `atomicity`, `addressed`, `amqp`, `storage` and `limits`, read from
//! `context.toa.yaml` for one environment, from `TOA_*` environment variables (how a pod receives
//! them), or from a Composition's `spec.context` ([`crate::spec`]). Every setting is one row of
//! [`SETTINGS`], which drives all three readings and [`Context::to_vars`]; this table shows the
//! rows (a test keeps the two alike).
//!
//! | annotation             | environment variable     | default        |
//! |------------------------|--------------------------|----------------|
//! | `name`                 | `TOA_APPLICATION`        | required       |
//! | `atomicity.redis`      | `TOA_ATOMICITY_REDIS` (addresses separated by `,`) | none: no atomicity |
//! | `atomicity.interval`   | `TOA_ATOMICITY_INTERVAL` | 5000 ms        |
//! | `atomicity.ttl`        | `TOA_ATOMICITY_TTL`      | 10000 ms       |
//! | `addressed.timeout`    | `TOA_ADDRESSED_TIMEOUT`  | 5000 ms        |
//! | `amqp`                 | `TOA_AMQP`               | none: in-process calls (local runs) |
//! | `storage`              | `TOA_STORAGE`            | none: entities kept in the agent's process (local runs) |
//! | `limits.operation`     | `TOA_LIMIT_OPERATION`    | 60000 ms: a program's answer to an ordinary call |
//! | `limits.runCommand`    | `TOA_LIMIT_RUN_COMMAND`  | 60000 ms: one run command |
//! | `limits.drain`         | `TOA_LIMIT_DRAIN`        | 25000 ms: the drain's wait for calls in flight |
//! | `limits.queue`         | `TOA_LIMIT_QUEUE`        | 100000 calls in a shared queue |
//! | `limits.deliveries`    | `TOA_LIMIT_DELIVERIES`   | 5 deliveries of one call, then dead-lettered |
//! | `limits.idempotency`   | `TOA_LIMIT_IDEMPOTENCY`  | 600000 ms: how long a call's idempotency key is remembered |
//! | `limits.once`          | `TOA_LIMIT_ONCE`         | 604800000 ms (7 days): how long the record of a write applied once (`once`, or a key) is kept |
//! | `limits.events`        | `TOA_LIMIT_EVENTS`       | 86400000 ms (1 day): how long a published event's outbox row is kept |
//! | `limits.inflight`      | `TOA_LIMIT_INFLIGHT`     | 256 calls a component's program has in flight at once |
//! | `limits.message`       | `TOA_LIMIT_MESSAGE`      | 16777216 bytes (16 MiB) of a program's answer or a broker message |
//!
//! Adding a setting is one field in its typed section here (with its serde name), one field in
//! its wire form ([`crate::spec`]) and one row of [`SETTINGS`] (and its line above).

mod settings;

pub use settings::{IfAbsent, Kind, Setting, SETTINGS};

use crate::address::{AmqpAddress, RedisAddress, StorageAddress};
use crate::environment::Environment;
use crate::ContextError;
use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Where environment variables come from: the process, or a map in tests.
pub trait Vars {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessVars;

impl Vars for ProcessVars {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Vars for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// The application context for one environment, validated. Its serde form is the settings' wire
/// form (durations in milliseconds, addresses as text); it is read only from checked settings:
/// read a context with [`Context::parse`], [`Context::from_vars`] or
/// [`crate::spec::ContextSpec::validate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The application's name; keys in Redis and queues in the broker are namespaced by it.
    pub name: String,
    /// Coordination across replicas; `None` when the annotation is absent.
    pub atomicity: Option<Atomicity>,
    pub addressed: Addressed,
    /// The broker; `None` when the annotation is absent.
    pub amqp: Option<AmqpAddress>,
    /// The store of entities (PostgreSQL); `None`: kept in the agent's process.
    pub storage: Option<StorageAddress>,
    pub limits: Limits,
}

/// The limits every process of the application keeps (docs/calls.md, "Limits").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// How long a program may take to answer an ordinary call or a task.
    #[serde(with = "millis")]
    pub operation: Duration,
    /// How long one run command may take.
    #[serde(with = "millis")]
    pub run_command: Duration,
    /// How long the drain waits for the calls in flight before `dispose`.
    #[serde(with = "millis")]
    pub drain: Duration,
    /// The most calls a component's shared queue holds; a call beyond is refused `UNAVAILABLE`.
    pub queue: u32,
    /// How many times one call is delivered before it is dead-lettered.
    pub deliveries: u32,
    /// How long the outcome of a call given an idempotency key answers its repeats.
    #[serde(with = "millis")]
    pub idempotency: Duration,
    /// How long the store keeps the record of a write applied once (an operation declaring
    /// `once`, or a caller's key on an operation that writes): a repeat within it answers the
    /// first outcome.
    #[serde(with = "millis")]
    pub once: Duration,
    /// How long the outbox keeps an event once it was published (DESIGN 18).
    #[serde(with = "millis")]
    pub events: Duration,
    /// How many calls a component's program may have in flight through its agent at once; one
    /// more waits for a slot, within its deadline.
    pub inflight: u32,
    /// The largest program answer or broker message, in bytes.
    pub message: u32,
}

/// Each limit's default, from [`SETTINGS`].
impl Default for Limits {
    fn default() -> Self {
        settings::defaults("limits")
    }
}

impl Limits {
    /// The longest a process takes to stop: the drain's wait, `dispose`, and 5 s to stop the
    /// programs. A pod's `terminationGracePeriodSeconds` is this, in whole seconds.
    pub fn stop(&self) -> Duration {
        self.drain + self.run_command + Duration::from_secs(5)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Atomicity {
    /// One or an odd number of independent servers. Slots and meter use the first.
    pub redis: Vec<RedisAddress>,
    /// The heartbeat interval of slots.
    #[serde(with = "millis")]
    pub interval: Duration,
    /// How long a lock outlives a holder that stopped extending it.
    #[serde(with = "millis")]
    pub ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addressed {
    /// How long a call to one named process waits for its reply by default.
    #[serde(with = "millis")]
    pub timeout: Duration,
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5000);
pub const DEFAULT_TTL: Duration = Duration::from_millis(10_000);
pub const DEFAULT_ADDRESSED_TIMEOUT: Duration = Duration::from_millis(5000);

/// The default from [`SETTINGS`].
impl Default for Addressed {
    fn default() -> Self {
        settings::defaults("addressed")
    }
}

impl Context {
    /// Reads a `context.toa.yaml` document for the environment chain `env`; an unknown key is
    /// refused.
    pub fn parse(yaml: &str, env: &Environment) -> Result<Self, ContextError> {
        let raw: Value =
            serde_yaml::from_str(yaml).map_err(|error| ContextError::Yaml(error.to_string()))?;
        let resolved = env.resolve(&raw, "")?;
        let root = settings::mapping(&resolved, "(root)")?;
        settings::only_known_keys(root)?;
        Self::from_tree(root)
    }

    /// Reads a tree of annotations (a document, or a spec's `context` with its `name`), unknown
    /// keys ignored; keys in messages are the annotations' (`limits.drain`).
    pub(crate) fn from_tree(root: &Mapping) -> Result<Self, ContextError> {
        settings::read(&settings::Tree(root))
    }

    /// Reads the `TOA_*` variables listed in the module documentation.
    pub fn from_vars(vars: &dyn Vars) -> Result<Self, ContextError> {
        settings::read(&settings::Variables(vars))
    }

    /// The `TOA_*` variables that [`Context::from_vars`] reads back into this context.
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        settings::to_vars(self)
    }

    /// Refuses a name that is not a DNS label.
    fn with_valid_name(self) -> Result<Self, ContextError> {
        check_name(&self.name).map_err(|message| ContextError::invalid("name", message))?;
        Ok(self)
    }
}

/// The variable the operator sets in a pod to the pod's Kubernetes namespace (the downward API).
pub const KUBERNETES_NAMESPACE: &str = "TOA_KUBERNETES_NAMESPACE";

/// How the application `name` is named on the servers it may share with others (its queues on
/// the broker, its keys and channels in Redis): in a pod `<kubernetes namespace>/<name>`, so two
/// namespaces running one application name on one broker or Redis never meet; in a local run
/// (no namespace) the name alone. A `/` is in neither a DNS label nor a component's name, so no
/// two of these names are alike.
pub fn shared_name(name: &str, kubernetes_namespace: Option<&str>) -> String {
    match kubernetes_namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// The application's name is a DNS label (1 to 63 lowercase letters, digits or `-`): it names
/// the Deployments, Redis keys and queues. The error says what was expected and what came.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "expected 1 to 63 lowercase letters, digits or '-', got {name:?}"
        ))
    }
}

impl Atomicity {
    /// Validates a list of address texts and the optional timings.
    pub fn new(
        redis: &[String],
        interval: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<Self, ContextError> {
        Ok(Self {
            redis: settings::redis_addresses(redis, "atomicity.redis")?,
            interval: interval.unwrap_or(DEFAULT_INTERVAL),
            ttl: ttl.unwrap_or(DEFAULT_TTL),
        })
    }
}

/// A duration as the settings' wire form writes it: whole milliseconds, at most `i64::MAX` (what
/// a Composition's integer fields hold; longer is forever all the same).
pub(crate) fn wire_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A duration as a whole number of milliseconds, the settings' wire form ([`wire_millis`]).
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(super::wire_millis(*duration))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests;
