//! The seed's terminals component, written against the agent's HTTP protocol with axum alone:
//! it serves `POST /lifecycle/{command}` and `POST /operations/{name}` on 127.0.0.1:$TOA_PORT.
//! See docs/component-protocol.md.

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// What this process holds: the terminals whose connection it opened (`context.state`).
#[derive(Default)]
struct Terminals {
    connected: Mutex<HashSet<String>>,
    instance: String,
}

async fn lifecycle(
    Path(command): Path<String>,
    State(state): State<Arc<Terminals>>,
) -> Json<Value> {
    if command == "dispose" {
        // Close every connection this process opened.
        state.connected.lock().expect("state").clear();
    }
    Json(json!({}))
}

async fn operation(
    Path(name): Path<String>,
    State(state): State<Arc<Terminals>>,
    Json(request): Json<Value>,
) -> Json<Value> {
    let input = &request["input"];
    let terminal = input["terminal"].as_str().unwrap_or_default().to_owned();
    Json(match name.as_str() {
        "connect" => {
            state.connected.lock().expect("state").insert(terminal);
            json!({"reply": {"holder": state.instance}})
        }
        "charge" if state.connected.lock().expect("state").contains(&terminal) => {
            json!({"reply": {"charged": input["amount"], "by": state.instance}})
        }
        "charge" => {
            json!({"error": {"code": "NOT_HELD", "message": format!("{terminal} is not connected here")}})
        }
        "echo" => json!({"reply": input}),
        other => {
            json!({"error": {"code": "NOT_FOUND", "message": format!("no operation {other}")}})
        }
    })
}

#[tokio::main]
async fn main() {
    let port: u16 = std::env::var("TOA_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .expect("TOA_PORT, set by the agent");
    let state = Arc::new(Terminals {
        instance: std::env::var("TOA_INSTANCE").unwrap_or_default(),
        ..Default::default()
    });
    let app = Router::new()
        .route("/lifecycle/{command}", post(lifecycle))
        .route("/operations/{name}", post(operation))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port the agent gave");
    axum::serve(listener, app).await.expect("serving");
}
