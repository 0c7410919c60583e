//! HTTP from the agent into the program: run commands and operations.

use serde_json::{json, Value};
use std::time::Duration;

use toa_context::answer::NotAnOutcome;
pub use toa_context::answer::Outcome;
use toa_context::program;
pub use toa_context::program::{CallMeta, Description};

#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{component} is unreachable: {message}")]
    Unreachable { component: String, message: String },
    #[error("{component} did not answer within {limit:?}")]
    TimedOut { component: String, limit: Duration },
    #[error("{component} answered {status}: {body}")]
    Failed {
        component: String,
        status: u16,
        body: String,
    },
    #[error("{component} answered something that is not {{\"reply\"}} or {{\"error\": {{\"code\"}}}}: {body}")]
    Malformed { component: String, body: String },
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
    base: String,
    http: reqwest::Client,
}

impl ProgramClient {
    pub fn new(component: &str, port: u16) -> Self {
        Self {
            component: component.to_owned(),
            port,
            run_command_limit: toa_context::Limits::default().run_command,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
        }
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

    /// The same client, with run commands limited to `limit`.
    pub fn with_run_command_limit(mut self, limit: Duration) -> Self {
        self.run_command_limit = limit;
        self
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
        let body = response.text().await.unwrap_or_default();
        Err(ProgramError::Failed {
            component: self.component.clone(),
            status: status.as_u16(),
            body,
        })
    }

    /// What the program says it serves (`GET /program`: `{"commands": [...], "operations":
    /// [...]}`), or `None` from a program that does not say (any answer but a 2xx, or one that is
    /// not a description: the manifest's word is taken).
    pub async fn describe(&self) -> Result<Option<Description>, ProgramError> {
        let unreachable = |error: reqwest::Error| ProgramError::Unreachable {
            component: self.component.clone(),
            message: error.to_string(),
        };
        let response = self
            .http
            .get(format!("{}{}", self.base, program::PROGRAM_PATH))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(unreachable)?;
        // 404, 405, 501 (a handler without GET): the program does not say.
        if !response.status().is_success() {
            return Ok(None);
        }
        let body = response.text().await.map_err(unreachable)?;
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

    /// Calls an operation with its input.
    pub async fn operate(
        &self,
        operation: &str,
        input: &Value,
        call: &CallMeta,
        limit: Duration,
    ) -> Result<Outcome, ProgramError> {
        let response = self
            .post(
                &program::operation_path(operation),
                &serde_json::to_value(program::OperationCall { input, call }).map_err(|error| {
                    ProgramError::Unreachable {
                        component: self.component.clone(),
                        message: error.to_string(),
                    }
                })?,
                limit,
            )
            .await?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&body).map_err(|_| ProgramError::Malformed {
            component: self.component.clone(),
            body: body.clone(),
        })?;
        let malformed = || ProgramError::Malformed {
            component: self.component.clone(),
            body: body.clone(),
        };
        match Outcome::from_json(&value) {
            // The operation's own error, whatever the status.
            Ok(error @ Outcome::Error { .. }) => Ok(error),
            Err(NotAnOutcome::ErrorWithoutCode) => Err(malformed()),
            _ if !(200..300).contains(&status) => Err(ProgramError::Failed {
                component: self.component.clone(),
                status,
                body,
            }),
            Ok(reply) => Ok(reply),
            Err(NotAnOutcome::Neither) => Err(malformed()),
        }
    }

    async fn post(
        &self,
        path: &str,
        body: &Value,
        limit: Duration,
    ) -> Result<reqwest::Response, ProgramError> {
        self.http
            .post(format!("{}{path}", self.base))
            .json(body)
            .timeout(limit)
            .send()
            .await
            .map_err(|error| {
                if error.is_timeout() {
                    ProgramError::TimedOut {
                        component: self.component.clone(),
                        limit,
                    }
                } else {
                    ProgramError::Unreachable {
                        component: self.component.clone(),
                        message: error.to_string(),
                    }
                }
            })
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
            })
        );
        // Something else answered with 200 (a catch-all page): no description.
        assert_eq!(described(program("<html>hello</html>")).await, None);
        // A program without the route.
        assert_eq!(described(axum::Router::new()).await, None);
    }
}
