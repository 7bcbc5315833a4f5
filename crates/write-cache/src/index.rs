//! The block index: block number → where the block's bytes are, in sharded hash maps.
//!
//! # Design notes
//!
//! An entry is packed into one `u64` (16 bytes per cached block with its key):
//!
//! ```text
//!  63 62 61                      32 31                         0
//! ┌─────┬──────────────────────────┬────────────────────────────┐
//! │ tag │ slot (RAM or overflow)   │ generation                 │
//! └─────┴──────────────────────────┴────────────────────────────┘
//!  tag: 0 RAM slot, 1 overflow slot, 2 zero (no storage)
//! ```
//!
//! Every state change takes a fresh generation from one global counter, so a reader that
//! looked an entry up, did its I/O outside the lock and looks again can tell "unchanged"
//! from "changed and changed back" (no ABA on slot reuse). Shards are picked by a
//! multiplicative hash of the block number; a lookup holds its shard's mutex for one hash
//! probe and no I/O is ever done under it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

/// log2 of the number of index shards.
const SHARD_BITS: u32 = 6;
/// The most slots a tier can address (30 bits of the packed entry).
pub const SLOTS_MAX: u64 = 1 << 30;

const TAG_SHIFT: u32 = 62;
const SLOT_SHIFT: u32 = 32;
const SLOT_MASK: u64 = SLOTS_MAX - 1;
const TAG_RAM: u64 = 0;
const TAG_DISK: u64 = 1;
const TAG_ZERO: u64 = 2;

/// Where a cached block's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In RAM slot n.
    Ram(u32),
    /// In overflow slot n.
    Disk(u64),
    /// Reads as zeros (written with zeros); holds no storage.
    Zero,
}

/// A place and the generation of the change that put the block there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Where.
    pub place: Place,
    /// Which change.
    pub generation: u32,
}

impl Entry {
    fn pack(self) -> u64 {
        let (tag, slot) = match self.place {
            Place::Ram(r) => (TAG_RAM, u64::from(r)),
            Place::Disk(s) => (TAG_DISK, s),
            Place::Zero => (TAG_ZERO, 0),
        };
        debug_assert!(slot <= SLOT_MASK, "slot {slot} over SLOTS_MAX");
        (tag << TAG_SHIFT) | ((slot & SLOT_MASK) << SLOT_SHIFT) | u64::from(self.generation)
    }

    fn unpack(v: u64) -> Entry {
        let slot = (v >> SLOT_SHIFT) & SLOT_MASK;
        // The low 32 bits are the generation by construction.
        let generation = (v & u64::from(u32::MAX)) as u32;
        let place = match v >> TAG_SHIFT {
            TAG_RAM => Place::Ram(u32::try_from(slot).unwrap_or(u32::MAX)),
            TAG_DISK => Place::Disk(slot),
            _ => Place::Zero,
        };
        Entry { place, generation }
    }
}

/// A hasher for block numbers: one multiplication (Fibonacci hashing).
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Shard = HashMap<u64, u64, BuildHasherDefault<BlockHasher>>;

/// The sharded index.
#[derive(Debug)]
pub struct Index {
    shards: Box<[Mutex<Shard>]>,
    generation: AtomicU32,
}

impl Index {
    /// An empty index sized for about `expected_blocks` entries (no rehash until then).
    pub fn new(expected_blocks: usize) -> Index {
        let per = expected_blocks >> SHARD_BITS;
        Index {
            shards: (0..1usize << SHARD_BITS)
                .map(|_| Mutex::new(Shard::with_capacity_and_hasher(per, Default::default())))
                .collect(),
            generation: AtomicU32::new(0),
        }
    }

    fn shard(&self, block: u64) -> &Mutex<Shard> {
        let h = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS);
        // h < 2^SHARD_BITS = shards.len().
        &self.shards[h as usize]
    }

    /// A new entry for `place` with a fresh generation.
    pub fn entry(&self, place: Place) -> Entry {
        Entry {
            place,
            generation: self.generation.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The entry of `block`, if cached.
    pub fn get(&self, block: u64) -> Option<Entry> {
        self.shard(block)
            .lock()
            .get(&block)
            .map(|&v| Entry::unpack(v))
    }

    /// Replaces `block`'s entry by `new` if it is still `expected`; false otherwise.
    pub fn replace(&self, block: u64, expected: Option<Entry>, new: Option<Entry>) -> bool {
        let mut shard = self.shard(block).lock();
        let cur = shard.get(&block).map(|&v| Entry::unpack(v));
        if cur != expected {
            return false;
        }
        match new {
            Some(e) => {
                shard.insert(block, e.pack());
            }
            None => {
                shard.remove(&block);
            }
        }
        true
    }

    /// Number of entries (all shards; not a snapshot under concurrent change).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_packs_and_unpacks() {
        let e = Entry {
            place: Place::Disk(SLOTS_MAX - 1),
            generation: u32::MAX,
        };
        assert_eq!(Entry::unpack(e.pack()), e);
    }

    #[test]
    fn replace_with_stale_expectation_fails() {
        let idx = Index::new(0);
        let a = idx.entry(Place::Ram(1));
        assert!(idx.replace(7, None, Some(a)));
        assert!(!idx.replace(7, None, Some(idx.entry(Place::Zero))));
        assert_eq!(idx.get(7), Some(a));
    }

    #[test]
    fn same_place_new_generation_is_a_change() {
        let idx = Index::new(0);
        let a = idx.entry(Place::Ram(3));
        let b = idx.entry(Place::Ram(3));
        assert!(idx.replace(1, None, Some(a)));
        assert!(idx.replace(1, Some(a), Some(b)));
        assert!(!idx.replace(1, Some(a), None));
    }
}
