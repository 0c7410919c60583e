//! How many times the broker redelivered an ordinary call, counted where every replica sees it.
//!
//! The shared queue of ordinary calls is a classic queue, which counts nothing: a call whose
//! program kills its agent (or whose agent dies under it) is redelivered to the next replica with
//! only the `redelivered` flag set, and without a count it would go round the replicas without
//! end. With atomicity, each redelivery is counted on the first Redis server under the call's id
//! (hashed), and the call is dead-lettered once its deliveries pass `limits.deliveries`. Without
//! atomicity nothing is shared: a redelivery counts as one (docs/calls.md).

use super::keys::Scope;
use super::repeats::hex;
use super::AtomError;
use crate::coordination::redis::Servers;
use redis::Script;
use sha2::{Digest, Sha256};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// KEYS[1]: the call's count. ARGV[1]: its time to live (ms). Counts one more; returns the count.
static COUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local count = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return count
",
    )
});

/// One component's counts of redelivered calls.
pub enum Redeliveries {
    Redis {
        servers: Arc<Servers>,
        prefix: String,
    },
    /// No Redis: nothing any other replica would see.
    Unshared,
}

impl Redeliveries {
    pub fn redis(servers: Arc<Servers>, scope: &Scope) -> Self {
        Self::Redis {
            servers,
            prefix: format!("{}redelivered:", scope.prefix()),
        }
    }

    /// Counts one more redelivery of the call `id` as published with the delivery number
    /// `published` (an agent that gives a call back publishes it anew, numbered), kept for `ttl`
    /// after the last; the count so far, or `None` where nothing is shared.
    pub async fn count(
        &self,
        id: &str,
        published: i64,
        ttl: Duration,
    ) -> Result<Option<i64>, AtomError> {
        let Self::Redis { servers, prefix } = self else {
            return Ok(None);
        };
        // Any text a publisher chose: hashed, so the key is bounded.
        let hashed = hex(&Sha256::digest(id.as_bytes()));
        let mut invocation = COUNT.prepare_invoke();
        invocation
            .key(format!("{prefix}{hashed}:{published}"))
            .arg(ttl.as_millis().max(1) as u64);
        Ok(Some(servers.first().invoke_prepared(&invocation).await?))
    }
}
