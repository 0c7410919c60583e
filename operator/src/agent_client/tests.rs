//! Against a small axum server on 127.0.0.1 standing in for the agent's control endpoint, which
//! checks each request's signature as the agent does.

use super::*;
use crate::halt::{AgentPhase, Calls};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::net::Ipv4Addr;
use std::sync::Arc;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const POD: Target<'static> = Target {
    name: "shop-0",
    ip: LOOPBACK,
};

fn paused(halt: &str) -> AgentStatus {
    AgentStatus {
        phase: AgentPhase::Paused,
        halt: Some(halt.into()),
        instance: "shop-0".into(),
        calls: Calls::default(),
        failure: None,
        key: None,
    }
}

/// Whether the request is signed with `s3cret` for pod `shop-0`, now.
fn authorized(method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> bool {
    let header = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let request = Signed {
        method: method.as_str(),
        path: uri.path(),
        pod: "shop-0",
        ts: now_s(),
        nonce: "",
        body,
    };
    request.verify(header, "s3cret").is_ok()
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
            get(|method: Method, uri: Uri, headers: HeaderMap| async move {
                if !authorized(&method, &uri, &headers, b"") {
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
                |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| async move {
                    if !authorized(&method, &uri, &headers, &body) {
                        return Err(StatusCode::UNAUTHORIZED);
                    }
                    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
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
async fn status_and_halt_are_signed_and_read_the_status() {
    let control = serve(agent()).await;
    let status = control.status(POD, &Keys::one("s3cret")).await.unwrap();
    assert_eq!(status.phase, AgentPhase::Running);
    assert_eq!(
        control.halt(POD, &Keys::one("s3cret"), "h1").await.unwrap(),
        paused("h1")
    );
}

#[tokio::test]
async fn the_token_never_travels_and_a_wrong_one_is_a_permanent_error() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let router = Router::new().route(
        "/control/status",
        get(move |headers: HeaderMap| {
            record.lock().unwrap().push(format!("{headers:?}"));
            async { StatusCode::UNAUTHORIZED }
        }),
    );
    let control = serve(router).await;
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("401"), "{error}");
    let seen = seen.lock().unwrap().join("\n");
    assert!(seen.contains("Toa-HMAC-SHA256 pod=shop-0"), "{seen}");
    assert!(!seen.contains("s3cret"), "the token travelled: {seen}");

    let control = serve(agent()).await;
    let error = control.status(POD, &Keys::one("wrong")).await.unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
}

#[tokio::test]
async fn a_process_answering_as_another_pod_is_refused() {
    let control = serve(agent()).await;
    let elsewhere = Target {
        name: "shop-1",
        ..POD
    };
    // Signed for shop-1: the stand-in (shop-0) refuses it, as a real agent would.
    let error = control
        .status(elsewhere, &Keys::one("s3cret"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
    // A listener that answers whatever it is asked, as some other process.
    let router = Router::new().route(
        "/control/status",
        get(|| async {
            Json(serde_json::json!({
                "phase": "paused", "halt": "h1", "instance": "intruder",
                "calls": {"since_pause": 0, "last_at_ms": null}
            }))
        }),
    );
    let control = serve(router).await;
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("answered as \"intruder\", not as the pod shop-0"),
        "{error}"
    );
}

#[tokio::test]
async fn a_conflict_is_permanent_and_keeps_the_agents_words() {
    let control = serve(agent()).await;
    let error = control
        .resume(POD, &Keys::one("s3cret"), "h1")
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ControlError::Permanent(
            "resume h1 on shop-0: answered 409 Conflict: paused for another halt".into()
        )
    );
}

#[tokio::test]
async fn answers_are_capped_cut_and_never_redirected() {
    let router = Router::new()
        .route(
            "/control/status",
            get(|| async { (StatusCode::BAD_REQUEST, "x ".repeat(1000)) }),
        )
        .route(
            "/control/halt",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", "http://127.0.0.1:1/control/halt")],
                )
            }),
        )
        .route(
            "/control/resume",
            post(|| async { "y".repeat(MAX_ANSWER + 1) }),
        );
    let control = serve(router).await;
    let error = control
        .status(POD, &Keys::one("s3cret"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.ends_with('…'), "{error}");
    assert!(
        error.chars().count() < MAX_WORDS + 80,
        "{} chars",
        error.len()
    );
    let error = control
        .halt(POD, &Keys::one("s3cret"), "h1")
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("307"),
        "followed a redirect: {error}"
    );
    let error = control
        .resume(POD, &Keys::one("s3cret"), "h1")
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("longer than 65536 bytes"),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_error_is_transient() {
    let router = Router::new().route(
        "/control/status",
        get(|| async { StatusCode::SERVICE_UNAVAILABLE }),
    );
    let control = serve(router).await;
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
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
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
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
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
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
    let error = control.status(POD, &Keys::one("s3cret")).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("expected the status JSON"),
        "{error}"
    );
}

/// During a rotation an agent that has not read the new token yet refuses it: the request is
/// signed again with the previous one, and only then is a refusal an error.
#[tokio::test]
async fn a_request_the_agent_refuses_is_signed_again_with_the_previous_token() {
    let rotated = Keys {
        current: "new".into(),
        previous: Some("s3cret".into()),
    };
    // The stand-in agent knows only `s3cret`.
    let control = serve(agent()).await;
    let status = control.status(POD, &rotated).await.unwrap();
    assert_eq!(status.instance, "shop-0");
    assert_eq!(
        control.halt(POD, &rotated, "h1").await.unwrap(),
        paused("h1")
    );
    let error = control.status(POD, &Keys::one("new")).await.unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
}
