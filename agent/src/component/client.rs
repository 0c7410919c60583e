//! HTTP from the agent into the program: run commands and operations.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::answering::Answering;
use super::hop::{self, Hop};
use hyper::http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use hyper::{Method, StatusCode};

use toa_context::answer::NotAnOutcome;
pub use toa_context::answer::Outcome;
use toa_context::program;
pub use toa_context::program::{CallMeta, Description};
use toa_context::trace::TraceContext;

#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{component} is unreachable: {message}")]
    Unreachable { component: String, message: String },
    #[error("{component} did not answer within {limit:?}")]
    TimedOut { component: String, limit: Duration },
    /// The program on the component's port does not know the agent's token (401): another
    /// process serves that port, or the program was given another token.
    #[error("{component}: 127.0.0.1:{port} refused the agent's token (401): the process serving it is not the program this agent started or was told of, or it was given another token")]
    Refused { component: String, port: u16 },
    #[error("{component} answered {status}: {body}")]
    Failed {
        component: String,
        status: u16,
        body: String,
    },
    #[error("{component} answered something that is not {{\"reply\"}} (a transition: {{\"entry\"}}) or {{\"error\": {{\"code\"}}}}: {body}")]
    Malformed { component: String, body: String },
    #[error(
        "{component} answered more than {limit} bytes (limits.message); the answer is dropped"
    )]
    TooLarge { component: String, limit: usize },
    /// The program answered a question of the agent's (which events a write publishes) with
    /// something that is not an answer to it; not quoted: the question held the object's data.
    #[error("{component}: {message}")]
    Unanswered { component: String, message: String },
    /// The call breaks what the operation takes, found where it runs (a query an effect does not
    /// take, no id for an object): the caller's `RequestContract`.
    #[error("{0}")]
    Contract(String),
    /// The operation answered an error code its manifest does not declare (`errors:`): the
    /// program's failure, not a code a caller could have known to expect.
    #[error("{component}.{operation} answered the error {code}, which its manifest does not declare (errors: [{}]): taken as the program's failure", declared.join(", "))]
    Undeclared {
        component: String,
        operation: String,
        code: String,
        declared: Vec<String>,
    },
}

impl ProgramError {
    /// The program did not answer before the call's deadline, or its SDK refused the call as
    /// past it (504, docs/component-protocol.md): either way the operation did not finish for a
    /// caller still waiting.
    pub fn past_deadline(&self) -> bool {
        matches!(
            self,
            Self::TimedOut { .. } | Self::Failed { status: 504, .. }
        )
    }
}

/// How long `GET /program` may take.
const DESCRIBE_LIMIT: Duration = Duration::from_secs(10);

/// The most of a program's answer an error repeats (in logs, to callers, in a pod's status):
/// enough to say what went wrong, never the whole of a large answer.
pub const QUOTED: usize = 1024;

/// `body`, cut to [`QUOTED`] bytes (at a character boundary) and marked when cut.
pub fn quoted(body: &str) -> String {
    if body.len() <= QUOTED {
        return body.to_owned();
    }
    let mut end = QUOTED;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &body[..end], body.len() - end)
}

/// A call made here, for the first time.
pub fn first_call(deadline_ms: Option<i64>) -> CallMeta {
    CallMeta {
        id: new_id(),
        redelivered: false,
        deadline_ms,
    }
}

/// A random call id, 32 hex digits.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[derive(Clone)]
pub struct ProgramClient {
    component: String,
    port: u16,
    /// How long one run command may take (`limits.runCommand`).
    run_command_limit: Duration,
    /// The largest answer read, in bytes (`limits.message`).
    answer_limit: usize,
    /// The component's token, sent with every request: a program that knows it (the SDKs)
    /// answers no one else.
    token: Option<String>,
    /// `Authorization: Bearer <token>`, made once.
    bearer: Option<HeaderValue>,
    hop: Hop,
    /// Each operation's declared error codes (the manifest's `errors:`); `None`: not checked
    /// (a client made without a manifest, in tests).
    errors: Option<Arc<HashMap<String, Vec<String>>>>,
    /// The calls the program is answering now, for its lock requests' deadlines.
    answering: Arc<Answering>,
}

impl ProgramClient {
    pub fn new(component: &str, port: u16) -> Self {
        Self {
            component: component.to_owned(),
            port,
            run_command_limit: toa_context::Limits::default().run_command,
            answer_limit: toa_context::Limits::default().message as usize,
            token: None,
            bearer: None,
            hop: Hop::new(port),
            errors: None,
            answering: Arc::default(),
        }
    }

    /// The same client, refusing an error code an operation does not declare in `manifest`.
    pub fn with_errors(mut self, manifest: &toa_context::Manifest) -> Self {
        let errors = manifest.operations.iter();
        let errors = errors.map(|(name, operation)| (name.clone(), operation.errors.clone()));
        self.errors = Some(Arc::new(errors.collect()));
        self
    }

    /// The calls the program is answering now.
    pub fn answering(&self) -> Arc<Answering> {
        self.answering.clone()
    }

    /// `outcome`, unless it is an error code `operation` does not declare: then the program's
    /// failure, logged with the code.
    fn declared(&self, operation: &str, outcome: Outcome) -> Result<Outcome, ProgramError> {
        let (Some(errors), Outcome::Error { code, .. }) = (&self.errors, &outcome) else {
            return Ok(outcome);
        };
        let declared = errors.get(operation).cloned().unwrap_or_default();
        if declared.contains(code) || toa_context::answer::RUNTIME_CODES.contains(&code.as_str()) {
            return Ok(outcome);
        }
        tracing::warn!(component = %self.component, %operation, %code, "an operation answered an error code its manifest does not declare: taken as the program's failure");
        Err(ProgramError::Undeclared {
            component: self.component.clone(),
            operation: operation.to_owned(),
            code: code.clone(),
            declared,
        })
    }

    /// Whether the program accepts connections on its port (within 500 ms).
    pub async fn alive(&self) -> bool {
        let connect = tokio::net::TcpStream::connect(("127.0.0.1", self.port));
        matches!(
            tokio::time::timeout(Duration::from_millis(500), connect).await,
            Ok(Ok(_))
        )
    }

    /// Watches the program: the receiver says whether it accepts connections, checked every
    /// `every`; it turns false after two failed checks in a row and true after one success.
    pub fn watch(&self, every: Duration) -> tokio::sync::watch::Receiver<bool> {
        let (alive, receiver) = tokio::sync::watch::channel(true);
        let client = self.clone();
        tokio::spawn(async move {
            let mut failed = 0;
            loop {
                tokio::select! {
                    () = alive.closed() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if client.alive().await {
                    failed = 0;
                    if !*alive.borrow() {
                        tracing::info!(component = %client.component, "the program answers again");
                    }
                    alive.send_replace(true);
                } else {
                    failed += 1;
                    if failed == 2 && *alive.borrow() {
                        tracing::error!(component = %client.component, port = client.port, "the program does not answer: not ready, its calls go elsewhere");
                        alive.send_replace(false);
                    }
                }
            }
        });
        receiver
    }

    /// The same client, sending `token` with every request.
    pub fn with_token(mut self, token: Option<&str>) -> Self {
        self.token = token.map(str::to_owned);
        self.bearer = token.map(|token| {
            let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                .expect("a token is printable ASCII");
            value.set_sensitive(true);
            value
        });
        self
    }

    /// The same client, with run commands limited to `limits.runCommand` and answers to
    /// `limits.message` bytes.
    pub fn with_limits(mut self, limits: &toa_context::Limits) -> Self {
        self.run_command_limit = limits.run_command;
        self.answer_limit = limits.message as usize;
        self
    }

    /// The answer's body as text, read up to the limit: a longer one is refused with the rest
    /// unread (a program answering 200 MB no longer takes the agent's memory with it).
    /// `limit`: the request's time limit, past which reading it is the program's timeout.
    async fn body(&self, response: hop::Answer, limit: Duration) -> Result<String, ProgramError> {
        let body = response
            .bytes(self.answer_limit)
            .await
            .map_err(|failure| self.failed(failure, limit))?;
        // Valid UTF-8 (the JSON every program sends) is taken as it is, not copied.
        Ok(String::from_utf8(body)
            .unwrap_or_else(|invalid| String::from_utf8_lossy(invalid.as_bytes()).into_owned()))
    }

    /// Runs a run command (within the client's limit); a non-2xx answer is its failure.
    pub async fn run(&self, command: &str) -> Result<(), ProgramError> {
        let response = self
            .post(
                &program::lifecycle_path(command),
                &json!({}),
                self.run_command_limit,
            )
            .await?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = self.body(response, self.run_command_limit).await?;
        Err(ProgramError::Failed {
            component: self.component.clone(),
            status: status.as_u16(),
            body: quoted(&body),
        })
    }

    /// What the program says it serves (`GET /program`: `{"commands": [...], "operations":
    /// [...]}`), or `None` from a program that does not say (any answer but a 2xx, or one that is
    /// not a description: the manifest's word is taken).
    pub async fn describe(&self) -> Result<Option<Description>, ProgramError> {
        let until = tokio::time::Instant::now() + DESCRIBE_LIMIT;
        let response = self
            .hop
            .send(
                (Method::GET, program::PROGRAM_PATH),
                self.bearer.clone().map(|token| (AUTHORIZATION, token)),
                None,
                until,
            )
            .await
            .map_err(|failure| self.failed(failure, DESCRIBE_LIMIT))?;
        if response.status() == StatusCode::UNAUTHORIZED {
            return Err(ProgramError::Refused {
                component: self.component.clone(),
                port: self.port,
            });
        }
        // 404, 405, 501 (a handler without GET): the program does not say.
        if !response.status().is_success() {
            return Ok(None);
        }
        let body = self.body(response, DESCRIBE_LIMIT).await?;
        // A program written to the raw protocol may answer every GET: what is not a description
        // is no description, and the manifest's word is taken.
        match serde_json::from_str(&body) {
            Ok(description) => Ok(Some(description)),
            Err(error) => {
                tracing::warn!(component = %self.component, %error, "GET /program is not a description of the program; the manifest's run commands are taken");
                Ok(None)
            }
        }
    }

    /// Calls an operation with its input (and, for a transition or an observation of an
    /// entity, the object: `entry`).
    pub async fn operate(
        &self,
        operation: &str,
        input: &Value,
        entry: Option<&Value>,
        call: &CallMeta,
        limit: Duration,
    ) -> Result<Outcome, ProgramError> {
        let (status, value, body) = self.exchange(operation, input, entry, call, limit).await?;
        match Outcome::from_json(&value) {
            // The operation's own error, whatever the status.
            Ok(error @ Outcome::Error { .. }) => self.declared(operation, error),
            Err(NotAnOutcome::ErrorWithoutCode) => Err(self.malformed(&body)),
            _ if !(200..300).contains(&status) => Err(self.failed_with(status, &body)),
            Ok(reply) => Ok(reply),
            Err(NotAnOutcome::Neither) => Err(self.malformed(&body)),
        }
    }

    /// Runs a transition on `entry`: the entry as the function left it and what it returned
    /// (`None`: the entry itself), or the operation's own error.
    pub async fn transit(
        &self,
        operation: &str,
        input: &Value,
        entry: &Value,
        call: &CallMeta,
        limit: Duration,
    ) -> Result<Result<(serde_json::Map<String, Value>, Option<Value>), Outcome>, ProgramError>
    {
        let (status, mut value, body) = self
            .exchange(operation, input, Some(entry), call, limit)
            .await?;
        if let Ok(error @ Outcome::Error { .. }) = Outcome::from_json(&value) {
            return self.declared(operation, error).map(Err);
        }
        if !(200..300).contains(&status) {
            return Err(self.failed_with(status, &body));
        }
        let returned = value.get_mut("reply").map(Value::take);
        match value.get_mut("entry").map(Value::take) {
            Some(Value::Object(left)) => Ok(Ok((left, returned))),
            _ => Err(self.malformed(&body)),
        }
    }

    /// The request the program's adaptation makes of the event `label`'s `payload`
    /// (`receivers/<label>` exporting `request(payload)`): what its `{"request"}` holds.
    pub async fn adapt(
        &self,
        label: &str,
        payload: &Value,
        limit: Duration,
    ) -> Result<Value, ProgramError> {
        let body = json!({ "payload": payload });
        let response = self
            .post(&program::receiver_path(label), &body, limit)
            .await?;
        let status = response.status().as_u16();
        let body = self.body(response, limit).await?;
        if !(200..300).contains(&status) {
            return Err(self.failed_with(status, &body));
        }
        match serde_json::from_str::<Value>(&body) {
            Ok(Value::Object(mut answer)) if answer.get("request").is_some_and(Value::is_object) => {
                Ok(answer.remove("request").expect("checked"))
            }
            // Not quoted: an adaptation's answer holds the event's data.
            _ => Err(ProgramError::Contract(format!(
                "{}: the receiver of {label} answered something that is not {{\"request\": {{...}}}} ({} bytes)",
                self.component,
                body.len()
            ))),
        }
    }

    /// Which of the events whose condition the program keeps hold for a write that stores
    /// `entry` over `previous` (`None`: there was none): their names, each one of `asked`.
    pub async fn conditions(
        &self,
        entry: &Value,
        previous: Option<&Value>,
        asked: &[String],
        limit: Duration,
    ) -> Result<Vec<String>, ProgramError> {
        // As for any run of the program: one that could not finish before the caller stops
        // waiting does not start.
        if limit <= program::START_MARGIN {
            let component = self.component.clone();
            return Err(ProgramError::TimedOut { component, limit });
        }
        let body = program::Conditions { entry, previous };
        let body = serde_json::to_value(body).expect("JSON values serialise");
        let response = self.post(program::CONDITIONS_PATH, &body, limit).await?;
        let status = response.status().as_u16();
        let body = self.body(response, limit).await?;
        let unanswered = |what: String| ProgramError::Unanswered {
            component: self.component.clone(),
            message: format!("its events' conditions answered {what}; nothing was stored"),
        };
        if !(200..300).contains(&status) {
            // Not quoted: what a failing condition says may quote the object.
            let length = body.len();
            let failed = format!("{status} ({length} bytes, in the program's log if anywhere)");
            return Err(unanswered(failed));
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Answer {
            publish: Vec<String>,
        }
        let answer: Answer = serde_json::from_str(&body).map_err(|_| {
            unanswered(format!(
                "something that is not {{\"publish\": [names]}} ({} bytes)",
                body.len()
            ))
        })?;
        match answer.publish.iter().find(|name| !asked.contains(name)) {
            Some(name) => Err(unanswered(format!(
                "{name:?}, which is no event with a condition of its"
            ))),
            None => Ok(answer.publish),
        }
    }

    /// Posts an operation's call: the answer's status, its JSON and its text.
    async fn exchange(
        &self,
        operation: &str,
        input: &Value,
        entry: Option<&Value>,
        call: &CallMeta,
        limit: Duration,
    ) -> Result<(u16, Value, String), ProgramError> {
        // The program is told when the agent stops waiting for it: the caller's deadline, or
        // this run's limit (an ordinary call has no deadline of its caller's); its lock
        // requests are waited for until then, not past it.
        let now_ms = program::now_ms();
        let limit_ms = now_ms.saturating_add(limit.as_millis() as i64);
        let deadline_ms = call.deadline_ms.map_or(limit_ms, |d| d.min(limit_ms));
        let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms).max(0) as u64);
        let until = tokio::time::Instant::now() + left;
        let call = &CallMeta {
            deadline_ms: Some(deadline_ms),
            ..call.clone()
        };
        let _answer = (!call.id.is_empty()).then(|| self.answering.enter(&call.id, until));
        let request = program::OperationCall { input, entry, call };
        let response = self
            .post(&program::operation_path(operation), &request, limit)
            .await?;
        let status = response.status().as_u16();
        let body = self.body(response, limit).await?;
        let value: Value = serde_json::from_str(&body).map_err(|_| self.malformed(&body))?;
        Ok((status, value, body))
    }

    /// An answer with a status that is not 2xx and no error of the operation's own.
    fn failed_with(&self, status: u16, body: &str) -> ProgramError {
        ProgramError::Failed {
            component: self.component.clone(),
            status,
            body: quoted(body),
        }
    }

    fn malformed(&self, body: &str) -> ProgramError {
        ProgramError::Malformed {
            component: self.component.clone(),
            body: quoted(body),
        }
    }

    /// What a request's failure means: past its time `limit`, the program unreachable, or its
    /// answer too long.
    fn failed(&self, failure: hop::Failure, limit: Duration) -> ProgramError {
        let component = self.component.clone();
        match failure {
            hop::Failure::TimedOut => ProgramError::TimedOut { component, limit },
            hop::Failure::Unreachable(message) => ProgramError::Unreachable { component, message },
            hop::Failure::TooLarge => ProgramError::TooLarge {
                component,
                limit: self.answer_limit,
            },
        }
    }

    /// Posts `body` as JSON to the program's `path`, with the component's token and the run's
    /// trace (which the program's own spans and calls continue), answered within `limit`.
    async fn post(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        limit: Duration,
    ) -> Result<hop::Answer, ProgramError> {
        let until = tokio::time::Instant::now() + limit;
        let body = serde_json::to_vec(body).map_err(|error| ProgramError::Unreachable {
            component: self.component.clone(),
            message: error.to_string(),
        })?;
        let trace = crate::traces::current();
        let trace = trace.iter().flat_map(TraceContext::write);
        let trace = trace.filter_map(|(name, value)| {
            Some((
                HeaderName::from_static(name),
                HeaderValue::try_from(value).ok()?,
            ))
        });
        let token = self.bearer.clone().map(|token| (AUTHORIZATION, token));
        self.hop
            .send(
                (Method::POST, path),
                token.into_iter().chain(trace),
                Some(body),
                until,
            )
            .await
            .map_err(|failure| self.failed(failure, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `describe` makes of a program serving `app`, on a free port.
    async fn described(app: axum::Router) -> Option<Description> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        ProgramClient::new("shop.mail", port)
            .describe()
            .await
            .unwrap()
    }

    /// A program answering `GET /program` with `body`.
    fn program(body: &'static str) -> axum::Router {
        axum::Router::new().route("/program", axum::routing::get(move || async move { body }))
    }

    #[tokio::test]
    async fn a_program_says_what_it_serves_or_is_taken_at_its_manifests_word() {
        let said = program(r#"{"commands": ["preflight"], "operations": ["send"]}"#);
        assert_eq!(
            described(said).await,
            Some(Description {
                commands: vec!["preflight".into()],
                operations: vec!["send".into()],
                kinds: Default::default(),
                receivers: Vec::new(),
                conditions: Vec::new(),
            })
        );
        // Something else answered with 200 (a catch-all page): no description.
        assert_eq!(described(program("<html>hello</html>")).await, None);
        // A program without the route.
        assert_eq!(described(axum::Router::new()).await, None);
    }

    /// A program that refuses the agent's token is not taken at its manifest's word: every call
    /// would be refused, so the start fails naming the port.
    #[tokio::test]
    async fn a_program_refusing_the_agents_token_is_no_program_of_its() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stranger =
            axum::Router::new().fallback(|| async { (axum::http::StatusCode::UNAUTHORIZED, "{}") });
        tokio::spawn(async move { axum::serve(listener, stranger).await });
        let error = ProgramClient::new("shop.mail", port)
            .with_token(Some("ours"))
            .describe()
            .await
            .unwrap_err();
        assert!(matches!(error, ProgramError::Refused { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains(&format!("127.0.0.1:{port} refused the agent's token")),
            "{message}"
        );
    }

    /// The client of a program serving `app`, its answers limited to `message` bytes.
    async fn client(app: axum::Router, message: u32) -> ProgramClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let limits = toa_context::Limits {
            message,
            ..Default::default()
        };
        ProgramClient::new("shop.mail", port).with_limits(&limits)
    }

    async fn operate(client: &ProgramClient) -> Result<Outcome, ProgramError> {
        let call = first_call(None);
        let limit = Duration::from_secs(5);
        client.operate("send", &json!({}), None, &call, limit).await
    }

    #[tokio::test]
    async fn an_answer_past_the_limit_is_refused_said_or_streamed() {
        let big = format!(r#"{{"reply": "{}"}}"#, "x".repeat(2_000));
        let said = big.clone();
        let app = axum::Router::new().route(
            "/operations/send",
            axum::routing::post(move || async move { said }),
        );
        let error = operate(&client(app.clone(), 1_000).await)
            .await
            .unwrap_err();
        assert!(
            matches!(error, ProgramError::TooLarge { limit: 1_000, .. }),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "shop.mail answered more than 1000 bytes (limits.message); the answer is dropped"
        );
        assert!(operate(&client(app, 4_000).await).await.is_ok());
        // Without a length: chunks counted as they come.
        let chunks = move || {
            let pieces = (0..20).map(|_| Ok::<_, std::io::Error>("x".repeat(100)));
            axum::body::Body::from_stream(futures::stream::iter(pieces))
        };
        let streamed = axum::Router::new().route(
            "/operations/send",
            axum::routing::post(move || async move { chunks() }),
        );
        let error = operate(&client(streamed, 1_000).await).await.unwrap_err();
        assert!(matches!(error, ProgramError::TooLarge { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_failure_repeats_at_most_a_kibibyte_of_the_answer_marked_as_cut() {
        let failing = || async {
            let text = "é".repeat(1_000);
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, text)
        };
        let app = axum::Router::new()
            .route("/operations/send", axum::routing::post(failing))
            .route("/lifecycle/preflight", axum::routing::post(failing));
        let client = client(app, 1 << 20).await;
        let cut = |body: &str| {
            assert!(body.starts_with(&"é".repeat(512)), "{body}");
            assert!(body.ends_with("… (976 bytes cut)"), "{body}");
        };
        match operate(&client).await.unwrap_err() {
            ProgramError::Malformed { body, .. } => cut(&body),
            other => panic!("{other}"),
        }
        match client.run("preflight").await.unwrap_err() {
            ProgramError::Failed { body, status, .. } => (assert_eq!(status, 500), cut(&body)).1,
            other => panic!("{other}"),
        }
        assert_eq!(quoted("short"), "short");
    }

    #[tokio::test]
    async fn every_request_carries_the_components_token() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = |seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>| {
            move |headers: axum::http::HeaderMap| async move {
                let given = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned());
                seen.lock().unwrap().push(given.unwrap_or_default());
                r#"{"reply": 1}"#
            }
        };
        let app = axum::Router::new()
            .route("/program", axum::routing::get(record(seen.clone())))
            .route(
                "/operations/send",
                axum::routing::post(record(seen.clone())),
            )
            .route(
                "/lifecycle/ready",
                axum::routing::post(record(seen.clone())),
            );
        let client = client(app, 1 << 20).await.with_token(Some("t-1"));
        let _ = client.describe().await;
        operate(&client).await.unwrap();
        client.run("ready").await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["Bearer t-1"; 3]);
    }

    #[tokio::test]
    async fn a_run_in_a_trace_tells_the_program_its_context_and_one_outside_tells_none() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        let app = axum::Router::new().route(
            "/operations/send",
            axum::routing::post(move |headers: axum::http::HeaderMap| async move {
                let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                kept.lock()
                    .unwrap()
                    .push((header("traceparent"), header("tracestate")));
                r#"{"reply": 1}"#
            }),
        );
        let client = client(app, 1 << 20).await;
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::read(Some(parent.as_bytes()), Some(b"congo=t61rcWkgMzE"));
        crate::traces::within(context, operate(&client))
            .await
            .unwrap();
        operate(&client).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (
                    Some(parent.to_owned()),
                    Some("congo=t61rcWkgMzE".to_owned())
                ),
                (None, None)
            ]
        );
    }
}
