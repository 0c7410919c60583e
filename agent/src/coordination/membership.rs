//! Slots' membership as Redis keeps it (the heartbeat script of [`super::atom::slots`]), in a
//! process: the first process of a local group keeps it for all. A member's heartbeat renews
//! its expiry; the view (the live members, sorted) gets a new epoch when it changes.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Server time: ms since the Unix epoch (one machine's clock, shared by every leader).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A member's session with the group's leader: its members leave when it ends.
pub type Session = u64;

/// A heartbeat's reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct View {
    pub epoch: u64,
    /// Server time (ms) the view last changed.
    pub changed: u64,
    /// Server time (ms) of this heartbeat.
    pub now: u64,
    /// The live members, sorted.
    pub members: Vec<String>,
}

/// A member's membership in one component's view.
#[derive(Default)]
pub struct Membership {
    /// Member → (expiry, server ms; its session).
    pub members: HashMap<String, (u64, Session)>,
    view: Vec<String>,
    epoch: u64,
    changed: u64,
    /// The next view is the first ever: made `settle` (the members' TTL) ago.
    pub fresh: bool,
}

impl Membership {
    /// A membership with no view yet; `fresh`: its first view replaces no other (no leader came
    /// before), so it counts as settled already.
    pub fn new(fresh: bool) -> Self {
        Self {
            fresh,
            ..Self::default()
        }
    }

    /// The heartbeat script of [`crate::coordination::atom::slots`], on this process's clock.
    pub fn beat(
        &mut self,
        session: Session,
        member: String,
        ttl_ms: u64,
        withdraw: bool,
        first_epoch: u64,
    ) -> View {
        let now = now_ms();
        self.members.retain(|_, (expiry, _)| *expiry > now);
        if withdraw {
            self.members.remove(&member);
        } else {
            self.members.insert(member, (now + ttl_ms, session));
        }
        self.renew(now, first_epoch);
        if std::mem::take(&mut self.fresh) {
            self.changed = now.saturating_sub(ttl_ms);
        }
        View {
            epoch: self.epoch,
            changed: self.changed,
            now,
            members: self.view.clone(),
        }
    }

    /// A new epoch if the members changed.
    pub fn renew(&mut self, now: u64, first_epoch: u64) {
        let mut members: Vec<String> = self.members.keys().cloned().collect();
        members.sort();
        if members != self.view || self.changed == 0 {
            self.view = members;
            self.epoch = (self.epoch + 1).max(first_epoch);
            self.changed = now;
        }
    }
}
