//! Who may start the drain, and how they wait for it. In a pod, the kubelet's hooks on the probe
//! port: `GET /drain/<key>` (the component containers' `preStop`, and `toa-agent drain --probe`
//! in the agent's own) starts the drain and answers once `dispose` ran; beside it,
//! `GET /started/<index>/<key>`, each component container's `postStart`, tells the agent a
//! container (re)started. In a local run, `POST /v1/drain` on the local API (`toa-agent drain`).
//!
//! A hook is taken only from the node ([`crate::process::node`]: the kubelet connects from one of
//! the node's addresses, which no other pod and no program in this one has) and only with the
//! pod's drain key (random per Composition, made by the operator, in the pod spec's hooks: a
//! program does not have it) in the path (kubelets before 1.23 send hooks without headers, and
//! with a doubled leading slash, which is taken too); the agent is given its digest
//! ([`drain_digest`]) and compares digests. The key alone is no longer enough: anyone who may
//! read the pod spec (`view`) has it, but not the node's address. The local API does not drain a
//! pod at all: a program cannot stop the pod it runs in.

use crate::process::node::Node;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use toa_context::control::{drain_digest, same_key, DRAIN_PATH, STARTED_PATH};
use tokio::sync::{mpsc, watch};

/// The drain's trigger, shared by the routes that may pull it.
#[derive(Clone)]
pub struct Trigger {
    asked: mpsc::Sender<()>,
    done: watch::Receiver<bool>,
    started: mpsc::UnboundedSender<usize>,
    /// The digest of the pod's drain key (`None`: no hook drains).
    digest: Option<String>,
    /// Where the node connects from, the only place hooks are taken from.
    node: Arc<Node>,
    /// A pod: the local API does not drain it.
    in_pod: bool,
}

/// The composition's side: the drain was asked for; mark it done; which component container
/// started.
pub struct Asked {
    pub asked: mpsc::Receiver<()>,
    pub done: watch::Sender<bool>,
    pub started: mpsc::UnboundedReceiver<usize>,
}

/// A trigger and its other end. In a pod only the hooks from `node` carrying the key of `digest`
/// drain; in a local run, the local API.
pub fn channel(digest: Option<String>, in_pod: bool, node: Node) -> (Trigger, Asked) {
    let (asked_tx, asked) = mpsc::channel(1);
    let (done_tx, done) = watch::channel(false);
    let (started_tx, started) = mpsc::unbounded_channel();
    let trigger = Trigger {
        asked: asked_tx,
        done,
        started: started_tx,
        digest,
        node: Arc::new(node),
        in_pod,
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

/// `POST /v1/drain`: in a local run, starts the drain and answers once it is done; in a pod, 403.
async fn by_header(State(trigger): State<Trigger>) -> Response {
    if trigger.in_pod {
        return crate::api::ApiError::new(
            StatusCode::FORBIDDEN,
            "DRAIN_IN_POD",
            "in a pod the drain is started by the kubelet's preStop hook, not the local API",
        )
        .into_response();
    }
    trigger.pull().await
}

/// The probe port's fallback, the kubelet's hooks (with a doubled leading slash too): `GET
/// /drain/<key>` drains; `GET /started/<index>/<key>` tells that component container `index`
/// started. 403 from anywhere but the node, 401 with another key; any other path is 404.
async fn by_path(State(trigger): State<Trigger>, request: Request) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().to_canonical());
    let path = request.uri().path().trim_start_matches('/');
    let hooked = hook(path, DRAIN_PATH).is_some() || hook(path, STARTED_PATH).is_some();
    if hooked && !peer.is_some_and(|peer| trigger.node.contains(peer)) {
        let peer = peer.map_or_else(|| "an unknown address".to_owned(), |p| p.to_string());
        tracing::warn!(%peer, "refused a drain hook that did not come from the node");
        let message =
            format!("a kubelet hook comes from the node; {peer} is not one of its addresses");
        return (StatusCode::FORBIDDEN, message).into_response();
    }
    hooks(&trigger, path).await
}

/// `path` past `prefix` and a slash (`Some("")` for `prefix` itself).
fn hook<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    match path.strip_prefix(prefix.trim_start_matches('/')) {
        Some("") => Some(""),
        Some(rest) => rest.strip_prefix('/'),
        None => None,
    }
}

/// A hook from the node: its key checked, then what it asks.
async fn hooks(trigger: &Trigger, path: &str) -> Response {
    let hook = |prefix: &str| hook(path, prefix);
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
    /// Whether `presented` is the pod's drain key.
    fn keyed(&self, presented: &str) -> bool {
        self.digest
            .as_deref()
            .is_some_and(|digest| same_key(&drain_digest(presented), digest))
    }

    async fn pull(&self) -> Response {
        let _ = self.asked.try_send(());
        let mut done = self.done.clone();
        let _ = done.wait_for(|done| *done).await;
        "drained".into_response()
    }
}
