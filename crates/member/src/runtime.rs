//! The runtime's one state machine: [`Runtime::tick`] at `now` does whatever is due
//! (heartbeat, session recheck, drain or rebalance check, promotion check) and says when it
//! is next due. [`Runtime::run`] is the real-time driver; a simulation calls `tick` itself.
//!
//! Design notes. One task, not one per timer: the checks are short database calls, and one
//! sequence makes a simulated run deterministic (the same seed, the same order of moves).
//! Each activity keeps its next due time; a failed database call logs and waits for its
//! next turn, as the loops it replaces did. The first tick heartbeats, rechecks, checks the
//! drain flag and lists production versions at once (a server starting prefetches the
//! production boot sets before any device asks); the first rebalance check comes a jittered
//! pause later.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng as _;
use rand::rngs::StdRng;

use crate::drain::Drain;
use crate::rebalance::{Decision, Rebalance};
use crate::{Served, Timing};

/// The farm-member runtime of one server.
#[derive(Debug)]
pub struct Runtime {
    farm: Arc<farm::Farm>,
    server_id: i64,
    served: Arc<dyn Served>,
    timing: Timing,
    next_heartbeat_ms: i64,
    next_recheck_ms: i64,
    next_drain_ms: i64,
    next_promotion_ms: i64,
    next_snapshot_ms: i64,
    next_vanish_ms: i64,
    drain: Drain,
    rebalance: Rebalance,
    /// The production versions seen at the last promotion check (only the current list is
    /// remembered: bounded by the farm's vDisks).
    promoted: HashSet<(String, i64)>,
}

/// What one [`Runtime::tick`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ticked {
    /// When the runtime is next due (Unix ms).
    pub next_due_ms: i64,
    /// A heartbeat was recorded.
    pub heartbeat: bool,
    /// Whether the farm said this server drains (`None`: not checked, or the check failed).
    pub draining: Option<bool>,
    /// Sessions a drain moved, with how many times each has been moved.
    pub drained: Vec<(String, u32)>,
    /// Sessions moved for balance.
    pub rebalanced: Vec<String>,
    /// Sessions closed because their session ended.
    pub revoked: Vec<String>,
    /// Production versions whose boot set started prefetching here.
    pub prefetched: Vec<(String, u32)>,
    /// The snapshot of the farm was read again.
    pub snapshot: bool,
    /// Logins made while the database was away, written now that it is back.
    pub caught_up: usize,
    /// Sessions of the farm ended because their machines vanished.
    pub vanished: Vec<String>,
}

impl Runtime {
    /// The runtime of server `server_id` of `farm`, serving through `served`, with `timing`'s
    /// intervals; `seed` seeds its RNG (the rebalance pauses' jitter). `now_ms` is the time
    /// it starts at (the first tick is due then).
    ///
    /// From now on, every session the farm's session table ends (this process's API ended
    /// it, or the device logged in again) has its connections closed at once.
    pub fn new(
        farm: Arc<farm::Farm>,
        server_id: i64,
        served: Arc<dyn Served>,
        timing: Timing,
        seed: u64,
        now_ms: i64,
    ) -> Runtime {
        let on_end = Arc::clone(&served);
        farm.session_table().on_end(move |name| {
            on_end.revoke_session(name);
        });
        Runtime {
            rebalance: Rebalance::new(&timing, now_ms, StdRng::seed_from_u64(seed)),
            drain: Drain::new(timing.drain_move_again_after),
            farm,
            server_id,
            served,
            timing,
            next_heartbeat_ms: now_ms,
            next_recheck_ms: now_ms,
            next_drain_ms: now_ms,
            next_promotion_ms: now_ms,
            next_snapshot_ms: now_ms,
            next_vanish_ms: now_ms,
            promoted: HashSet::new(),
        }
    }

    /// The intervals it runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The drain's memory (how many times it moved a session).
    pub fn drain(&self) -> &Drain {
        &self.drain
    }

    /// Does what is due at `now_ms`; returns what it did and when it is next due.
    pub async fn tick(&mut self, now_ms: i64) -> Ticked {
        let mut t = Ticked::default();
        if now_ms >= self.next_heartbeat_ms {
            self.next_heartbeat_ms = after(now_ms, self.timing.heartbeat_every);
            t.heartbeat = self.heartbeat().await;
        }
        // Before any recheck: a session granted offline is in the database only then.
        let pending = self.farm.database_state().pending_logins;
        if pending > 0 && (t.heartbeat || now_ms >= self.next_recheck_ms) {
            match self.farm.catch_up().await {
                Ok(n) => t.caught_up = n,
                Err(e) => tracing::debug!(error = %e, pending, "offline logins not written yet"),
            }
        }
        if now_ms >= self.next_recheck_ms {
            self.next_recheck_ms = after(now_ms, self.timing.session_recheck_every);
            // While the database is away or logins wait, nothing is revoked on its word.
            let db = self.farm.database_state();
            if db.up && db.pending_logins == 0 {
                t.revoked = self.recheck_sessions().await;
            }
        }
        if now_ms >= self.next_vanish_ms {
            self.next_vanish_ms = after(now_ms, self.timing.vanish_check_every);
            t.vanished = self.sweep_vanished(now_ms).await;
        }
        if now_ms >= self.next_snapshot_ms {
            self.next_snapshot_ms = after(now_ms, self.timing.snapshot_every);
            t.snapshot = self.refresh_snapshot().await;
        }
        if now_ms >= self.next_drain_ms {
            self.next_drain_ms = after(now_ms, self.timing.drain_check_every);
            self.check_drain(now_ms, &mut t).await;
        }
        if now_ms >= self.next_promotion_ms {
            self.next_promotion_ms = after(now_ms, self.timing.promotion_check_every);
            t.prefetched = self.prefetch_promoted().await;
        }
        t.next_due_ms = self
            .next_heartbeat_ms
            .min(self.next_recheck_ms)
            .min(self.next_drain_ms)
            .min(self.next_promotion_ms)
            .min(self.next_snapshot_ms)
            .min(self.next_vanish_ms);
        t
    }

    /// Ticks on `clock` until `stop` completes, sleeping (in tokio's time) until each next
    /// due time.
    pub async fn run(mut self, clock: Arc<dyn farm::Clock>, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let t = self.tick(clock.now_ms()).await;
            let wait = t.next_due_ms.saturating_sub(clock.now_ms()).max(0);
            let wait = Duration::from_millis(u64::try_from(wait).unwrap_or(0));
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Marks the sessions open here as held; then, once the database has answered for
    /// `SESSION_VANISHED_MS` without a break (servers and devices have had the time to be
    /// heard again) and no offline login waits, ends the sessions neither reported nor held
    /// for that long. Their connections here close through the session table.
    async fn sweep_vanished(&self, now_ms: i64) -> Vec<String> {
        let open = self.served.open_session_names();
        if let Err(e) = self.farm.hold_sessions(&open).await {
            tracing::debug!(error = %e, "held sessions not marked");
            return Vec::new();
        }
        let db = self.farm.database_state();
        let steady = db
            .up_since_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= farm::counters::SESSION_VANISHED_MS);
        if !steady || db.pending_logins > 0 {
            return Vec::new();
        }
        self.farm.end_vanished_sessions().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "vanished sessions not ended");
            Vec::new()
        })
    }

    async fn refresh_snapshot(&self) -> bool {
        match self.farm.refresh_snapshot(Some(self.server_id)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, "farm snapshot not read (the last one stays)");
                false
            }
        }
    }

    async fn heartbeat(&self) -> bool {
        match self.farm.heartbeat(self.server_id).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "farm heartbeat failed");
                false
            }
        }
    }

    /// Closes the sessions open here that the database no longer holds (ended by another
    /// server's API, or expired).
    async fn recheck_sessions(&self) -> Vec<String> {
        let mut revoked = Vec::new();
        for name in self.served.open_session_names() {
            match self.farm.session_by_export(&name).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    self.farm.session_table().remove(&name);
                    self.served.revoke_session(&name);
                    revoked.push(name);
                }
                Err(e) => tracing::warn!(error = %e, "session recheck failed"),
            }
        }
        revoked
    }

    /// Reads this server's draining flag: while it is set, moves sessions away at the
    /// drain's pace; while it is not, moves the excess over its share (rebalancing).
    async fn check_drain(&mut self, now_ms: i64, t: &mut Ticked) {
        let draining = match self.farm.server(self.server_id).await {
            Ok(s) => s.draining.0,
            Err(e) => {
                tracing::warn!(error = %e, "drain check failed");
                return;
            }
        };
        t.draining = Some(draining);
        if draining {
            for (name, times) in self.drain.check(self.served.open_session_names(), now_ms) {
                let n = self.served.move_session(&name);
                tracing::info!(session = %name, connections = n, times,
                    "draining: closed the session's connections (the device fails over)");
                t.drained.push((name, times));
            }
            return;
        }
        let moved = self.drain.end();
        if moved > 0 {
            tracing::info!(moved, "drain ended");
        }
        if !self.rebalance.start_check(now_ms) {
            return;
        }
        let plan = match self.farm.rebalance_plan(self.server_id).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "rebalance check failed");
                return;
            }
        };
        // Only sessions open here whose device's destination has room (farm::moves).
        let open: std::collections::HashSet<String> =
            self.served.open_session_names().into_iter().collect();
        let movable: Vec<&farm::moves::Movable> = plan
            .movable
            .iter()
            .filter(|m| open.contains(&m.export_name))
            .collect();
        let names = movable.iter().map(|m| m.export_name.clone()).collect();
        if let Decision::Move(names) = self.rebalance.decide(plan.excess, names, now_ms) {
            for name in names {
                let Some(m) = movable.iter().find(|m| m.export_name == name) else {
                    continue;
                };
                // Counted on its destination first, so that no check overfills it.
                if let Err(e) = self.farm.move_session_to(&m.session_id, m.to).await {
                    tracing::warn!(error = %e, session = %name, "rebalance move not recorded");
                    continue;
                }
                let n = self.served.move_session(&name);
                tracing::info!(session = %name, connections = n, excess = plan.excess, to = m.to,
                    "rebalancing: closed the session's connections (the device moves to a server below its share)");
                t.rebalanced.push(name);
            }
        }
    }

    /// Prefetches the boot set of each vDisk's newest production version into this server's
    /// block cache: those in production at the first check, then each version promoted.
    /// Once per version while it stays in production: a version already prefetched is not
    /// read again by this check (a boot's own open still starts a run if the cache lost it).
    /// Versions this server's store does not hold are skipped.
    async fn prefetch_promoted(&mut self) -> Vec<(String, u32)> {
        let now = match self.farm.production_boot_sets().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %contract::ErrorChain(&e), "production versions not listed");
                return Vec::new();
            }
        };
        let new: Vec<_> = now
            .iter()
            .filter(|v| !self.promoted.contains(*v))
            .cloned()
            .collect();
        self.promoted = now.into_iter().collect();
        if new.is_empty() {
            return Vec::new();
        }
        let served = Arc::clone(&self.served);
        // The registry's prefetch may read the farm's copy of a set (blocking).
        let ran = tokio::task::spawn_blocking(move || {
            let mut started = Vec::new();
            for (vdisk, number) in new {
                let Ok(version) = u32::try_from(number) else {
                    continue;
                };
                match served.prefetch_boot_set(&vdisk, version) {
                    Ok(true) => {
                        tracing::info!(%vdisk, version,
                            "prefetching the boot set of a production version");
                        started.push((vdisk, version));
                    }
                    Ok(false) => {}
                    Err(e) => tracing::debug!(%vdisk, version, error = %e, "not prefetched here"),
                }
            }
            started
        })
        .await;
        ran.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the promoted versions' prefetch failed");
            Vec::new()
        })
    }
}

/// `now_ms` plus `every`, saturating.
fn after(now_ms: i64, every: Duration) -> i64 {
    now_ms.saturating_add(crate::ms(every))
}
