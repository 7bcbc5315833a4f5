//! The write cache's state ([`WriteCache`]) and what every path shares: construction,
//! usage, bounds and poisoning, block arithmetic and ENOSPC. The paths are further
//! `impl WriteCache` blocks in the files above this one (see the crate's layout): reads
//! (`read.rs`), writes, trims and zeroes (`write.rs`), RAM slots and eviction
//! (`evict.rs`), overflow I/O (`overflow.rs`), and the `BlockDevice` decorator
//! (`device.rs`). The design notes below cover them all.
//!
//! # Design notes
//!
//! Invariants:
//! * A block's entry is only ever changed by [`Index::replace`] from the value the changer
//!   looked up (compare-and-swap), with a fresh generation. No I/O runs under an index lock.
//! * RAM slot `r` is b's data exactly while `r.owner == b`. The owner is set (and the entry
//!   published) by whoever fills the slot, under the slot's write lock, and cleared under the
//!   write lock by whoever frees or evicts it. Readers and writers that found `Ram(r)` lock
//!   `r` and retry the lookup if the owner changed.
//! * Overflow slot `s` is protected by stripe `s % STRIPES`: users (read, in-place write)
//!   hold it shared and re-check the entry after taking it; whoever frees `s` holds it
//!   exclusively after the entry stopped naming `s`. So an overflow slot is never reused
//!   under a reader or writer.
//! * A partial-block write to a block the cache does not hold fills the rest of the block
//!   from where the block's bytes are (the layer below, zeros, or the overflow slot) into a
//!   slot nobody else can see yet, then publishes it with a compare-and-swap against the
//!   entry it read. If the entry changed meanwhile, the slot is dropped and the write
//!   retried, so a stale base is never published. Inserts of one block are serialized by
//!   an insert lock (1024 stripes by block), so racing writers of a new block do not each
//!   fill a slot: near a full budget that would refuse other writes (ENOSPC) for slots
//!   about to be given back. A writer that finds the budget used up while other inserts
//!   hold slots waits for them (`filling`) before it refuses.
//! * Eviction writes a victim to a fresh overflow slot under the victim's *upgradable* read
//!   lock (readers of the victim proceed; writers wait), then upgrades, swaps the entry to
//!   `Disk`, and hands the RAM slot to the writer that needed it. Only that writer waits
//!   for the overflow I/O: reads of other RAM-resident blocks never do.
//!
//! * `try_read_at` / `try_write_at` (called inline on the NBD server's reactor) never wait
//!   for a lock held across I/O and do only the overflow I/O the store's own inline paths
//!   accept (`OverflowStore::try_read_at` / `try_write_at`: a page-cache read that cannot
//!   wait, an overwrite in place of whole pages): they `try_lock` the insert lock and the
//!   overflow stripe, take only an already free RAM slot, and otherwise return `None`
//!   having changed nothing. The slow path, when it must evict, frees a batch of slots
//!   (`EVICT_BATCH`) for the fast path to use.
//!
//! Debug builds check these in pairs (`debug_assert!`, free in release builds): under any
//! lock of RAM slot `r`, `r.owner == b` exactly when b's entry is `Ram(r)` (reads, in-place
//! writes); a slot handed out is free and a slot released has no owner; a published insert's
//! entry names its slot while the slot lock is held; an evicted or cleared block's entry no
//! longer names its RAM slot before the slot is freed; the CLOCK hand stays below its limit;
//! slot counts (RAM, overflow, inserts in flight) never go below zero, and a free list is
//! never longer than the slots handed out. The usage counters are exact only when nothing
//! runs concurrently (a slot released and taken again may be counted twice for a moment),
//! so the model test checks them after every operation.
//!
//! Rejected: per-sector valid bits (a partial write would not need the base block, but every
//! read of a partly valid block would have to merge with the layer below, and the guest's
//! 4 KiB I/O makes partial blocks rare); one big lock (serializes a queue depth of 16).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use disk::device::check_bounds;
use disk::{BlockDevice, Error, ErrorKind, Result};
use parking_lot::{Mutex, RwLock};

use crate::arena::Arena;
use crate::config::{BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, Config, ConfigError, Mode};
use crate::disk_slots::DiskSlots;
use crate::index::{Index, SLOTS_MAX};
use crate::policy::Clock;
use crate::store::OverflowStore;

/// Stripes of overflow-slot locks.
pub(crate) const STRIPES: usize = 1024;

/// Counters of a cache.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Blocks moved from RAM to the overflow store.
    pub(crate) evictions: AtomicU64,
    /// Blocks moved back to RAM by a write.
    pub(crate) promotions: AtomicU64,
    /// Writes refused for lack of space.
    pub(crate) enospc: AtomicU64,
    /// Partial-block writes that read the rest of their block first.
    pub(crate) rmw: AtomicU64,
}

/// Space and event counts of a cache, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Cache block in bytes.
    pub block_bytes: u32,
    /// RAM in use by cached blocks.
    pub ram_bytes: u64,
    /// RAM budget.
    pub ram_bytes_max: u64,
    /// Overflow file bytes holding blocks.
    pub overflow_bytes: u64,
    /// Overflow budget.
    pub overflow_bytes_max: u64,
    /// Blocks moved from RAM to the overflow file.
    pub evictions: u64,
    /// Blocks moved back from the overflow file to RAM by a write.
    pub promotions: u64,
    /// Writes refused for lack of space (NBD_ENOSPC).
    pub enospc: u64,
    /// Partial-block writes that read the rest of their block first.
    pub read_modify_writes: u64,
}

/// A write cache over `next` (see the crate docs).
#[derive(Debug)]
pub struct WriteCache {
    /// The device below (the vDisk as streamed, read-only).
    pub(crate) next: Arc<dyn BlockDevice>,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// The mode.
    pub(crate) mode: Mode,
    /// The cache block in bytes (a power of two).
    pub(crate) block: u64,
    /// log2 of `block`.
    pub(crate) shift: u32,
    /// Block → where its bytes are.
    pub(crate) index: Index,
    /// The RAM slots.
    pub(crate) arena: Arena,
    /// CLOCK over the RAM slots.
    pub(crate) clock: Clock,
    /// The overflow store (`RamOverflow`, `Disk`).
    pub(crate) store: Option<Arc<dyn OverflowStore>>,
    /// The overflow store's slots.
    pub(crate) disk: DiskSlots,
    /// Overflow-slot locks, by slot: readers and in-place writers share one, whoever frees
    /// the slot takes it exclusively (see the design notes).
    pub(crate) stripes: Box<[RwLock<()>]>,
    /// Insert locks, by block: serialize inserts of one block (see `write_piece`).
    pub(crate) inserts: Box<[Mutex<()>]>,
    /// A block of zeros (partial write-zeroes).
    pub(crate) zeros: Box<[u8]>,
    /// Set by a failed overflow write or flush: every later operation fails.
    pub(crate) poisoned: AtomicBool,
    /// RAM slots allocated by inserts not yet published or released.
    pub(crate) filling: AtomicU64,
    /// Event counters.
    pub(crate) counters: Counters,
}

impl WriteCache {
    /// A new, empty cache over `next`. `store` is required by `RamOverflow` and `Disk`.
    ///
    /// # Errors
    /// [`ConfigError`].
    pub fn new(
        next: Arc<dyn BlockDevice>,
        config: Config,
        store: Option<Arc<dyn OverflowStore>>,
    ) -> std::result::Result<WriteCache, ConfigError> {
        let bs = config.block_bytes;
        if !bs.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&bs) {
            return Err(ConfigError::InvalidBlockSize { bytes: bs });
        }
        if config.mode != Mode::Ram && store.is_none() {
            return Err(ConfigError::MissingStore { mode: config.mode });
        }
        let block = u64::from(bs);
        let ram_slots = match config.mode {
            Mode::Disk => 0,
            _ => config.ram_bytes_max / block,
        };
        let disk_slots = match config.mode {
            Mode::Ram => 0,
            _ => config.overflow_bytes_max / block,
        };
        let too_many = |what, bytes| ConfigError::TooManySlots { what, bytes };
        let ram_slots = u32::try_from(ram_slots)
            .ok()
            .filter(|&n| u64::from(n) <= SLOTS_MAX)
            .ok_or(too_many("RAM", config.ram_bytes_max))?;
        if disk_slots > SLOTS_MAX {
            return Err(too_many("overflow", config.overflow_bytes_max));
        }
        let size = next.size();
        Ok(WriteCache {
            next,
            size,
            mode: config.mode,
            block,
            shift: bs.trailing_zeros(),
            index: Index::new(size.div_ceil(block)),
            arena: Arena::new(bs as usize, ram_slots),
            clock: Clock::new(ram_slots),
            store,
            disk: DiskSlots::new(disk_slots),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            inserts: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            zeros: vec![0u8; bs as usize].into_boxed_slice(),
            poisoned: AtomicBool::new(false),
            filling: AtomicU64::new(0),
            counters: Counters::default(),
        })
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Space in use and event counts.
    pub fn usage(&self) -> Usage {
        let c = &self.counters;
        Usage {
            block_bytes: u32::try_from(self.block).unwrap_or(u32::MAX),
            ram_bytes: self.arena.used() * self.block,
            ram_bytes_max: u64::from(self.arena.slots_max()) * self.block,
            overflow_bytes: self.disk.used.load(Ordering::Relaxed) * self.block,
            overflow_bytes_max: self.disk.max * self.block,
            evictions: c.evictions.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            enospc: c.enospc.load(Ordering::Relaxed),
            read_modify_writes: c.rmw.load(Ordering::Relaxed),
        }
    }

    /// Number of blocks the index holds (RAM, overflow and zero entries).
    pub fn cached_blocks(&self) -> usize {
        self.index.len()
    }

    /// Fails when the cache is poisoned or `[offset, offset + len)` is out of bounds.
    #[inline]
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Poisoned,
                "write cache failed an earlier overflow write or flush",
            ));
        }
        check_bounds(self.size, offset, len)
    }

    /// Bytes of block `b` (the last block may be short).
    #[inline]
    pub(crate) fn block_len(&self, b: u64) -> usize {
        // At most `block` (≤ 1 MiB).
        (self.size - (b << self.shift)).min(self.block) as usize
    }

    /// Counts (and now and then logs) a refused write; the `LimitExceeded` error.
    pub(crate) fn enospc(&self, what: &str, source: Option<std::io::Error>) -> Error {
        let n = self.counters.enospc.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                refused = n,
                "write cache full ({what}): writes fail with ENOSPC"
            );
        }
        let msg = format!("write cache full: {what}");
        match source {
            Some(e) => Error::with_source(ErrorKind::LimitExceeded, msg, e),
            None => Error::new(ErrorKind::LimitExceeded, msg),
        }
    }

    /// Calls `f(block, offset in block, range in the caller's buffer)` per block piece.
    pub(crate) fn pieces(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let b = at >> self.shift;
            // Below `block` (≤ 1 MiB).
            let o = (at & (self.block - 1)) as usize;
            let n = (self.block as usize - o).min(len - pos);
            f(b, o, pos..pos + n)?;
            pos += n;
        }
        Ok(())
    }
}
