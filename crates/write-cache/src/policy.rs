//! The eviction policy of the RAM tier: CLOCK (second chance) over RAM slot numbers.
//!
//! # Design notes
//!
//! Pure: no I/O, no clock, no knowledge of blocks. The cache calls [`Clock::touch`] on every
//! hit (a relaxed store to one byte, no lock, so lookups stay lock-light) and
//! [`Clock::next_victim`] when it needs a slot back. The hand sweeps slots `0..limit`; a slot
//! with its reference bit set gets a second chance (the bit is cleared and the hand moves
//! on), the first slot found clear is the victim. After at most two turns every bit is
//! clear, so a call returns within `2 * limit` steps.
//!
//! LRU proper was rejected: it needs a list relinked on every hit, under a lock every hit
//! takes. CLOCK approximates it with one bit per slot and a lock only the evictor takes.
//! The victim is only a *candidate*: the cache skips a slot that is busy or free and asks
//! again.

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

/// CLOCK state over `slots` RAM slots.
#[derive(Debug)]
pub struct Clock {
    /// One reference bit per slot (a byte each, so a hit is one plain store).
    referenced: Box<[AtomicU8]>,
    /// The hand: the next slot to look at. Only the evictor moves it.
    hand: Mutex<u32>,
}

impl Clock {
    /// A clock over `slots` slots, all unreferenced.
    pub fn new(slots: u32) -> Clock {
        Clock {
            referenced: (0..slots).map(|_| AtomicU8::new(0)).collect(),
            hand: Mutex::new(0),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        // Built from a u32 count.
        u32::try_from(self.referenced.len()).unwrap_or(u32::MAX)
    }

    /// Marks `slot` as recently used. Out-of-range slots are ignored.
    pub fn touch(&self, slot: u32) {
        if let Some(r) = self.referenced.get(slot as usize)
            && r.load(Ordering::Relaxed) == 0
        {
            r.store(1, Ordering::Relaxed);
        }
    }

    /// Clears the reference bit of `slot` (it was freed).
    pub fn forget(&self, slot: u32) {
        if let Some(r) = self.referenced.get(slot as usize) {
            r.store(0, Ordering::Relaxed);
        }
    }

    /// The next victim among slots `0..limit` (the slots handed out so far), or `None` when
    /// `limit` is 0.
    pub fn next_victim(&self, limit: u32) -> Option<u32> {
        let limit = limit.min(self.slots());
        if limit == 0 {
            return None;
        }
        let mut hand = self.hand.lock();
        for _ in 0..limit.saturating_mul(2) {
            let slot = if *hand >= limit { 0 } else { *hand };
            *hand = slot + 1;
            let r = &self.referenced[slot as usize];
            if r.load(Ordering::Relaxed) == 0 {
                debug_assert!(slot < limit && *hand <= limit, "CLOCK hand out of bounds");
                return Some(slot);
            }
            r.store(0, Ordering::Relaxed);
        }
        // Every bit was set again by concurrent hits during two turns: take the hand's slot.
        let slot = if *hand >= limit { 0 } else { *hand };
        *hand = slot + 1;
        debug_assert!(slot < limit && *hand <= limit, "CLOCK hand out of bounds");
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_slots_are_taken_in_order() {
        let c = Clock::new(4);
        assert_eq!(c.next_victim(4), Some(0));
        assert_eq!(c.next_victim(4), Some(1));
    }

    #[test]
    fn touched_slot_gets_a_second_chance() {
        let c = Clock::new(3);
        c.touch(0);
        assert_eq!(c.next_victim(3), Some(1));
    }

    #[test]
    fn all_touched_still_returns_a_victim() {
        let c = Clock::new(2);
        c.touch(0);
        c.touch(1);
        assert_eq!(c.next_victim(2), Some(0));
    }

    #[test]
    fn zero_limit_has_no_victim() {
        let c = Clock::new(2);
        assert_eq!(c.next_victim(0), None);
    }

    #[test]
    fn forgotten_slot_is_a_victim_again() {
        let c = Clock::new(1);
        c.touch(0);
        c.forget(0);
        assert_eq!(c.next_victim(1), Some(0));
    }

    proptest::proptest! {
        /// Whatever was touched, the victim is a slot below the limit, and a slot touched
        /// since the last sweep is never chosen while an untouched one remains.
        #[test]
        fn victim_is_in_range_and_prefers_untouched(
            slots in 1u32..64, touched in proptest::collection::vec(0u32..64, 0..64)
        ) {
            let c = Clock::new(slots);
            for t in &touched { c.touch(*t); }
            let v = c.next_victim(slots).unwrap();
            proptest::prop_assert!(v < slots);
            let all = (0..slots).all(|s| touched.contains(&s));
            if !all {
                proptest::prop_assert!(!touched.contains(&v));
            }
        }
    }
}
