//! The local API: what a component in any language calls, over HTTP on loopback.
//!
//! Every response that is not a stream is JSON; every error is
//! `{"error": {"code": "...", "message": "..."}}` with a 4xx or 5xx status, and the agent keeps
//! serving. Streams are newline-delimited JSON (`application/x-ndjson`); a blank line is a
//! keep-alive, written every second so that a component that went away is noticed.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /v1/{component}/lock` `{"keys": [...]}` | stream: `{"event":"acquired","token":N}`, later maybe `{"event":"lost"}` (or `{"event":"error","code":"DEADLINE"}` when its call ran out first); closing the request releases |
//! | `GET /v1/{component}/slots?total=N` | `{"slots": [..] \| null}` |
//! | `GET /v1/{component}/onassigned` | stream: `{"listener":ID,"assignment":{i,n,epoch} \| null}` at once and on every change |
//! | `POST /v1/{component}/onassigned/{listener}/failed` | the component's listener failed: this replica owns nothing from now on |
//! | `POST /v1/{component}/meter` `{"keys": [...], "deltas": [...]}` | `{"debts": [...]}` |
//! | `GET`, `PUT {"value", "ttl"}`, `DELETE` `/v1/{component}/stash/{key}` | `{"value"}`, `{}`, `{"deleted"}` |
//! | `GET /metrics` | the agent's metrics, OpenMetrics text ([`crate::metrics`]) |
//!
//! Calls, the process's name and the probes are in [`calls`].

mod atom;
mod body;
pub(crate) mod calls;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

use crate::calls::router::Calls;
use crate::coordination::atom::{Atom, AtomError};
use crate::metrics::Metrics;

/// What the API serves: the components of this process.
pub struct Host {
    pub atoms: HashMap<String, Arc<Atom>>,
    /// The calls each component's program answers now, for its lock requests' deadlines.
    pub answering: HashMap<String, Arc<crate::Answering>>,
    /// The call router; `None` where this process routes no calls.
    pub calls: Option<Arc<Calls>>,
    /// This process's name.
    pub instance: String,
    /// True once every component ran `ready`.
    pub ready: tokio::sync::watch::Receiver<bool>,
    /// Open `onassigned` streams, for their failure reports.
    pub listeners: Listeners,
    /// Open lock and `onassigned` streams, per component, bounded.
    pub streams: Streams,
    /// What `GET /metrics` answers.
    pub metrics: Arc<Metrics>,
    /// Each component's token for its routes.
    pub tokens: Arc<crate::control::component_tokens::ComponentTokens>,
}

/// The `onassigned` streams open now, by component and id.
#[derive(Default)]
pub struct Listeners {
    open: std::sync::Mutex<std::collections::HashSet<(String, u64)>>,
}

impl Listeners {
    /// A new stream's id: random (another component cannot guess it to fail the stream), below
    /// 2^53 (a JSON number every client reads exactly).
    fn open(&self, component: &str) -> u64 {
        let id = rand::random_range(1..1u64 << 53);
        self.open
            .lock()
            .expect("listeners")
            .insert((component.to_owned(), id));
        id
    }

    fn close(&self, component: &str, id: u64) {
        self.open
            .lock()
            .expect("listeners")
            .remove(&(component.to_owned(), id));
    }

    fn is_open(&self, component: &str, id: u64) -> bool {
        self.open
            .lock()
            .expect("listeners")
            .contains(&(component.to_owned(), id))
    }
}

/// The most lock and `onassigned` streams one component may hold open at once: each holds a
/// task (and a lock waiter), and a component's code is not trusted to close them.
pub const MAX_STREAMS: usize = 256;

/// The lock and `onassigned` streams open now, counted per component.
#[derive(Default, Clone)]
pub struct Streams(Arc<std::sync::Mutex<HashMap<String, usize>>>);

/// One open stream; dropping it closes it.
pub struct Stream {
    streams: Streams,
    component: String,
}

impl Streams {
    fn open(&self, component: &str) -> Result<Stream, ApiError> {
        let mut open = self.0.lock().expect("streams");
        let count = open.entry(component.to_owned()).or_default();
        if *count >= MAX_STREAMS {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TOO_MANY_STREAMS",
                format!(
                    "{component}: expected at most {MAX_STREAMS} lock and onassigned streams open \
                     at once; close one first"
                ),
            ));
        }
        *count += 1;
        Ok(Stream {
            streams: self.clone(),
            component: component.to_owned(),
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(count) = self
            .streams
            .0
            .lock()
            .expect("streams")
            .get_mut(&self.component)
        {
            *count = count.saturating_sub(1);
        }
    }
}

impl Host {
    fn atom(&self, component: &str) -> Result<&Arc<Atom>, ApiError> {
        self.atoms.get(component).ok_or_else(|| {
            let mut known: Vec<&str> = self.atoms.keys().map(String::as_str).collect();
            known.sort_unstable();
            ApiError::new(
                StatusCode::NOT_FOUND,
                "UNKNOWN_COMPONENT",
                format!(
                    "no component {component:?} in this process; expected one of: {}",
                    known.join(", ")
                ),
            )
        })
    }
}

/// The router of the local API.
pub fn router(host: Arc<Host>) -> axum::Router {
    let metrics = host.metrics.clone();
    let authorize = axum::middleware::from_fn_with_state(host.clone(), atom::authorize);
    atom::routes()
        .route_layer(authorize)
        .merge(calls::routes())
        .with_state(host)
        .merge(metrics_route(metrics))
        .fallback(body::unknown_route)
        .method_not_allowed_fallback(body::method_not_allowed)
}

/// `GET /metrics` (OpenMetrics text, which Prometheus reads): on the local API and on the probe
/// listener.
pub fn metrics_route(metrics: Arc<Metrics>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = metrics.encode();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    )
}

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<AtomError> for ApiError {
    fn from(error: AtomError) -> Self {
        let (status, code) = match &error {
            AtomError::RequiresAtomicity(_) => (StatusCode::NOT_IMPLEMENTED, "REQUIRES_ATOMICITY"),
            AtomError::InvalidKey { .. }
            | AtomError::TooManyKeys(_)
            | AtomError::InvalidMeter(_)
            | AtomError::InvalidStash(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            AtomError::Unavailable(_) | AtomError::Protocol(_) | AtomError::Group(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
            }
        };
        Self::new(status, code, error.to_string())
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::JsonRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!(
                    "the body is larger than this route takes: {}",
                    rejection.body_text()
                ),
            );
        }
        Self::bad_request(rejection.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}
