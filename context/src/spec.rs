//! The context's annotations in their wire form: a Composition's `spec.context` (the operator's
//! CRD embeds these types, and their JSON Schema), which `toa-operator render` writes from a
//! [`Context`] and the operator reads back into one with [`ContextSpec::validate`]. Durations are
//! whole numbers of milliseconds, addresses their text.
//!
//! Decoding takes unknown fields without a word: an object read back from the API server may
//! carry fields of a newer CRD. User input is refused unknown keys where it is read
//! ([`Context::parse`]); the API server prunes them from objects it stores.

use crate::annotations::Context;
use crate::ContextError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_yaml::Value;

/// The context annotations of context.toa.yaml, with values for one environment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextSpec {
    /// Coordination across replicas (locks, slots, meter); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atomicity: Option<AtomicitySpec>,
    /// Calls to one named process.
    #[serde(default)]
    pub addressed: AddressedSpec,
    /// The broker, `amqp://host[:port][/vhost]` (`amqps://` for TLS); absent: no broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<String>,
    /// The store of entities, `postgres://host[:port]/database` (credentials from the
    /// environment); absent: entities are kept in the agent's process (a local run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// Limits every process keeps (docs/calls.md, "Limits"); each absent one has its default.
    #[serde(default)]
    pub limits: LimitsSpec,
}

/// `limits` of the context; durations in milliseconds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsSpec {
    /// How long a program may take to answer an ordinary call or a task (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub operation: Option<i64>,
    /// How long one run command may take (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_command: Option<i64>,
    /// How long the drain waits for calls in flight (default 25000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub drain: Option<i64>,
    /// The most calls a shared queue holds (default 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub queue: Option<i64>,
    /// Deliveries of one call before it is dead-lettered (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub deliveries: Option<i64>,
    /// How long a call's idempotency key is remembered (default 600000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub idempotency: Option<i64>,
    /// How long the record of a write applied once is kept, in ms: 7 days (default 604800000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub once: Option<i64>,
    /// How long a published event's outbox row is kept, in ms: 1 day (default 86400000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub events: Option<i64>,
    /// Calls a component's program may have in flight at once; one more waits (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub inflight: Option<i64>,
    /// The largest program answer or broker message, in bytes (default 16777216).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub message: Option<i64>,
}

/// The odd-address rule as the API server checks it at admission. Its message matches the
/// reconcile-time and agent refusals. The message is built with `format` (new CRDs may use it from
/// Kubernetes 1.30): the cost estimator prices `string(size(self))` as unbounded, which made every
/// server from 1.27 refuse the whole CRD, while `format` over an integer is priced as small.
pub const ODD_ADDRESSES_RULE: &str = "size(self) % 2 == 1";
pub const ODD_ADDRESSES_MESSAGE_EXPRESSION: &str =
    "'Atomicity takes an odd number of addresses, %d given.'.format([size(self)])";
/// What the API server says should the message expression fail to evaluate.
pub const ODD_ADDRESSES_MESSAGE: &str = "Atomicity takes an odd number of addresses.";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AtomicitySpec {
    /// One or an odd number of independent Redis servers, `redis[s]://host[:port][/db]`, without
    /// credentials. Slots and meter use the first.
    #[schemars(
        length(min = 1),
        extend("x-kubernetes-validations" = [{
            "rule": ODD_ADDRESSES_RULE,
            "messageExpression": ODD_ADDRESSES_MESSAGE_EXPRESSION,
            "message": ODD_ADDRESSES_MESSAGE,
        }])
    )]
    pub redis: Vec<String>,
    /// The heartbeat interval of slots, in milliseconds.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1))]
    pub interval: i64,
    /// How long a lock outlives a holder that stopped extending it, in milliseconds.
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 1))]
    pub ttl: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressedSpec {
    /// How long a call to one named process waits for its reply by default, in milliseconds.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1))]
    pub timeout: i64,
}

impl Default for AddressedSpec {
    fn default() -> Self {
        Self {
            timeout: default_timeout(),
        }
    }
}

impl ContextSpec {
    /// The validated context of the application `name`, checked setting by setting as
    /// `context.toa.yaml` is; keys in messages are the annotations' (`limits.drain`).
    pub fn validate(&self, name: &str) -> Result<Context, ContextError> {
        let mut tree = match serde_yaml::to_value(self) {
            Ok(Value::Mapping(tree)) => tree,
            _ => unreachable!("a ContextSpec serializes to a mapping"),
        };
        tree.insert("name".into(), name.into());
        Context::from_tree(&tree)
    }
}

/// The wire form of a validated context: addresses as toa-context prints them (with their ports,
/// never with credentials), every setting given.
impl From<&Context> for ContextSpec {
    fn from(context: &Context) -> Self {
        let tree = serde_json::to_value(context).expect("a context serializes");
        serde_json::from_value(tree).expect("a context's wire form is a ContextSpec")
    }
}

fn default_interval() -> i64 {
    crate::annotations::wire_millis(crate::annotations::DEFAULT_INTERVAL)
}

fn default_ttl() -> i64 {
    crate::annotations::wire_millis(crate::annotations::DEFAULT_TTL)
}

fn default_timeout() -> i64 {
    crate::annotations::wire_millis(crate::annotations::DEFAULT_ADDRESSED_TIMEOUT)
}

#[cfg(test)]
mod tests;
