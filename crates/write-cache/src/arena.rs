//! The RAM tier: block-sized slots, allocated in 1 MiB chunks as the cache grows up to its
//! budget, then reused through a free list, so a write never allocates once the tier is warm.
//!
//! Each slot is a `RwLock` holding its bytes and its *owner* (the block it holds, or
//! [`FREE`]). The owner is what makes lookups safe without holding the index lock during a
//! copy: a reader finds `Ram(r)` in the index, locks slot `r`, and uses it only if `r` still
//! belongs to its block; whoever frees or moves a slot changes its owner under the write lock.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

/// The owner of a slot that holds no block.
pub const FREE: u64 = u64::MAX;
/// Bytes per chunk of slots allocated at once.
const CHUNK_BYTES: usize = 1 << 20;

/// A chunk of slots, allocated at once.
type Chunk = Box<[RwLock<RamSlot>]>;

/// One RAM slot.
#[derive(Debug)]
pub struct RamSlot {
    /// The block held, or [`FREE`].
    pub owner: u64,
    /// The block's bytes (block-sized).
    pub data: Box<[u8]>,
}

/// The slots of the RAM tier.
#[derive(Debug)]
pub struct Arena {
    block_bytes: usize,
    slots_max: u32,
    per_chunk: u32,
    chunks: Box<[OnceLock<Chunk>]>,
    /// Slots handed out by growth so far (0..grown exist).
    grown: AtomicU32,
    free: Mutex<Vec<u32>>,
    /// Slots holding a block or being filled.
    used: AtomicU64,
}

impl Arena {
    /// An arena of at most `slots_max` slots of `block_bytes` each; nothing is allocated yet.
    pub fn new(block_bytes: usize, slots_max: u32) -> Arena {
        let per_chunk = u32::try_from((CHUNK_BYTES / block_bytes).max(1)).unwrap_or(1);
        let chunks = slots_max.div_ceil(per_chunk);
        Arena {
            block_bytes,
            slots_max,
            per_chunk,
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
            grown: AtomicU32::new(0),
            free: Mutex::new(Vec::new()),
            used: AtomicU64::new(0),
        }
    }

    /// The most slots.
    pub fn slots_max(&self) -> u32 {
        self.slots_max
    }

    /// Slots handed out by growth so far (every slot below exists).
    pub fn grown(&self) -> u32 {
        self.grown.load(Ordering::Acquire).min(self.slots_max)
    }

    /// Slots in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Slot `r` (which must have been handed out).
    pub fn slot(&self, r: u32) -> &RwLock<RamSlot> {
        let chunk = self.chunks[(r / self.per_chunk) as usize]
            .get()
            .expect("a slot handed out lies in an initialized chunk");
        &chunk[(r % self.per_chunk) as usize]
    }

    /// A free slot (owner [`FREE`]), or `None` when the budget is used up.
    pub fn alloc(&self) -> Option<u32> {
        if let Some(r) = self.free.lock().pop() {
            self.used.fetch_add(1, Ordering::Relaxed);
            return Some(r);
        }
        let r = self
            .grown
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g < self.slots_max).then_some(g + 1)
            })
            .ok()?;
        let c = (r / self.per_chunk) as usize;
        self.chunks[c].get_or_init(|| {
            let first = c as u64 * u64::from(self.per_chunk);
            let n = (u64::from(self.slots_max) - first).min(u64::from(self.per_chunk));
            (0..n)
                .map(|_| {
                    RwLock::new(RamSlot {
                        owner: FREE,
                        data: vec![0u8; self.block_bytes].into_boxed_slice(),
                    })
                })
                .collect()
        });
        self.used.fetch_add(1, Ordering::Relaxed);
        Some(r)
    }

    /// Returns slot `r` (its owner already [`FREE`]) to the free list. The caller holds no
    /// lock of the slot.
    pub fn release(&self, r: u32) {
        // The pair of "a slot handed out is free" (asserted where a slot is filled): no
        // free slot has an owner.
        debug_assert_eq!(
            self.slot(r).read().owner,
            FREE,
            "RAM slot {r} freed while owned"
        );
        {
            let mut free = self.free.lock();
            free.push(r);
            // Each free slot is a distinct slot handed out: a slot released twice would
            // eventually make the list longer than that.
            debug_assert!(
                r < self.grown() && free.len() <= self.grown() as usize,
                "RAM slot {r} released twice or never handed out"
            );
        }
        let before = self.used.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "RAM slots in use below zero");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_stops_at_the_budget() {
        let a = Arena::new(4096, 2);
        assert!(a.alloc().is_some());
        assert!(a.alloc().is_some());
        assert_eq!(a.alloc(), None);
    }

    #[test]
    fn released_slot_is_reused() {
        let a = Arena::new(4096, 1);
        let r = a.alloc().unwrap();
        a.release(r);
        assert_eq!(a.alloc(), Some(r));
        assert_eq!(a.used(), 1);
    }

    #[test]
    fn new_slot_is_free_and_block_sized() {
        let a = Arena::new(512, 3);
        let r = a.alloc().unwrap();
        let s = a.slot(r).read();
        assert_eq!(s.owner, FREE);
        assert_eq!(s.data.len(), 512);
    }
}
