//! The HTTP/1.1 hop from the agent to its program on 127.0.0.1: hyper's pooled client, kept-alive
//! connections, and nothing else in between.
//!
//! Not reqwest, which the agent uses elsewhere: on this hop, taken by every call, its layers cost
//! a quarter of a served call's instructions (a URL parsed and printed again per request, a
//! redirect policy and a retry layer cloning each request; docs/benchmarks.md, "Where a call's
//! cost goes"). The time limit covers the whole exchange, as reqwest's did: connecting, the
//! request, and the answer to its last byte.

use crate::errors::described;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::{timeout_at, Instant};

/// How long a connection to the program is kept idle.
const IDLE: std::time::Duration = std::time::Duration::from_secs(50);

/// How a request to the program failed.
#[derive(Debug)]
pub enum Failure {
    /// Not answered within its limit.
    TimedOut,
    /// No connection, or the connection failed.
    Unreachable(String),
    /// The answer is longer than the most taken.
    TooLarge,
}

/// The pooled connections to one program.
#[derive(Clone)]
pub struct Hop {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `127.0.0.1:<port>`.
    authority: hyper::http::uri::Authority,
}

/// The program's answer: its status, its body still to read, by the request's deadline.
pub struct Answer {
    status: StatusCode,
    length: Option<u64>,
    body: Incoming,
    until: Instant,
}

impl Hop {
    pub fn new(port: u16) -> Self {
        let mut connector = HttpConnector::new();
        // A request is one write; nothing to gain by holding it back.
        connector.set_nodelay(true);
        Self {
            // Idle connections closed after 50 s, by a reaper of their own: before the
            // TypeScript SDK's server closes them (60 s), so one it is closing is not taken for
            // a call; without the timer an idle connection (a Python SDK thread each) stayed.
            client: Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(IDLE)
                .build(connector),
            authority: format!("127.0.0.1:{port}")
                .parse()
                .expect("a loopback authority"),
        }
    }

    /// `method path` with `headers` and a JSON `body` (none for a GET), answered by `until`.
    pub async fn send(
        &self,
        (method, path): (Method, &str),
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
        body: Option<Vec<u8>>,
        until: Instant,
    ) -> Result<Answer, Failure> {
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|error| Failure::Unreachable(format!("{path}: {error}")))?;
        let mut request = Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let body = Full::new(body.map(Bytes::from).unwrap_or_default());
        let request = request
            .body(body)
            .map_err(|error| Failure::Unreachable(error.to_string()))?;
        let response = timeout_at(until, self.client.request(request))
            .await
            .map_err(|_| Failure::TimedOut)?
            .map_err(|error| Failure::Unreachable(format!("{path}: {}", described(&error))))?;
        let length = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|length| length.to_str().ok()?.parse().ok());
        let (parts, body) = response.into_parts();
        Ok(Answer {
            status: parts.status,
            length,
            body,
            until,
        })
    }
}

impl Answer {
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The body, read up to `most` bytes by the request's deadline: a longer one is refused
    /// with the rest unread.
    pub async fn bytes(mut self, most: usize) -> Result<Vec<u8>, Failure> {
        if self.length.is_some_and(|length| length > most as u64) {
            return Err(Failure::TooLarge);
        }
        let mut body = Vec::with_capacity(self.length.unwrap_or(0) as usize);
        loop {
            let frame = timeout_at(self.until, self.body.frame())
                .await
                .map_err(|_| Failure::TimedOut)?;
            let Some(frame) = frame else {
                return Ok(body);
            };
            let frame = frame.map_err(|error| Failure::Unreachable(described(&error)))?;
            if let Ok(data) = frame.into_data() {
                if body.len() + data.len() > most {
                    return Err(Failure::TooLarge);
                }
                body.extend_from_slice(&data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The time limit covers the answer to its last byte, as reqwest's did: a program that
    /// sends its head and stalls in its body is past it, not waited for.
    #[tokio::test]
    async fn the_limit_covers_the_body_and_a_closed_port_is_unreachable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0; 1024];
            let _ = stream.read(&mut request).await.unwrap();
            let head = "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{\"";
            stream.write_all(head.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let until = Instant::now() + Duration::from_millis(300);
        let answer = Hop::new(port)
            .send(
                (Method::POST, "/operations/a"),
                [],
                Some(b"{}".to_vec()),
                until,
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let read = answer.bytes(1024).await;
        assert!(matches!(read, Err(Failure::TimedOut)), "{read:?}");
        assert!(Instant::now() < until + Duration::from_millis(200));

        let closed = closed_port();
        let until = Instant::now() + Duration::from_secs(5);
        let sent = Hop::new(closed)
            .send((Method::GET, "/program"), [], None, until)
            .await;
        let Err(Failure::Unreachable(message)) = sent else {
            panic!("not unreachable")
        };
        assert!(message.contains("refused"), "{message}");
    }

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }
}
