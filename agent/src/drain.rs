//! Who may start the drain, and how they wait for it: `POST /v1/drain` on the local API (local
//! runs, `toa-agent drain`) and, in a pod, `GET /drain/<key>` on the probe port (the component
//! containers' `preStop` hook). Either starts the drain and answers once `dispose` ran. Beside
//! it on the probe port, the other kubelet hook: `GET /started/<index>/<key>`, each component
//! container's `postStart`, which tells the agent a container (re)started.
//!
//! In a pod every program can reach both ports, so a drain there must carry the drain key
//! ([`toa_context::control::drain_key`] of the control token): in the
//! [`toa_context::control::DRAIN_HEADER`] header on the local API, in the path on the probe port
//! (kubelets before 1.23 send hooks without headers, and with a doubled leading slash, which is
//! taken too). The agent and the pod spec's hook have the key, the program does not. A local run
//! (no control token) drains on any local API request, as before.

use crate::tokens::Tokens;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use toa_context::control::{drain_key, same_key, DRAIN_HEADER, DRAIN_PATH, STARTED_PATH};
use tokio::sync::{mpsc, watch};

/// The drain's trigger, shared by the routes that may pull it.
#[derive(Clone)]
pub struct Trigger {
    asked: mpsc::Sender<()>,
    done: watch::Receiver<bool>,
    started: mpsc::UnboundedSender<usize>,
    /// The control tokens the drain keys derive from; `None`: no key needed (a local run).
    tokens: Option<Tokens>,
}

/// The composition's side: the drain was asked for; mark it done; which component container
/// started.
pub struct Asked {
    pub asked: mpsc::Receiver<()>,
    pub done: watch::Sender<bool>,
    pub started: mpsc::UnboundedReceiver<usize>,
}

/// A trigger and its other end; with control tokens, requests must carry a drain key of one.
pub fn channel(tokens: Option<Tokens>) -> (Trigger, Asked) {
    let (asked_tx, asked) = mpsc::channel(1);
    let (done_tx, done) = watch::channel(false);
    let (started_tx, started) = mpsc::unbounded_channel();
    let trigger = Trigger {
        asked: asked_tx,
        done,
        started: started_tx,
        tokens,
    };
    (
        trigger,
        Asked {
            asked,
            done: done_tx,
            started,
        },
    )
}

/// The local API's route: `POST /v1/drain`.
pub fn local_route(trigger: Trigger) -> Router {
    Router::new()
        .route("/v1/drain", post(by_header))
        .with_state(trigger)
}

/// The probe port's kubelet hooks: whatever the probes themselves do not serve.
pub fn hook_routes(trigger: Trigger) -> Router {
    Router::new().fallback(by_path).with_state(trigger)
}

/// `POST /v1/drain`: 401 without the right key in the header (in a pod); otherwise starts the
/// drain and answers once it is done.
async fn by_header(State(trigger): State<Trigger>, headers: HeaderMap) -> Response {
    if trigger.tokens.is_some() {
        let presented = headers
            .get(DRAIN_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if !trigger.keyed(presented) {
            return (
                StatusCode::UNAUTHORIZED,
                format!("a drain needs the pod's drain key in the {DRAIN_HEADER} header"),
            )
                .into_response();
        }
    }
    trigger.pull().await
}

/// The probe port's fallback, the kubelet's hooks (with a doubled leading slash too): `GET
/// /drain/<key>` drains; `GET /started/<index>/<key>` tells that component container `index`
/// started. 401 with another key; any other path is 404.
async fn by_path(State(trigger): State<Trigger>, uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    let hook = |prefix: &str| match path.strip_prefix(prefix.trim_start_matches('/')) {
        Some("") => Some(""),
        Some(rest) => rest.strip_prefix('/'),
        None => None,
    };
    let keyed = |presented: &str| trigger.keyed(presented);
    let refused = || {
        (
            StatusCode::UNAUTHORIZED,
            "a kubelet hook needs the pod's drain key",
        )
            .into_response()
    };
    if let Some(presented) = hook(DRAIN_PATH) {
        return if keyed(presented) {
            trigger.pull().await
        } else {
            refused()
        };
    }
    if let Some(rest) = hook(STARTED_PATH) {
        let (index, presented) = rest.split_once('/').unwrap_or((rest, ""));
        if !keyed(presented) {
            return refused();
        }
        return match index.parse::<usize>() {
            Ok(index) => {
                let _ = trigger.started.send(index);
                "noted".into_response()
            }
            Err(_) => (
                StatusCode::BAD_REQUEST,
                format!("{STARTED_PATH}/<index>/<key>: expected a container index, got {index:?}"),
            )
                .into_response(),
        };
    }
    (StatusCode::NOT_FOUND, "not found").into_response()
}

impl Trigger {
    /// Whether `presented` is the drain key of a token this agent accepts (during a rotation, a
    /// pod spec written before it still carries the previous token's key).
    fn keyed(&self, presented: &str) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|tokens| tokens.any(|token| same_key(presented, &drain_key(token))))
    }

    async fn pull(&self) -> Response {
        let _ = self.asked.try_send(());
        let mut done = self.done.clone();
        let _ = done.wait_for(|done| *done).await;
        "drained".into_response()
    }
}
