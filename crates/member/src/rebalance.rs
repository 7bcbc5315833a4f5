//! Rebalancing (issue 20) uses the drain's move. A serving server that carries more than its
//! share of its site's sessions (`farm::balance::excess`: a server joined, returned or ended
//! a drain) moves its excess away, at most [`REBALANCE_MOVES_PER_CHECK`] sessions per check,
//! checks [`crate::Timing::rebalance_every`] apart with ± [`REBALANCE_JITTER_PERCENT`] %
//! jitter (so that the servers of a site do not move in step), and only once the excess has
//! lasted [`crate::Timing::rebalance_settle`]: a device learns a server that joined from its
//! status reports within 12 s, and a moved device should find it. A session is moved for
//! balance at most once per [`crate::Timing::rebalance_forget`] (one whose list did not hold
//! the new server yet comes back and is moved again later). A move is a failover, not a
//! login: the device keeps its session and its boot is not counted again. Only sessions whose
//! device was told a destination with room move, no more to one server than its room, each
//! counted there first (`farm::moves`, issue 31): moved devices spread over the servers below
//! their share, ties included, and none moves twice.
//!
//! This module is the pure plan ([`Rebalance`], [`to_rebalance`]) on `now` and a seeded RNG;
//! [`crate::Runtime`] asks the farm for the excess and performs the moves.

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng as _;
use rand::rngs::StdRng;

use crate::Timing;

/// How often, on average, a serving server checks whether it carries more than its share.
pub const REBALANCE_EVERY: Duration = Duration::from_secs(5);
/// How far, in percent, each pause between two checks differs from the mean at most.
pub const REBALANCE_JITTER_PERCENT: u32 = 20;
/// The most sessions one rebalance check moves.
pub const REBALANCE_MOVES_PER_CHECK: usize = 8;
/// How long a session moved for balance is not moved again.
pub const REBALANCE_FORGET: Duration = Duration::from_secs(60);
/// How long an excess must last before sessions move: longer than a device takes to learn
/// a new server (a server-list refresh every 10 s, `agent::report::SERVERS_REFRESH_REPORTS`
/// reports of 2 s, plus one report), and longer than `farm::balance::REBALANCE_ALIVE_MS`,
/// so that the empty place of a server killed a moment ago never moves a device.
pub const REBALANCE_SETTLE: Duration = Duration::from_secs(25);

/// The rebalance checks of one serving server.
#[derive(Debug)]
pub struct Rebalance {
    /// Sessions moved for balance, with when (Unix ms); pruned past the forget window.
    recent: HashMap<String, i64>,
    /// When the next check is due (Unix ms).
    next_check_ms: i64,
    /// When the excess was first seen, in the run of checks that all saw one.
    excess_since_ms: Option<i64>,
    /// Turns each check, so that no session is always the first moved.
    turn: usize,
    /// Draws the jitter of the pauses.
    rng: StdRng,
    every: Duration,
    settle_ms: i64,
    forget_ms: i64,
}

/// What a check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No excess: nothing moves, and the settling starts over.
    Balanced,
    /// An excess that has not lasted the settling time yet: nothing moves.
    Settling {
        /// Since when (Unix ms).
        since_ms: i64,
    },
    /// These sessions move.
    Move(Vec<String>),
}

impl Rebalance {
    /// Checks with `timing`'s intervals, the first one a pause after `now_ms`, the pauses'
    /// jitter drawn from `rng`.
    pub fn new(timing: &Timing, now_ms: i64, rng: StdRng) -> Rebalance {
        let mut r = Rebalance {
            recent: HashMap::new(),
            next_check_ms: now_ms,
            excess_since_ms: None,
            turn: 0,
            rng,
            every: timing.rebalance_every,
            settle_ms: crate::ms(timing.rebalance_settle),
            forget_ms: crate::ms(timing.rebalance_forget),
        };
        r.next_check_ms = now_ms.saturating_add(crate::ms(r.pause()));
        r
    }

    /// When the next check is due (Unix ms).
    pub fn next_check_ms(&self) -> i64 {
        self.next_check_ms
    }

    /// Whether a check is due at `now_ms`; if so, the next one is scheduled a pause later
    /// (whether or not this one gets to [`Rebalance::decide`]: a failed excess query waits
    /// like any check).
    pub fn start_check(&mut self, now_ms: i64) -> bool {
        if now_ms < self.next_check_ms {
            return false;
        }
        self.next_check_ms = now_ms.saturating_add(crate::ms(self.pause()));
        true
    }

    /// Given the `excess` the farm counts for this server at `now_ms` and the sessions
    /// `open` on it, which move. Records the moved sessions.
    pub fn decide(&mut self, excess: usize, mut open: Vec<String>, now_ms: i64) -> Decision {
        if excess == 0 {
            self.excess_since_ms = None;
            return Decision::Balanced;
        }
        let since = *self.excess_since_ms.get_or_insert(now_ms);
        if now_ms.saturating_sub(since) < self.settle_ms {
            return Decision::Settling { since_ms: since };
        }
        let forget = self.forget_ms;
        self.recent
            .retain(|_, t| now_ms.saturating_sub(*t) < forget);
        open.sort();
        self.turn = self.turn.wrapping_add(1);
        let moving = to_rebalance(&open, &self.recent, excess, self.turn, now_ms, forget);
        for name in &moving {
            self.recent.insert(name.clone(), now_ms);
        }
        Decision::Move(moving)
    }

    /// The pause before the next check: the mean ± [`REBALANCE_JITTER_PERCENT`] %.
    fn pause(&mut self) -> Duration {
        let jitter = f64::from(REBALANCE_JITTER_PERCENT) / 100.0;
        self.every
            .mul_f64(self.rng.gen_range((1.0 - jitter)..(1.0 + jitter)))
    }
}

/// The sessions a rebalance check moves: up to `excess` (and [`REBALANCE_MOVES_PER_CHECK`])
/// of `open`, skipping those moved within `forget_ms`, from a position that changes with
/// `turn`.
pub fn to_rebalance(
    open: &[String],
    recent: &HashMap<String, i64>,
    excess: usize,
    turn: usize,
    now_ms: i64,
    forget_ms: i64,
) -> Vec<String> {
    let waiting: Vec<&String> = open
        .iter()
        .filter(|n| {
            recent
                .get(*n)
                .is_none_or(|t| now_ms.saturating_sub(*t) >= forget_ms)
        })
        .collect();
    crate::drain::rotated(&waiting, turn, excess.min(REBALANCE_MOVES_PER_CHECK))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    const FORGET_MS: i64 = 60_000;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ferry-s-{i:04}")).collect()
    }

    #[test]
    fn rebalance_moves_at_most_the_excess_and_not_the_same_session_twice() {
        let open = names(40);
        let mut recent = HashMap::new();
        let first = to_rebalance(&open, &recent, 5, 0, 0, FORGET_MS);
        assert_eq!(first.len(), 5);
        for n in &first {
            recent.insert(n.clone(), 0);
        }
        let second = to_rebalance(&open, &recent, 100, 0, 0, FORGET_MS);
        assert_eq!(second.len(), REBALANCE_MOVES_PER_CHECK);
        assert!(second.iter().all(|n| !first.contains(n)));
        assert_eq!(
            to_rebalance(&open[..5], &recent, 9, 0, FORGET_MS, FORGET_MS).len(),
            5
        );
        assert!(to_rebalance(&open, &recent, 0, 0, 0, FORGET_MS).is_empty());
    }

    #[test]
    fn pauses_stay_within_the_jitter_of_the_mean() {
        let timing = Timing::default();
        let mut r = Rebalance::new(&timing, 0, StdRng::seed_from_u64(7));
        let mean = crate::ms(timing.rebalance_every);
        let (lo, hi) = (mean * 8 / 10, mean * 12 / 10);
        let mut at = r.next_check_ms();
        assert!((lo..=hi).contains(&at), "{at}");
        for _ in 0..100 {
            assert!(r.start_check(at));
            let next = r.next_check_ms();
            assert!((lo..=hi).contains(&(next - at)), "{}", next - at);
            assert!(!r.start_check(next - 1));
            at = next;
        }
    }

    #[test]
    fn an_excess_moves_nothing_until_it_has_lasted_the_settling_time() {
        let timing = Timing::default();
        let settle = crate::ms(timing.rebalance_settle);
        let mut r = Rebalance::new(&timing, 0, StdRng::seed_from_u64(7));
        assert_eq!(
            r.decide(2, names(4), 1_000),
            Decision::Settling { since_ms: 1_000 }
        );
        assert_eq!(r.decide(0, names(4), 2_000), Decision::Balanced);
        assert_eq!(
            r.decide(2, names(4), 3_000),
            Decision::Settling { since_ms: 3_000 },
            "a balanced check starts the settling over"
        );
        let Decision::Move(moved) = r.decide(2, names(4), 3_000 + settle) else {
            panic!("settled");
        };
        assert_eq!(moved.len(), 2);
    }
}
