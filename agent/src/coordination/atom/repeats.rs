//! Repeats of a call given an idempotency key: the first call with a key runs; a second one with
//! the same key (on the same operation, within the window) gets the first one's outcome instead
//! of running again. Across replicas the record lives on the first Redis server, like `meter`'s
//! debts; a local run without atomicity keeps it in the process.
//!
//! A record is `running:<input hash>` while the first call runs (it expires after the call's own
//! limit, so a process that died under it frees the key), then `done:<input hash>:<outcome>` for
//! the window. A failure removes it: a failed call is not an outcome to repeat, and the next call
//! with the key runs. The key with another input is refused (the hash differs). An outcome larger
//! than [`MAX_STORED`] is recorded as too large, and a repeat is refused saying so.

use super::keys::Scope;
use super::AtomError;
use crate::coordination::expiring::Expiring;
use crate::coordination::group::Group;
use crate::coordination::redis::Servers;
use redis::Script;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

/// The largest outcome kept for repeats, in bytes of JSON.
pub const MAX_STORED: usize = 64 * 1024;

/// KEYS[1]: the record. ARGV[1]: the `running:` value, ARGV[2]: its time to live (ms).
/// Claims the key when free; otherwise returns the record.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local record = redis.call('GET', KEYS[1])
if record then return record end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
",
    )
});

/// What the first call with a key ended with, as kept for its repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stored {
    Reply(Value),
    Error {
        code: String,
        message: Option<String>,
    },
    /// The outcome was larger than [`MAX_STORED`]: not kept.
    TooLarge {
        bytes: usize,
    },
}

/// What a call with a key may do.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Run it, then [`Repeats::done`] or [`Repeats::failed`].
    Run,
    /// The first call's outcome.
    Done(Stored),
    /// The first call still runs: ask again.
    Running,
    /// The key was used with another input.
    OtherInput,
}

/// One component's records of repeats.
pub enum Repeats {
    Redis {
        servers: Arc<Servers>,
        prefix: String,
    },
    Local(Mutex<Expiring>),
    /// Kept by the first process of a local group.
    Group {
        group: Arc<Group>,
        prefix: String,
    },
    /// A pod without atomicity: replicas cannot see each other's records.
    Disabled,
}

/// The record's text for a claim.
fn running(hash: &str) -> String {
    format!("running:{hash}")
}

/// A hash of `input`, the same whatever the order of its objects' keys.
pub fn input_hash(input: &Value) -> String {
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for key in keys {
                    out.push_str(&serde_json::to_string(key).expect("a string"));
                    out.push(':');
                    canonical(&map[key], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for item in items {
                    canonical(item, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = String::new();
    canonical(input, &mut text);
    hex(&Sha256::digest(text.as_bytes()))
}

/// Lowercase hex of `bytes` (hashed keys in Redis).
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a record against the input's hash.
fn read(record: &str, hash: &str) -> Claim {
    let (state, rest) = record.split_once(':').unwrap_or((record, ""));
    let (recorded, outcome) = rest.split_once(':').unwrap_or((rest, ""));
    if recorded != hash {
        return Claim::OtherInput;
    }
    match state {
        "done" => serde_json::from_str(outcome).map_or(Claim::Running, Claim::Done),
        _ => Claim::Running,
    }
}

impl Repeats {
    pub fn redis(servers: Arc<Servers>, scope: &Scope) -> Self {
        Self::Redis {
            servers,
            prefix: format!("{}repeat:", scope.prefix()),
        }
    }

    pub fn local() -> Self {
        Self::Local(Mutex::default())
    }

    pub fn group(group: Arc<Group>, scope: &Scope) -> Self {
        let prefix = format!("{}repeat:", scope.prefix());
        Self::Group { group, prefix }
    }

    /// The record's key: the operation and a hash of the caller's key (any text, bounded).
    fn key(&self, operation: &str, key: &str) -> String {
        let hashed = hex(&Sha256::digest(key.as_bytes()));
        match self {
            Self::Redis { prefix, .. } | Self::Group { prefix, .. } => {
                format!("{prefix}{operation}:{hashed}")
            }
            _ => format!("{operation}:{hashed}"),
        }
    }

    /// Claims `key` for a call of `operation` with `input`, or says what became of the first.
    /// `limit`: how long the claim holds if this call never reports back.
    pub async fn claim(
        &self,
        operation: &str,
        key: &str,
        hash: &str,
        limit: Duration,
    ) -> Result<Claim, AtomError> {
        let record = self.key(operation, key);
        match self {
            Self::Redis { servers, .. } => {
                let mut invocation = CLAIM.prepare_invoke();
                invocation
                    .key(&record)
                    .arg(running(hash))
                    .arg(limit.as_millis().max(1) as u64);
                let found: Option<String> = servers.first().invoke_prepared(&invocation).await?;
                Ok(found.map_or(Claim::Run, |found| read(&found, hash)))
            }
            Self::Local(records) => {
                let found = records
                    .lock()
                    .expect("records")
                    .claim(&record, running(hash), limit);
                Ok(found.map_or(Claim::Run, |found| read(&found, hash)))
            }
            Self::Group { group, .. } => {
                let ttl_ms = limit.as_millis().max(1) as u64;
                let found = group.claim(record, running(hash), ttl_ms).await?;
                Ok(found.map_or(Claim::Run, |found| read(&found, hash)))
            }
            Self::Disabled => Err(AtomError::RequiresAtomicity("a call with a key")),
        }
    }

    /// The claimed call ended with `outcome`: its repeats get it for `window`.
    pub async fn done(
        &self,
        operation: &str,
        key: &str,
        hash: &str,
        outcome: Stored,
        window: Duration,
    ) -> Result<(), AtomError> {
        let mut text = serde_json::to_string(&outcome).expect("JSON");
        if text.len() > MAX_STORED {
            let bytes = text.len();
            text = serde_json::to_string(&Stored::TooLarge { bytes }).expect("JSON");
        }
        let value = format!("done:{hash}:{text}");
        let record = self.key(operation, key);
        match self {
            Self::Redis { servers, .. } => {
                let mut cmd = redis::cmd("SET");
                cmd.arg(&record)
                    .arg(value)
                    .arg("PX")
                    .arg(window.as_millis().max(1) as u64);
                servers.first().query::<()>(&cmd).await?;
            }
            Self::Local(records) => records.lock().expect("records").set(&record, value, window),
            Self::Group { group, .. } => {
                let ttl_ms = window.as_millis().max(1) as u64;
                group.set(record, value, ttl_ms).await?;
            }
            Self::Disabled => {}
        }
        Ok(())
    }

    /// The claimed call failed: the key is free again.
    pub async fn failed(&self, operation: &str, key: &str) -> Result<(), AtomError> {
        let record = self.key(operation, key);
        match self {
            Self::Redis { servers, .. } => {
                servers
                    .first()
                    .query::<()>(redis::cmd("DEL").arg(&record))
                    .await?;
            }
            Self::Local(records) => {
                records.lock().expect("records").remove(&record);
            }
            Self::Group { group, .. } => {
                group.delete(record).await?;
            }
            Self::Disabled => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_repeat_gets_the_first_outcome_another_input_is_refused_a_failure_frees_the_key() {
        let repeats = Repeats::local();
        let limit = Duration::from_secs(5);
        let window = Duration::from_secs(60);
        let hash = input_hash(&json!({"a": 1, "b": [1, {"c": 2, "d": 3}]}));
        assert_eq!(
            hash,
            input_hash(&json!({"b": [1, {"d": 3, "c": 2}], "a": 1})),
            "the order of keys does not matter"
        );
        let other = input_hash(&json!({"a": 2}));
        assert_eq!(
            repeats.claim("op", "k", &hash, limit).await.unwrap(),
            Claim::Run
        );
        assert_eq!(
            repeats.claim("op", "k", &hash, limit).await.unwrap(),
            Claim::Running
        );
        assert_eq!(
            repeats.claim("op", "k", &other, limit).await.unwrap(),
            Claim::OtherInput
        );
        // Another operation, the same key: its own record.
        assert_eq!(
            repeats.claim("op2", "k", &hash, limit).await.unwrap(),
            Claim::Run
        );
        let reply = Stored::Reply(json!({"charged": 5}));
        repeats
            .done("op", "k", &hash, reply.clone(), window)
            .await
            .unwrap();
        assert_eq!(
            repeats.claim("op", "k", &hash, limit).await.unwrap(),
            Claim::Done(reply)
        );
        repeats.failed("op2", "k").await.unwrap();
        assert_eq!(
            repeats.claim("op2", "k", &hash, limit).await.unwrap(),
            Claim::Run
        );
    }

    #[tokio::test]
    async fn a_too_large_outcome_is_told_and_a_claim_expires_with_its_calls_limit() {
        let repeats = Repeats::local();
        let limit = Duration::from_secs(5);
        let window = Duration::from_secs(60);
        let hash = input_hash(&json!({"a": 1}));
        assert_eq!(
            repeats.claim("op2", "k", &hash, limit).await.unwrap(),
            Claim::Run
        );
        // Too large to keep: the repeat is told so.
        let large = Stored::Reply(json!("x".repeat(MAX_STORED)));
        repeats
            .done("op2", "k", &hash, large, window)
            .await
            .unwrap();
        match repeats.claim("op2", "k", &hash, limit).await.unwrap() {
            Claim::Done(Stored::TooLarge { bytes }) => assert!(bytes > MAX_STORED),
            other => panic!("expected too large, got {other:?}"),
        }
        // A claim expires with its call's limit: a process that died under it frees the key.
        assert_eq!(
            repeats
                .claim("op3", "k", &hash, Duration::from_millis(20))
                .await
                .unwrap(),
            Claim::Run
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(
            repeats.claim("op3", "k", &hash, limit).await.unwrap(),
            Claim::Run
        );
    }
}
