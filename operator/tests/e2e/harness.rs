//! The suite's harness: an HTTP server on the node's bridge address, which pods reach and nothing
//! beyond this machine does. The e2e recorder (`operator/tests/fixtures/image`, in the
//! `localhost/toa/python:e2e` image) tells it what happens in its container (`POST /events`) and
//! asks it what to do (`GET /commands?pod=…`), so the scenarios see run commands recorded in real
//! containers, and reach into a pod's own loopback (its agent's local API) without `exec`.

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// One thing a recorder told.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    pub pod: String,
    pub component: String,
    pub event: String,
    #[serde(flatten)]
    pub details: HashMap<String, Value>,
}

#[derive(Default)]
struct Shared {
    events: Vec<Event>,
    /// Commands waiting for a pod's recorders.
    commands: HashMap<String, Vec<Value>>,
}

#[derive(Clone)]
pub struct Harness {
    shared: Arc<Mutex<Shared>>,
    pub url: String,
}

/// The run commands, in the order a recorder reports them.
const LIFECYCLE: [&str; 5] = ["preflight", "ready", "pause", "resume", "dispose"];

impl Harness {
    /// Serves on `ip` (the node's bridge address), a free port.
    pub async fn start(ip: std::net::IpAddr) -> Self {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .expect("the harness binds on the node's bridge");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let harness = Self {
            shared: Arc::default(),
            url,
        };
        let app = Router::new()
            .route("/events", post(told))
            .route("/commands", get(asked))
            .with_state(harness.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        harness
    }

    /// Everything the pod's recorders told, in order.
    pub fn events(&self, pod: &str) -> Vec<Event> {
        let shared = self.shared.lock().unwrap();
        shared
            .events
            .iter()
            .filter(|e| e.pod == pod)
            .cloned()
            .collect()
    }

    /// The run commands `component` ran in `pod`, in order.
    pub fn lifecycle(&self, pod: &str, component: &str) -> Vec<String> {
        self.events(pod)
            .into_iter()
            .filter(|e| e.component == component && LIFECYCLE.contains(&e.event.as_str()))
            .map(|e| e.event)
            .collect()
    }

    /// The names of the events the pod's recorders told, in order.
    pub fn names(&self, pod: &str) -> Vec<String> {
        self.events(pod).into_iter().map(|e| e.event).collect()
    }

    /// Asks the pod's recorders to do `command` (`{"do": "call"}` …).
    pub fn ask(&self, pod: &str, command: Value) {
        self.shared
            .lock()
            .unwrap()
            .commands
            .entry(pod.to_owned())
            .or_default()
            .push(command);
    }
}

async fn told(State(harness): State<Harness>, Json(event): Json<Event>) -> &'static str {
    harness.shared.lock().unwrap().events.push(event);
    "ok"
}

#[derive(Deserialize)]
struct Asking {
    pod: String,
}

async fn asked(State(harness): State<Harness>, Query(asking): Query<Asking>) -> Json<Vec<Value>> {
    let commands = harness
        .shared
        .lock()
        .unwrap()
        .commands
        .remove(&asking.pod)
        .unwrap_or_default();
    Json(commands)
}
