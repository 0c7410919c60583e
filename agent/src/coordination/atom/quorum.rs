//! Pure: the arithmetic of one Redlock round over `n` servers, apart from the I/O that feeds it.
//!
//! A round asks every server at once and counts the replies as they come. [`Tally`] takes one
//! reply at a time and says whether the round is decided: **granted** once a majority
//! (`n / 2 + 1`) said yes; **denied** once the servers that said no are so many that a majority of
//! yes is out of reach whatever the others answer; **failed** once the no's and the errors together
//! put it out of reach; otherwise **continue**. It decides at the first reply that settles it, and
//! never waits for the slowest server. Safety does not rest here (two holders would need two
//! majorities of servers that each granted the keys, which the servers' scripts exclude), but a
//! wrong count here would hand out a lock without a majority: hence the exhaustive tests.
//!
//! Also pure, for a round that failed: whether the servers that said no saw one other holder on a
//! majority ([`one_holder_has_majority`]; if not, the vote was split and waiters must be woken),
//! and which servers to release ([`to_release`]).

/// One server's reply, as the count sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// Granted (or extended), by a server that may count.
    Yes,
    /// Refused: held by another, not seeded, or granted by a server that may not count yet.
    No,
    /// No usable answer: an error, or an unexpected reply.
    Failed,
}

/// Where a round stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Granted,
    /// A majority of yes is out of reach by the no's alone.
    Denied,
    /// A majority of yes is out of reach, errors included.
    Failed,
}

/// The count of one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    n: usize,
    yes: usize,
    no: usize,
    failed: usize,
}

/// A majority of `n`.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

impl Tally {
    pub fn new(n: usize) -> Self {
        Self {
            n,
            yes: 0,
            no: 0,
            failed: 0,
        }
    }

    /// Counts one reply; the verdict after it.
    pub fn add(&mut self, vote: Vote) -> Verdict {
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::No => self.no += 1,
            Vote::Failed => self.failed += 1,
        }
        self.verdict()
    }

    pub fn verdict(&self) -> Verdict {
        let quorum = quorum(self.n);
        let spare = self.n - quorum; // how many may say anything but yes
        if self.yes >= quorum {
            Verdict::Granted
        } else if self.no > spare {
            Verdict::Denied
        } else if self.no + self.failed > spare {
            Verdict::Failed
        } else {
            Verdict::Continue
        }
    }
}

/// Whether the holders the servers named when they said no include one named by a majority of
/// `n` (that holder's release will wake the waiters); if not, the vote was split.
pub fn one_holder_has_majority(holders: &[String], n: usize) -> bool {
    let mut sorted: Vec<&String> = holders.iter().collect();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .any(|same| same.len() >= quorum(n))
}

/// The servers a failed round releases: every server that granted, counted or not, and every
/// server that had not answered (its grant may still come: the release queues behind it on the
/// same connection). Sorted, each once.
pub fn to_release(granted: &[usize], unanswered: &[usize]) -> Vec<usize> {
    let mut release: Vec<usize> = granted.iter().chain(unanswered).copied().collect();
    release.sort_unstable();
    release.dedup();
    release
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOTES: [Vote; 3] = [Vote::Yes, Vote::No, Vote::Failed];

    /// Every sequence of `n` replies (in arrival order).
    fn sequences(n: usize) -> Vec<Vec<Vote>> {
        (0..n).fold(vec![Vec::new()], |all, _| {
            all.into_iter()
                .flat_map(|prefix| {
                    VOTES.iter().map(move |vote| {
                        let mut next = prefix.clone();
                        next.push(*vote);
                        next
                    })
                })
                .collect()
        })
    }

    /// The verdict after `seen` of `n` replies, said differently: by whether a majority of yes is
    /// reached, still reachable with the replies to come, or would be reachable if every error
    /// had been a yes.
    fn oracle(seen: &[Vote], n: usize) -> Verdict {
        let count = |v: Vote| seen.iter().filter(|s| **s == v).count();
        let (yes, failed) = (count(Vote::Yes), count(Vote::Failed));
        let still_to_come = n - seen.len();
        if yes >= quorum(n) {
            Verdict::Granted
        } else if yes + still_to_come >= quorum(n) {
            Verdict::Continue
        } else if yes + failed + still_to_come >= quorum(n) {
            Verdict::Failed
        } else {
            Verdict::Denied
        }
    }

    #[test]
    fn every_order_of_replies_for_one_three_and_five_servers() {
        for n in [1, 3, 5] {
            let all = sequences(n);
            assert_eq!(all.len(), 3usize.pow(n as u32));
            for sequence in all {
                let mut tally = Tally::new(n);
                let mut decided = None;
                for (i, vote) in sequence.iter().enumerate() {
                    let verdict = tally.add(*vote);
                    assert_eq!(
                        verdict,
                        oracle(&sequence[..=i], n),
                        "{n} servers: {sequence:?}"
                    );
                    if verdict != Verdict::Continue {
                        decided.get_or_insert(verdict);
                    }
                }
                // Every round is decided once every server answered.
                let decided = decided.unwrap_or_else(|| panic!("undecided: {sequence:?}"));
                // Granted exactly when a majority said yes; never with fewer.
                let yes = sequence.iter().filter(|v| **v == Vote::Yes).count();
                let first_decision = sequence
                    .iter()
                    .scan(Tally::new(n), |t, v| Some(t.add(*v)))
                    .find(|v| *v != Verdict::Continue)
                    .unwrap();
                assert_eq!(first_decision, decided);
                if decided == Verdict::Granted {
                    assert!(yes >= quorum(n), "{sequence:?}");
                } else {
                    // Decided against: no later reply could have made a majority.
                    let at = sequence
                        .iter()
                        .scan(Tally::new(n), |t, v| Some(t.add(*v)))
                        .position(|v| v != Verdict::Continue)
                        .unwrap();
                    let yes_so_far = sequence[..=at].iter().filter(|v| **v == Vote::Yes).count();
                    assert!(yes_so_far + (n - at - 1) < quorum(n), "{sequence:?}");
                }
            }
        }
    }

    #[test]
    fn a_split_vote_is_told_from_one_other_holder() {
        let named = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(one_holder_has_majority(&named(&["b", "b"]), 3));
        assert!(!one_holder_has_majority(&named(&["b", "c"]), 3));
        assert!(!one_holder_has_majority(&named(&["b", "c", "b", "c"]), 5));
        assert!(one_holder_has_majority(&named(&["c", "b", "c", "c"]), 5));
        assert!(one_holder_has_majority(&named(&["b"]), 1));
        assert!(!one_holder_has_majority(&[], 1));
    }

    #[test]
    fn a_failed_round_releases_every_grant_and_every_server_yet_to_answer() {
        assert_eq!(to_release(&[3, 0], &[4, 0]), [0, 3, 4]);
        assert!(to_release(&[], &[]).is_empty());
    }
}
