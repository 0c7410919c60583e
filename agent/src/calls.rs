//! Calls between components: the request contract checked before anything is sent, then the
//! route to the callee: over RabbitMQ when the context names a broker ([`crate::broker`]), else
//! in-process to the components of this process (a local run).
//!
//! Refused before anything is sent, with `RequestContract`:
//! - a call to an operation the component does not declare, or with an input its schema refuses;
//! - a call to a stateful operation that names no instance;
//! - a call to an ordinary operation that names one, or that states a timeout;
//! - a task that names an instance.

use crate::activity::Activity;
use crate::catalog::Catalog;
use crate::component::client::{CallMeta, Outcome, ProgramClient, ProgramError};
use crate::component::Component;
use crate::once::Once;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A call as a caller makes it.
#[derive(Debug, Clone, Deserialize)]
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
}

/// The longest `timeout` a call may state, in ms: RabbitMQ refuses a message expiration above
/// 2^32 − 1 ms, and closes the channel every call shares.
pub const MAX_TIMEOUT_MS: u64 = u32::MAX as u64;

/// Why a call failed, as the caller sees it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
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
        }
    }
}

/// A component this process runs, reachable for calls.
pub struct Callee {
    pub component: Arc<Component>,
    pub client: ProgramClient,
    /// The records of calls given a key.
    pub repeats: Arc<crate::atom::repeats::Repeats>,
}

/// The in-process router.
pub struct Calls {
    callees: HashMap<String, Callee>,
    /// Every component whose declarations this process knows (its own and the others').
    catalog: Arc<Catalog>,
    broker: Option<Arc<crate::broker::Broker>>,
    instance: String,
    default_timeout: Duration,
    /// How long the program may take to answer an ordinary call (`limits.operation`).
    operation_limit: Duration,
    /// How long a call's idempotency key is remembered (`limits.idempotency`).
    idempotency: Duration,
    /// Operations are served once preflight ran (and no longer once the drain began).
    serving: watch::Receiver<bool>,
    /// Calls made (and, in-process, received) count here; the broker's consumers count the
    /// calls received over it.
    activity: Arc<Activity>,
}

/// How long a call over the broker waits for the declarations of a component nobody declared yet.
pub const LOOKUP: Duration = Duration::from_secs(30);

impl Calls {
    pub fn new(
        callees: HashMap<String, Callee>,
        instance: String,
        context: &toa_context::Context,
        serving: watch::Receiver<bool>,
        activity: Arc<Activity>,
    ) -> Self {
        let own: Vec<Arc<Component>> = callees.values().map(|c| c.component.clone()).collect();
        let catalog = Catalog::new(&own, Vec::new());
        Self {
            callees,
            catalog,
            broker: None,
            instance,
            default_timeout: context.addressed.timeout,
            operation_limit: context.limits.operation,
            idempotency: context.limits.idempotency,
            serving,
            activity,
        }
    }

    /// Routes over `broker`; `catalog` knows the declarations of components other processes run.
    pub fn over_broker(
        mut self,
        broker: Arc<crate::broker::Broker>,
        catalog: Arc<Catalog>,
    ) -> Self {
        self.catalog = catalog;
        self.broker = Some(broker);
        self
    }

    /// Stops taking calls over the broker (see [`crate::broker::Broker::drain`]) and waits for
    /// the calls running here, up to `budget`: how many still run.
    pub async fn drain(&self, budget: Duration) -> u64 {
        match &self.broker {
            Some(broker) => broker.drain(&self.activity, budget).await,
            None => self.activity.settled(budget).await,
        }
    }

    /// Checks the contract, then calls; `task` calls do not wait for the reply.
    pub async fn call(
        &self,
        component: &str,
        operation: &str,
        request: Request,
        task: bool,
    ) -> Result<Outcome, CallError> {
        let in_flight = self.activity.begin();
        let declared = match self.catalog.get(component) {
            Some(declared) => declared,
            // Over a broker, a component may be deployed later: its declarations are looked up
            // for a while. A call closed meanwhile is made nowhere.
            None if self.broker.is_some() => self
                .catalog
                .find(component, LOOKUP)
                .await
                .ok_or_else(|| CallError::UnknownComponent(component.to_owned()))?,
            None => return Err(CallError::UnknownComponent(component.to_owned())),
        };
        let stateful = check_contract(&declared, operation, &request, task)?;
        if let Some(broker) = &self.broker {
            let timeout = stateful.then(|| {
                request
                    .timeout
                    .map_or(self.default_timeout, Duration::from_millis)
            });
            let call = crate::broker::Call {
                component,
                operation,
                input: &request.input,
                instance: request.instance.as_deref(),
                key: request.key.as_deref(),
                task,
            };
            return broker.call(call, timeout).await;
        }
        let callee = self
            .callees
            .get(component)
            .ok_or_else(|| CallError::UnknownComponent(component.to_owned()))?;
        let limit = if stateful {
            let instance = request.instance.as_deref().unwrap_or_default();
            if instance != self.instance {
                return Err(CallError::Addressee {
                    component: component.to_owned(),
                    instance: instance.to_owned(),
                });
            }
            request
                .timeout
                .map_or(self.default_timeout, Duration::from_millis)
        } else {
            self.operation_limit
        };
        let deadline = tokio::time::Instant::now() + limit;
        let abandoned = || CallError::Abandoned {
            component: component.to_owned(),
            timeout_ms: limit.as_millis() as u64,
        };
        // Wait until operations are served (preflight done).
        let mut serving = self.serving.clone();
        if tokio::time::timeout_at(deadline, serving.wait_for(|on| *on))
            .await
            .is_err()
        {
            return Err(abandoned());
        }
        let client = callee.client.clone();
        let repeats = callee.repeats.clone();
        let window = self.idempotency;
        let operation = operation.to_owned();
        let input = request.input;
        let key = request.key;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let meta =
            CallMeta::new(stateful.then(|| crate::broker::now_ms() + left.as_millis() as i64));
        let run = async move {
            let program = client.operate(&operation, &input, &meta, left);
            let once = crate::once::run_once(
                &repeats,
                &operation,
                key.as_deref(),
                &input,
                deadline,
                window,
                program,
            )
            .await;
            match once {
                Once::Ran(result) => result.map_err(|e| match e {
                    ProgramError::TimedOut { .. } if stateful => abandoned_error(&operation, left),
                    other => CallError::Failed(other.to_string()),
                }),
                Once::Repeated(outcome) => Ok(outcome),
                Once::Refused(message) => Err(CallError::RequestContract(message)),
                Once::StillRunning if stateful => Err(abandoned_error(&operation, left)),
                Once::StillRunning => Err(CallError::Failed(format!(
                    "{operation}: the first call with this key still runs"
                ))),
                Once::Unavailable(message) => Err(CallError::Unavailable(message)),
            }
        };
        if task {
            tokio::spawn(async move {
                let _in_flight = in_flight;
                if let Err(error) = run.await {
                    tracing::warn!(%error, "a task failed");
                }
            });
            return Ok(Outcome::Reply(Value::Null));
        }
        run.await.map_err(|error| match error {
            CallError::Abandoned { .. } => abandoned(),
            other => other,
        })
    }
}

/// An `Abandoned` for a call whose wait of `limit` ran out (the caller names the component).
fn abandoned_error(operation: &str, limit: Duration) -> CallError {
    CallError::Abandoned {
        component: operation.to_owned(),
        timeout_ms: limit.as_millis() as u64,
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
    if !declaration.stateful && request.timeout.is_some() {
        return refuse(format!(
            "{target} is not stateful: only a call to one process states a timeout"
        ));
    }
    if request.timeout == Some(0) {
        return refuse(format!(
            "{target}: expected a positive timeout in milliseconds"
        ));
    }
    if let Some(timeout) = request.timeout.filter(|t| *t > MAX_TIMEOUT_MS) {
        return refuse(format!(
            "{target}: expected a timeout of at most {MAX_TIMEOUT_MS} ms (the broker's limit on \
             a message's expiration), got {timeout}"
        ));
    }
    if let Some(key) = &request.key {
        crate::once::check_key(key)
            .map_err(|e| CallError::RequestContract(format!("{target}: {e}")))?;
    }
    if let Some(instance) = &request.instance {
        if let Err(error) = crate::instance::Instance::parse(instance) {
            let expected = error.to_string();
            let expected = expected.trim_start_matches("TOA_INSTANCE: ");
            return refuse(format!("{target}: `instance`: {expected}"));
        }
    }
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
            input,
            instance: instance.map(str::to_owned),
            timeout,
            key: None,
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
