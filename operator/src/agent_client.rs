//! The client of the agents' control endpoint (`POST /control/halt`, `POST /control/resume`,
//! `GET /control/status` on the pod IP, port [`CONTROL_PORT`]), behind [`AgentControl`] so the
//! controller can be tested without pods.
//!
//! Every request carries the composition's token as `Authorization: Bearer` and gives up after
//! [`TIMEOUT`]: the reconcile loop never waits long on a slow agent; it records the pod as
//! unreachable and asks again on the next reconcile. Errors say whether trying again can help.

use crate::halt::AgentStatus;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;
use toa_context::control::{HaltRequest, CONTROL_PORT, HALT_PATH, RESUME_PATH, STATUS_PATH};

/// How long one control request may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Why a control request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Timed out, refused, or a 5xx: the agent may answer later.
    #[error("{0}")]
    Transient(String),
    /// 401 (wrong token), 409 (paused for another halt) or another refusal that the same request
    /// will get again.
    #[error("{0}")]
    Permanent(String),
}

impl ControlError {
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient(_))
    }
}

pub type Reply<'a> = Pin<Box<dyn Future<Output = Result<AgentStatus, ControlError>> + Send + 'a>>;

/// The control endpoint of one pod's agent, addressed by the pod's IP.
pub trait AgentControl: Send + Sync + 'static {
    fn status<'a>(&'a self, pod: IpAddr, token: &'a str) -> Reply<'a>;
    fn halt<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a>;
    fn resume<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a>;
}

/// [`AgentControl`] over HTTP.
#[derive(Debug, Clone)]
pub struct HttpAgentControl {
    client: reqwest::Client,
    port: u16,
}

impl HttpAgentControl {
    /// A client for agents listening on [`CONTROL_PORT`].
    pub fn new() -> Result<Self, reqwest::Error> {
        Self::with_port(CONTROL_PORT)
    }

    /// A client for agents listening on `port` (tests run agents on free ports).
    pub fn with_port(port: u16) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .build()?;
        Ok(Self { client, port })
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
        token: &str,
    ) -> Result<AgentStatus, ControlError> {
        let response =
            request.bearer_auth(token).send().await.map_err(|error| {
                ControlError::Transient(format!("{what}: {}", describe(&error)))
            })?;
        let code = response.status();
        if code.is_success() {
            return response.json::<AgentStatus>().await.map_err(|error| {
                ControlError::Permanent(format!(
                    "{what}: expected the status JSON {{phase, halt, instance, calls}}, got an answer that does not parse: {error}"
                ))
            });
        }
        let body = response.text().await.unwrap_or_default();
        let message = format!("{what}: answered {code}: {}", body.trim());
        if code.is_server_error() || code == reqwest::StatusCode::TOO_MANY_REQUESTS {
            Err(ControlError::Transient(message))
        } else {
            Err(ControlError::Permanent(message))
        }
    }

    fn url(&self, pod: IpAddr, path: &str) -> String {
        format!("http://{}{path}", SocketAddr::new(pod, self.port))
    }
}

impl AgentControl for HttpAgentControl {
    fn status<'a>(&'a self, pod: IpAddr, token: &'a str) -> Reply<'a> {
        Box::pin(async move {
            let request = self.client.get(self.url(pod, STATUS_PATH));
            self.send(request, &format!("status of {pod}"), token).await
        })
    }

    fn halt<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a> {
        Box::pin(async move {
            let request = self
                .client
                .post(self.url(pod, HALT_PATH))
                .json(&HaltRequest {
                    halt: halt.to_owned(),
                });
            self.send(request, &format!("halt {halt} on {pod}"), token)
                .await
        })
    }

    fn resume<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a> {
        Box::pin(async move {
            let request = self
                .client
                .post(self.url(pod, RESUME_PATH))
                .json(&HaltRequest {
                    halt: halt.to_owned(),
                });
            self.send(request, &format!("resume {halt} on {pod}"), token)
                .await
        })
    }
}

fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        format!("no answer within {} s", TIMEOUT.as_secs())
    } else if error.is_connect() {
        "connection refused or unreachable".to_owned()
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests;
