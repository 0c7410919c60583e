//! Calls between components: the request contract ([`crate::calls::contract`]) checked before
//! anything is sent, then the route to the callee: over RabbitMQ when the context names a broker
//! ([`crate::calls::broker`]), else through the local group to a replica in any of its
//! processes ([`crate::coordination::group`]), else in-process to the components of this process
//! (a local run alone).

use crate::calls::activity::Activity;
use crate::calls::catalog::Catalog;
use crate::calls::contract::{check_contract, CallError, Request, START_MARGIN};
use crate::calls::inflight::Inflight;
use crate::calls::once::Once;
use crate::component::client::{self, Outcome, ProgramClient, ProgramError};
use crate::component::Component;
use crate::coordination::group::{CallAnswer, Group, GroupError};
use crate::entities::objects::{self, Objects, Run};
use crate::entities::retrying::Retrying;
use crate::entities::store::Receipt;
use crate::traces::{self, Kind, Span};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use toa_context::trace::TraceContext;
use tokio::sync::watch;

/// A component this process runs, reachable for calls.
pub struct Callee {
    pub component: Arc<Component>,
    /// Shared: every call takes its own handle, and a clone of the client would copy its names.
    pub client: Arc<ProgramClient>,
    /// The records of calls given a key.
    pub repeats: Arc<crate::coordination::atom::repeats::Repeats>,
    /// Its objects, when it declares an entity.
    pub objects: Option<Arc<Objects>>,
    /// Counts and times its operations' runs.
    pub operations: Arc<crate::metrics::Operations>,
}

/// The in-process router.
pub struct Calls {
    callees: HashMap<String, Callee>,
    /// Every component whose declarations this process knows (its own and the others').
    catalog: Arc<Catalog>,
    broker: Option<Arc<crate::calls::broker::Broker>>,
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
    /// The calls made through this process at once, per callee (`limits.inflight`).
    inflight: Inflight,
    /// The calls running here as transitions under `retry`: a call one makes to an operation
    /// declaring `once` is refused.
    retrying: Arc<Retrying>,
    /// A local run's group: calls go to a replica in any of its processes.
    group: Option<Arc<Group>>,
    /// The drain began: calls the group hands here are handed back.
    draining: std::sync::atomic::AtomicBool,
}

/// How much longer than the call's own limit a caller waits for another process of its group to
/// answer (the hops through the leader).
const RELAY_MARGIN: Duration = Duration::from_secs(2);

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
            inflight: Inflight::new(context.limits.inflight),
            retrying: Arc::default(),
            group: None,
            draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Calls go through the local `group`: to a replica of the callee in any of its processes.
    pub fn in_group(mut self, group: Option<Arc<Group>>) -> Self {
        self.group = group;
        self
    }

    /// Refuses the calls that the transitions `retrying` knows make to an operation declaring
    /// `once` (the process's components' objects tell it which run).
    pub fn refusing_once_from(mut self, retrying: Arc<Retrying>) -> Self {
        self.retrying = retrying;
        self
    }

    /// Routes over `broker`; `catalog` knows the declarations of components other processes run.
    pub fn over_broker(
        mut self,
        broker: Arc<crate::calls::broker::Broker>,
        catalog: Arc<Catalog>,
    ) -> Self {
        self.catalog = catalog;
        self.broker = Some(broker);
        self
    }

    /// Stops taking calls over the broker (see [`crate::calls::broker::Broker::drain`]) and waits
    /// for the calls running here, up to `budget`: how many still run.
    pub async fn drain(&self, budget: Duration) -> u64 {
        if let Some(group) = &self.group {
            self.draining
                .store(true, std::sync::atomic::Ordering::Relaxed);
            group.withdraw_offer();
        }
        match &self.broker {
            Some(broker) => broker.drain(&self.activity, budget).await,
            None => self.activity.settled(budget).await,
        }
    }

    /// Checks the contract, then calls; `task` calls do not wait for the reply. `made_in`: the
    /// id of the call the program serves while it makes this one (the `toa-call` header).
    pub async fn call(
        &self,
        component: &str,
        operation: &str,
        request: Request,
        task: bool,
        made_in: Option<&str>,
    ) -> Result<Outcome, CallError> {
        let in_flight = self.activity.begin();
        let declared = self.declared(component).await?;
        let stateful = check_contract(&declared, operation, &request, task)?;
        // A call with a key is the same call on every run: applied once by its key.
        if request.key.is_none() {
            self.repeatable(&declared, operation, made_in)?;
        }
        let timeout = stateful.then(|| {
            request
                .timeout
                .map_or(self.default_timeout, Duration::from_millis)
        });
        let waiting = tokio::time::Instant::now();
        let _slot = self
            .inflight
            .enter(component, timeout.unwrap_or(self.operation_limit))
            .await
            .map_err(|full| match timeout {
                Some(limit) => CallError::Abandoned {
                    component: component.to_owned(),
                    timeout_ms: limit.as_millis() as u64,
                },
                None => CallError::Unavailable(full.to_string()),
            })?;
        // The wait for a slot counts toward a deadline.
        let timeout = timeout.map(|limit| limit.saturating_sub(waiting.elapsed()));
        let Some(broker) = &self.broker else {
            let call = Local {
                component,
                operation,
                request,
                task,
                stateful,
            };
            if let Some(group) = &self.group {
                return self.through(group, call, in_flight, timeout).await;
            }
            return self.in_process(call, in_flight).await;
        };
        let call = crate::calls::broker::Call {
            component,
            operation,
            input: &request.input,
            instance: request.instance.as_deref(),
            key: request.key.as_deref(),
            query: request.query.as_ref(),
            task,
        };
        broker.call(call, timeout).await
    }

    /// Runs a received event's `request` on `operation` of `component`, a component of this
    /// process: here, or over the broker when it names another process (`instance`). An
    /// operation that writes to the store keeps the event's `inbox` record with the write, so a
    /// copy of the event runs nothing (over the broker, as the call's key); any other runs for
    /// every copy. A `latest` request keeps its watermark instead (its key names the object).
    pub async fn receive(
        &self,
        component: &str,
        operation: &str,
        mut request: Request,
        inbox: &str,
    ) -> Result<Outcome, CallError> {
        let callee = self
            .callees
            .get(component)
            .ok_or_else(|| CallError::UnknownComponent(component.to_owned()))?;
        let records = callee
            .objects
            .as_ref()
            .is_some_and(|objects| objects.records(operation));
        let latest = matches!(request.receipt, Some(Receipt::Latest(_)));
        if latest && !records {
            // Checked at start; a watermark is kept only with a write.
            return Err(CallError::RequestContract(format!(
                "{component}.{operation}: `latest` takes a transition or an assignment"
            )));
        }
        if !latest {
            request.key = records.then(|| inbox.to_owned());
            request.receipt = records.then_some(Receipt::Inbox);
        }
        let stateful = check_contract(&callee.component, operation, &request, false)?;
        let elsewhere = stateful && request.instance.as_deref() != Some(self.instance.as_str());
        if elsewhere && latest {
            // The watermark travels with the run, not in a call over the broker.
            return Err(CallError::RequestContract(format!(
                "{component}.{operation}: a `latest` receiver runs where the event is received; \
                 its request may not name another process"
            )));
        }
        if elsewhere && self.broker.is_some() {
            // Over the broker the inbox record is the call's key: a copy with another request
            // (an adaptation changed meanwhile) is refused, not run.
            request.key = records.then(|| format!("event:{inbox}"));
            request.receipt = None;
            return self.call(component, operation, request, false, None).await;
        }
        let in_flight = self.activity.begin();
        let call = Local {
            component,
            operation,
            request,
            task: false,
            stateful,
        };
        self.in_process(call, in_flight).await
    }

    /// A call `made_in` a transition running here under `retry` may not be to an operation
    /// declaring `once`: a run made again after a lost write would make it again.
    fn repeatable(
        &self,
        declared: &Component,
        operation: &str,
        made_in: Option<&str>,
    ) -> Result<(), CallError> {
        let once = declared
            .manifest
            .operations
            .get(operation)
            .is_some_and(|o| o.once);
        if once && made_in.is_some_and(|call| self.retrying.contains(call)) {
            return Err(CallError::Unrepeatable {
                target: format!("{}.{operation}", declared.name),
            });
        }
        Ok(())
    }

    /// The component's declarations. Over a broker, a component may be deployed later: its
    /// declarations are looked up for a while. A call closed meanwhile is made nowhere.
    async fn declared(&self, component: &str) -> Result<Arc<Component>, CallError> {
        let unknown = || CallError::UnknownComponent(component.to_owned());
        match self.catalog.get(component) {
            Some(declared) => Ok(declared),
            None if self.broker.is_some() => self
                .catalog
                .find(component, LOOKUP)
                .await
                .ok_or_else(unknown),
            None => Err(unknown()),
        }
    }

    /// A call through the local group: the leader picks the process (the one named, else the
    /// next in turn serving the component), this one included; run here without asking when
    /// this process leads and alone serves the component.
    async fn through(
        &self,
        group: &Group,
        call: Local<'_>,
        in_flight: crate::calls::activity::InFlight,
        timeout: Option<Duration>,
    ) -> Result<Outcome, CallError> {
        let named = call.request.instance.clone().filter(|_| call.stateful);
        if named.as_deref() == Some(self.instance.as_str()) {
            return self.in_process(call, in_flight).await;
        }
        let here = self.callees.contains_key(call.component);
        // The leader would answer `Here`: no other process serves the component.
        if here && named.is_none() && group.only_here(call.component) {
            return self.in_process(call, in_flight).await;
        }
        let wait = timeout.unwrap_or(self.operation_limit) + RELAY_MARGIN;
        let answer = match hand(group, &call, named.as_deref(), wait).await {
            Ok(answer) => answer,
            // No answer within the call's time: it may still run where it was handed, so it is
            // not run here as well.
            Err(GroupError::Unavailable) => {
                return Err(CallError::Abandoned {
                    component: call.component.to_owned(),
                    timeout_ms: wait.as_millis() as u64,
                })
            }
            Err(error) => return Err(CallError::Unavailable(error.to_string())),
        };
        match serde_json::from_value::<CallAnswer>(answer.clone()) {
            Ok(CallAnswer::Here) => self.in_process(call, in_flight).await,
            // This process's own offer may not have reached the leader yet.
            Ok(CallAnswer::Nobody) if named.is_none() && here => {
                self.in_process(call, in_flight).await
            }
            Ok(CallAnswer::Nobody) => Err(match named {
                Some(instance) => CallError::Addressee {
                    component: call.component.to_owned(),
                    instance,
                },
                None => CallError::UnknownComponent(call.component.to_owned()),
            }),
            Ok(CallAnswer::Gone) => Err(CallError::Failed(format!(
                "{}.{}: the process that took the call stopped before it answered",
                call.component, call.operation
            ))),
            Err(_) => relayed(&answer),
        }
    }

    /// Runs a call another process of the group handed here: its answer, to hand back. A
    /// process that began draining takes none: `Gone`, and the caller hands it to another.
    pub async fn run_handed(&self, component: String, call: Value) -> Value {
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            return json!(CallAnswer::Gone);
        }
        let outcome = async {
            let (operation, request, task, trace) = handed(call)?;
            // The caller's `hand` span's child; the program's run (`operate`) is this one's.
            let mut span = Span::start(
                || format!("run {component}.{operation}"),
                Kind::Server,
                trace,
            );
            let callee = self
                .callees
                .get(&component)
                .ok_or_else(|| CallError::UnknownComponent(component.clone()))?;
            let stateful = check_contract(&callee.component, &operation, &request, task)?;
            let in_flight = self.activity.begin();
            let call = Local {
                component: &component,
                operation: &operation,
                request,
                task,
                stateful,
            };
            let ran = traces::within(span.context(), self.in_process(call, in_flight)).await;
            if let Err(error) = &ran {
                span.fail(|| error.code().to_owned());
            }
            ran
        };
        match outcome.await {
            Ok(outcome) => json!({ "outcome": outcome.to_json() }),
            Err(error) => json!({ "error": error }),
        }
    }

    /// A call to a component of this process, without a broker.
    async fn in_process(
        &self,
        call: Local<'_>,
        in_flight: crate::calls::activity::InFlight,
    ) -> Result<Outcome, CallError> {
        let Local {
            component,
            operation,
            request,
            task,
            stateful,
        } = call;
        let callee = self
            .callees
            .get(component)
            .ok_or_else(|| CallError::UnknownComponent(component.to_owned()))?;
        let limit = self.limit(component, &request, stateful)?;
        let deadline = tokio::time::Instant::now() + limit;
        let abandoned = || CallError::Abandoned {
            component: component.to_owned(),
            timeout_ms: limit.as_millis() as u64,
        };
        // Wait until operations are served (preflight done).
        let mut serving = self.serving.clone();
        let served = serving.wait_for(|on| *on);
        if tokio::time::timeout_at(deadline, served).await.is_err() {
            return Err(abandoned());
        }
        let run = run_here(
            callee,
            operation.to_owned(),
            request,
            deadline,
            stateful,
            self.idempotency,
        );
        if task {
            // The task runs on after the answer, in the caller's trace (a task-local ends at a
            // spawn).
            let trace = crate::traces::current();
            tokio::spawn(crate::traces::within(trace, async move {
                let _in_flight = in_flight;
                if let Err(error) = run.await {
                    tracing::warn!(%error, "a task failed");
                }
            }));
            return Ok(Outcome::Reply(Value::Null));
        }
        run.await.map_err(|error| match error {
            CallError::Abandoned { .. } => abandoned(),
            other => other,
        })
    }

    /// How long an in-process call may take: a stateful call, named to this process, its own
    /// timeout (or the default); any other the operation limit.
    fn limit(
        &self,
        component: &str,
        request: &Request,
        stateful: bool,
    ) -> Result<Duration, CallError> {
        if !stateful {
            return Ok(self.operation_limit);
        }
        let instance = request.instance.as_deref().unwrap_or_default();
        if instance != self.instance {
            return Err(CallError::Addressee {
                component: component.to_owned(),
                instance: instance.to_owned(),
            });
        }
        Ok(request
            .timeout
            .map_or(self.default_timeout, Duration::from_millis))
    }
}

/// A call to run in this process.
struct Local<'a> {
    component: &'a str,
    operation: &'a str,
    request: Request,
    task: bool,
    /// Addressed to one process, with a deadline.
    stateful: bool,
}

/// The program's run of a call, once per key, until `deadline`.
fn run_here(
    callee: &Callee,
    operation: String,
    request: Request,
    deadline: tokio::time::Instant,
    stateful: bool,
    window: Duration,
) -> impl std::future::Future<Output = Result<Outcome, CallError>> + Send + 'static {
    let client = callee.client.clone();
    let repeats = callee.repeats.clone();
    let objects = callee.objects.clone();
    let operations = callee.operations.clone();
    let Request {
        input,
        key,
        query,
        receipt,
        ..
    } = request;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let meta = client::first_call(
        stateful.then(|| crate::calls::broker::now_ms() + left.as_millis() as i64),
    );
    async move {
        // As over the broker: a call that could not start before its caller stops waiting does
        // not start at all.
        if stateful && left <= START_MARGIN {
            return Err(abandoned_error(&operation, left));
        }
        let (stored_key, key) =
            crate::calls::once::keys(objects.as_deref(), &operation, key.as_deref());
        // The program's time counts from when it runs, after any wait for the key's claim.
        // Pinned here: `run_once` holds a pointer to it, not a copy of the program's call path.
        let program = std::pin::pin!(async {
            let run = Run {
                client: &client,
                operation: &operation,
                input: &input,
                query: query.as_ref(),
                meta: &meta,
                deadline: tokio::time::Instant::now() + left,
                key: stored_key,
                receipt,
            };
            objects::operate(objects.as_deref(), run, &operations).await
        });
        let once = crate::calls::once::run_once(
            &repeats, &operation, key, &input, deadline, window, program,
        )
        .await;
        answer_of(once, &operation, stateful, left)
    }
}

/// How many times an ordinary call is handed out again when the process that took it stopped
/// (or was draining) before it answered: at least once, as over a broker.
const HAND_OUTS: usize = 3;

/// Hands a call to the group's leader; again, to another process, when the one that took an
/// ordinary call stopped before it answered. In a `hand` span, to the leader's answer (a run
/// `Here` is outside it, as the caller's own), whose context goes with the call.
async fn hand(
    group: &Group,
    call: &Local<'_>,
    named: Option<&str>,
    wait: Duration,
) -> Result<Value, GroupError> {
    let mut span = Span::start(
        || format!("hand {}.{}", call.component, call.operation),
        Kind::Client,
        traces::current(),
    );
    let mut wire =
        json!({"operation": call.operation, "request": &call.request, "task": call.task});
    for (header, value) in span.context().iter().flat_map(|trace| trace.write()) {
        wire[header] = Value::String(value);
    }
    let mut handed = 1;
    loop {
        let answer = group.call(call.component, named, wire.clone(), wait).await;
        // The kind of failure only: the spans go to a collector, and the leader's refusal
        // may quote the request.
        let answer = answer.inspect_err(|_| span.fail(|| "unanswered".to_owned()))?;
        let gone = answer == json!(CallAnswer::Gone);
        if !gone || named.is_some() || handed == HAND_OUTS {
            return Ok(answer);
        }
        handed += 1;
    }
}

/// A handed call's parts: the operation, the request, whether it is a task, and the trace it is
/// in (read as strictly as from a program: a malformed one is ignored).
fn handed(call: Value) -> Result<(String, Request, bool, Option<TraceContext>), CallError> {
    #[derive(serde::Deserialize)]
    struct Handed {
        operation: String,
        request: Request,
        task: bool,
        #[serde(default)]
        traceparent: Option<String>,
        #[serde(default)]
        tracestate: Option<String>,
    }
    let handed: Handed = serde_json::from_value(call).map_err(|e| {
        CallError::Failed(format!(
            "a call handed by the group that this process cannot read: {e}"
        ))
    })?;
    let trace = TraceContext::read(
        handed.traceparent.as_deref().map(str::as_bytes),
        handed.tracestate.as_deref().map(str::as_bytes),
    );
    Ok((handed.operation, handed.request, handed.task, trace))
}

/// The answer another process of the group gave.
fn relayed(answer: &Value) -> Result<Outcome, CallError> {
    if let Some(error) = answer.get("error") {
        return Err(serde_json::from_value(error.clone()).unwrap_or_else(|_| {
            CallError::Failed(format!(
                "another process of the group failed the call: {error}"
            ))
        }));
    }
    let outcome = answer.get("outcome").unwrap_or(&Value::Null);
    Outcome::from_json(outcome).map_err(|e| {
        CallError::Failed(format!(
            "another process of the group answered what is not an outcome ({e})"
        ))
    })
}

/// What the caller of an in-process run gets (`left`: the time it had).
fn answer_of(
    once: Once,
    operation: &str,
    stateful: bool,
    left: Duration,
) -> Result<Outcome, CallError> {
    match once {
        Once::Ran(result) => result.map_err(|e| match e {
            ProgramError::Contract(message) => CallError::RequestContract(message),
            error if stateful && error.past_deadline() => abandoned_error(operation, left),
            other => CallError::Failed(other.to_string()),
        }),
        Once::Repeated(outcome) => Ok(outcome),
        Once::Refused(message) => Err(CallError::RequestContract(message)),
        Once::StillRunning if stateful => Err(abandoned_error(operation, left)),
        Once::StillRunning => Err(CallError::Failed(format!(
            "{operation}: the first call with this key still runs"
        ))),
        Once::Unavailable(message) => Err(CallError::Unavailable(message)),
    }
}

/// An `Abandoned` for a call whose wait of `limit` ran out (the caller names the component).
fn abandoned_error(operation: &str, limit: Duration) -> CallError {
    CallError::Abandoned {
        component: operation.to_owned(),
        timeout_ms: limit.as_millis() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most this many bytes in a call's future, in a debug build (whose futures are larger
    /// than a release's). The future lives for the whole call, one per call in flight, and is
    /// copied as it moves (issue 24, docs/benchmarks.md "Where a call's cost goes"): 6.7 KB on
    /// 2026-12-03, 10.2 KB with the store's path not boxed (`objects::operate`).
    const MOST: usize = 8 * 1024;

    #[test]
    fn a_calls_future_stays_small() {
        let local = toa_context::Environment::local();
        let context = toa_context::Context::parse("name: sizes\n", &local).expect("a context");
        let (_serve, serving) = watch::channel(true);
        let calls = Calls::new(
            HashMap::new(),
            "i".into(),
            &context,
            serving,
            Activity::new(),
        );
        let request: Request = serde_json::from_value(json!({})).expect("a request");
        let call = calls.call("c", "o", request, false, None);
        let size = std::mem::size_of_val(&call);
        println!("a call's future: {size} bytes");
        assert!(
            size <= MOST,
            "a call's future is {size} bytes, over {MOST}: box what made it grow, or raise the \
             bound knowing what each call in flight now holds"
        );
    }
}
