//! `toa-operator probe URL`: asks an operator's `/ready` (or any plain-HTTP URL) until it answers
//! 200, for the chart's `helm test`, which runs it in a pod of the operator's own image (no other
//! image is needed, and the image has no shell or HTTP client).

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long one attempt may take, and the wait between attempts.
const ATTEMPT: Duration = Duration::from_secs(2);
/// The most of an answer read: its status line is at the start.
const ANSWER: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0:?} is not an http://HOST:PORT/PATH URL")]
    Url(String),
    #[error("{url} did not answer 200 within {seconds} s; last: {last}")]
    NotReady {
        url: String,
        seconds: u64,
        last: String,
    },
}

/// Where a plain-HTTP URL points.
#[derive(Debug, PartialEq)]
struct Target {
    authority: String,
    path: String,
}

fn target(url: &str) -> Result<Target, ProbeError> {
    let bad = || ProbeError::Url(url.to_owned());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    let path = if path.is_empty() { "/" } else { path };
    Ok(Target {
        authority: authority.to_owned(),
        path: path.to_owned(),
    })
}

/// Asks `url` every [`ATTEMPT`] until it answers 200 or `timeout` has passed.
pub async fn probe(url: &str, timeout: Duration) -> Result<(), ProbeError> {
    let target = target(url)?;
    let deadline = Instant::now() + timeout;
    loop {
        let started = Instant::now();
        let last = match tokio::time::timeout(ATTEMPT, status_line(&target)).await {
            Ok(Ok(line)) if line.split(' ').nth(1) == Some("200") => return Ok(()),
            Ok(Ok(line)) => line,
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {} s", ATTEMPT.as_secs()),
        };
        tracing::info!(url, last, "not ready yet");
        if started + ATTEMPT >= deadline {
            return Err(ProbeError::NotReady {
                url: url.to_owned(),
                seconds: timeout.as_secs(),
                last,
            });
        }
        tokio::time::sleep_until(started + ATTEMPT).await;
    }
}

/// The first line of the answer to a GET of `target`.
async fn status_line(target: &Target) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(&target.authority).await?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.path, target.authority
    );
    stream.write_all(request.as_bytes()).await?;
    // Up to the status line's end: a server that keeps the connection open is not waited for.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    while !answer.contains(&b'\n') && answer.len() < ANSWER {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or("an empty answer").to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn only_plain_http_urls_with_a_port() {
        assert_eq!(
            target("http://toa-operator.toa.svc:8080/ready").unwrap(),
            Target {
                authority: "toa-operator.toa.svc:8080".to_owned(),
                path: "/ready".to_owned()
            }
        );
        assert_eq!(target("http://10.0.0.1:80").unwrap().path, "/");
        for bad in [
            "https://a:1/ready",
            "http://a/ready",
            "http://:8080/",
            "a:1",
        ] {
            assert!(
                matches!(target(bad), Err(ProbeError::Url(_))),
                "{bad} taken"
            );
        }
    }

    #[tokio::test]
    async fn waits_for_ready_and_names_the_last_answer() {
        let ready = Arc::new(AtomicBool::new(false));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/ready", listener.local_addr().unwrap());
        let router = crate::http::router(crate::metrics::Metrics::default(), ready.clone());
        tokio::spawn(crate::http::serve(listener, router, std::future::pending()));
        // Starting (503) throughout: refused, naming the answer.
        let error = probe(&url, Duration::from_secs(1)).await.unwrap_err();
        assert!(
            error.to_string().contains("503 Service Unavailable"),
            "{error}"
        );
        // Ready after a first 503: the probe waits for it.
        let later = ready.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            later.store(true, std::sync::atomic::Ordering::Release);
        });
        probe(&url, Duration::from_secs(10)).await.unwrap();
        // Nothing listening: refused, naming the connection's error.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let error = probe(&format!("http://{closed}/ready"), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("refused"), "{error}");
    }

    #[tokio::test]
    async fn a_server_that_keeps_the_connection_open_is_read_to_its_status_line() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/ready", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 512];
            let _ = stream.read(&mut request).await;
            stream.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
            // Neither the rest nor the end: the answer's first line is all the probe reads.
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        tokio::time::timeout(Duration::from_secs(5), probe(&url, Duration::from_secs(1)))
            .await
            .expect("the probe returned")
            .unwrap();
    }
}
