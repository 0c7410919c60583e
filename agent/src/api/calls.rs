//! Calls over HTTP, plus the process's name and its probes.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /v1/call/{component}/{operation}` `{"input", "instance"?, "timeout"?}` | `{"reply": ...}` or the operation's own `{"error": {"code"}}`; failures of the call itself with 4xx/5xx and `code` `RequestContract` (202), `Addressee` (403), `Abandoned` (404) |
//! | `POST /v1/task/{component}/{operation}` `{"input"}` | `{"reply": null}` at once; the operation runs without a caller waiting |
//!
//! Both take the header `toa-call`, the id of the call the program is serving
//! ([`toa_context::program::CallHeaders`]); a malformed one is refused, naming it. A call to a
//! component with an entity may name its object, `{"query": {"id", "version"?}, "input"}`; the
//! version may come as `If-Match` instead. The runtime's codes of a call on an object answer
//! with their status: `NOT_FOUND` 404, `PRECONDITION_FAILED` 412, `CONFLICT` and `CONTENDED`
//! 409, `UNAVAILABLE` 503, `RequestContract` 400, `INVALID_ENTRY` 422 (DESIGN 17).
//! | `GET /v1/instance` | `{"instance": "..."}`, this process's name |
//! | `GET /healthz`, `GET /readyz` | 200 when alive; 200 once every component ran `ready`, else 503 |

use super::body::{Object, Path};
use super::{ApiError, Host};
use crate::calls::contract::{CallError, Request};
use crate::traces::{self, Span};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use toa_context::answer::Outcome;
use toa_context::program::CallHeaders;

pub fn routes() -> Router<Arc<Host>> {
    Router::new()
        .route("/v1/call/{component}/{operation}", post(call))
        .route("/v1/task/{component}/{operation}", post(task))
        .route("/v1/instance", get(instance))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .layer(super::body::limited(MAX_CALL_BODY))
}

/// The largest call or task body taken (its input travels in one broker message).
pub const MAX_CALL_BODY: usize = 1024 * 1024;

async fn call(
    state: State<Arc<Host>>,
    path: Path<(String, String)>,
    headers: HeaderMap,
    body: Object<Request>,
) -> Response {
    forward(state, path, &headers, body, false).await
}

async fn task(
    state: State<Arc<Host>>,
    path: Path<(String, String)>,
    headers: HeaderMap,
    body: Object<Request>,
) -> Response {
    forward(state, path, &headers, body, true).await
}

async fn forward(
    State(host): State<Arc<Host>>,
    Path((component, operation)): Path<(String, String)>,
    headers: &HeaderMap,
    Object(mut request): Object<Request>,
    task: bool,
) -> Response {
    if let Err(refused) = if_match(headers, &mut request) {
        return refused.into_response();
    }
    let (made_in, trace) = match CallHeaders::read(|name| headers.get(name).map(|v| v.as_bytes())) {
        Ok(read) => (read.call, read.trace),
        Err(bad) => return ApiError::bad_request(bad.to_string()).into_response(),
    };
    tracing::debug!(%component, %operation, made_in = made_in.as_deref(), "a call from the program");
    let Some(calls) = &host.calls else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "NO_CALLS",
            "this process routes no calls",
        )
        .into_response();
    };
    let kind = if task { "task" } else { "call" };
    let mut span = Span::start(
        || format!("{kind} {component}.{operation}"),
        traces::Kind::Server,
        trace,
    );
    // Boxed: the call's future is deep, and the trace's scope around it went past the compiler's
    // limit for computing its layout.
    let called = Box::pin(calls.call(&component, &operation, request, task, made_in.as_deref()));
    match traces::within(span.context(), called).await {
        Ok(outcome) => {
            if let Outcome::Error { code, .. } = &outcome {
                span.attribute("toa.error", || code.clone());
            }
            (status_of(&outcome), Json(outcome)).into_response()
        }
        Err(error) => {
            span.fail(|| error.code().to_owned());
            let status = match &error {
                CallError::RequestContract(_) | CallError::Unrepeatable { .. } => {
                    StatusCode::BAD_REQUEST
                }
                CallError::Addressee { .. } | CallError::UnknownComponent(_) => {
                    StatusCode::NOT_FOUND
                }
                CallError::Abandoned { .. } => StatusCode::GATEWAY_TIMEOUT,
                CallError::Failed(_) => StatusCode::BAD_GATEWAY,
                CallError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = json!({"error": {"code": error.code(), "number": error.number(), "message": error.to_string()}});
            (status, Json(body)).into_response()
        }
    }
}

/// `If-Match: "3"` (or `3`): the caller saw version 3; the same as `query.version`, which, when
/// also given, must say the same.
fn if_match(headers: &HeaderMap, request: &mut Request) -> Result<(), ApiError> {
    let Some(value) = headers.get("if-match") else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or_default().trim();
    let version = text.trim_matches('"').parse::<u64>().map_err(|_| {
        let given: String = text.chars().take(40).collect();
        ApiError::bad_request(format!(
            "header `if-match`: expected the version the caller saw (\"3\"), got {given:?}"
        ))
    })?;
    let query = request.query.get_or_insert_with(Default::default);
    match query.version {
        Some(stated) if stated != version => Err(ApiError::bad_request(format!(
            "header `if-match` says version {version} and `query.version` {stated}"
        ))),
        _ => {
            query.version = Some(version);
            Ok(())
        }
    }
}

/// The status of an outcome: 200, or the runtime's code on an object's.
fn status_of(outcome: &Outcome) -> StatusCode {
    let Outcome::Error { code, .. } = outcome else {
        return StatusCode::OK;
    };
    match code.as_str() {
        "NOT_FOUND" => StatusCode::NOT_FOUND,
        "PRECONDITION_FAILED" => StatusCode::PRECONDITION_FAILED,
        "CONFLICT" | "CONTENDED" => StatusCode::CONFLICT,
        "UNAVAILABLE" => StatusCode::SERVICE_UNAVAILABLE,
        "RequestContract" => StatusCode::BAD_REQUEST,
        "INVALID_ENTRY" => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::OK,
    }
}

async fn instance(State(host): State<Arc<Host>>) -> Json<serde_json::Value> {
    Json(json!({"instance": host.instance}))
}

/// The probes and the metrics, for a listener on the pod network: no token, nothing but alive,
/// ready and the numbers Prometheus scrapes (no keys' values, no addresses, no credentials).
pub fn probes(
    ready: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<crate::metrics::Metrics>,
) -> axum::Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move { readiness(*ready.borrow()) }
            }),
        )
        .merge(super::metrics_route(metrics))
}

fn readiness(ready: bool) -> Response {
    if ready {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn ready(State(host): State<Arc<Host>>) -> Response {
    if *host.ready.borrow() {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}
