//! When a buffered write may run on the caller's thread (an NBD server's reactor).
//!
//! ext4 refuses buffered writes with `RWF_NOWAIT` (`EOPNOTSUPP`), so "would this wait?"
//! cannot be asked of the kernel. A buffered overwrite of bytes a file already holds (no
//! block allocation, no size change) of whole pages (no read of the rest of a page) does
//! not wait in the common case; what remains is the kernel throttling a writer of too much
//! dirty memory (`balance_dirty_pages`, up to 200 ms) or a journal wait. [`InlineGate`]
//! times each inline write and, after one that took over [`INLINE_WRITE_SLOW`], declines
//! inline writes for [`INLINE_BACKOFF`], so a throttled disk stalls the caller's thread at
//! most once per period.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// An inline write that took longer than this waited for something. A buffered 4 KiB
/// write into the page cache takes microseconds.
pub const INLINE_WRITE_SLOW: Duration = Duration::from_millis(10);
/// After a slow inline write, inline writes are declined (they go to a blocking pool) for
/// this long.
pub const INLINE_BACKOFF: Duration = Duration::from_secs(1);

/// A source of the current time (injectable for tests).
pub type Now = Box<dyn Fn() -> Instant + Send + Sync>;

/// Times inline writes and turns them off for a while after a slow one.
pub struct InlineGate {
    now: Now,
    epoch: Instant,
    /// Inline writes are off until this many nanoseconds after `epoch`.
    off_until: AtomicU64,
}

impl std::fmt::Debug for InlineGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineGate")
            .field("off_until", &self.off_until)
            .finish_non_exhaustive()
    }
}

impl Default for InlineGate {
    fn default() -> Self {
        InlineGate::with_clock(Box::new(Instant::now))
    }
}

impl InlineGate {
    /// A gate timed by `now`.
    pub fn with_clock(now: Now) -> InlineGate {
        let epoch = now();
        InlineGate {
            now,
            epoch,
            off_until: AtomicU64::new(0),
        }
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs `write` now and returns its result, or `None` (without running it) while
    /// inline writes are off. `what` names the write in the log line of a slow one.
    pub fn run<T>(&self, what: &'static str, write: impl FnOnce() -> T) -> Option<T> {
        let start = (self.now)();
        if self.since_epoch(start) < self.off_until.load(Ordering::Relaxed) {
            return None;
        }
        let r = write();
        let end = (self.now)();
        let took = end.saturating_duration_since(start);
        if took > INLINE_WRITE_SLOW {
            self.off_until
                .store(self.since_epoch(end + INLINE_BACKOFF), Ordering::Relaxed);
            tracing::debug!(
                what,
                took_us = took.as_micros() as u64,
                "slow inline write: inline writes off for a while"
            );
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that advances by `step` at every look.
    fn stepping_clock(step: Duration) -> Now {
        let t0 = Instant::now();
        let ticks = AtomicU64::new(0);
        Box::new(move || t0 + step * ticks.fetch_add(1, Ordering::Relaxed) as u32)
    }

    #[test]
    fn fast_writes_stay_inline() {
        let g = InlineGate::with_clock(stepping_clock(Duration::from_micros(5)));
        for i in 0..100 {
            assert_eq!(g.run("test", || i), Some(i));
        }
    }

    #[test]
    fn a_slow_write_turns_inline_writes_off_then_they_come_back() {
        // Every look moves the clock 20 ms: the first write (two looks) takes 20 ms.
        let g = InlineGate::with_clock(stepping_clock(Duration::from_millis(20)));
        assert_eq!(g.run("test", || 1), Some(1));
        let mut ran = false;
        assert_eq!(g.run("test", || ran = true), None);
        assert!(!ran, "a declined write must not run");
        // 1 s of backoff is 50 looks of 20 ms; each declined call looks once.
        let mut declined = 1;
        while g.run("test", || ()).is_none() {
            declined += 1;
            assert!(declined < 100, "inline writes never came back");
        }
        assert!(declined >= 45, "back after only {declined} declined calls");
    }
}
