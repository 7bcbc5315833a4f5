//! The farm-member runtime: what a `ferry server --farm` does as one server of a farm, on
//! an injected clock and a seeded RNG, so that its timing cases run in simulated time.
//!
//! * **Session resolution** ([`FarmSessions`]): the session-scoped export names of device
//!   login (`ferry-s-…`) resolve through the farm's session table, else the farm database
//!   (a session another server granted is honoured); [`FarmBootSets`] keeps the boot sets
//!   this server records in the farm.
//! * **Heartbeat**: the server records that it lives every [`Timing::heartbeat_every`].
//! * **Session recheck**: sessions ended elsewhere (another server's API, expiry) are
//!   closed within [`Timing::session_recheck_every`]; those this process ends, at once.
//! * **Drain** ([`drain`]): a draining server moves its sessions' devices away, a few each
//!   [`Timing::drain_check_every`].
//! * **Rebalancing** ([`rebalance`]): a serving server that carries more than its share moves
//!   its excess, once the excess has lasted [`Timing::rebalance_settle`].
//! * **Promotion prefetch**: the boot set of each vDisk's production version is read into the
//!   block cache when the server starts and when a version is promoted.
//! * **Snapshot and catch-up** (`farm::offline`): the server reads its snapshot of the farm
//!   every [`Timing::snapshot_every`], so that known devices boot and fail over while the
//!   database is away; when a heartbeat finds the database back, the logins made meanwhile
//!   are written before any session is rechecked.
//! * **Vanished machines**: every [`Timing::vanish_check_every`] the server marks the
//!   sessions it holds open, and ends the farm's sessions neither reported nor held for
//!   `farm::counters::SESSION_VANISHED_MS` (once the database has been up that long).
//!
//! # Layout
//!
//! ```text
//!   ferry server (cli: flags) ──► Runtime::new(farm, server id, Served, Timing, seed)
//!                                   │ run(clock, stop): tick(now) whenever one is due
//!                                   ▼
//!   Runtime::tick(now_ms) ──► heartbeat ─────────────► farm::Farm (SQLite / PostgreSQL)
//!         │               ──► session recheck ───────►   "
//!         │               ──► Drain / Rebalance ─────►   "      (pure plans: drain.rs,
//!         │               ──► promotion prefetch ────►   "       rebalance.rs)
//!         ▼
//!   Served (server::exports::Registry): open sessions, move, revoke, prefetch
//! ```
//!
//! Time is the farm's [`farm::Clock`] (Unix milliseconds): [`farm::SystemClock`] in a server,
//! [`farm::SimClock`] in tests, which open the farm with the same clock so that its
//! heartbeats, expiries and liveness read simulated time too. [`Runtime::tick`] takes `now`
//! and returns when it is next due; [`Runtime::run`] sleeps until then on a real clock
//! (TigerBeetle's ticking time: a simulation calls `tick` itself and runs hours in
//! milliseconds). The only randomness (the rebalance pause's jitter) comes from a seeded
//! [`rand::rngs::StdRng`].
//!
//! # Why a crate of its own
//!
//! Not a module of `server`: that would make the data-path crate depend on the farm's
//! database (sqlx), where today the farm reaches the server only through the traits it
//! declares (`SessionResolver`, `BootSetMirror`). This crate implements those traits over
//! `farm::Farm` and drives the server through [`Served`], so `server` stays farm-free and
//! `cli` only parses flags and wires this crate.

#![warn(missing_docs)]

pub mod drain;
pub mod rebalance;
mod runtime;
mod served;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

pub use runtime::{Runtime, Ticked};
pub use served::Served;
pub use sessions::{FarmBootSets, FarmSessions, export_for};

/// How often a farm server records its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// How often a farm server checks that the sessions open on it still exist in the farm
/// database (ended by another server's API, or expired), closing those that do not.
pub const SESSION_RECHECK_EVERY: Duration = Duration::from_secs(10);
/// How often a farm server asks which versions are in production (to prefetch a promoted
/// version's boot set before its devices boot it).
pub const PROMOTION_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How often a farm server marks the sessions it holds open and ends vanished ones.
pub const VANISH_CHECK_EVERY: Duration = Duration::from_secs(60);

/// Every interval of the runtime, settable so that tests (in simulated time, or processes in
/// short real time) need not wait for production values. [`Timing::default`] is what a
/// server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often the server records its heartbeat ([`HEARTBEAT_EVERY`]).
    pub heartbeat_every: Duration,
    /// How often open sessions are checked against the database ([`SESSION_RECHECK_EVERY`]).
    pub session_recheck_every: Duration,
    /// How often the server reads whether it drains, and the drain's pacing
    /// ([`drain::DRAIN_CHECK_EVERY`]); rebalance checks happen at these ticks too.
    pub drain_check_every: Duration,
    /// The least time between two moves of one session by a drain
    /// ([`drain::DRAIN_MOVE_AGAIN_AFTER`]).
    pub drain_move_again_after: Duration,
    /// The mean pause between rebalance checks, ± [`rebalance::REBALANCE_JITTER_PERCENT`]
    /// ([`rebalance::REBALANCE_EVERY`]).
    pub rebalance_every: Duration,
    /// How long an excess must last before sessions move ([`rebalance::REBALANCE_SETTLE`]).
    pub rebalance_settle: Duration,
    /// How long a session moved for balance is not moved again
    /// ([`rebalance::REBALANCE_FORGET`]).
    pub rebalance_forget: Duration,
    /// How often production versions are listed for prefetch ([`PROMOTION_CHECK_EVERY`]).
    pub promotion_check_every: Duration,
    /// How often the server reads its snapshot of the farm, what its devices boot and fail
    /// over from while the database is away ([`farm::snapshot::SNAPSHOT_EVERY_MS`]).
    pub snapshot_every: Duration,
    /// How often the server marks the sessions it serves as held and ends those whose
    /// machines vanished ([`VANISH_CHECK_EVERY`], `farm::counters::SESSION_VANISHED_MS`).
    pub vanish_check_every: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat_every: HEARTBEAT_EVERY,
            session_recheck_every: SESSION_RECHECK_EVERY,
            drain_check_every: drain::DRAIN_CHECK_EVERY,
            drain_move_again_after: drain::DRAIN_MOVE_AGAIN_AFTER,
            rebalance_every: rebalance::REBALANCE_EVERY,
            rebalance_settle: rebalance::REBALANCE_SETTLE,
            rebalance_forget: rebalance::REBALANCE_FORGET,
            promotion_check_every: PROMOTION_CHECK_EVERY,
            vanish_check_every: VANISH_CHECK_EVERY,
            snapshot_every: Duration::from_millis(
                u64::try_from(farm::snapshot::SNAPSHOT_EVERY_MS).unwrap_or(15_000),
            ),
        }
    }
}

/// What a farm server is in its farm: the farm, and its own registration.
#[derive(Debug)]
pub struct FarmHandle {
    /// The farm.
    pub farm: Arc<farm::Farm>,
    /// This server's id in the farm.
    pub server_id: i64,
    /// This server's name in the farm.
    pub name: String,
    /// The NBD address devices are told to use.
    pub advertise: String,
}

/// `d` in whole milliseconds, saturating: the unit of [`farm::Clock`].
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
