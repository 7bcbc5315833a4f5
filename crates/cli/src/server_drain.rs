//! Draining a farm server (issue 20): when the farm marks this server draining
//! (`ferry farm server set ID --drain`), it closes the connections of the sessions it
//! serves, a few each second, so that each device fails over to the next server of the list
//! its login gave it: the same path as a crash, without the wait for a dead connection and
//! without a new login. Logins name a draining server last (`farm::balance`).
//!
//! Each session is moved at most [`DRAIN_MOVES_PER_SESSION`] times per drain, at least
//! [`DRAIN_MOVE_AGAIN_AFTER`] apart: a device that comes back (its list, refreshed every
//! 10 s, did not say the server drains yet) is moved again once it knows, and a device
//! whose list holds no other server comes back for good and is served. Ending the drain
//! (`--no-drain`) forgets the moves.
//!
//! **Rebalancing** uses the same move. A serving server that carries more than its share
//! of its site's sessions (`farm::balance::excess`: a server joined, returned or ended a
//! drain) moves its excess away, at most [`REBALANCE_MOVES_PER_CHECK`] sessions per check,
//! checks [`REBALANCE_EVERY`] apart with ±20 % jitter (so that the servers of a site do
//! not move in step), and only once the excess has lasted [`REBALANCE_SETTLE`]: a device
//! learns a server that joined from its status reports within 12 s, and a moved device
//! should find it. A session is moved for balance at most once per [`REBALANCE_FORGET`]
//! (one whose list did not hold the new server yet comes back and is moved again later). A
//! move is a failover, not a login: the device keeps its session and its boot is not
//! counted again.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::farm_client::{Client, Conn};
use crate::server_farm::FarmHandle;

/// `ferry server drain|undrain NAME`: the same change as `ferry farm server set ID
/// --drain|--no-drain`, by the server's name.
#[derive(Debug, Subcommand)]
pub enum DrainCommand {
    /// Drain a farm server: logins name it last, and it moves the devices it serves to the
    /// other servers of their lists (each fails over without a new login).
    #[command(
        after_help = "Examples:\n  ferry server drain pvs1 --api https://farm:8080 \\\n      \
        --farm-ca ca-cert.pem --token $FERRY_TOKEN\n  ferry server undrain pvs1"
    )]
    Drain {
        /// The server's name in the farm.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// End a server's drain: logins name it by its load again.
    #[command(after_help = "Example:\n  ferry server undrain pvs1")]
    Undrain {
        /// The server's name in the farm.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Runs `ferry server drain|undrain NAME`.
///
/// # Errors
/// API errors; no server of that name.
pub fn run(c: &DrainCommand) -> anyhow::Result<ExitCode> {
    let (name, conn, draining) = match c {
        DrainCommand::Drain { name, conn } => (name, conn, true),
        DrainCommand::Undrain { name, conn } => (name, conn, false),
    };
    let client = Client::new(conn)?;
    let mut offset = 0;
    let id = loop {
        let page = client.get(&format!("/servers?limit=1000&offset={offset}"))?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if let Some(s) = items.iter().find(|s| s["name"] == name.as_str()) {
            break s["id"].as_i64().unwrap_or_default();
        }
        if items.is_empty() {
            anyhow::bail!("the farm has no server named {name:?} (see `ferry farm server list`)");
        }
        offset += items.len();
    };
    let v = client.call(
        Method::PATCH,
        &format!("/servers/{id}"),
        Some(json!({ "draining": draining })),
    )?;
    let what = if draining {
        "draining: logins name it last, and it moves its devices to their next servers"
    } else {
        "serving: logins name it by its load again"
    };
    client.done(&v, &format!("server {name} (id {id}) {what}"))?;
    Ok(ExitCode::SUCCESS)
}

/// How often the server reads whether it is draining.
pub const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);
/// The most sessions moved per check: a drain must not turn into a reconnect storm on the
/// other servers.
pub const DRAIN_SESSIONS_PER_CHECK: usize = 16;

/// The most times a drain moves one session.
pub const DRAIN_MOVES_PER_SESSION: u32 = 3;
/// The least time between two moves of one session by a drain: longer than a device takes
/// to learn that the server drains (a list refresh every 10 s, plus a report).
pub const DRAIN_MOVE_AGAIN_AFTER: Duration = Duration::from_secs(15);

/// The sessions to move now: those open and not moved yet, or moved fewer than
/// [`DRAIN_MOVES_PER_SESSION`] times and last more than [`DRAIN_MOVE_AGAIN_AFTER`] ago; at
/// most [`DRAIN_SESSIONS_PER_CHECK`], starting at a position that changes with `turn` so
/// that no session is always last.
pub fn to_move(
    open: &[String],
    moved: &HashMap<String, (u32, Instant)>,
    turn: usize,
    now: Instant,
) -> Vec<String> {
    let waiting: Vec<&String> = open
        .iter()
        .filter(|n| match moved.get(*n) {
            None => true,
            Some((times, at)) => {
                *times < DRAIN_MOVES_PER_SESSION
                    && now.saturating_duration_since(*at) >= DRAIN_MOVE_AGAIN_AFTER
            }
        })
        .collect();
    rotated(&waiting, turn, DRAIN_SESSIONS_PER_CHECK)
}

/// Up to `n` of `waiting`, starting at a position that changes with `turn` (so that no
/// session is always last) and wrapping around.
fn rotated(waiting: &[&String], turn: usize, n: usize) -> Vec<String> {
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

/// How often, on average, a serving server checks whether it carries more than its share.
pub const REBALANCE_EVERY: Duration = Duration::from_secs(5);
/// The most sessions one rebalance check moves.
pub const REBALANCE_MOVES_PER_CHECK: usize = 8;
/// How long a session moved for balance is not moved again.
pub const REBALANCE_FORGET: Duration = Duration::from_secs(60);
/// How long an excess must last before sessions move: longer than a device takes to learn
/// a new server (a server-list refresh every 10 s, `agent::report::SERVERS_REFRESH_REPORTS`
/// reports of 2 s, plus one report), and longer than `farm::balance::REBALANCE_ALIVE_MS`,
/// so that the empty place of a server killed a moment ago never moves a device.
pub const REBALANCE_SETTLE: Duration = Duration::from_secs(25);

/// The sessions a rebalance check moves: up to `excess` (and
/// [`REBALANCE_MOVES_PER_CHECK`]) of `open`, skipping those moved within
/// [`REBALANCE_FORGET`], from a position that changes with `turn`.
pub fn to_rebalance(
    open: &[String],
    recent: &HashMap<String, Instant>,
    excess: usize,
    turn: usize,
    now: Instant,
) -> Vec<String> {
    let waiting: Vec<&String> = open
        .iter()
        .filter(|n| {
            recent
                .get(*n)
                .is_none_or(|t| now.saturating_duration_since(*t) >= REBALANCE_FORGET)
        })
        .collect();
    rotated(&waiting, turn, excess.min(REBALANCE_MOVES_PER_CHECK))
}

/// The pause before the next rebalance check: [`REBALANCE_EVERY`] ± 20 %.
fn rebalance_pause() -> Duration {
    use rand::Rng as _;
    REBALANCE_EVERY.mul_f64(rand::thread_rng().gen_range(0.8..1.2))
}

/// Watches this server's draining flag and moves its sessions away while it is set; while
/// it is not, moves its excess over its share of the site's sessions (rebalancing).
pub fn drain_when_told(
    handle: &FarmHandle,
    registry: &server::exports::Registry,
    runtime: &tokio::runtime::Handle,
) {
    let reg = registry.clone();
    let farm = Arc::clone(&handle.farm);
    let id = handle.server_id;
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(DRAIN_CHECK_EVERY);
        let mut moved: HashMap<String, (u32, Instant)> = HashMap::new();
        let mut turn = 0usize;
        let mut rebalanced: HashMap<String, Instant> = HashMap::new();
        let mut next_rebalance = Instant::now() + rebalance_pause();
        let mut excess_since: Option<Instant> = None;
        loop {
            tick.tick().await;
            let draining = match farm.server(id).await {
                Ok(s) => s.draining.0,
                Err(e) => {
                    tracing::warn!(error = %e, "drain check failed");
                    continue;
                }
            };
            if !draining {
                if !moved.is_empty() {
                    tracing::info!(moved = moved.len(), "drain ended");
                    moved.clear();
                }
                let now = Instant::now();
                if now < next_rebalance {
                    continue;
                }
                next_rebalance = now + rebalance_pause();
                let excess = match farm.rebalance_excess(id).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(error = %e, "rebalance check failed");
                        continue;
                    }
                };
                if excess == 0 {
                    excess_since = None;
                    continue;
                }
                let since = *excess_since.get_or_insert(now);
                if now.saturating_duration_since(since) < REBALANCE_SETTLE {
                    continue;
                }
                rebalanced.retain(|_, t| now.saturating_duration_since(*t) < REBALANCE_FORGET);
                let mut open = reg.open_session_names();
                open.sort();
                turn = turn.wrapping_add(1);
                for name in to_rebalance(&open, &rebalanced, excess, turn, now) {
                    let n = reg.move_session(&name);
                    tracing::info!(session = %name, connections = n, excess,
                        "rebalancing: closed the session's connections (the device moves to a less loaded server)");
                    rebalanced.insert(name, now);
                }
                continue;
            }
            let mut open = reg.open_session_names();
            open.sort();
            turn = turn.wrapping_add(1);
            let now = Instant::now();
            for name in to_move(&open, &moved, turn, now) {
                let n = reg.move_session(&name);
                let times = moved.get(&name).map_or(0, |(t, _)| *t) + 1;
                tracing::info!(session = %name, connections = n, times,
                    "draining: closed the session's connections (the device fails over)");
                moved.insert(name, (times, now));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ferry-s-{i:04}")).collect()
    }

    #[test]
    fn moves_each_session_once_a_bounded_number_at_a_time() {
        let open = names(40);
        let mut moved = HashMap::new();
        let mut checks = 0;
        let t0 = Instant::now();
        loop {
            let now = to_move(&open, &moved, checks, t0);
            if now.is_empty() {
                break;
            }
            assert!(now.len() <= DRAIN_SESSIONS_PER_CHECK);
            for n in now {
                assert!(moved.insert(n, (1, t0)).is_none(), "a session moved twice");
            }
            checks += 1;
        }
        assert_eq!(moved.len(), 40);
        assert_eq!(checks, 3, "40 sessions, 16 per check");
    }

    #[test]
    fn a_session_that_comes_back_is_moved_again_later_a_bounded_number_of_times() {
        let open = names(1);
        let t0 = Instant::now();
        let mut moved = HashMap::new();
        moved.insert(open[0].clone(), (1, t0));
        assert!(to_move(&open, &moved, 0, t0 + Duration::from_secs(1)).is_empty());
        let later = t0 + DRAIN_MOVE_AGAIN_AFTER;
        assert_eq!(to_move(&open, &moved, 0, later), open);
        moved.insert(open[0].clone(), (DRAIN_MOVES_PER_SESSION, t0));
        assert!(
            to_move(&open, &moved, 0, later).is_empty(),
            "it stays at last"
        );
    }

    #[test]
    fn rebalance_moves_at_most_the_excess_and_not_the_same_session_twice() {
        let open = names(40);
        let now = Instant::now();
        let mut recent = HashMap::new();
        let first = to_rebalance(&open, &recent, 5, 0, now);
        assert_eq!(first.len(), 5);
        for n in &first {
            recent.insert(n.clone(), now);
        }
        let second = to_rebalance(&open, &recent, 100, 0, now);
        assert_eq!(second.len(), REBALANCE_MOVES_PER_CHECK);
        assert!(second.iter().all(|n| !first.contains(n)));
        let later = now + REBALANCE_FORGET;
        assert_eq!(to_rebalance(&open[..5], &recent, 9, 0, later).len(), 5);
        assert!(to_rebalance(&open, &recent, 0, 0, now).is_empty());
    }

    #[test]
    fn the_first_session_moved_changes_with_the_turn() {
        let open = names(5);
        let moved = HashMap::new();
        let t0 = Instant::now();
        let firsts: std::collections::HashSet<String> = (0..5)
            .map(|t| to_move(&open, &moved, t, t0)[0].clone())
            .collect();
        assert_eq!(firsts.len(), 5);
    }
}
