//! Against a small axum server on 127.0.0.1 standing in for the agent's control endpoint.

use super::*;
use crate::halt::{AgentPhase, Calls};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::net::Ipv4Addr;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn paused(halt: &str) -> AgentStatus {
    AgentStatus {
        phase: AgentPhase::Paused,
        halt: Some(halt.into()),
        instance: "shop-0".into(),
        calls: Calls::default(),
        failure: None,
    }
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer s3cret")
}

async fn serve(router: Router) -> HttpAgentControl {
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    HttpAgentControl::with_port(port).unwrap()
}

fn agent() -> Router {
    Router::new()
        .route(
            "/control/status",
            get(|headers: HeaderMap| async move {
                if !authorized(&headers) {
                    return Err(StatusCode::UNAUTHORIZED);
                }
                Ok(Json(serde_json::json!({
                    "phase": "running", "halt": null, "instance": "shop-0",
                    "calls": {"since_pause": 0, "last_at_ms": null}
                })))
            }),
        )
        .route(
            "/control/halt",
            post(
                |headers: HeaderMap, Json(body): Json<serde_json::Value>| async move {
                    if !authorized(&headers) {
                        return Err(StatusCode::UNAUTHORIZED);
                    }
                    Ok(Json(paused(body["halt"].as_str().unwrap())))
                },
            ),
        )
        .route(
            "/control/resume",
            post(|| async { (StatusCode::CONFLICT, "paused for another halt") }),
        )
}

#[tokio::test]
async fn status_and_halt_carry_the_token_and_read_the_status() {
    let control = serve(agent()).await;
    let status = control.status(LOOPBACK, "s3cret").await.unwrap();
    assert_eq!(status.phase, AgentPhase::Running);
    assert_eq!(
        control.halt(LOOPBACK, "s3cret", "h1").await.unwrap(),
        paused("h1")
    );
}

#[tokio::test]
async fn a_wrong_token_is_a_permanent_error() {
    let control = serve(agent()).await;
    let error = control.status(LOOPBACK, "wrong").await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("401"), "{error}");
}

#[tokio::test]
async fn a_conflict_is_permanent_and_keeps_the_agents_words() {
    let control = serve(agent()).await;
    let error = control.resume(LOOPBACK, "s3cret", "h1").await.unwrap_err();
    assert_eq!(
        error,
        ControlError::Permanent(
            "resume h1 on 127.0.0.1: answered 409 Conflict: paused for another halt".into()
        )
    );
}

#[tokio::test]
async fn a_server_error_is_transient() {
    let router = Router::new().route(
        "/control/status",
        get(|| async { StatusCode::SERVICE_UNAVAILABLE }),
    );
    let control = serve(router).await;
    let error = control.status(LOOPBACK, "s3cret").await.unwrap_err();
    assert!(error.is_transient(), "{error}");
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    // Bind then drop, so the port is (almost certainly) closed.
    let port = {
        let listener = std::net::TcpListener::bind((LOOPBACK, 0)).unwrap();
        listener.local_addr().unwrap().port()
    };
    let control = HttpAgentControl::with_port(port).unwrap();
    let error = control.status(LOOPBACK, "s3cret").await.unwrap_err();
    assert!(error.is_transient(), "{error}");
}

#[tokio::test]
async fn a_slow_agent_times_out_as_transient() {
    let router = Router::new().route(
        "/control/status",
        get(|| async {
            tokio::time::sleep(TIMEOUT * 3).await;
            StatusCode::OK
        }),
    );
    let control = serve(router).await;
    let started = std::time::Instant::now();
    let error = control.status(LOOPBACK, "s3cret").await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(started.elapsed() < TIMEOUT * 2, "{:?}", started.elapsed());
    assert!(
        error.to_string().contains("no answer within 2 s"),
        "{error}"
    );
}

#[tokio::test]
async fn an_answer_that_is_not_a_status_is_permanent() {
    let router = Router::new().route("/control/status", get(|| async { "hello" }));
    let control = serve(router).await;
    let error = control.status(LOOPBACK, "s3cret").await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("expected the status JSON"),
        "{error}"
    );
}
