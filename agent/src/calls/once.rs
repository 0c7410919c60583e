//! A call given an idempotency `key` runs once: the receiving side (the callee's agent, or the
//! process itself for an in-process call) claims the key before the program is asked, and a repeat
//! gets the first call's outcome (see [`crate::coordination::atom::repeats`] for the records).
//! Without a key a call simply runs.
//!
//! A key on an operation that writes to a component's store (a transition, an assignment) is
//! not Redis's: the store keeps it as a record with the write, in one transaction, as it does
//! for an operation declaring `once` ([`crate::entities::store::Record`]); [`keys`] tells
//! which.

use crate::component::client::{Outcome, ProgramError};
use crate::coordination::atom::repeats::{input_hash, Claim, Repeats, Stored, MAX_STORED};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// What became of a call.
#[derive(Debug)]
pub enum Once {
    /// It ran (no key, or the first with its key).
    Ran(Result<Outcome, ProgramError>),
    /// A repeat: the first call's outcome, without running.
    Repeated(Outcome),
    /// The key cannot be honoured: another input, or the first outcome was too large to keep.
    Refused(String),
    /// The first call with the key still ran when this one's time was up.
    StillRunning,
    /// The records cannot be reached (Redis down, or no atomicity in a pod): not run, so as not
    /// to run twice.
    Unavailable(String),
}

/// How often a repeat asks whether the first call finished.
const POLL: Duration = Duration::from_millis(50);

/// The most characters of a key.
pub const MAX_KEY: usize = 256;

/// Runs `run` unless a call of `operation` with `key` ran (or runs) already. `until`: when this
/// call's caller stops waiting (a repeat waits for the first call until then); `window`: how long
/// the outcome answers repeats.
pub async fn run_once<F>(
    repeats: &Repeats,
    operation: &str,
    key: Option<&str>,
    input: &Value,
    until: Instant,
    window: Duration,
    run: F,
) -> Once
where
    F: Future<Output = Result<Outcome, ProgramError>>,
{
    let run = std::pin::pin!(run); // awaited by reference: by value it was held here thrice
    let Some(key) = key else {
        return Once::Ran(run.await);
    };
    let hash = input_hash(input);
    let mut run = Some(run);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match repeats.claim(operation, key, &hash, left).await {
            Err(error) => return Once::Unavailable(error.to_string()),
            Ok(Claim::Run) => {
                let result = run.take().expect("a claim is won once").await;
                let recorded = match &result {
                    Ok(outcome) => {
                        let stored = match outcome.clone() {
                            Outcome::Reply(reply) => Stored::Reply(reply),
                            Outcome::Error { code, message } => Stored::Error { code, message },
                        };
                        repeats.done(operation, key, &hash, stored, window).await
                    }
                    Err(_) => repeats.failed(operation, key).await,
                };
                if let Err(error) = recorded {
                    tracing::warn!(%error, operation, "the outcome of a call with a key was not recorded: a repeat may run again once its claim expires");
                }
                return Once::Ran(result);
            }
            Ok(Claim::Done(Stored::Reply(reply))) => return Once::Repeated(Outcome::Reply(reply)),
            Ok(Claim::Done(Stored::Error { code, message })) => {
                return Once::Repeated(Outcome::Error { code, message })
            }
            Ok(Claim::Done(Stored::TooLarge { bytes })) => {
                return Once::Refused(format!(
                    "{operation}: the first call with this key answered {bytes} bytes, more than \
                     the {MAX_STORED} kept for repeats; it is not run again"
                ))
            }
            Ok(Claim::OtherInput) => {
                return Once::Refused(format!(
                    "{operation}: the key was given with another input within its window \
                     (limits.idempotency); a key names one call"
                ))
            }
            Ok(Claim::Running) if left.is_zero() => return Once::StillRunning,
            Ok(Claim::Running) => tokio::time::sleep(POLL.min(left)).await,
        }
    }
}

/// A call's key, as the store's (for an operation that writes to `objects`) or as Redis's
/// (any other): `(store's, Redis's)`.
pub fn keys<'a>(
    objects: Option<&crate::entities::objects::Objects>,
    operation: &str,
    key: Option<&'a str>,
) -> (Option<&'a str>, Option<&'a str>) {
    if objects.is_some_and(|objects| objects.records(operation)) {
        (key, None)
    } else {
        (None, key)
    }
}

/// The request contract's rule for a key: 1 to [`MAX_KEY`] characters, none of them control
/// characters.
pub fn check_key(key: &str) -> Result<(), InvalidKey> {
    let length = key.chars().count();
    if length == 0 || length > MAX_KEY || key.chars().any(char::is_control) {
        return Err(InvalidKey { length });
    }
    Ok(())
}

/// A key the request contract refuses; `length` in characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`key`: expected 1 to {max} characters without control characters, got {length}", max = MAX_KEY)]
pub struct InvalidKey {
    length: usize,
}
