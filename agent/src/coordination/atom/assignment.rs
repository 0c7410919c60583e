//! Which slots a replica owns, decided from heartbeats: pure logic, no I/O, driven by the caller's
//! clock so tests can step through it.
//!
//! Every heartbeat's reply carries the membership *view* (the live members, sorted) with its epoch
//! and the server time it last changed. A replica's share of a view is `{i, n}`: its rank among
//! the members and their count.
//!
//! No slot ever has two owners:
//! - a new view is adopted only `settle` after it was made (server time); by then every replica
//!   has either seen it (and dropped its old share at once) or lost its lease;
//! - a replica owns anything only until `settle` after it *sent* its latest successful heartbeat
//!   (its lease), and drops everything at once when a heartbeat fails. A view made after that
//!   heartbeat is adopted by the others no earlier than `settle` after the heartbeat reached the
//!   server, which is after the lease ended.
//!
//! So losing slots is immediate and gaining them waits `settle` (two heartbeat intervals).

use std::time::Duration;
use tokio::time::Instant;

/// This replica is number `i` of `n`; `epoch` names the membership view it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    pub i: u32,
    pub n: u32,
    pub epoch: u64,
}

impl Assignment {
    /// The only replica: it owns every slot.
    pub fn alone() -> Self {
        Self {
            i: 0,
            n: 1,
            epoch: 1,
        }
    }

    /// The slots owned out of `total`: `i, i + n, i + 2n, …` below `total` (possibly none).
    pub fn slots(&self, total: u32) -> Vec<u32> {
        (self.i..total).step_by(self.n.max(1) as usize).collect()
    }
}

pub use crate::coordination::membership::View;

#[derive(Debug, Clone)]
struct Adopted {
    epoch: u64,
    changed: u64,
    share: Option<(u32, u32)>,
    from: Instant,
}

/// The assignment state of one replica.
#[derive(Debug)]
pub struct Assignor {
    me: String,
    settle: Duration,
    margin: Duration,
    view: Option<Adopted>,
    lease_until: Option<Instant>,
    withdrawn: bool,
}

impl Assignor {
    /// `settle` is how long a view waits before it is adopted (two heartbeat intervals).
    pub fn new(me: impl Into<String>, settle: Duration) -> Self {
        Self {
            me: me.into(),
            settle,
            margin: settle / 100 + Duration::from_millis(2),
            view: None,
            lease_until: None,
            withdrawn: false,
        }
    }

    /// A heartbeat sent at `sent` was answered at `received` with `view`.
    pub fn on_heartbeat(&mut self, sent: Instant, received: Instant, view: &View) {
        let same = self
            .view
            .as_ref()
            .is_some_and(|adopted| adopted.epoch == view.epoch && adopted.changed == view.changed);
        if !same {
            let settle_ms = self.settle.as_millis() as u64;
            let wait = Duration::from_millis((view.changed + settle_ms).saturating_sub(view.now));
            let n = view.members.len() as u32;
            let share = view
                .members
                .iter()
                .position(|member| *member == self.me)
                .map(|i| (i as u32, n));
            self.view = Some(Adopted {
                epoch: view.epoch,
                changed: view.changed,
                share,
                // `received` is the latest local time the server's `now` can stand for.
                from: received + wait,
            });
        }
        self.lease_until = Some(
            (sent + self.settle)
                .checked_sub(self.margin)
                .unwrap_or(sent),
        );
    }

    /// A heartbeat failed: own nothing until one succeeds.
    pub fn on_failure(&mut self) {
        self.lease_until = None;
    }

    /// Own nothing from now on.
    pub fn withdraw(&mut self) {
        self.withdrawn = true;
    }

    /// The assignment at `now`.
    pub fn current(&self, now: Instant) -> Option<Assignment> {
        if self.withdrawn || self.lease_until.is_none_or(|until| now >= until) {
            return None;
        }
        let view = self.view.as_ref()?;
        if now < view.from {
            return None;
        }
        view.share.map(|(i, n)| Assignment {
            i,
            n,
            epoch: view.epoch,
        })
    }

    /// The next moment the assignment can change without a heartbeat: a view's adoption or the
    /// lease's end.
    pub fn next_change(&self, now: Instant) -> Option<Instant> {
        let adoption = self
            .view
            .as_ref()
            .map(|view| view.from)
            .filter(|at| *at > now);
        let lease = self.lease_until.filter(|at| *at > now);
        match (adoption, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_millis(200);

    fn view(epoch: u64, changed: u64, now: u64, members: &[&str]) -> View {
        View {
            epoch,
            changed,
            now,
            members: members.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn slots_of_a_share() {
        assert_eq!(
            Assignment {
                i: 0,
                n: 2,
                epoch: 1
            }
            .slots(8),
            vec![0, 2, 4, 6]
        );
        assert_eq!(
            Assignment {
                i: 1,
                n: 2,
                epoch: 1
            }
            .slots(7),
            vec![1, 3, 5]
        );
        assert_eq!(Assignment::alone().slots(4), vec![0, 1, 2, 3]);
        // replica 4 of 5 owns nothing of 4 slots: an empty list, not none
        assert_eq!(
            Assignment {
                i: 4,
                n: 5,
                epoch: 1
            }
            .slots(4),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn a_new_view_is_adopted_only_after_settling() {
        let t0 = Instant::now();
        let mut a = Assignor::new("b", SETTLE);
        a.on_heartbeat(t0, t0, &view(1, 1000, 1000, &["a", "b"]));
        assert_eq!(a.current(t0), None);
        assert_eq!(a.next_change(t0), Some(t0 + SETTLE - a.margin));
        // the lease ends before adoption unless another heartbeat renews it
        let t1 = t0 + Duration::from_millis(100);
        a.on_heartbeat(t1, t1, &view(1, 1000, 1100, &["a", "b"]));
        assert_eq!(a.current(t0 + SETTLE - Duration::from_millis(1)), None);
        assert_eq!(
            a.current(t0 + SETTLE),
            Some(Assignment {
                i: 1,
                n: 2,
                epoch: 1
            })
        );
    }

    #[test]
    fn a_change_drops_the_share_at_once_and_failures_drop_everything() {
        let t0 = Instant::now();
        let mut a = Assignor::new("a", SETTLE);
        a.on_heartbeat(t0, t0, &view(3, 0, 1000, &["a"])); // settled long ago
        assert_eq!(
            a.current(t0),
            Some(Assignment {
                i: 0,
                n: 1,
                epoch: 3
            })
        );
        let t1 = t0 + Duration::from_millis(50);
        a.on_heartbeat(t1, t1, &view(4, 1040, 1050, &["a", "c"]));
        assert_eq!(a.current(t1), None);
        assert_eq!(a.next_change(t1), Some(t1 + Duration::from_millis(190)));
        let t2 = t1 + Duration::from_millis(100);
        a.on_heartbeat(t2, t2, &view(4, 1040, 1150, &["a", "c"]));
        assert_eq!(
            a.current(t1 + Duration::from_millis(190)),
            Some(Assignment {
                i: 0,
                n: 2,
                epoch: 4
            })
        );
        a.on_failure();
        assert_eq!(a.current(t2), None);
    }

    #[test]
    fn the_lease_ends_without_heartbeats() {
        let t0 = Instant::now();
        let mut a = Assignor::new("a", SETTLE);
        a.on_heartbeat(
            t0,
            t0 + Duration::from_millis(30),
            &view(1, 0, 1000, &["a"]),
        );
        // measured from when the heartbeat was sent, not answered
        assert!(a
            .current(t0 + SETTLE - a.margin - Duration::from_millis(1))
            .is_some());
        assert_eq!(a.current(t0 + SETTLE - a.margin), None);
    }

    #[test]
    fn a_member_missing_from_the_view_owns_nothing() {
        let t0 = Instant::now();
        let mut a = Assignor::new("z", SETTLE);
        a.on_heartbeat(t0, t0, &view(1, 0, 1000, &["a"]));
        assert_eq!(a.current(t0), None);
        a.withdraw();
        a.on_heartbeat(t0, t0, &view(2, 0, 1000, &["z"]));
        assert_eq!(a.current(t0), None);
    }
}
