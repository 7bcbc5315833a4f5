//! Prefetch at the device: given the boot set of the attached version (the extents a boot
//! reads, in the order it reads them), fetch the next ones into the host cache (or a
//! private one) ahead of the machine's reads, so a boot over a network with latency is not
//! a chain of round trips.
//!
//! # Design notes
//!
//! The set becomes a list of cache blocks in first-read order, cut into *runs* of
//! consecutive blocks (one server request each, at most [`PrefetchConfig::request_bytes`]).
//! [`PrefetchConfig::inflight_bytes`] ÷ `request_bytes` workers take runs in order; a
//! worker waits while its run starts more than [`PrefetchConfig::ahead_bytes`] of the set
//! past the furthest block the machine has read (the [`Cursor`], fed by every read of
//! [`HostCached`]), so the window follows the boot. Both bounds are named limits: bytes in
//! flight and distance ahead.
//!
//! It stops when every run is fetched, when the boot ended (the agent's boot clock), or
//! when the machine has made [`OUTSIDE_READS_MAX`] reads in a row outside the set (the
//! boot moved past it, or the set is of another boot). It fetches through the layer that
//! holds the attached version's key, so it never fills an entry of another version: a
//! set recorded on another version only wastes reads, never leaks bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use disk::BlockDevice;
use parking_lot::{Condvar, Mutex};

use crate::host_read::{HostCached, ReadObserver};

/// True once the machine's boot ended (the agent's boot clock).
pub type BootEnded = Arc<dyn Fn() -> bool + Send + Sync>;

/// Most extents of a boot set taken (the rest is ignored).
pub const BOOT_SET_EXTENTS_MAX: usize = 1 << 20;
/// Most bytes of a boot set taken.
pub const BOOT_SET_BYTES_MAX: u64 = 16 << 30;
/// Reads in a row outside the set after which the boot counts as past it.
pub const OUTSIDE_READS_MAX: u64 = 4096;
/// Default distance ahead of the machine's furthest read in the set.
pub const AHEAD_BYTES: u64 = 64 << 20;
/// Default bytes in flight.
pub const INFLIGHT_BYTES: u64 = 8 << 20;
/// Default longest prefetch request.
pub const REQUEST_BYTES: u64 = 1 << 20;
/// Most workers (requests in flight).
const WORKERS_MAX: u64 = 64;
/// How often a waiting worker looks whether it should stop.
const WAIT_TICK: Duration = Duration::from_millis(10);

/// Where a boot set comes from: the farm's API for the attached version (wired by the
/// caller), a file, or a list in tests. Called once, on the prefetch's own thread.
pub trait BootSetSource: Send + Sync + std::fmt::Debug {
    /// The extents `(offset, len)` a boot of the attached version reads, in order; empty
    /// when the version has none yet.
    ///
    /// # Errors
    /// Why the set could not be had (logged; the agent runs without prefetch).
    fn boot_set(&self) -> Result<Vec<(u64, u32)>, String>;
}

impl BootSetSource for Vec<(u64, u32)> {
    fn boot_set(&self) -> Result<Vec<(u64, u32)>, String> {
        Ok(self.clone())
    }
}

/// The prefetch's bounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchConfig {
    /// Distance ahead of the machine's furthest read in the set, in bytes of the set.
    pub ahead_bytes: u64,
    /// Bytes in flight (workers × request).
    pub inflight_bytes: u64,
    /// Longest request.
    pub request_bytes: u64,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            ahead_bytes: AHEAD_BYTES,
            inflight_bytes: INFLIGHT_BYTES,
            request_bytes: REQUEST_BYTES,
        }
    }
}

/// The machine's position in the set, fed by reads.
#[derive(Debug)]
pub struct Cursor {
    /// Block → its index in the set.
    index: HashMap<u64, usize>,
    /// One past the furthest index read.
    seen: AtomicUsize,
    /// Reads outside the set since the last inside.
    outside: AtomicU64,
    wake: (Mutex<()>, Condvar),
}

impl ReadObserver for Cursor {
    fn observe(&self, b: u64) {
        match self.index.get(&b) {
            Some(&i) => {
                self.outside.store(0, Ordering::Relaxed);
                if self.seen.fetch_max(i + 1, Ordering::AcqRel) < i + 1 {
                    self.wake.1.notify_all();
                }
            }
            None => {
                self.outside.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What the prefetch does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefetchState {
    /// Getting the boot set.
    Starting,
    /// Fetching ahead of the boot.
    Fetching,
    /// Every block of the set was fetched or found cached.
    Done,
    /// The boot ended first.
    BootEnded,
    /// The machine read outside the set for [`OUTSIDE_READS_MAX`] reads.
    MovedPast,
    /// No boot set (none recorded, or it could not be had).
    NoSet,
    /// A server read failed; the machine's own reads go on.
    Failed,
}

/// The prefetch's part of the status report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrefetchStatus {
    /// What it does now.
    pub state: PrefetchState,
    /// Blocks in the set.
    pub set_blocks: u64,
    /// Bytes of those blocks.
    pub set_bytes: u64,
    /// Bytes fetched from the server by the prefetch.
    pub fetched_bytes: u64,
    /// Blocks of the set the machine has reached (the furthest read).
    pub position_blocks: u64,
}

/// A running prefetch.
#[derive(Debug)]
pub struct Prefetch {
    state: Mutex<PrefetchState>,
    set_blocks: AtomicU64,
    set_bytes: AtomicU64,
    fetched: AtomicU64,
    cursor: Mutex<Option<Arc<Cursor>>>,
    stop: AtomicBool,
}

/// One server request of the plan: `n` blocks from `first`, at set index `at`.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    n: u64,
    at: usize,
}

/// The set's blocks in first-read order, without repeats, inside `size`.
fn blocks_of(set: &[(u64, u32)], block_bytes: u64, size: u64) -> Vec<u64> {
    let shift = block_bytes.trailing_zeros();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for &(offset, len) in set.iter().take(BOOT_SET_EXTENTS_MAX) {
        let Some(end) = offset.checked_add(u64::from(len)).map(|e| e.min(size)) else {
            continue;
        };
        if len == 0 || offset >= end {
            continue;
        }
        for b in offset >> shift..=(end - 1) >> shift {
            if seen.insert(b) {
                out.push(b);
                bytes += block_bytes;
                if bytes >= BOOT_SET_BYTES_MAX {
                    return out;
                }
            }
        }
    }
    out
}

/// The runs of consecutive blocks, each at most `max` blocks.
fn runs_of(blocks: &[u64], max: u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.first + r.n == b && r.n < max => r.n += 1,
            _ => runs.push(Run {
                first: b,
                n: 1,
                at: i,
            }),
        }
    }
    runs
}

impl Prefetch {
    /// Starts prefetching `source`'s set through `dev` (threads that end with the agent),
    /// until it is fetched, `boot` ends, or the machine moved past it.
    pub fn start(
        dev: &Arc<HostCached>,
        source: Arc<dyn BootSetSource>,
        cfg: PrefetchConfig,
        boot: BootEnded,
    ) -> Arc<Prefetch> {
        let p = Arc::new(Prefetch {
            state: Mutex::new(PrefetchState::Starting),
            set_blocks: AtomicU64::new(0),
            set_bytes: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            cursor: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let (me, weak) = (Arc::clone(&p), Arc::downgrade(dev));
        let spawned = std::thread::Builder::new()
            .name("ferry-prefetch".into())
            .spawn(move || me.plan(&weak, source.as_ref(), cfg, &boot));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no prefetch thread");
            *p.state.lock() = PrefetchState::Failed;
        }
        p
    }

    /// Stops the workers at their next step.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn plan(
        self: Arc<Self>,
        dev: &Weak<HostCached>,
        source: &dyn BootSetSource,
        cfg: PrefetchConfig,
        boot: &BootEnded,
    ) {
        let set = match source.boot_set() {
            Ok(s) if !s.is_empty() => s,
            Ok(_) => return *self.state.lock() = PrefetchState::NoSet,
            Err(e) => {
                tracing::warn!(error = %e, "no boot set: booting without prefetch");
                return *self.state.lock() = PrefetchState::NoSet;
            }
        };
        let Some(d) = dev.upgrade() else { return };
        let bb = d.block_bytes();
        let blocks = blocks_of(&set, bb, d.size());
        let runs = Arc::new(runs_of(&blocks, (cfg.request_bytes / bb).max(1)));
        let cursor = Arc::new(Cursor {
            index: blocks.iter().enumerate().map(|(i, &b)| (b, i)).collect(),
            seen: AtomicUsize::new(0),
            outside: AtomicU64::new(0),
            wake: (Mutex::new(()), Condvar::new()),
        });
        d.watch(Arc::clone(&cursor) as Arc<dyn ReadObserver>);
        drop(d);
        self.set_blocks
            .store(blocks.len() as u64, Ordering::Relaxed);
        self.set_bytes
            .store(blocks.len() as u64 * bb, Ordering::Relaxed);
        *self.cursor.lock() = Some(Arc::clone(&cursor));
        *self.state.lock() = PrefetchState::Fetching;
        tracing::info!(
            blocks = blocks.len(),
            runs = runs.len(),
            ahead = cfg.ahead_bytes,
            inflight = cfg.inflight_bytes,
            "prefetching the boot set"
        );
        let workers = (cfg.inflight_bytes / cfg.request_bytes.max(1)).clamp(1, WORKERS_MAX);
        let ahead = (cfg.ahead_bytes / bb).max(1) as usize;
        let next = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for _ in 0..workers {
            let (me, dev, runs, next, cursor, boot) = (
                Arc::clone(&self),
                dev.clone(),
                Arc::clone(&runs),
                Arc::clone(&next),
                Arc::clone(&cursor),
                Arc::clone(boot),
            );
            let h = std::thread::Builder::new()
                .name("ferry-prefetch".into())
                .spawn(move || me.work(&dev, &runs, &next, &cursor, &boot, ahead));
            handles.extend(h.ok());
        }
        for h in handles {
            let _ = h.join();
        }
        let mut st = self.state.lock();
        if *st == PrefetchState::Fetching {
            *st = PrefetchState::Done;
        }
        drop(st);
        tracing::info!(state = ?*self.state.lock(), fetched = self.fetched.load(Ordering::Relaxed),
            "prefetch over");
    }

    /// Why to stop now, if so.
    fn should_stop(&self, cursor: &Cursor, boot: &BootEnded) -> Option<PrefetchState> {
        if self.stop.load(Ordering::Relaxed) {
            Some(PrefetchState::Done)
        } else if boot() {
            Some(PrefetchState::BootEnded)
        } else if cursor.outside.load(Ordering::Relaxed) >= OUTSIDE_READS_MAX {
            Some(PrefetchState::MovedPast)
        } else {
            None
        }
    }

    fn work(
        &self,
        dev: &Weak<HostCached>,
        runs: &[Run],
        next: &AtomicUsize,
        cursor: &Cursor,
        boot: &BootEnded,
        ahead: usize,
    ) {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(run) = runs.get(i) else { return };
            // Wait until the run is within `ahead` of the machine's furthest read.
            loop {
                if let Some(why) = self.should_stop(cursor, boot) {
                    let mut st = self.state.lock();
                    if *st == PrefetchState::Fetching {
                        *st = why;
                    }
                    return;
                }
                if run.at < cursor.seen.load(Ordering::Acquire) + ahead {
                    break;
                }
                // The agent is gone.
                if dev.strong_count() == 0 {
                    return;
                }
                let mut g = cursor.wake.0.lock();
                cursor.wake.1.wait_for(&mut g, WAIT_TICK);
            }
            let Some(d) = dev.upgrade() else { return };
            match d.fill_run(run.first, run.n) {
                Ok(n) => {
                    self.fetched.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "prefetch read failed; stopping the prefetch");
                    *self.state.lock() = PrefetchState::Failed;
                    self.stop();
                    return;
                }
            }
        }
    }

    /// The status report's part.
    pub fn status(&self) -> PrefetchStatus {
        PrefetchStatus {
            state: *self.state.lock(),
            set_blocks: self.set_blocks.load(Ordering::Relaxed),
            set_bytes: self.set_bytes.load(Ordering::Relaxed),
            fetched_bytes: self.fetched.load(Ordering::Relaxed),
            position_blocks: self
                .cursor
                .lock()
                .as_ref()
                .map_or(0, |c| c.seen.load(Ordering::Relaxed) as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_first_read_order_without_repeats() {
        // 64 KiB blocks: extents in blocks 3, 0-1, 3 again, and one past the 1 MiB disk.
        let set = [(3 << 16, 4096), (0, 70_000), (3 << 16, 10), (1 << 20, 4096)];
        assert_eq!(blocks_of(&set, 1 << 16, 1 << 20), vec![3, 0, 1]);
    }

    #[test]
    fn runs_join_consecutive_blocks_up_to_the_request() {
        let runs = runs_of(&[5, 6, 7, 9, 10], 2);
        let got: Vec<_> = runs.iter().map(|r| (r.first, r.n, r.at)).collect();
        assert_eq!(got, vec![(5, 2, 0), (7, 1, 2), (9, 2, 3)]);
    }

    #[test]
    fn reads_outside_the_set_count_until_one_inside() {
        let c = Cursor {
            index: [(4, 0), (8, 1)].into_iter().collect(),
            seen: AtomicUsize::new(0),
            outside: AtomicU64::new(0),
            wake: (Mutex::new(()), Condvar::new()),
        };
        c.observe(1);
        c.observe(2);
        assert_eq!(c.outside.load(Ordering::Relaxed), 2);
        c.observe(8);
        assert_eq!(c.outside.load(Ordering::Relaxed), 0);
        assert_eq!(c.seen.load(Ordering::Relaxed), 2);
    }
}
