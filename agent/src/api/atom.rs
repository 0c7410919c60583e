//! `lock`, `slots`, `onassigned` and `meter` over HTTP (see the table in [`super`]).

use super::body::{Object, Path};
use super::{ApiError, Host};
use crate::coordination::atom::{keys, Atom};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
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
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
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
    Object(request): Object<LockRequest>,
) -> Result<Response, ApiError> {
    let atom: Arc<Atom> = host.atom(&component)?.clone();
    // Refuse what can be refused before the stream starts, so it gets a status code.
    let keys = keys::validate(request.keys)?;
    atom.available("lock")?;
    let stream = host.streams.open(&component)?;
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _stream = stream;
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        let acquire = atom.acquire(keys);
        tokio::pin!(acquire);
        let held = loop {
            tokio::select! {
                held = &mut acquire => break held,
                _ = tx.closed() => return, // gave up waiting
                _ = keepalive.tick() => { let _ = tx.send(Bytes::from_static(b"\n")).await; }
            }
        };
        let held = match held {
            Ok(held) => held,
            Err(error) => {
                let _ = tx
                    .send(line(
                        json!({"event": "error", "message": error.to_string()}),
                    ))
                    .await;
                return;
            }
        };
        let signal = held.signal();
        if tx
            .send(line(json!({"event": "acquired", "token": held.token()})))
            .await
            .is_err()
        {
            held.release().await;
            return;
        }
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
    });
    Ok(ndjson(rx))
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
