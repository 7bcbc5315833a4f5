//! Overflow slots: block-sized places in the overflow store, handed out by growth up to
//! the budget, then reused through a free list. Pure bookkeeping: no I/O (the cache reads
//! and writes the slots through its `OverflowStore`).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Overflow slots: handed out by growth up to the budget, then reused.
#[derive(Debug)]
pub(crate) struct DiskSlots {
    /// (slots handed out by growth so far, free slots below that).
    inner: Mutex<(u64, Vec<u64>)>,
    /// The most slots (the overflow budget in blocks).
    pub(crate) max: u64,
    /// Slots holding a block or being written.
    pub(crate) used: AtomicU64,
}

impl DiskSlots {
    /// No slot handed out yet, at most `max`.
    pub(crate) fn new(max: u64) -> DiskSlots {
        DiskSlots {
            inner: Mutex::new((0, Vec::new())),
            max,
            used: AtomicU64::new(0),
        }
    }

    /// A free slot, or `None` when the budget is used up.
    #[inline]
    pub(crate) fn alloc(&self) -> Option<u64> {
        let mut g = self.inner.lock();
        let s = match g.1.pop() {
            Some(s) => s,
            None if g.0 < self.max => {
                g.0 += 1;
                g.0 - 1
            }
            None => return None,
        };
        debug_assert!(
            s < g.0 && g.0 <= self.max && g.1.len() as u64 <= g.0,
            "overflow slot {s} handed out past {} of {} ({} free)",
            g.0,
            self.max,
            g.1.len()
        );
        self.used.fetch_add(1, Ordering::Relaxed);
        Some(s)
    }

    /// Returns slot `s`, which no index entry names any more, to the free list.
    pub(crate) fn release(&self, s: u64) {
        {
            let mut g = self.inner.lock();
            debug_assert!(s < g.0, "overflow slot {s} released but never handed out");
            g.1.push(s);
            // Each free slot is a distinct slot handed out: a slot released twice would
            // eventually make the list longer than that.
            debug_assert!(
                g.1.len() as u64 <= g.0,
                "more overflow slots free than handed out"
            );
        }
        let before = self.used.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "overflow slots in use below zero");
    }
}
