//! Giving freed connection memory back to the system after connections close.
//!
//! glibc's malloc keeps what a closed connection freed (its read and write buffers, its
//! tasks) in its arenas and reuses it only partly: measured with 4,095 clients connecting
//! and leaving four times, the server's RSS went 30 → 182 → 455 → 620 → 740 MB while
//! `malloc_stats` counted 6.5 to 7.6 MB in use after each round (no leak: free memory the
//! arenas held, spread over many of them). `malloc_trim(0)` after each round brought it
//! back to 48 → 59 → 62 → 62 MB (docs/scale.md, "Devices per server").
//!
//! So the listener counts closed connections, and a task trims at most every
//! [`TRIM_INTERVAL`] when some closed since the last trim, on the blocking pool (a trim
//! walks every arena's free chunks; a few milliseconds on a heap of a gigabyte). Other
//! allocators (musl, a `#[global_allocator]`) are left alone: only glibc's is trimmed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the trimmer looks whether connections closed since its last trim.
pub(crate) const TRIM_INTERVAL: Duration = Duration::from_secs(5);

/// Connections closed since the last trim; the listener counts, the trimmer takes.
#[derive(Debug, Default)]
pub(crate) struct Closed(AtomicU64);

impl Closed {
    /// One more connection closed.
    pub(crate) fn note(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// How many closed since the last call.
    fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

/// Every [`TRIM_INTERVAL`], trims the heap when connections closed since the last trim.
/// Runs until dropped.
pub(crate) async fn trim_after_closes(closed: &Closed) {
    let mut tick = tokio::time::interval(TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let n = closed.take();
        if n == 0 {
            continue;
        }
        let start = Instant::now();
        let _ = tokio::task::spawn_blocking(give_back).await;
        tracing::debug!(closed = n, took = ?start.elapsed(), "gave freed memory back");
    }
}

/// Gives the allocator's free memory back to the system, where the allocator is glibc's.
pub(crate) fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::trim();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod glibc {
    unsafe extern "C" {
        /// `int malloc_trim(size_t pad)`, malloc.h.
        fn malloc_trim(pad: usize) -> i32;
    }

    /// `malloc_trim(0)`: every arena's free pages go back to the system.
    pub(super) fn trim() {
        // SAFETY: malloc_trim takes no pointer and may be called from any thread at any
        // time; it takes each arena's lock itself. The process allocates through glibc's
        // malloc (Rust's System allocator on this target), so it trims the heap in use.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_are_taken_once() {
        let c = Closed::default();
        c.note();
        c.note();
        assert_eq!(c.take(), 2);
        assert_eq!(c.take(), 0);
    }

    #[test]
    fn giving_back_after_freeing_keeps_the_heap_usable() {
        let v: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 256 << 10]).collect();
        drop(v);
        give_back();
        let w = vec![7u8; 1 << 20];
        assert!(w.iter().all(|&b| b == 7));
    }
}
