//! `meter`'s arithmetic in a process: used by a process alone and by the first process of a
//! local group for all of them.

use std::collections::HashMap;
use tokio::time::Instant;

/// Debts per key, each with the time it was last computed: `meter`'s arithmetic in a process
/// (alone, or the first of a local group for all of them).
#[derive(Debug, Default)]
pub struct Debts(HashMap<String, (u64, Instant)>);

impl Debts {
    /// Adds each delta to its key's debt, drained one millisecond per millisecond since it was
    /// last computed; the debts reached.
    pub fn charge(&mut self, keys: &[String], deltas: &[u64]) -> Vec<u64> {
        let now = Instant::now();
        self.0
            .retain(|_, (debt, at)| (now - *at).as_millis() < u128::from(*debt));
        keys.iter()
            .zip(deltas)
            .map(|(key, delta)| {
                let (debt, at) = self.0.get(key).copied().unwrap_or((0, now));
                let drained = (now - at).as_millis().min(u128::from(debt)) as u64;
                let reached = debt - drained + delta;
                if reached > 0 {
                    self.0.insert(key.clone(), (reached, now));
                }
                reached
            })
            .collect()
    }
}
