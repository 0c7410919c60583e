//! The client of the agents' control endpoint (`POST /control/halt`, `POST /control/resume`,
//! `GET /control/status` on the pod IP, port [`CONTROL_PORT`]), behind [`AgentControl`] so the
//! controller can be tested without pods.
//!
//! Every request is signed with the composition's token ([`toa_context::control::Signed`]: an
//! HMAC over the method, path, body, the pod it is for and the time; the token never travels) and
//! gives up after [`TIMEOUT`]: the reconcile loop never waits long on a slow agent; it records the
//! pod as unreachable and asks again on the next reconcile. An answer is trusted no further than
//! it must be: no redirects or proxies, at most [`MAX_ANSWER`] bytes read, the status's
//! `instance` must be the pod asked (an IP another pod took answers as someone else), and the
//! words of an error are cut to [`MAX_WORDS`] characters before they reach a condition. Errors
//! say whether trying again can help.

use crate::halt::AgentStatus;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;
use toa_context::control::{
    HaltRequest, Signed, CONTROL_PORT, HALT_PATH, RESUME_PATH, STATUS_PATH,
};

/// How long one control request may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The most of an answer read: a status is a few hundred bytes.
pub const MAX_ANSWER: usize = 64 * 1024;

/// The most characters of an agent's error quoted (in logs and conditions).
pub const MAX_WORDS: usize = 200;

/// The pod a control request goes to: its name (what the request is signed for, and what its
/// agent must answer as) and its IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub name: &'a str,
    pub ip: IpAddr,
}

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
    fn status<'a>(&'a self, pod: Target<'a>, keys: &'a Keys) -> Reply<'a>;
    fn halt<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a>;
    fn resume<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a>;
}

/// A Composition's control tokens (its Secret's `token` and, during a rotation, `previous`).
/// Requests are signed with the current one; an agent that has not read it yet answers 401, and
/// the request is signed again with the previous one.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub current: String,
    pub previous: Option<String>,
}

/// Key ids only: a token never reaches a log through `{:?}`.
impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use toa_context::control::key_id;
        f.debug_struct("Keys")
            .field("current", &key_id(&self.current))
            .field("previous", &self.previous.as_deref().map(key_id))
            .finish()
    }
}

impl Keys {
    /// One token, no rotation under way.
    pub fn one(token: &str) -> Self {
        Self {
            current: token.to_owned(),
            previous: None,
        }
    }
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
            // Idle connections go before the agent closes them (reqwest keeps them 90 s): a
            // request sent on one the agent is closing fails, and a halt then waits a poll.
            .pool_idle_timeout(toa_context::control::HEADER_READ / 2)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        Ok(Self { client, port })
    }

    /// Sends one request to `pod`, signed with the current token and, when the agent refuses it
    /// (401: a rotation it has not read yet), with the previous one; reads its status.
    async fn send(
        &self,
        pod: Target<'_>,
        method: reqwest::Method,
        path: &str,
        body: Option<&HaltRequest>,
        keys: &Keys,
        what: &str,
    ) -> Result<AgentStatus, ControlError> {
        let body = body.map_or_else(Vec::new, |body| serde_json::to_vec(body).expect("JSON"));
        let first = self
            .send_signed(pod, &method, path, &body, &keys.current, what)
            .await;
        let answered = match (first, &keys.previous) {
            (Err(Refused::Unauthorized(_)), Some(previous)) => {
                self.send_signed(pod, &method, path, &body, previous, what)
                    .await
            }
            (first, _) => first,
        };
        answered.map_err(|refused| match refused {
            Refused::Unauthorized(error) | Refused::Other(error) => error,
        })
    }

    /// One request, signed with `token`.
    async fn send_signed(
        &self,
        pod: Target<'_>,
        method: &reqwest::Method,
        path: &str,
        body: &[u8],
        token: &str,
        what: &str,
    ) -> Result<AgentStatus, Refused> {
        let nonce = format!("{:032x}", rand::random::<u128>());
        let signed = Signed {
            method: method.as_str(),
            path,
            pod: pod.name,
            ts: now_s(),
            nonce: &nonce,
            body,
        };
        let url = format!("http://{}{path}", SocketAddr::new(pod.ip, self.port));
        let mut request = self
            .client
            .request(method.clone(), url)
            .header(reqwest::header::AUTHORIZATION, signed.authorization(token));
        if method == reqwest::Method::POST {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        let response = request
            .send()
            .await
            .map_err(|error| ControlError::Transient(format!("{what}: {}", describe(&error))))?;
        answered(pod, what, response).await
    }
}

/// The agent's answer to one request: its status, when the request was taken and the status is
/// the pod's own.
async fn answered(
    pod: Target<'_>,
    what: &str,
    response: reqwest::Response,
) -> Result<AgentStatus, Refused> {
    let code = response.status();
    let answer = read_capped(response)
        .await
        .map_err(|message| ControlError::Transient(format!("{what}: {message}")))?;
    if !code.is_success() {
        let words = quote(&String::from_utf8_lossy(&answer));
        let message = format!("{what}: answered {code}: {words}");
        return Err(match code {
            reqwest::StatusCode::UNAUTHORIZED => {
                Refused::Unauthorized(ControlError::Permanent(message))
            }
            code if code.is_server_error() || code == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                Refused::Other(ControlError::Transient(message))
            }
            _ => Refused::Other(ControlError::Permanent(message)),
        });
    }
    let status: AgentStatus = serde_json::from_slice(&answer).map_err(|error| {
        ControlError::Permanent(format!(
            "{what}: expected the status JSON {{phase, halt, instance, calls}}, got an answer that does not parse: {error}"
        ))
    })?;
    if status.instance != pod.name {
        return Err(Refused::Other(ControlError::Permanent(format!(
            "{what}: answered as {:?}, not as the pod {}: another process holds its IP",
            quote(&status.instance),
            pod.name
        ))));
    }
    Ok(status)
}

/// Why one signed request failed: its token was refused (another may be taken), or otherwise.
enum Refused {
    Unauthorized(ControlError),
    Other(ControlError),
}

impl From<ControlError> for Refused {
    fn from(error: ControlError) -> Self {
        Self::Other(error)
    }
}

impl AgentControl for HttpAgentControl {
    fn status<'a>(&'a self, pod: Target<'a>, keys: &'a Keys) -> Reply<'a> {
        Box::pin(async move {
            let what = format!("status of {}", pod.name);
            self.send(pod, reqwest::Method::GET, STATUS_PATH, None, keys, &what)
                .await
        })
    }

    fn halt<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a> {
        Box::pin(self.post_halt(pod, keys, HALT_PATH, "halt", halt))
    }

    fn resume<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a> {
        Box::pin(self.post_halt(pod, keys, RESUME_PATH, "resume", halt))
    }
}

impl HttpAgentControl {
    /// `POST {"halt": id}` to `path` (halt or resume).
    async fn post_halt(
        &self,
        pod: Target<'_>,
        keys: &Keys,
        path: &str,
        action: &str,
        halt: &str,
    ) -> Result<AgentStatus, ControlError> {
        let body = HaltRequest {
            halt: halt.to_owned(),
        };
        let what = format!("{action} {halt} on {}", pod.name);
        self.send(pod, reqwest::Method::POST, path, Some(&body), keys, &what)
            .await
    }
}

/// The answer's body, at most [`MAX_ANSWER`] bytes.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| format!("the answer broke off: {}", describe(&error)))?
    {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(format!(
                "the answer is longer than {MAX_ANSWER} bytes; a status is a few hundred"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// One line of an agent's words, at most [`MAX_WORDS`] characters.
fn quote(words: &str) -> String {
    let line = words.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_WORDS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
