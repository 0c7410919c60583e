//! `meter`: usage per key over all replicas, kept as a debt in milliseconds that drains by itself.
//!
//! The debt of a key *is* the remaining time to live of its Redis key: the script reads `PTTL`,
//! adds the delta and sets the key to expire when the new debt is paid off. Draining therefore runs
//! on the server's clock (never the client's), the key disappears when its debt is gone, and all
//! keys of one call change in one atomic script. The first server is used.

use super::keys::Scope;
use super::AtomError;
use crate::coordination::redis::{ServerError, Servers};
use crate::metrics::ComponentMetrics;
use redis::Script;
use std::sync::{Arc, LazyLock};

/// KEYS: the meter keys. ARGV: one delta (ms, ≥ 0) per key. Returns the debts reached. Every
/// debt is computed before any is written: a refusal (a debt beyond what a Redis expiry and a Lua
/// number hold exactly) charges nothing, as Redis does not undo a script's writes.
static METER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local reached = {}
for i = 1, #KEYS do
  local debt = redis.call('PTTL', KEYS[i])
  if debt < 0 then debt = 0 end
  debt = debt + tonumber(ARGV[i])
  if debt > 9007199254740991 then
    return redis.error_reply('ERR debt beyond 2^53 ms: more than a Redis expiry keeps exactly')
  end
  reached[i] = debt
end
for i = 1, #KEYS do
  if tonumber(ARGV[i]) > 0 then
    redis.call('SET', KEYS[i], '', 'PX', reached[i])
  end
end
return reached
",
    )
});

/// The largest delta one call may add to a key, in ms: a year. Checked before anything is
/// charged.
pub const MAX_DELTA_MS: u64 = 365 * 24 * 3600 * 1000;

/// The script's refusal of a debt it cannot keep.
const DEBT_BEYOND: &str = "debt beyond 2^53 ms";

pub struct Meter {
    servers: Arc<Servers>,
    prefix: String,
    metrics: ComponentMetrics,
}

impl Meter {
    pub fn new(servers: Arc<Servers>, scope: &Scope, metrics: ComponentMetrics) -> Self {
        Self {
            servers,
            prefix: format!("{}meter:", scope.prefix()),
            metrics,
        }
    }

    /// The script as this module runs it, for benchmarks that call it directly.
    pub fn script() -> &'static Script {
        &METER
    }

    pub async fn charge(&self, keys: &[String], deltas: &[u64]) -> Result<Vec<u64>, AtomError> {
        let mut invocation = METER.prepare_invoke();
        for key in keys {
            invocation.key(format!("{}{key}", self.prefix));
        }
        for delta in deltas {
            invocation.arg(*delta);
        }
        self.metrics.meter_called();
        match self.servers.first().invoke_prepared(&invocation).await {
            Err(ServerError::Refused(_, message)) if message.contains(DEBT_BEYOND) => Err(
                AtomError::InvalidMeter(format!("a {DEBT_BEYOND}; nothing was charged")),
            ),
            reached => Ok(reached?),
        }
    }
}
