//! The request contract, shared by the caller's agent (checked before anything is sent) and the
//! receiving one (checked before the program sees a call), and how a call fails. A leaf: the call
//! router and the broker both use it, and it uses neither.
//!
//! Refused with `RequestContract`:
//! - a call to an operation the component does not declare, or with an input its schema refuses;
//! - a call to a stateful operation that names no instance;
//! - a call to an ordinary operation that names one, or that states a timeout;
//! - a task that names an instance;
//! - a timeout of 0 or past the broker's limit, an instance that is not a process name, a key
//!   that is empty, too long or holds control characters.

use crate::component::Component;
use serde::{Deserialize, Serialize};
use serde_json::Value;
pub use toa_context::query::{check_id, Query};

pub use toa_context::program::START_MARGIN;

/// A call as a caller makes it (and as a local group hands it to another process).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    #[serde(default)]
    pub input: Value,
    /// The process a stateful operation is called on.
    #[serde(default)]
    pub instance: Option<String>,
    /// How long a stateful call waits for its reply, in ms.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// An idempotency key: a repeat of the call with this key (same operation, same input,
    /// within `limits.idempotency`) gets the first call's outcome instead of running again.
    #[serde(default)]
    pub key: Option<String>,
    /// The object a call works on, in a component with an entity.
    #[serde(default)]
    pub query: Option<Query>,
    /// A received event's run: how it is recorded, its `key` naming the event (or, `latest`, its
    /// object). Never a caller's (not read from a request).
    #[serde(skip)]
    pub receipt: Option<crate::entities::store::Receipt>,
}

/// A call's query against what the operation declares: refused by a component without an entity
/// and by `query: false`, required by `query: true`; its id of the alphabet.
fn check_query(
    component: &Component,
    operation: &str,
    query: Option<&Query>,
) -> Result<(), String> {
    let declared = component.manifest.operations[operation].query;
    let entity = component.manifest.entity.is_some();
    match (query, declared) {
        (Some(_), _) if !entity => Err(format!(
            "`query`: {} declares no entity: a call names no object",
            component.name
        )),
        (Some(_), Some(false)) => Err(format!("`query`: {operation} takes no query")),
        (None | Some(Query { id: None, .. }), Some(true)) => Err(format!(
            "`query`: {operation} works on one object: the call names it (`query: {{id}}`)"
        )),
        (Some(Query { id: Some(id), .. }), _) => check_id(id),
        _ => Ok(()),
    }
}

/// The longest `timeout` a call may state, in ms: RabbitMQ refuses a message expiration above
/// 2^32 − 1 ms, and closes the channel every call shares.
pub const MAX_TIMEOUT_MS: u64 = u32::MAX as u64;

/// Why a call failed, as the caller sees it.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum CallError {
    /// The request breaks the callee's declarations; nothing was sent.
    #[error("RequestContract: {0}")]
    RequestContract(String),
    /// No process holds the instance name.
    #[error("Addressee: no process {instance:?} serves {component}")]
    Addressee { component: String, instance: String },
    /// The wait for a named process's reply ended.
    #[error("Abandoned: {component} did not reply within {timeout_ms} ms")]
    Abandoned { component: String, timeout_ms: u64 },
    /// The component is not part of this composition.
    #[error("no component {0:?} is running here")]
    UnknownComponent(String),
    /// The callee failed without an answer.
    #[error("{0}")]
    Failed(String),
    /// The broker cannot take the call now (it did not confirm it in time, or the queue is full).
    #[error("{0}")]
    Unavailable(String),
    /// Made from a transition under `concurrency: retry` to an operation declaring `once`: a
    /// run made again after a lost write would make it again, as a new call (seed 003); refused
    /// before it is sent, every time.
    #[error(
        "'{target}' is made once, and a transition retried on a lost write would make it again"
    )]
    Unrepeatable { target: String },
}

impl CallError {
    /// The seeds' numeric codes (`exception.code`).
    pub fn number(&self) -> Option<u16> {
        match self {
            Self::RequestContract(_) => Some(202),
            Self::Addressee { .. } => Some(403),
            Self::Abandoned { .. } => Some(404),
            _ => None,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::RequestContract(_) => "RequestContract",
            Self::Addressee { .. } => "Addressee",
            Self::Abandoned { .. } => "Abandoned",
            Self::UnknownComponent(_) => "UNKNOWN_COMPONENT",
            Self::Failed(_) => "FAILED",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::Unrepeatable { .. } => "UnrepeatableException",
        }
    }
}

/// Only a call to one process states a timeout: a positive one, within the broker's limit.
fn check_timeout(target: &str, stateful: bool, timeout: Option<u64>) -> Result<(), CallError> {
    let refuse = |message: String| Err(CallError::RequestContract(message));
    match timeout {
        None => Ok(()),
        Some(_) if !stateful => refuse(format!(
            "{target} is not stateful: only a call to one process states a timeout"
        )),
        Some(0) => refuse(format!(
            "{target}: expected a positive timeout in milliseconds"
        )),
        Some(timeout) if timeout > MAX_TIMEOUT_MS => refuse(format!(
            "{target}: expected a timeout of at most {MAX_TIMEOUT_MS} ms (the broker's limit on \
             a message's expiration), got {timeout}"
        )),
        Some(_) => Ok(()),
    }
}

/// The request contract; returns whether the operation is stateful.
pub fn check_contract(
    component: &Component,
    operation: &str,
    request: &Request,
    task: bool,
) -> Result<bool, CallError> {
    let refuse = |message: String| Err(CallError::RequestContract(message));
    let Some(declaration) = component.manifest.operations.get(operation) else {
        let known: Vec<&str> = component
            .manifest
            .operations
            .keys()
            .map(String::as_str)
            .collect();
        return refuse(format!(
            "{} has no operation {operation:?}; it declares: {}",
            component.name,
            known.join(", ")
        ));
    };
    let target = format!("{}.{operation}", component.name);
    match (declaration.stateful, request.instance.is_some(), task) {
        (_, true, true) => return refuse(format!("a task cannot name an instance ({target})")),
        (true, false, _) => {
            return refuse(format!(
                "{target} is stateful: the call must name an instance"
            ))
        }
        (false, true, _) => {
            return refuse(format!(
                "{target} is not stateful: the call must not name an instance"
            ))
        }
        _ => {}
    }
    check_timeout(&target, declaration.stateful, request.timeout)?;
    if let Some(key) = &request.key {
        crate::calls::once::check_key(key)
            .map_err(|e| CallError::RequestContract(format!("{target}: {e}")))?;
    }
    if let Some(instance) = &request.instance {
        if let Err(error) = crate::instance::Instance::parse(instance) {
            let expected = error.to_string();
            let expected = expected.trim_start_matches("TOA_INSTANCE: ");
            return refuse(format!("{target}: `instance`: {expected}"));
        }
    }
    check_query(component, operation, request.query.as_ref())
        .map_err(|message| CallError::RequestContract(format!("{target}: {message}")))?;
    if let Some(schema) = component.schemas.get(operation) {
        schema
            .check(&request.input)
            .map_err(|problems| CallError::RequestContract(format!("{target}: {problems}")))?;
    }
    Ok(declaration.stateful)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toa_context::Manifest;

    fn terminals() -> Component {
        let manifest = Manifest::parse(
            "name: terminals\noperations:\n  charge:\n    stateful: true\n    input: {type: object, properties: {amount: {type: integer}}, required: [amount]}\n  connect: {}\n",
            "m",
        )
        .unwrap();
        Component::new(manifest, ".".into()).unwrap()
    }

    fn request(input: Value, instance: Option<&str>, timeout: Option<u64>) -> Request {
        Request {
            receipt: None,
            input,
            instance: instance.map(str::to_owned),
            timeout,
            key: None,
            query: None,
        }
    }

    #[test]
    fn timeouts_past_the_brokers_limit_and_bad_instance_names_are_refused() {
        let c = terminals();
        let refused = |r: Request| match check_contract(&c, "charge", &r, false) {
            Err(CallError::RequestContract(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let charge = || json!({"amount": 1});
        for timeout in [MAX_TIMEOUT_MS + 1, i64::MAX as u64, u64::MAX] {
            assert_eq!(
                refused(request(charge(), Some("till-7"), Some(timeout))),
                format!(
                    "terminals.charge: expected a timeout of at most 4294967295 ms (the broker's \
                     limit on a message's expiration), got {timeout}"
                )
            );
        }
        assert!(check_contract(
            &c,
            "charge",
            &request(charge(), Some("till-7"), Some(MAX_TIMEOUT_MS)),
            false
        )
        .is_ok());
        for bad in ["x".repeat(300), "../till".to_owned(), String::new()] {
            let message = refused(request(charge(), Some(&bad), None));
            assert!(
                message.starts_with(
                    "terminals.charge: `instance`: expected 1 to 64 ASCII letters, digits"
                ),
                "{message}"
            );
        }
    }

    #[test]
    fn each_contract_refusal() {
        let c = terminals();
        let refused =
            |operation: &str, r: Request, task: bool| match check_contract(&c, operation, &r, task)
            {
                Err(CallError::RequestContract(message)) => message,
                other => panic!("expected a refusal, got {other:?}"),
            };
        assert_eq!(
            refused("charge", request(json!({"amount": 1}), None, None), false),
            "terminals.charge is stateful: the call must name an instance"
        );
        assert_eq!(
            refused("connect", request(json!({}), Some("till-7"), None), false),
            "terminals.connect is not stateful: the call must not name an instance"
        );
        assert_eq!(
            refused(
                "charge",
                request(json!({"amount": 1}), Some("till-7"), None),
                true
            ),
            "a task cannot name an instance (terminals.charge)"
        );
        assert_eq!(
            refused("connect", request(json!({}), None, Some(1000)), false),
            "terminals.connect is not stateful: only a call to one process states a timeout"
        );
        assert_eq!(
            refused("refund", request(json!({}), None, None), false),
            "terminals has no operation \"refund\"; it declares: charge, connect"
        );
        assert!(refused(
            "charge",
            request(json!({"amount": "x"}), Some("t"), None),
            false
        )
        .contains("input/amount"));
        assert_eq!(
            check_contract(
                &c,
                "charge",
                &request(json!({"amount": 1}), Some("t"), Some(50)),
                false
            ),
            Ok(true)
        );
        assert_eq!(
            check_contract(&c, "connect", &request(json!({}), None, None), true),
            Ok(false)
        );
        assert_eq!(
            CallError::RequestContract(String::new()).number(),
            Some(202)
        );
    }
}
