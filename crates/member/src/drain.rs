//! Draining a farm server (issue 20): when the farm marks this server draining
//! (`ferry farm server set ID --drain`), it closes the connections of the sessions it
//! serves, a few each check, so that each device fails over to the next server of the list
//! its login gave it: the same path as a crash, without the wait for a dead connection and
//! without a new login. Logins name a draining server last (`farm::balance`).
//!
//! Each session is moved at most [`DRAIN_MOVES_PER_SESSION`] times per drain, at least
//! [`crate::Timing::drain_move_again_after`] apart: a device that comes back (its list,
//! refreshed every 10 s, did not say the server drains yet) is moved again once it knows,
//! and a device whose list holds no other server comes back for good and is served. Ending
//! the drain (`--no-drain`) forgets the moves.
//!
//! This module is the pure plan ([`Drain`], [`to_move`]): which sessions to move at `now`.
//! [`crate::Runtime`] reads the flag and performs the moves.

use std::collections::HashMap;
use std::time::Duration;

/// How often the server reads whether it is draining (the drain's pacing).
pub const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);
/// The most sessions moved per check: a drain must not turn into a reconnect storm on the
/// other servers.
pub const DRAIN_SESSIONS_PER_CHECK: usize = 16;
/// The most times a drain moves one session.
pub const DRAIN_MOVES_PER_SESSION: u32 = 3;
/// The least time between two moves of one session by a drain: longer than a device takes
/// to learn that the server drains (a list refresh every 10 s, plus a report).
pub const DRAIN_MOVE_AGAIN_AFTER: Duration = Duration::from_secs(15);

/// One drain's memory: the sessions moved, how many times and when last.
#[derive(Debug, Clone)]
pub struct Drain {
    /// Session export name → (times moved, last move in Unix ms). Bounded by the sessions
    /// this server served during the drain; forgotten when it ends.
    moved: HashMap<String, (u32, i64)>,
    /// Turns each check, so that no session is always last.
    turn: usize,
    move_again_after_ms: i64,
}

impl Drain {
    /// A drain that moves a session again no sooner than `move_again_after`.
    pub fn new(move_again_after: Duration) -> Drain {
        Drain {
            moved: HashMap::new(),
            turn: 0,
            move_again_after_ms: crate::ms(move_again_after),
        }
    }

    /// The sessions of `open` to move at `now_ms`, each with how many times it will have
    /// been moved, recorded as moved.
    pub fn check(&mut self, mut open: Vec<String>, now_ms: i64) -> Vec<(String, u32)> {
        open.sort();
        self.turn = self.turn.wrapping_add(1);
        let names = to_move(
            &open,
            &self.moved,
            self.turn,
            now_ms,
            self.move_again_after_ms,
        );
        names
            .into_iter()
            .map(|name| {
                let times = self.moved.get(&name).map_or(0, |(t, _)| *t) + 1;
                self.moved.insert(name.clone(), (times, now_ms));
                (name, times)
            })
            .collect()
    }

    /// Forgets the moves (the drain ended); returns how many sessions it had moved.
    pub fn end(&mut self) -> usize {
        let n = self.moved.len();
        self.moved.clear();
        n
    }

    /// How many times the drain moved `name`.
    pub fn times_moved(&self, name: &str) -> u32 {
        self.moved.get(name).map_or(0, |(t, _)| *t)
    }
}

/// The sessions to move now: those open and not moved yet, or moved fewer than
/// [`DRAIN_MOVES_PER_SESSION`] times and last at least `move_again_after_ms` ago; at most
/// [`DRAIN_SESSIONS_PER_CHECK`], starting at a position that changes with `turn`.
pub fn to_move(
    open: &[String],
    moved: &HashMap<String, (u32, i64)>,
    turn: usize,
    now_ms: i64,
    move_again_after_ms: i64,
) -> Vec<String> {
    let waiting: Vec<&String> = open
        .iter()
        .filter(|n| match moved.get(*n) {
            None => true,
            Some((times, at)) => {
                *times < DRAIN_MOVES_PER_SESSION
                    && now_ms.saturating_sub(*at) >= move_again_after_ms
            }
        })
        .collect();
    rotated(&waiting, turn, DRAIN_SESSIONS_PER_CHECK)
}

/// Up to `n` of `waiting`, starting at a position that changes with `turn` (so that no
/// session is always last) and wrapping around.
pub(crate) fn rotated(waiting: &[&String], turn: usize, n: usize) -> Vec<String> {
    if waiting.is_empty() {
        return Vec::new();
    }
    let start = turn % waiting.len();
    waiting
        .iter()
        .cycle()
        .skip(start)
        .take(waiting.len().min(n))
        .map(|n| (*n).clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGAIN_MS: i64 = 15_000;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ferry-s-{i:04}")).collect()
    }

    #[test]
    fn moves_each_session_once_a_bounded_number_at_a_time() {
        let mut d = Drain::new(DRAIN_MOVE_AGAIN_AFTER);
        let mut seen = std::collections::HashSet::new();
        let mut checks = 0;
        loop {
            let now = d.check(names(40), 0);
            if now.is_empty() {
                break;
            }
            assert!(now.len() <= DRAIN_SESSIONS_PER_CHECK);
            for (n, times) in now {
                assert_eq!(times, 1);
                assert!(seen.insert(n), "a session moved twice");
            }
            checks += 1;
        }
        assert_eq!(seen.len(), 40);
        assert_eq!(checks, 3, "40 sessions, 16 per check");
    }

    #[test]
    fn a_session_that_comes_back_is_moved_again_later_a_bounded_number_of_times() {
        let open = names(1);
        let mut moved = HashMap::new();
        moved.insert(open[0].clone(), (1, 0));
        assert!(to_move(&open, &moved, 0, 1_000, AGAIN_MS).is_empty());
        assert_eq!(to_move(&open, &moved, 0, AGAIN_MS, AGAIN_MS), open);
        moved.insert(open[0].clone(), (DRAIN_MOVES_PER_SESSION, 0));
        assert!(
            to_move(&open, &moved, 0, AGAIN_MS, AGAIN_MS).is_empty(),
            "it stays at last"
        );
    }

    #[test]
    fn the_first_session_moved_changes_with_the_turn() {
        let open = names(5);
        let moved = HashMap::new();
        let firsts: std::collections::HashSet<String> = (0..5)
            .map(|t| to_move(&open, &moved, t, 0, AGAIN_MS)[0].clone())
            .collect();
        assert_eq!(firsts.len(), 5);
    }
}
