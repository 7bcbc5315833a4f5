//! RAM slots for inserts and CLOCK eviction: a writer that needs a slot takes a free one,
//! or (`RamOverflow`) moves a CLOCK victim to a new overflow slot and takes its RAM slot,
//! freeing a batch of others while there so the fast path finds free slots.

use std::sync::atomic::Ordering;

use disk::Result;
use parking_lot::RwLockUpgradableReadGuard;

use crate::arena::FREE;
use crate::cache::WriteCache;
use crate::config::Mode;
use crate::index::Place;

/// RAM slots one slow-path eviction frees at once (see `ram_alloc`).
const EVICT_BATCH: usize = 32;
/// Times a writer waits for racing inserts to give a RAM slot back before ENOSPC.
const ALLOC_WAITS_MAX: usize = 1 << 12;
/// Victims looked at by one eviction before giving up (every one busy: being filled by
/// other writers, who publish and let go within one block copy).
const EVICT_ATTEMPTS_MAX: usize = 1 << 16;

impl WriteCache {
    /// A RAM slot: a free one, or (RamOverflow) one taken by eviction. A slot counts in
    /// `filling` until its insert published or gave it back.
    #[inline]
    pub(crate) fn ram_alloc(&self) -> Result<u32> {
        let take = |r: u32| {
            self.filling.fetch_add(1, Ordering::AcqRel);
            Ok(r)
        };
        for _ in 0..ALLOC_WAITS_MAX {
            if let Some(r) = self.arena.alloc() {
                return take(r);
            }
            if self.mode == Mode::RamOverflow {
                let r = self.evict_one(EVICT_ATTEMPTS_MAX)?;
                // Evict a batch while here (at most an eighth of RAM, one sweep each), so
                // the next writes find free slots and complete on the server's fast path
                // (`try_write_at`) without overflow I/O.
                let sweep = 2 * self.arena.grown() as usize;
                let batch = EVICT_BATCH.min(self.arena.slots_max() as usize / 8);
                for _ in 1..batch {
                    match self.evict_one(sweep) {
                        Ok(extra) => self.arena.release(extra),
                        Err(_) => break,
                    }
                }
                return take(r);
            }
            // Full, unless other writers hold slots for inserts that may lose a race on
            // their block and give the slot back: wait for them rather than refuse. A
            // loser releases its slot before it leaves `filling`, so once `filling` is 0
            // one more try sees every slot given back.
            if self.filling.load(Ordering::Acquire) == 0 {
                if let Some(r) = self.arena.alloc() {
                    return take(r);
                }
                break;
            }
            std::thread::yield_now();
        }
        Err(self.enospc("RAM budget", None))
    }

    /// An insert's slot was published or released.
    #[inline]
    pub(crate) fn filled(&self) {
        let before = self.filling.fetch_sub(1, Ordering::AcqRel);
        // Each insert leaves `filling` once, after entering it in `ram_alloc`.
        debug_assert!(before > 0, "RAM slots being filled below zero");
    }

    /// Moves one CLOCK victim from RAM to a new overflow slot and returns its RAM slot,
    /// free, to the caller (or a slot another writer's batch freed meanwhile), looking at
    /// no more than `attempts` candidates.
    fn evict_one(&self, attempts: usize) -> Result<u32> {
        for attempt in 0..attempts {
            let Some(r) = self.clock.next_victim(self.arena.grown()) else {
                break;
            };
            if attempt > 0 && (attempt as u64).is_multiple_of(u64::from(self.arena.grown().max(1)))
            {
                // A whole turn found only busy or free slots: a batch of another writer may
                // have freed some, or their writers need to finish.
                if let Some(free) = self.arena.alloc() {
                    return Ok(free);
                }
                std::thread::yield_now();
            }
            let Some(g) = self.arena.slot(r).try_upgradable_read() else {
                continue;
            };
            let b = g.owner;
            if b == FREE {
                continue;
            }
            let cur = self.index.get(b);
            if cur.map(|e| e.place) != Some(Place::Ram(r)) {
                continue;
            }
            let s = self.disk_alloc()?;
            if let Err(e) = self.store_write(&g.data[..self.block_len(b)], s << self.shift) {
                self.disk.release(s);
                return Err(e);
            }
            let mut w = RwLockUpgradableReadGuard::upgrade(g);
            debug_assert_eq!(w.owner, b, "a slot's owner is fixed under its lock");
            let new = self.index.entry(Place::Disk(s));
            // Changing a RAM entry needs the slot's write lock, which we held (upgradable)
            // since the lookup: the entry cannot have changed.
            let swapped = self.index.replace(b, cur, Some(new));
            assert!(
                swapped,
                "RAM entry of block {b} changed under its slot lock"
            );
            // The victim's entry names its overflow slot before its RAM slot is reused, and
            // no later change can make it name this slot again while we hold the lock.
            debug_assert_ne!(
                self.index.get(b).map(|e| e.place),
                Some(Place::Ram(r)),
                "evicted block {b} still names RAM slot {r}"
            );
            w.owner = FREE;
            drop(w);
            self.clock.forget(r);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            return Ok(r);
        }
        Err(self.enospc("no evictable block", None))
    }
}
