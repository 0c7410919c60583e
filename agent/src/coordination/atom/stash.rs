//! The stash: what every replica of a component should see (seed 001: "What has to survive
//! belongs in the entity. What every replica should see belongs in the stash."). JSON values
//! under the component's own keys, each with a time to live the caller must give (at most 30
//! days): a cache of something fetched once for all replicas, a flag, a short-lived token. Kept
//! on the first atomicity server (one `SET … PX`, no quorum: the stash is not a record); in a
//! local run without atomicity, in the process (or the first process of its local group); in a pod without atomicity, refused as `lock` is.

use super::keys::Scope;
use super::AtomError;
use crate::coordination::expiring::Expiring;
use crate::coordination::group::Group;
use crate::coordination::redis::Servers;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest time to live a value is given: 30 days.
pub const MAX_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
/// The largest value kept, as JSON: 1 MiB.
pub const MAX_VALUE: usize = 1024 * 1024;

pub enum Stash {
    Redis {
        servers: Arc<Servers>,
        prefix: String,
    },
    /// Key → the value as JSON.
    Local(Mutex<Expiring>),
    /// Kept by the first process of a local group, under the component's keys.
    Group {
        group: Arc<Group>,
        prefix: String,
    },
    Disabled,
}

impl Stash {
    pub fn redis(servers: Arc<Servers>, scope: &Scope) -> Self {
        let prefix = format!("{}stash:", scope.prefix());
        Self::Redis { servers, prefix }
    }

    pub fn local() -> Self {
        Self::Local(Mutex::default())
    }

    pub fn group(group: Arc<Group>, scope: &Scope) -> Self {
        let prefix = format!("{}stash:", scope.prefix());
        Self::Group { group, prefix }
    }

    /// The value under `key`, or `None` (never set, expired or deleted).
    pub async fn get(&self, key: &str) -> Result<Option<Value>, AtomError> {
        let text = match self {
            Self::Redis { servers, prefix } => {
                let get = redis::cmd("GET").arg(format!("{prefix}{key}")).clone();
                servers.first().query::<Option<String>>(&get).await?
            }
            Self::Local(values) => values.lock().expect("stash").get(key).map(str::to_owned),
            Self::Group { group, prefix } => group.get(format!("{prefix}{key}")).await?,
            Self::Disabled => return Err(AtomError::RequiresAtomicity("stash")),
        };
        text.map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|_| AtomError::Protocol(format!("the stash's {key:?} holds no JSON")))
    }

    /// Keeps `value` under `key` for `ttl_ms`, replacing what was there.
    pub async fn set(&self, key: &str, value: &Value, ttl_ms: u64) -> Result<(), AtomError> {
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(AtomError::InvalidStash(format!(
                "ttl: expected 1 to {MAX_TTL_MS} ms (30 days), got {ttl_ms}; nothing was kept"
            )));
        }
        let text = value.to_string();
        if text.len() > MAX_VALUE {
            return Err(AtomError::InvalidStash(format!(
                "value: expected at most {MAX_VALUE} bytes of JSON, got {}; nothing was kept",
                text.len()
            )));
        }
        match self {
            Self::Redis { servers, prefix } => {
                let mut set = redis::cmd("SET");
                set.arg(format!("{prefix}{key}"))
                    .arg(text)
                    .arg("PX")
                    .arg(ttl_ms);
                servers.first().query::<()>(&set).await?;
            }
            Self::Local(values) => {
                let ttl = Duration::from_millis(ttl_ms);
                values.lock().expect("stash").set(key, text, ttl);
            }
            Self::Group { group, prefix } => {
                group.set(format!("{prefix}{key}"), text, ttl_ms).await?;
            }
            Self::Disabled => return Err(AtomError::RequiresAtomicity("stash")),
        }
        Ok(())
    }

    /// Removes `key`; whether a live value was there.
    pub async fn delete(&self, key: &str) -> Result<bool, AtomError> {
        match self {
            Self::Redis { servers, prefix } => {
                let del = redis::cmd("DEL").arg(format!("{prefix}{key}")).clone();
                Ok(servers.first().query::<u64>(&del).await? > 0)
            }
            Self::Local(values) => Ok(values.lock().expect("stash").remove(key)),
            Self::Group { group, prefix } => Ok(group.delete(format!("{prefix}{key}")).await?),
            Self::Disabled => Err(AtomError::RequiresAtomicity("stash")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn a_value_lives_for_its_ttl_and_goes_when_deleted() {
        let stash = Stash::local();
        assert_eq!(stash.get("k").await.unwrap(), None);
        stash.set("k", &json!({"rate": 1.1}), 1000).await.unwrap();
        assert_eq!(stash.get("k").await.unwrap(), Some(json!({"rate": 1.1})));
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(stash.get("k").await.unwrap(), None, "expired");
        stash.set("k", &json!(2), 1000).await.unwrap();
        assert!(stash.delete("k").await.unwrap());
        assert!(!stash.delete("k").await.unwrap(), "nothing left");
    }

    #[tokio::test]
    async fn a_ttl_out_of_range_or_a_value_too_large_keeps_nothing() {
        let stash = Stash::local();
        for ttl in [0, MAX_TTL_MS + 1] {
            let refused = stash.set("k", &json!(1), ttl).await.unwrap_err();
            assert!(
                refused.to_string().contains("ttl: expected 1 to"),
                "{refused}"
            );
        }
        let large = json!("x".repeat(MAX_VALUE));
        let refused = stash.set("k", &large, 1000).await.unwrap_err();
        assert!(
            refused.to_string().contains("at most 1048576 bytes"),
            "{refused}"
        );
        assert_eq!(stash.get("k").await.unwrap(), None);
        let disabled = Stash::Disabled.get("k").await.unwrap_err();
        assert!(disabled.to_string().starts_with("stash requires atomicity"));
    }
}
