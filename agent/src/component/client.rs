//! HTTP from the agent into the program: run commands and operations.

use serde_json::{json, Value};
use std::time::Duration;

/// What an operation answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply(Value),
    /// The operation's own error, e.g. `NOT_HELD`: passed to the caller unchanged.
    Error {
        code: String,
        message: Option<String>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{component} is unreachable: {message}")]
    Unreachable { component: String, message: String },
    #[error("{component} answered {status}: {body}")]
    Failed {
        component: String,
        status: u16,
        body: String,
    },
    #[error("{component} answered something that is not {{\"reply\"}} or {{\"error\": {{\"code\"}}}}: {body}")]
    Malformed { component: String, body: String },
}

#[derive(Clone)]
pub struct ProgramClient {
    component: String,
    base: String,
    http: reqwest::Client,
}

impl ProgramClient {
    pub fn new(component: &str, port: u16) -> Self {
        Self {
            component: component.to_owned(),
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
        }
    }

    /// Runs a run command; a non-2xx answer is its failure.
    pub async fn run(&self, command: &str, limit: Duration) -> Result<(), ProgramError> {
        let response = self
            .post(&format!("/lifecycle/{command}"), &json!({}), limit)
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

    /// Calls an operation with its input.
    pub async fn operate(
        &self,
        operation: &str,
        input: &Value,
        limit: Duration,
    ) -> Result<Outcome, ProgramError> {
        let response = self
            .post(
                &format!("/operations/{operation}"),
                &json!({"input": input}),
                limit,
            )
            .await?;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&body).map_err(|_| ProgramError::Malformed {
            component: self.component.clone(),
            body: body.clone(),
        })?;
        if let Some(error) = value.get("error") {
            let code = error.get("code").and_then(Value::as_str);
            return match code {
                Some(code) => Ok(Outcome::Error {
                    code: code.to_owned(),
                    message: error
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                }),
                None => Err(ProgramError::Malformed {
                    component: self.component.clone(),
                    body,
                }),
            };
        }
        if !(200..300).contains(&status) {
            return Err(ProgramError::Failed {
                component: self.component.clone(),
                status,
                body,
            });
        }
        match value.get("reply") {
            Some(reply) => Ok(Outcome::Reply(reply.clone())),
            None => Err(ProgramError::Malformed {
                component: self.component.clone(),
                body,
            }),
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
            .map_err(|error| ProgramError::Unreachable {
                component: self.component.clone(),
                message: error.to_string(),
            })
    }
}
