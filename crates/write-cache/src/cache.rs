//! The write cache: read, write, trim and eviction paths over the index, the RAM arena and
//! the overflow store.
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
//! Rejected: per-sector valid bits (a partial write would not need the base block, but every
//! read of a partly valid block would have to merge with the layer below, and the guest's
//! 4 KiB I/O makes partial blocks rare); one big lock (serializes a queue depth of 16).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use disk::device::{Geometry, LayerRun, Source, Submitted, check_bounds};
use disk::{BlockDevice, Error, ErrorKind, FastPath, Result};
use parking_lot::{Mutex, RwLock, RwLockUpgradableReadGuard};

use crate::arena::{Arena, FREE};
use crate::index::{Entry, Index, Place, SLOTS_MAX};
use crate::policy::Clock;
use crate::store::OverflowStore;
use crate::{BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, Config, ConfigError, Mode};

/// Whether a write to a block in the overflow file moves it back to RAM (evicting another)
/// rather than updating it in place. In place: one `pwrite` and no eviction, where moving
/// back costs the victim's `pwrite` plus, for a partial write, a `pread`; CLOCK already
/// keeps rewritten (hot) blocks in RAM, so a block in the file was cold when it left. The
/// two measured alike within the noise of a shared machine (docs/target.md).
const PROMOTE_ON_WRITE: bool = false;
/// RAM slots one slow-path eviction frees at once (see `ram_alloc`).
const EVICT_BATCH: usize = 32;
/// Times a writer waits for racing inserts to give a RAM slot back before ENOSPC.
const ALLOC_WAITS_MAX: usize = 1 << 12;
/// Stripes of overflow-slot locks.
const STRIPES: usize = 1024;
/// Victims looked at by one eviction before giving up (every one busy: being filled by
/// other writers, who publish and let go within one block copy).
const EVICT_ATTEMPTS_MAX: usize = 1 << 16;

thread_local! {
    /// A block-sized buffer per thread for disk-mode read-modify-write (no allocation per
    /// write once a thread has one).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Which of a range's blocks the cache holds ([`WriteCache::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// Every one (a range of no blocks too).
    All,
    /// Some but not all.
    Some,
    /// None.
    None,
}

/// Counters of a cache.
#[derive(Debug, Default)]
struct Counters {
    evictions: AtomicU64,
    promotions: AtomicU64,
    enospc: AtomicU64,
    rmw: AtomicU64,
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

/// Overflow slots: handed out by growth up to the budget, then reused.
#[derive(Debug)]
struct DiskSlots {
    inner: Mutex<(u64, Vec<u64>)>,
    max: u64,
    used: AtomicU64,
}

impl DiskSlots {
    fn alloc(&self) -> Option<u64> {
        let mut g = self.inner.lock();
        let s = match g.1.pop() {
            Some(s) => s,
            None if g.0 < self.max => {
                g.0 += 1;
                g.0 - 1
            }
            None => return None,
        };
        self.used.fetch_add(1, Ordering::Relaxed);
        Some(s)
    }

    fn release(&self, s: u64) {
        self.inner.lock().1.push(s);
        self.used.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A write cache over `next` (see the crate docs).
#[derive(Debug)]
pub struct WriteCache {
    next: Arc<dyn BlockDevice>,
    size: u64,
    mode: Mode,
    block: u64,
    shift: u32,
    index: Index,
    arena: Arena,
    clock: Clock,
    store: Option<Arc<dyn OverflowStore>>,
    disk: DiskSlots,
    stripes: Box<[RwLock<()>]>,
    /// Insert locks, by block: serialize inserts of one block (see `write_piece`).
    inserts: Box<[Mutex<()>]>,
    zeros: Box<[u8]>,
    poisoned: AtomicBool,
    /// RAM slots allocated by inserts not yet published or released.
    filling: AtomicU64,
    counters: Counters,
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
            disk: DiskSlots {
                inner: Mutex::new((0, Vec::new())),
                max: disk_slots,
                used: AtomicU64::new(0),
            },
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

    /// Whether the cache holds all, some or none of the blocks `[offset, offset+len)`
    /// touches.
    fn holds(&self, offset: u64, len: usize) -> Holds {
        let (mut any, mut all) = (false, true);
        let _ = self.pieces(offset, len, |b, _, _| {
            let held = self.index.get(b).is_some();
            any |= held;
            all &= held;
            Ok(())
        });
        match (any, all) {
            (_, true) => Holds::All,
            (true, false) => Holds::Some,
            (false, false) => Holds::None,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Poisoned,
                "write cache failed an earlier overflow write or flush",
            ));
        }
        check_bounds(self.size, offset, len)
    }

    /// Bytes of block `b` (the last block may be short).
    fn block_len(&self, b: u64) -> usize {
        // At most `block` (≤ 1 MiB).
        (self.size - (b << self.shift)).min(self.block) as usize
    }

    fn insert_lock(&self, b: u64) -> &Mutex<()> {
        let h = b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        // h < 2^10 = STRIPES.
        &self.inserts[h as usize % STRIPES]
    }

    fn stripe(&self, s: u64) -> &RwLock<()> {
        &self.stripes[(s % STRIPES as u64) as usize]
    }

    fn store(&self) -> &dyn OverflowStore {
        // `new` refuses RamOverflow and Disk without a store, and only they place blocks in
        // overflow slots.
        self.store
            .as_deref()
            .expect("overflow slots exist only in modes that have a store")
    }

    fn enospc(&self, what: &str, source: Option<std::io::Error>) -> Error {
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

    /// Writes `buf` to overflow slot bytes at `offset`. A full store is ENOSPC (the caller
    /// still holds the data); any other failure poisons the cache.
    fn store_write(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.store()
            .write_at(buf, offset)
            .map_err(|e| self.store_write_error(e))
    }

    /// What a failed overflow write means: ENOSPC when the store is full, else the cache is
    /// poisoned.
    fn store_write_error(&self, e: std::io::Error) -> Error {
        if is_full(&e) {
            self.enospc("overflow file", Some(e))
        } else {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "overflow write failed: write cache poisoned");
            Error::io("write overflow file", e)
        }
    }

    fn store_read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.store()
            .read_at(buf, offset)
            .map_err(|e| Error::io("read overflow file", e))
    }

    fn disk_alloc(&self) -> Result<u64> {
        self.disk
            .alloc()
            .ok_or_else(|| self.enospc("overflow budget", None))
    }

    /// Frees overflow slot `s`, whose entry no longer names it.
    fn disk_free(&self, s: u64) {
        let _excl = self.stripe(s).write();
        self.disk.release(s);
    }

    /// Calls `f(block, offset in block, range in the caller's buffer)` per block piece.
    fn pieces(
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

    // ---- reads ----

    /// Copies block `b`'s bytes `[o, o+dst.len())` into `dst`; false when the cache does
    /// not hold the block (the caller reads the layer below).
    fn read_piece(&self, b: u64, o: usize, dst: &mut [u8]) -> Result<bool> {
        loop {
            let Some(e) = self.index.get(b) else {
                return Ok(false);
            };
            match e.place {
                Place::Zero => {
                    dst.fill(0);
                    return Ok(true);
                }
                Place::Ram(r) => {
                    if !self.copy_from_slot(r, b, o, dst) {
                        continue;
                    }
                    return Ok(true);
                }
                Place::Disk(s) => {
                    let _shared = self.stripe(s).read();
                    if self.index.get(b) != Some(e) {
                        continue;
                    }
                    self.store_read(dst, (s << self.shift) + o as u64)?;
                    return Ok(true);
                }
            }
        }
    }

    /// Copies block `b`'s bytes from `o` out of RAM slot `r` into `dst`; false (nothing
    /// copied) when the slot no longer holds `b`.
    fn copy_from_slot(&self, r: u32, b: u64, o: usize, dst: &mut [u8]) -> bool {
        let g = self.arena.slot(r).read();
        if g.owner != b {
            return false;
        }
        dst.copy_from_slice(&g.data[o..o + dst.len()]);
        drop(g);
        self.clock.touch(r);
        true
    }

    /// [`Self::read_piece`] when it needs no lock held across I/O and no wait for a device;
    /// `None` otherwise (also when the cache does not hold the block).
    fn try_read_piece(&self, b: u64, o: usize, dst: &mut [u8]) -> Option<Result<()>> {
        loop {
            let e = self.index.get(b)?;
            match e.place {
                Place::Zero => {
                    dst.fill(0);
                    return Some(Ok(()));
                }
                Place::Ram(r) => {
                    if !self.copy_from_slot(r, b, o, dst) {
                        continue;
                    }
                    return Some(Ok(()));
                }
                Place::Disk(s) => {
                    let _shared = self.stripe(s).try_read()?;
                    if self.index.get(b) != Some(e) {
                        continue;
                    }
                    let r = self
                        .store()
                        .try_read_at(dst, (s << self.shift) + o as u64)?;
                    return Some(r.map_err(|e| Error::io("read overflow file", e)));
                }
            }
        }
    }

    /// Writes `src` into block `b`'s overflow slot `s` in place if the store can do it
    /// without waiting; `None` (nothing written) otherwise or when the entry is no longer
    /// `cur`.
    fn try_write_in_place(
        &self,
        b: u64,
        s: u64,
        o: usize,
        src: &[u8],
        cur: Option<Entry>,
    ) -> Option<Result<()>> {
        let _shared = self.stripe(s).try_read()?;
        if self.index.get(b) != cur {
            return None;
        }
        let r = self
            .store()
            .try_write_at(src, (s << self.shift) + o as u64)?;
        Some(r.map_err(|e| self.store_write_error(e)))
    }

    // ---- writes ----

    fn write_piece(&self, b: u64, o: usize, src: &[u8]) -> Result<()> {
        loop {
            let cur = self.index.get(b);
            let done = match cur.map(|e| e.place) {
                Some(Place::Ram(r)) => {
                    let mut g = self.arena.slot(r).write();
                    if g.owner != b {
                        continue;
                    }
                    crate::copy::copy_into_slot(&mut g.data[o..o + src.len()], src);
                    drop(g);
                    self.clock.touch(r);
                    true
                }
                Some(Place::Disk(s)) if self.mode == Mode::Disk || !PROMOTE_ON_WRITE => {
                    let _shared = self.stripe(s).read();
                    if self.index.get(b) != cur {
                        continue;
                    }
                    self.store_write(src, (s << self.shift) + o as u64)?;
                    true
                }
                _ => {
                    // One insert per block at a time: a second writer of the same new block
                    // waits, then writes in place, instead of filling a slot it would lose.
                    let _insert = self.insert_lock(b).lock();
                    if self.index.get(b) != cur {
                        continue;
                    }
                    if self.mode == Mode::Disk {
                        self.insert_disk(b, o, src, cur)?
                    } else {
                        self.insert_ram(b, o, src, cur)?
                    }
                }
            };
            if done {
                return Ok(());
            }
        }
    }

    /// Fills `dst` (block `b`'s bytes) from where `cur` says they are. False when `cur`
    /// changed under a read of the overflow slot.
    fn fill_base(&self, b: u64, cur: Option<Entry>, dst: &mut [u8]) -> Result<bool> {
        self.counters.rmw.fetch_add(1, Ordering::Relaxed);
        match cur.map(|e| e.place) {
            None => self.next.read_at(dst, b << self.shift)?,
            Some(Place::Zero) => dst.fill(0),
            Some(Place::Disk(s)) => {
                let _shared = self.stripe(s).read();
                if self.index.get(b) != cur {
                    return Ok(false);
                }
                self.store_read(dst, s << self.shift)?;
            }
            Some(Place::Ram(_)) => unreachable!("a RAM block is written in place, not refilled"),
        }
        Ok(true)
    }

    /// A RAM slot: a free one, or (RamOverflow) one taken by eviction. A slot counts in
    /// `filling` until its insert published or gave it back.
    fn ram_alloc(&self) -> Result<u32> {
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
    fn filled(&self) {
        self.filling.fetch_sub(1, Ordering::AcqRel);
    }

    /// Writes into a new RAM slot and publishes it in place of `cur` (absent, zero or an
    /// overflow slot). False when `cur` changed meanwhile (the caller retries).
    fn insert_ram(&self, b: u64, o: usize, src: &[u8], cur: Option<Entry>) -> Result<bool> {
        let r = self.ram_alloc()?;
        self.insert_into(r, b, o, src, cur, true)
    }

    /// [`Self::insert_ram`] with slot `r` already taken (and counted in `filling`). When
    /// `cur` is an overflow slot, `free_disk` frees it after the publish (false: the caller
    /// holds its stripe exclusively and frees it).
    fn insert_into(
        &self,
        r: u32,
        b: u64,
        o: usize,
        src: &[u8],
        cur: Option<Entry>,
        free_disk: bool,
    ) -> Result<bool> {
        let mut g = self.arena.slot(r).write();
        debug_assert_eq!(g.owner, FREE, "a slot handed out is free");
        let blen = self.block_len(b);
        let full = o == 0 && src.len() == blen;
        let based = if full {
            Ok(true)
        } else {
            self.fill_base(b, cur, &mut g.data[..blen])
        };
        if !matches!(based, Ok(true)) {
            drop(g);
            self.arena.release(r);
            self.filled();
            return based;
        }
        crate::copy::copy_into_slot(&mut g.data[o..o + src.len()], src);
        g.owner = b;
        let new = self.index.entry(Place::Ram(r));
        if !self.index.replace(b, cur, Some(new)) {
            g.owner = FREE;
            drop(g);
            self.arena.release(r);
            self.filled();
            return Ok(false);
        }
        drop(g);
        self.filled();
        self.clock.touch(r);
        if let Some(Place::Disk(s)) = cur.map(|e| e.place) {
            self.counters.promotions.fetch_add(1, Ordering::Relaxed);
            if free_disk {
                self.disk_free(s);
            }
        }
        Ok(true)
    }

    /// Disk mode: writes block `b` whole into a new overflow slot and publishes it in place
    /// of `cur` (absent or zero).
    fn insert_disk(&self, b: u64, o: usize, src: &[u8], cur: Option<Entry>) -> Result<bool> {
        let s = self.disk_alloc()?;
        let blen = self.block_len(b);
        let written = if o == 0 && src.len() == blen {
            self.store_write(src, s << self.shift)
        } else {
            SCRATCH.with(|cell| {
                let mut buf = cell.borrow_mut();
                if buf.len() < blen {
                    buf.resize(self.block as usize, 0);
                }
                let buf = &mut buf[..blen];
                // Disk mode has no RAM entries and overflow entries are written in place,
                // so the base is the layer below or zeros: it cannot change under us.
                self.fill_base(b, cur, buf)?;
                buf[o..o + src.len()].copy_from_slice(src);
                self.store_write(buf, s << self.shift)
            })
        };
        if let Err(e) = written {
            self.disk.release(s);
            return Err(e);
        }
        let new = self.index.entry(Place::Disk(s));
        if self.index.replace(b, cur, Some(new)) {
            return Ok(true);
        }
        self.disk_free(s);
        Ok(false)
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
            let new = self.index.entry(Place::Disk(s));
            // Changing a RAM entry needs the slot's write lock, which we held (upgradable)
            // since the lookup: the entry cannot have changed.
            let swapped = self.index.replace(b, cur, Some(new));
            assert!(
                swapped,
                "RAM entry of block {b} changed under its slot lock"
            );
            w.owner = FREE;
            drop(w);
            self.clock.forget(r);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            return Ok(r);
        }
        Err(self.enospc("no evictable block", None))
    }

    // ---- trim and zeroes ----

    /// Sets block `b`'s entry to `target` (absent or zero), freeing its storage.
    fn set_entry(&self, b: u64, zero: bool) {
        loop {
            let cur = self.index.get(b);
            let target = zero.then(|| self.index.entry(Place::Zero));
            match cur.map(|e| e.place) {
                None if !zero => return,
                Some(Place::Zero) if zero => return,
                None | Some(Place::Zero) => {
                    if self.index.replace(b, cur, target) {
                        return;
                    }
                }
                Some(Place::Ram(r)) => {
                    let mut g = self.arena.slot(r).write();
                    if g.owner != b || !self.index.replace(b, cur, target) {
                        continue;
                    }
                    g.owner = FREE;
                    drop(g);
                    self.clock.forget(r);
                    self.arena.release(r);
                    return;
                }
                Some(Place::Disk(s)) => {
                    let excl = self.stripe(s).write();
                    if !self.index.replace(b, cur, target) {
                        continue;
                    }
                    drop(excl);
                    self.disk.release(s);
                    return;
                }
            }
        }
    }

    /// Whole blocks of `[offset, offset+len)` get `set_entry(zero)`; partial ones get
    /// zeros written (`zero`) or are left alone (trim is advisory).
    fn clear(&self, offset: u64, len: u64, zero: bool) -> Result<()> {
        self.check(offset, len)?;
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let b = at >> self.shift;
            let o = (at & (self.block - 1)) as usize;
            let blen = self.block_len(b);
            let n = ((blen - o) as u64).min(end - at) as usize;
            if o == 0 && n == blen {
                self.set_entry(b, zero);
            } else if zero {
                self.write_piece(b, o, &self.zeros[..n])?;
            }
            at += n as u64;
        }
        Ok(())
    }
}

fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull
            | std::io::ErrorKind::QuotaExceeded
            | std::io::ErrorKind::FileTooLarge
    )
}

impl BlockDevice for WriteCache {
    fn geometry(&self) -> Geometry {
        self.next.geometry()
    }

    fn format(&self) -> &'static str {
        "write-cache"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        // Runs of blocks the cache does not hold are read from below in one call each.
        let len = buf.len();
        let mut below: Option<std::ops::Range<usize>> = None;
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let b = at >> self.shift;
            // Below `block` (≤ 1 MiB).
            let o = (at & (self.block - 1)) as usize;
            let n = (self.block as usize - o).min(len - pos);
            let held = self.read_piece(b, o, &mut buf[pos..pos + n])?;
            match (&mut below, held) {
                (Some(run), false) => run.end = pos + n,
                (None, false) => below = Some(pos..pos + n),
                (Some(_), true) => {
                    let run = below.take().unwrap_or_default();
                    self.next
                        .read_at(&mut buf[run.clone()], offset + run.start as u64)?;
                }
                (None, true) => {}
            }
            pos += n;
        }
        if let Some(run) = below {
            self.next
                .read_at(&mut buf[run.clone()], offset + run.start as u64)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.pieces(offset, buf.len(), |b, o, range| {
            self.write_piece(b, o, &buf[range])
        })
    }

    fn flush(&self) -> Result<()> {
        self.check(0, 0)?;
        if self.mode != Mode::Disk {
            // RAM and RAM-with-overflow caches are discarded at restart: nothing to make
            // durable.
            return Ok(());
        }
        self.store().flush().map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "overflow flush failed: write cache poisoned");
            Error::io("flush overflow file", e)
        })
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.clear(offset, len, false)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.clear(offset, len, true)
    }

    fn can_write(&self) -> bool {
        true
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        check_bounds(self.size, offset, len)?;
        let mut runs: Vec<LayerRun> = Vec::new();
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let b = at >> self.shift;
            let n = ((b + 1) << self.shift).min(end) - at;
            let source = match self.index.get(b).map(|e| e.place) {
                None => Source::Parent,
                Some(Place::Zero) => Source::Zero,
                Some(_) => Source::Data,
            };
            match runs.last_mut() {
                Some(last) if last.source == source => last.len += n,
                _ => runs.push(LayerRun { len: n, source }),
            }
            at += n;
        }
        Ok(runs)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        Some(Arc::clone(&self.next))
    }

    fn allocated_bytes(&self) -> Result<u64> {
        let u = self.usage();
        Ok(u.ram_bytes + u.overflow_bytes)
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// Reads and writes of blocks held in RAM complete in place; reads of blocks the cache does not hold are submitted below.
impl FastPath for WriteCache {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        // Only when the cache holds every block: the others are read from the server.
        if self.holds(offset, buf.len()) != Holds::All {
            return None;
        }
        let len = buf.len();
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let b = at >> self.shift;
            // Below `block` (≤ 1 MiB).
            let o = (at & (self.block - 1)) as usize;
            let n = (self.block as usize - o).min(len - pos);
            // `None`: trimmed meanwhile, or the overflow file would wait for the disk; the
            // blocking path reads it all again.
            if let Err(e) = self.try_read_piece(b, o, &mut buf[pos..pos + n])? {
                return Some(Err(e));
            }
            pos += n;
        }
        Some(Ok(()))
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return None;
        }
        // This runs on the NBD server's reactor: it must never wait for a lock held across
        // I/O (insert locks are held during a read from the server), evict (overflow I/O),
        // read below, or spin for a slot. `None` must mean nothing was written.
        let b = offset >> self.shift;
        let o = (offset & (self.block - 1)) as usize;
        if o + buf.len() > self.block_len(b) {
            // Several blocks: only when all are in RAM, so every piece is an in-place copy
            // (a block evicted between this check and its copy costs one page-cache write).
            let mut in_ram = true;
            let _ = self.pieces(offset, buf.len(), |b, _, _| {
                in_ram &= matches!(self.index.get(b).map(|e| e.place), Some(Place::Ram(_)));
                Ok(())
            });
            return in_ram.then(|| self.write_at(buf, offset));
        }
        let cur = self.index.get(b);
        match cur.map(|e| e.place) {
            Some(Place::Ram(_)) => Some(self.write_piece(b, o, buf)),
            Some(Place::Zero) | None if self.mode == Mode::Disk => None,
            Some(Place::Zero) | None => {
                let whole = o == 0 && buf.len() == self.block_len(b);
                if cur.is_none() && !whole {
                    // A partial new block reads the rest of the block from the server.
                    return None;
                }
                let _insert = self.insert_lock(b).try_lock()?;
                if self.index.get(b) != cur {
                    return None;
                }
                let r = self.arena.alloc()?;
                self.filling.fetch_add(1, Ordering::AcqRel);
                match self.insert_into(r, b, o, buf, cur, true) {
                    Ok(true) => Some(Ok(())),
                    // The entry changed (a trim) after all: the slot was given back and
                    // nothing was written.
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            Some(Place::Disk(s)) => {
                if let Some(r) = self.try_write_in_place(b, s, o, buf, cur) {
                    return Some(r);
                }
                if self.mode == Mode::Disk {
                    return None;
                }
                // A whole-block rewrite of a block in the overflow file moves it back to a
                // free RAM slot: no read is needed, and freeing its overflow slot needs the
                // slot's stripe, taken only if no reader holds it.
                if o != 0 || buf.len() != self.block_len(b) {
                    return None;
                }
                let _insert = self.insert_lock(b).try_lock()?;
                if self.index.get(b) != cur {
                    return None;
                }
                let excl = self.stripe(s).try_write()?;
                let r = self.arena.alloc()?;
                self.filling.fetch_add(1, Ordering::AcqRel);
                match self.insert_into(r, b, o, buf, cur, false) {
                    Ok(true) => {
                        drop(excl);
                        self.disk.release(s);
                        Some(Ok(()))
                    }
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
        }
    }

    /// A read of blocks none of which the cache holds goes to the device below as it is,
    /// so a device below that submits reads (the target's remote vDisk) answers it without
    /// a blocking thread. A block written meanwhile is a concurrent write: either answer is
    /// right.
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        self.check(offset, len as u64).ok()?;
        if self.holds(offset, len) != Holds::None {
            return None;
        }
        self.next.submit_read(offset, len)
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    /// A read-only device whose byte at `i` is `i % 251`, so any misplaced byte shows.
    #[derive(Debug)]
    struct Golden(u64);

    impl BlockDevice for Golden {
        fn geometry(&self) -> Geometry {
            Geometry {
                size: self.0,
                logical_sector_size: 512,
                physical_sector_size: 4096,
                block_size: 1 << 20,
            }
        }
        fn format(&self) -> &'static str {
            "golden"
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            check_bounds(self.0, offset, buf.len() as u64)?;
            for (i, b) in buf.iter_mut().enumerate() {
                *b = ((offset + i as u64) % 251) as u8;
            }
            Ok(())
        }

        fn fast_path(&self) -> Option<&dyn FastPath> {
            Some(self)
        }
    }

    impl FastPath for Golden {
        fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
            disk::device::read_each(self, bufs, offset)
        }

        fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<Result<()>> {
            None
        }

        fn try_read_shared(
            &self,
            _offset: u64,
            _len: u64,
        ) -> Option<Result<Vec<disk::device::Piece>>> {
            None
        }

        fn shares_reads(&self) -> bool {
            false
        }

        fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
            None
        }

        fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<Result<()>> {
            None
        }

        fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
            let mut data = vec![0u8; len];
            let r = self.read_at(&mut data, offset).map(|()| data);
            Some(Box::pin(std::future::ready(Some(r))))
        }

        fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
            None
        }
    }

    /// The outcome of a submitted call that is already complete.
    fn ready<T>(mut call: Submitted<T>) -> Option<Result<T>> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => panic!("the golden device answers at once"),
        }
    }

    fn cache(mode: Mode, ram_blocks: u64, disk_blocks: u64) -> WriteCache {
        let config = Config {
            mode,
            block_bytes: 4096,
            ram_bytes_max: ram_blocks * 4096,
            overflow_bytes_max: disk_blocks * 4096,
        };
        let store: Arc<dyn OverflowStore> = Arc::new(MemStore::new(1 << 30));
        WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
    }

    #[test]
    fn partial_write_keeps_the_rest_of_the_golden_block() {
        let c = cache(Mode::Ram, 4, 0);
        c.write_at(&[0xAA; 10], 4096 + 100).unwrap();
        let mut buf = [0u8; 3];
        c.read_at(&mut buf, 4096 + 99).unwrap();
        // Byte 4195 of the golden image is 4195 % 251 = 179.
        assert_eq!(buf, [179, 0xAA, 0xAA]);
    }

    /// A read of blocks the cache does not hold is submitted to the device below as it is;
    /// one touching a block the cache holds is not (the blocking read merges the two).
    #[test]
    fn reads_of_blocks_not_held_are_submitted_below() {
        let c = cache(Mode::Ram, 4, 0);
        let data = ready(c.submit_read(8192 + 5, 8192).expect("no block held"))
            .unwrap()
            .unwrap();
        assert_eq!(data.len(), 8192);
        assert_eq!(data[0], ((8192 + 5) % 251) as u8);
        c.write_at(&[0xAA; 10], 4096 + 100).unwrap();
        assert!(c.submit_read(4096, 4096).is_none(), "held");
        assert!(c.submit_read(0, 8192).is_none(), "partly held");
        assert!(c.submit_read(1 << 20, 4096).is_none(), "past the end");
        assert!(c.submit_read(8192, 4096).is_some());
    }

    #[test]
    fn ram_full_is_limit_exceeded() {
        let c = cache(Mode::Ram, 1, 0);
        c.write_at(&[1; 4096], 0).unwrap();
        let e = c.write_at(&[1; 4096], 8192).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitExceeded);
        assert_eq!(c.usage().enospc, 1);
    }

    #[test]
    fn ram_overflow_evicts_and_reads_back() {
        let c = cache(Mode::RamOverflow, 1, 4);
        c.write_at(&[1; 4096], 0).unwrap();
        c.write_at(&[2; 4096], 4096).unwrap();
        let mut buf = [0u8; 4096];
        c.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1; 4096]);
        assert_eq!(c.usage().evictions, 1);
    }

    #[test]
    fn overflow_full_is_limit_exceeded() {
        let c = cache(Mode::RamOverflow, 1, 1);
        c.write_at(&[1; 4096], 0).unwrap();
        c.write_at(&[2; 4096], 4096).unwrap();
        let e = c.write_at(&[3; 4096], 8192).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    }

    #[test]
    fn trim_frees_the_ram_block() {
        let c = cache(Mode::Ram, 1, 0);
        c.write_at(&[1; 4096], 0).unwrap();
        c.trim(0, 4096).unwrap();
        assert_eq!(c.usage().ram_bytes, 0);
    }

    #[test]
    fn write_zeroes_reads_zeros_without_storage() {
        let c = cache(Mode::Disk, 0, 4);
        c.write_zeroes(0, 8192).unwrap();
        let mut buf = [1u8; 8192];
        c.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [0; 8192]);
        assert_eq!(c.usage().overflow_bytes, 0);
    }

    /// A store whose writes fail with EIO (a dying disk).
    #[derive(Debug)]
    struct BrokenStore;

    impl OverflowStore for BrokenStore {
        fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(5))
        }
        fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(5))
        }
        fn flush(&self) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(5))
        }
    }

    fn broken(mode: Mode) -> WriteCache {
        let config = Config {
            mode,
            block_bytes: 4096,
            ram_bytes_max: 4096,
            overflow_bytes_max: 1 << 20,
        };
        let store: Arc<dyn OverflowStore> = Arc::new(BrokenStore);
        WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
    }

    #[test]
    fn failed_overflow_write_poisons_the_cache() {
        let c = broken(Mode::Disk);
        assert_eq!(c.write_at(&[1; 4096], 0).unwrap_err().kind(), ErrorKind::Io);
        let mut buf = [0u8; 512];
        assert_eq!(
            c.read_at(&mut buf, 0).unwrap_err().kind(),
            ErrorKind::Poisoned
        );
    }

    #[test]
    fn failed_flush_poisons_the_cache() {
        let c = broken(Mode::Disk);
        assert_eq!(c.flush().unwrap_err().kind(), ErrorKind::Io);
        assert_eq!(
            c.write_at(&[1; 512], 0).unwrap_err().kind(),
            ErrorKind::Poisoned
        );
    }

    #[test]
    fn failed_eviction_write_keeps_the_victim_in_ram() {
        let c = broken(Mode::RamOverflow);
        c.write_at(&[7; 4096], 0).unwrap();
        // The second block needs the only RAM slot: the victim's write to the store fails.
        assert_eq!(
            c.write_at(&[8; 4096], 4096).unwrap_err().kind(),
            ErrorKind::Io
        );
        assert_eq!(c.usage().evictions, 0);
        assert_eq!(c.usage().ram_bytes, 4096);
    }

    #[test]
    fn try_write_of_a_partial_new_block_defers_and_writes_nothing() {
        let c = cache(Mode::Ram, 4, 0);
        assert!(c.try_write_at(&[1; 512], 4096).is_none());
        assert_eq!(c.cached_blocks(), 0);
    }

    #[test]
    fn try_write_with_ram_full_defers_instead_of_evicting() {
        let c = cache(Mode::RamOverflow, 1, 4);
        c.write_at(&[1; 4096], 0).unwrap();
        assert!(c.try_write_at(&[2; 4096], 4096).is_none());
        assert_eq!(c.usage().evictions, 0);
    }

    #[test]
    fn try_write_of_a_whole_new_block_lands_in_ram() {
        let c = cache(Mode::Ram, 2, 0);
        assert!(matches!(c.try_write_at(&[3; 4096], 8192), Some(Ok(()))));
        let mut buf = [0u8; 4096];
        c.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, [3; 4096]);
    }

    fn cache_over(mode: Mode, store: Arc<dyn OverflowStore>) -> WriteCache {
        let config = Config {
            mode,
            block_bytes: 4096,
            ram_bytes_max: 4096,
            overflow_bytes_max: 1 << 20,
        };
        WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
    }

    #[test]
    fn try_write_rewrites_a_disk_block_in_place() {
        let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
        c.write_at(&[1; 4096], 0).unwrap();
        assert!(matches!(c.try_write_at(&[2; 4096], 0), Some(Ok(()))));
        let mut buf = [0u8; 4096];
        c.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [2; 4096]);
        assert_eq!(c.usage().overflow_bytes, 4096);
    }

    #[test]
    fn try_write_of_a_new_disk_block_defers_and_writes_nothing() {
        let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
        assert!(c.try_write_at(&[1; 4096], 0).is_none());
        assert_eq!(c.cached_blocks(), 0);
    }

    #[test]
    fn try_read_of_an_overflow_block_defers_when_the_store_would_wait() {
        let c = cache_over(Mode::Disk, Arc::new(MemStore::without_inline(1 << 20)));
        c.write_at(&[1; 4096], 0).unwrap();
        let mut buf = [0u8; 4096];
        assert!(c.try_read_at(&mut buf, 0).is_none());
    }

    #[test]
    fn try_read_of_an_overflow_block_reads_it_inline() {
        let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
        c.write_at(&[4; 4096], 4096).unwrap();
        let mut buf = [0u8; 4096];
        assert!(matches!(c.try_read_at(&mut buf, 4096), Some(Ok(()))));
        assert_eq!(buf, [4; 4096]);
    }

    /// A store whose blocking writes succeed and whose inline writes fail with EIO.
    #[derive(Debug)]
    struct FailsInline(MemStore);

    impl OverflowStore for FailsInline {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn try_write_at(&self, _: &[u8], _: u64) -> Option<std::io::Result<()>> {
            Some(Err(std::io::Error::from_raw_os_error(5)))
        }
    }

    #[test]
    fn failed_inline_overwrite_poisons_the_cache() {
        let c = cache_over(Mode::Disk, Arc::new(FailsInline(MemStore::new(1 << 20))));
        c.write_at(&[1; 4096], 0).unwrap();
        let r = c.try_write_at(&[2; 4096], 0);
        assert_eq!(r.unwrap().unwrap_err().kind(), ErrorKind::Io);
        assert_eq!(c.flush().unwrap_err().kind(), ErrorKind::Poisoned);
    }

    #[test]
    fn overflow_store_missing_is_a_config_error() {
        let config = Config {
            mode: Mode::Disk,
            ..Config::default()
        };
        let e = WriteCache::new(Arc::new(Golden(4096)), config, None).unwrap_err();
        assert_eq!(e, ConfigError::MissingStore { mode: Mode::Disk });
    }
}
