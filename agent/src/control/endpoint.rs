//! The control endpoint, for the operator: halt, resume, status, on its own port.
//!
//! Every request must be signed with the composition's token, read from a file at start (a
//! Secret the operator creates): `Authorization: Toa-HMAC-SHA256 pod=.., ts=.., sig=..`, an HMAC
//! over the method, path, body, this pod's name and a time within 30 s of this agent's clock
//! ([`toa_context::control::Signed`]); `Bearer <token>` from operators before signing is still
//! taken. Anything else gets 401 and changes nothing.
//! Actions are idempotent by halt id: halting twice with one id pauses once. A halt or resume
//! runs to its end once asked for, even when the request that asked is dropped (the operator's
//! requests give up after 2 s; it polls the status).
//!
//! | method and path | what |
//! |---|---|
//! | `POST /control/halt` `{"halt": "id"}` | stops pulses, runs `pause`; answers the status |
//! | `POST /control/resume` `{"halt": "id"}` | runs `resume`, starts pulses again; answers the status |
//! | `GET /control/status` | `{"phase", "halt", "instance", "calls": {"since_pause", "last_at_ms", "in_flight"}, "failure"}` |

use crate::control::tokens::Tokens;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use toa_context::control::{HaltRequest, Signed, Status, HALT_PATH, RESUME_PATH, STATUS_PATH};

pub type Reply = Pin<Box<dyn Future<Output = Result<Status, ActionError>> + Send>>;

/// Why a halt or resume was not done (answered 409 with the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("the process is draining")]
    Draining,
    /// The same halt's `pause` failed before: it is not tried again.
    #[error("pause for halt {halt:?} failed ({message}); it is not tried again")]
    PauseFailed { halt: String, message: String },
    #[error("paused for halt {current:?}, not {halt:?}")]
    OtherHalt { current: String, halt: String },
    /// A lifecycle command failed: the components' messages.
    #[error("{0}")]
    Command(String),
    /// The task running the action ended without an answer (it panicked).
    #[error("the action failed: {0}")]
    Ended(String),
}

/// Why a control request is not taken (401, after "expected a request signed with the
/// composition's token: ").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unauthorized {
    #[error("too many control requests in the last minute")]
    TooMany,
    #[error("this signed request was taken already (a replay)")]
    Replay,
    /// The signature's check, as [`Signed::verify`] words it.
    #[error("{0}")]
    Signature(String),
}

/// Why a request names no halt (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum BadHalt {
    #[error("expected a halt id of 1 to 128 characters")]
    Length,
    /// The body is not a halt request, as axum words it.
    #[error("{0}")]
    Body(String),
}

/// What the endpoint drives: the process's supervisor.
pub trait Supervisor: Send + Sync + 'static {
    fn halt(self: Arc<Self>, halt: String) -> Reply;
    fn resume(self: Arc<Self>, halt: String) -> Reply;
    fn status(&self) -> Status;
}

struct Control {
    tokens: Tokens,
    supervisor: Arc<dyn Supervisor>,
    seen: Seen,
}

/// The nonces of the signed requests taken in the last two signature windows: a request seen
/// once is refused as a replay (a listener on a pod's old IP could otherwise replay a halt).
#[derive(Default)]
struct Seen(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl Seen {
    /// Takes `nonce` at `now` (unix seconds), or refuses it as already used.
    fn take(&self, nonce: String, now: u64) -> Result<(), Unauthorized> {
        let mut seen = self.0.lock().expect("seen nonces");
        let keep = 2 * toa_context::control::SIGNATURE_WINDOW_S;
        seen.retain(|_, at| now.saturating_sub(*at) <= keep);
        if seen.len() >= MAX_SEEN {
            return Err(Unauthorized::TooMany);
        }
        match seen.insert(nonce, now) {
            None => Ok(()),
            Some(_) => Err(Unauthorized::Replay),
        }
    }
}

/// The most signed requests remembered at once (the operator sends a few per reconcile).
const MAX_SEEN: usize = 100_000;

/// The control router; every request must be signed with one of `tokens`.
pub fn router(tokens: Tokens, supervisor: Arc<dyn Supervisor>) -> Router {
    let control = Arc::new(Control {
        tokens,
        supervisor,
        seen: Seen::default(),
    });
    Router::new()
        .route(HALT_PATH, post(halt))
        .route(RESUME_PATH, post(resume))
        .route(STATUS_PATH, get(status))
        .layer(middleware::from_fn_with_state(
            control.clone(),
            authenticate,
        ))
        .with_state(control)
}

async fn authenticate(
    State(control): State<Arc<Control>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            "expected a body of at most 1 KiB",
        );
    };
    let given = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let instance = control.supervisor.status().instance;
    let signed = Signed {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        pod: &instance,
        ts: now_s(),
        nonce: "",
        body: &body,
    };
    if let Err(why) = control.authenticated(&signed, given) {
        tracing::warn!(%why, "control request refused");
        return error(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            &format!("expected a request signed with the composition's token: {why}"),
        );
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(body)))
        .await
}

/// The largest control request body: a halt id of at most 128 characters, in JSON.
const MAX_BODY: usize = 1024;

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// The halt id of a request, or what was wrong with the request.
fn halt_id(body: Result<Json<HaltRequest>, JsonRejection>) -> Result<String, BadHalt> {
    match body {
        Ok(Json(HaltRequest { halt })) if !halt.is_empty() && halt.len() <= 128 => Ok(halt),
        Ok(_) => Err(BadHalt::Length),
        Err(rejection) => Err(BadHalt::Body(rejection.body_text())),
    }
}

/// Runs `action` on a task of its own: a request dropped midway (the caller gave up) does not
/// cut a `pause` or `resume` in half.
async fn to_the_end(action: Reply) -> Result<Status, ActionError> {
    tokio::spawn(action)
        .await
        .unwrap_or_else(|error| Err(ActionError::Ended(error.to_string())))
}

/// The status, with the key id of the token this agent has now.
fn answer(control: &Control, result: Result<Status, ActionError>) -> Response {
    match result {
        Ok(status) => Json(control.keyed(status)).into_response(),
        Err(refused) => error(StatusCode::CONFLICT, "CONFLICT", &refused.to_string()),
    }
}

impl Control {
    /// Signed with a token this agent accepts, and not seen before; or the token itself as a
    /// bearer token, as operators before signing sent it (taken for one version).
    fn authenticated(&self, signed: &Signed<'_>, given: &str) -> Result<(), Unauthorized> {
        let bearer = given.strip_prefix("Bearer ").is_some_and(|presented| {
            self.tokens
                .any(|token| toa_context::control::same_key(presented, token))
        });
        if bearer {
            return Ok(());
        }
        let mut why = String::new();
        let mut nonce = None;
        self.tokens.any(|token| match signed.verify(given, token) {
            Ok(taken) => {
                nonce = Some(taken);
                true
            }
            Err(refused) => {
                if why.is_empty() {
                    why = refused;
                }
                false
            }
        });
        let nonce = nonce.ok_or(Unauthorized::Signature(why))?;
        self.seen.take(nonce, signed.ts)
    }

    fn keyed(&self, status: Status) -> Status {
        Status {
            key: Some(self.tokens.key_id()),
            ..status
        }
    }
}

async fn halt(
    State(control): State<Arc<Control>>,
    body: Result<Json<HaltRequest>, JsonRejection>,
) -> Response {
    match halt_id(body) {
        Ok(id) => answer(
            &control,
            to_the_end(control.supervisor.clone().halt(id)).await,
        ),
        Err(refused) => error(StatusCode::BAD_REQUEST, "BAD_REQUEST", &refused.to_string()),
    }
}

async fn resume(
    State(control): State<Arc<Control>>,
    body: Result<Json<HaltRequest>, JsonRejection>,
) -> Response {
    match halt_id(body) {
        Ok(id) => answer(
            &control,
            to_the_end(control.supervisor.clone().resume(id)).await,
        ),
        Err(refused) => error(StatusCode::BAD_REQUEST, "BAD_REQUEST", &refused.to_string()),
    }
}

async fn status(State(control): State<Arc<Control>>) -> Json<Status> {
    Json(control.keyed(control.supervisor.status()))
}
