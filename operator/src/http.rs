//! The operator's HTTP endpoint, for the kubelet and Prometheus; nothing here changes anything.
//!
//! | path | answer |
//! |---|---|
//! | `GET /health` | 200 while the process runs |
//! | `GET /ready` | 200 once the controller has started (whether or not this replica leads), 503 before |
//! | `GET /metrics` | OpenMetrics text ([`crate::metrics`]) |

use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;

#[derive(Clone)]
struct Shared {
    metrics: Metrics,
    ready: Arc<AtomicBool>,
}

/// The router; `ready` is set by the caller once the controller runs.
pub fn router(metrics: Metrics, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(readiness))
        .route("/metrics", get(metrics_text))
        .with_state(Shared { metrics, ready })
}

async fn readiness(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

async fn metrics_text(State(shared): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_ready_and_metrics_answer() {
        let metrics = Metrics::default();
        drop(metrics.reconcile());
        let ready = Arc::new(AtomicBool::new(false));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            router(metrics, ready.clone()),
            async move {
                let _ = stopped.await;
            },
        ));
        let client = reqwest::Client::new();
        let get = |path: &str| client.get(format!("{base}{path}")).send();

        assert_eq!(get("/health").await.unwrap().status(), 200);
        assert_eq!(get("/ready").await.unwrap().status(), 503);
        ready.store(true, Ordering::Release);
        assert_eq!(get("/ready").await.unwrap().status(), 200);
        let text = get("/metrics").await.unwrap().text().await.unwrap();
        assert!(text.contains("toa_operator_reconciles_total 1"), "{text}");

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
