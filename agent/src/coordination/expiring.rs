//! Text values that expire: the in-process form of what Redis keeps with `SET … PX` for the
//! stash and the records of repeated calls, used by a process alone and by the first process of
//! a local group ([`crate::coordination::group`]) for all of them. Expired entries count as
//! absent and are dropped on the next write.

use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Expiring(HashMap<String, (String, Instant)>);

impl Expiring {
    /// The live value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let now = Instant::now();
        let live = self.0.get(key).filter(|(_, until)| *until > now);
        live.map(|(value, _)| value.as_str())
    }

    /// Keeps `value` under `key` for `ttl`, replacing what was there (`SET key value PX ttl`).
    pub fn set(&mut self, key: &str, value: String, ttl: Duration) {
        self.purge();
        self.0.insert(key.to_owned(), (value, Instant::now() + ttl));
    }

    /// The live value under `key` if there is one; else keeps `value` for `ttl` and returns none.
    pub fn claim(&mut self, key: &str, value: String, ttl: Duration) -> Option<String> {
        self.purge();
        if let Some((found, _)) = self.0.get(key) {
            return Some(found.clone());
        }
        self.0.insert(key.to_owned(), (value, Instant::now() + ttl));
        None
    }

    /// Removes `key`; whether a live value was there.
    pub fn remove(&mut self, key: &str) -> bool {
        let removed = self.0.remove(key);
        removed.is_some_and(|(_, until)| until > Instant::now())
    }

    fn purge(&mut self) {
        let now = Instant::now();
        self.0.retain(|_, (_, until)| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_value_lives_for_its_ttl_and_a_claim_keeps_the_first() {
        let mut values = Expiring::default();
        let ttl = Duration::from_millis(100);
        assert_eq!(values.claim("k", "a".into(), ttl), None);
        assert_eq!(values.claim("k", "b".into(), ttl).as_deref(), Some("a"));
        assert_eq!(values.get("k"), Some("a"));
        tokio::time::advance(Duration::from_millis(101)).await;
        assert_eq!(values.get("k"), None, "expired");
        assert!(
            !values.remove("k"),
            "an expired value is not removed as live"
        );
        assert_eq!(values.claim("k", "c".into(), ttl), None, "free again");
        values.set("k", "d".into(), ttl);
        assert_eq!(values.get("k"), Some("d"));
        assert!(values.remove("k"));
    }
}
