//! Bounded waits: a condition polled until a deadline, never a sleep that hopes.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(200);

/// Polls `check` until it answers `Ok`, at most `timeout`; panics with `what` and the last `Err`
/// (what was seen instead) when the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting until {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Checks that `check` holds, again and again, for `duration`; panics with `what` and what was
/// seen the first time it does not. For "nothing happens" properties.
pub async fn always<F, Fut>(what: &str, duration: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let end = Instant::now() + duration;
    while Instant::now() < end {
        if let Err(seen) = check().await {
            panic!("expected that {what}, all along {duration:?}; seen: {seen}");
        }
        tokio::time::sleep(POLL).await;
    }
}
