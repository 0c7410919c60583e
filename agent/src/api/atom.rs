//! `lock`, `slots`, `onassigned` and `meter` over HTTP (see the table in [`super`]).

use super::body::{Object, Path};
use super::{ApiError, Host};
use crate::coordination::atom::{keys, stash, Atom, Held};
use crate::traces::{Kind, Span};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use toa_context::program::{CallHeaders, DEADLINE};
use tokio::sync::mpsc;

/// How often a stream writes a blank line, so that a component that went away is noticed.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

/// The most slots `GET /v1/{component}/slots?total=` splits (the answer lists them).
pub const MAX_TOTAL: u32 = 65_536;

/// The largest body the coordination routes take: 64 keys of 512 bytes even when every byte is
/// JSON-escaped (`\u00e9`: 6 bytes each, as Python's `json.dumps` writes non-ASCII), and room to
/// spare.
pub const MAX_BODY: usize = 256 * 1024;

pub fn routes() -> Router<Arc<Host>> {
    Router::new()
        .route("/v1/{component}/lock", post(lock))
        .route("/v1/{component}/slots", get(slots))
        .route("/v1/{component}/onassigned", get(onassigned))
        .route(
            "/v1/{component}/onassigned/{listener}/failed",
            post(listener_failed),
        )
        .route("/v1/{component}/meter", post(meter))
        .layer(super::body::limited(MAX_BODY))
        // After the layer above: a stashed value may be larger than a coordination body.
        .route(
            "/v1/{component}/stash/{key}",
            get(stash_get)
                .put(stash_set)
                .delete(stash_delete)
                .layer(super::body::limited(STASH_BODY)),
        )
}

/// The largest body `PUT /v1/{component}/stash/{key}` takes: the largest value even when a
/// client escapes every character of it (Python's `json.dumps` writes `é` as 6 bytes where the
/// value holds 2), and its wrapper.
pub const STASH_BODY: usize = 3 * stash::MAX_VALUE + 64 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StashRequest {
    value: Value,
    /// ms; required: a stash is not a store.
    ttl: u64,
}

async fn stash_get(
    State(host): State<Arc<Host>>,
    Path((component, key)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let value = host.atom(&component)?.stash_get(key).await?;
    Ok(Json(json!({ "value": value })))
}

async fn stash_set(
    State(host): State<Arc<Host>>,
    Path((component, key)): Path<(String, String)>,
    Object(request): Object<StashRequest>,
) -> Result<Json<Value>, ApiError> {
    let atom = host.atom(&component)?;
    atom.stash_set(key, &request.value, request.ttl).await?;
    Ok(Json(json!({})))
}

async fn stash_delete(
    State(host): State<Arc<Host>>,
    Path((component, key)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let deleted = host.atom(&component)?.stash_delete(key).await?;
    Ok(Json(json!({ "deleted": deleted })))
}

/// The coordination routes of `/v1/{component}/...` go on only with that component's token (in a
/// pod; see [`crate::control::component_tokens`]). The component is read with the extractor the
/// handlers use, so the name checked is the name acted on (`store%2Ecatalog` is `store.catalog` to
/// both).
pub async fn authorize(
    State(host): State<Arc<Host>>,
    params: Result<
        axum::extract::Path<HashMap<String, String>>,
        axum::extract::rejection::PathRejection,
    >,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let component = match &params {
        Ok(axum::extract::Path(params)) => params.get("component").cloned().unwrap_or_default(),
        Err(rejection) => {
            return axum::response::IntoResponse::into_response(ApiError::bad_request(
                rejection.body_text(),
            ))
        }
    };
    match host.tokens.check(&component, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => axum::response::IntoResponse::into_response(ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            refused.to_string(),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LockRequest {
    keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotsQuery {
    total: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeterRequest {
    keys: Vec<String>,
    deltas: Vec<u64>,
}

/// A stream of JSON lines fed by a task; the task sees `closed()` when the client goes away.
fn ndjson(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .expect("a valid response")
}

fn line(value: Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

async fn lock(
    State(host): State<Arc<Host>>,
    Path(component): Path<String>,
    headers: HeaderMap,
    Object(request): Object<LockRequest>,
) -> Result<Response, ApiError> {
    let atom: Arc<Atom> = host.atom(&component)?.clone();
    // Refuse what can be refused before the stream starts, so it gets a status code.
    let keys = keys::validate(request.keys)?;
    atom.available("lock")?;
    // Asked for while the program answers a call: waited for only until the agent stops
    // waiting for that call (seed 000: the wait counts toward the operation's duration). A call
    // the program no longer answers (the agent gave up on it: the caller was told it failed)
    // gets no lock at all.
    let made_in = CallHeaders::read(|name| headers.get(name).map(|v| v.as_bytes()))
        .map_err(|bad| ApiError::bad_request(bad.to_string()))?;
    let (made_in, trace) = (made_in.call, made_in.trace);
    let answering = host.answering.get(&component);
    let until = made_in.map(|id| {
        let until = answering.and_then(|answering| answering.until(&id));
        until.unwrap_or_else(tokio::time::Instant::now)
    });
    let stream = host.streams.open(&component)?;
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _stream = stream;
        // The wait for the lock, in the trace of the operation that asked for it (no keys in
        // it: they may name a customer).
        let mut span = Span::start(|| format!("lock {component}"), Kind::Server, trace);
        let held = acquired(&atom, keys, until, &tx).await;
        if held.is_none() {
            span.fail(|| "not taken".to_owned());
        }
        drop(span);
        if let Some(held) = held {
            hold(held, &tx).await;
        }
    });
    Ok(ndjson(rx))
}

/// What a lock's stream says when its call's deadline passed before the lock was taken.
pub const PAST_DEADLINE: &str = "the call's deadline passed while waiting for the lock: its \
    caller is told the call failed, so what the lock guards must not run";

/// Waits for the lock, at most `until`, keeping the stream alive; `None` when the stream says
/// why there is none (an error, the deadline) or its reader gave up waiting.
async fn acquired(
    atom: &Atom,
    keys: Vec<String>,
    until: Option<tokio::time::Instant>,
    tx: &mpsc::Sender<Bytes>,
) -> Option<Held> {
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    let acquire = atom.acquire(keys);
    tokio::pin!(acquire);
    let deadline = async {
        match until {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let past = json!({"event": "error", "code": DEADLINE, "message": PAST_DEADLINE});
    let refusal = loop {
        tokio::select! {
            // The lock first: one the backend granted as the deadline came is released here,
            // not dropped mid-acquisition and left in Redis until its TTL.
            biased;
            held = &mut acquire => match held {
                Ok(held) if until.is_some_and(|at| tokio::time::Instant::now() >= at) => {
                    held.release().await;
                    break past;
                }
                Ok(held) => return Some(held),
                Err(error) => break json!({"event": "error", "message": error.to_string()}),
            },
            () = &mut deadline => break past,
            _ = tx.closed() => return None, // gave up waiting
            _ = keepalive.tick() => { let _ = tx.send(Bytes::from_static(b"\n")).await; }
        }
    };
    let _ = tx.send(line(refusal)).await;
    None
}

/// Holds the lock while the stream is open, telling its reader if it is lost.
async fn hold(held: Held, tx: &mpsc::Sender<Bytes>) {
    let signal = held.signal();
    let acquired = json!({"event": "acquired", "token": held.token()});
    if tx.send(line(acquired)).await.is_err() {
        held.release().await;
        return;
    }
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    let mut told = false;
    loop {
        tokio::select! {
            _ = signal.lost(), if !told => {
                told = true;
                let _ = tx.send(line(json!({"event": "lost"}))).await;
            }
            _ = tx.closed() => break,
            _ = keepalive.tick() => { let _ = tx.send(Bytes::from_static(b"\n")).await; }
        }
    }
    held.release().await;
}

async fn slots(
    State(host): State<Arc<Host>>,
    Path(component): Path<String>,
    query: Result<Query<SlotsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query?;
    let atom = host.atom(&component)?;
    if query.total > MAX_TOTAL {
        return Err(ApiError::bad_request(format!(
            "total: expected at most {MAX_TOTAL} slots, got {}",
            query.total
        )));
    }
    Ok(Json(json!({"slots": atom.slots(query.total)})))
}

async fn onassigned(
    State(host): State<Arc<Host>>,
    Path(component): Path<String>,
) -> Result<Response, ApiError> {
    let atom = host.atom(&component)?.clone();
    let stream = host.streams.open(&component)?;
    let id = host.listeners.open(&component);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    // Only the latest assignment matters: a slow reader gets that, never a growing backlog.
    let (changes, mut changed) = tokio::sync::watch::channel(None);
    let listening = atom.onassigned(move |assignment| {
        changes.send_replace(Some(line(
            json!({"listener": id, "assignment": assignment}),
        )));
    });
    tokio::spawn(async move {
        let _stream = stream;
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        loop {
            tokio::select! {
                Ok(()) = changed.changed() => {
                    let change = changed.borrow_and_update().clone();
                    if let Some(change) = change {
                        if tx.send(change).await.is_err() { break }
                    }
                }
                _ = tx.closed() => break,
                _ = keepalive.tick() => { let _ = tx.send(Bytes::from_static(b"\n")).await; }
            }
        }
        drop(listening);
        host.listeners.close(&component, id);
    });
    Ok(ndjson(rx))
}

async fn listener_failed(
    State(host): State<Arc<Host>>,
    Path((component, listener)): Path<(String, u64)>,
) -> Result<Json<Value>, ApiError> {
    let atom = host.atom(&component)?;
    if !host.listeners.is_open(&component, listener) {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "UNKNOWN_LISTENER",
            format!("no open onassigned stream {listener} for {component:?}"),
        ));
    }
    tracing::error!(
        component,
        listener,
        "an onassigned listener failed: this replica owns nothing from now on"
    );
    atom.listener_failed();
    Ok(Json(json!({"slots": null})))
}

async fn meter(
    State(host): State<Arc<Host>>,
    Path(component): Path<String>,
    Object(request): Object<MeterRequest>,
) -> Result<Json<Value>, ApiError> {
    let atom = host.atom(&component)?;
    let debts = atom.meter(request.keys, &request.deltas).await?;
    Ok(Json(json!({"debts": debts})))
}
