//! The shared cache, its per-connection wrapper, single-flight fills and read-ahead workers.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};

use disk::bytes::is_zero;
use disk::device::{Geometry, LayerRun, ParentRef, Piece, check_bounds};
use disk::{BlockDevice, Error, ErrorKind, Result};
use vhdx::Guid;

use crate::aligned::{AlignedBuf, BufPool, HUGE_PAGE_BYTES};
use crate::shard::{Claim, Group, Key, Lookup, Published, Retired, Shard};
use crate::stats::{BlockCacheStats, Counters};
use crate::stream::Streams;
use crate::{
    COMPLETE_SCATTERED_PERCENT, COMPLETE_WINDOW_MISSES, CacheConfig, CacheError, ChainKey,
    ENTRY_OVERHEAD_BYTES, GROUP_BYTES, GROUPS_PER_SHARD_MIN, IDLE_CHAINS_MAX, PAGE_BYTES_MIN,
    POOL_BUFFERS_MAX, READ_AHEAD_ACCURACY_PERCENT, READ_AHEAD_WARMUP_BLOCKS, SCAN_AFTER_BYTES,
    SCAN_CHAIN_BUDGET_DIVISOR, SCAN_FILL_BYTES, SCAN_POOL_BUFFERS_MAX, SHARD_MIN_BLOCKS,
    SHARDS_MAX,
};

/// A block buffer whose bytes are counted in `resident_bytes` while it lives. It holds the
/// pages `[lo_page, lo_page + len / page)` of its block (the last may be short at the end of
/// the device).
struct Block {
    bytes: AlignedBuf,
    counters: Arc<Counters>,
}

impl Block {
    fn zeroed(len: usize, counters: &Arc<Counters>) -> Block {
        counters.resident_add(len as u64);
        Block {
            bytes: AlignedBuf::zeroed(len),
            counters: counters.clone(),
        }
    }

    /// A buffer of `pool`'s length for a read that overwrites all of it: a reused one when
    /// the pool has one (its bytes are stale until then), else a new mapping.
    fn pooled(pool: &Arc<BufPool>, counters: &Arc<Counters>) -> Block {
        let (bytes, reused) = pool.take();
        if reused {
            counters.buffers_reused.add(1);
        }
        counters.resident_add(bytes.len() as u64);
        Block {
            bytes,
            counters: counters.clone(),
        }
    }

    fn copy_of(src: &[u8], counters: &Arc<Counters>) -> Block {
        counters.resident_add(src.len() as u64);
        Block {
            bytes: AlignedBuf::copy_of(src),
            counters: counters.clone(),
        }
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.counters.resident_bytes.sub(self.bytes.len() as u64);
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Block({} bytes)", self.bytes.len())
    }
}

/// The largest scratch buffer a thread keeps between store reads (bigger runs allocate).
const SCRATCH_KEEP_BYTES: usize = 4 << 20;

thread_local! {
    /// Each thread's buffer for multi-block store reads, reused so a read-ahead window is
    /// not zero-filled and faulted in again every time.
    static SCRATCH: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// A ready block's bytes.
#[derive(Debug, Clone)]
enum Data {
    /// Bytes `[start, start + len)` of a buffer hold the block's bytes from byte `lo` on.
    /// The buffer is the block's own (`start` 0, `len` its length) or a group's.
    Bytes {
        block: Arc<Block>,
        lo: u32,
        start: u32,
        len: u32,
    },
    /// All zeros: no buffer is kept.
    Zero,
}

impl Data {
    /// A block's own buffer, holding its bytes from byte `lo` on.
    fn bytes(block: Block, lo: u32) -> Data {
        // Block buffers are at most BLOCK_BYTES_MAX (4 MiB).
        let len = block.bytes.len() as u32;
        Data::Bytes {
            block: Arc::new(block),
            lo,
            start: 0,
            len,
        }
    }
}

/// What the cache keeps per block: its bytes and which of its pages they hold. A block
/// fetched for one small read holds only that read's pages, so the store is read for the
/// bytes clients ask for, not whole granules (see the crate's design notes).
#[derive(Debug, Clone)]
struct Cached {
    data: Data,
    /// The group whose buffer `data` shares, if any.
    group: Option<Group>,
    /// Bit `i` set: page `i` of the block is valid.
    valid: u64,
}

impl Cached {
    fn charge_bytes(&self) -> u64 {
        match &self.data {
            Data::Bytes { len, .. } => u64::from(*len) + ENTRY_OVERHEAD_BYTES,
            Data::Zero => ENTRY_OVERHEAD_BYTES,
        }
    }

    fn covers(&self, need: u64) -> bool {
        self.valid & need == need
    }

    /// Copies the block's bytes `[at, at + dst.len())` (valid pages) into `dst`.
    fn copy_to(&self, dst: &mut [u8], at: usize) {
        match &self.data {
            Data::Bytes {
                block, lo, start, ..
            } => {
                let i = at - *lo as usize + *start as usize;
                dst.copy_from_slice(&block.bytes[i..i + dst.len()]);
            }
            Data::Zero => dst.fill(0),
        }
    }
}

/// One fill in progress. The claimant finishes it; waiters block on `done`.
#[derive(Debug)]
struct Flight {
    state: Mutex<FlightState>,
    done: Condvar,
}

#[derive(Debug)]
enum FlightState {
    Pending,
    Ready(Cached),
    Failed(ErrorKind, String),
}

impl Flight {
    fn new() -> Arc<Flight> {
        Arc::new(Flight {
            state: Mutex::new(FlightState::Pending),
            done: Condvar::new(),
        })
    }

    fn finish(&self, outcome: FlightState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = outcome;
        self.done.notify_all();
    }

    fn wait(&self) -> Result<Cached> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while matches!(*g, FlightState::Pending) {
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        match &*g {
            FlightState::Ready(d) => Ok(d.clone()),
            FlightState::Failed(kind, msg) => Err(Error::new(*kind, msg.clone())),
            FlightState::Pending => unreachable!("the loop above waits until the flight ends"),
        }
    }
}

type CacheShard = Shard<Cached, Arc<Flight>>;

/// Ownership of one claimed block: `publish` or `fail` it; dropping it unfinished (a panic
/// in the store read) abandons the fill so waiters wake with an error instead of hanging.
struct Claimed<'a> {
    shared: &'a Shared,
    key: Key,
    flight: Arc<Flight>,
    /// The entry this fill extends (a refill of more pages), if any.
    old: Option<Cached>,
    open: bool,
}

impl Claimed<'_> {
    fn publish(mut self, data: Cached, prefetched: bool) -> Published {
        let charge = data.charge_bytes();
        let p = self
            .shared
            .shard_of(self.key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .publish(self.key, data.clone(), charge, prefetched, data.group);
        self.flight.finish(FlightState::Ready(data));
        self.open = false;
        p
    }

    fn fail(mut self, kind: ErrorKind, msg: String) {
        self.end(FlightState::Failed(kind, msg));
    }

    fn end(&mut self, outcome: FlightState) {
        self.shared
            .shard_of(self.key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .abandon(self.key);
        self.flight.finish(outcome);
        self.open = false;
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if self.open {
            self.end(FlightState::Failed(
                ErrorKind::Io,
                "block fill abandoned".into(),
            ));
        }
    }
}

/// What a reader found for a block.
enum Found<'a> {
    Ready(Cached, bool),
    Wait(Arc<Flight>),
    Claimed(Claimed<'a>),
}

/// Read-ahead accounting of one chain, shared by its wrappers: blocks prefetched and blocks
/// of those a demand read later used. Read-ahead stays on only while it pays off.
#[derive(Debug, Default)]
struct ReadAheadScore {
    issued: AtomicU64,
    used: AtomicU64,
    /// Recent demand misses of the chain, and of those the scattered ones (decaying).
    misses: AtomicU64,
    scattered: AtomicU64,
}

impl ReadAheadScore {
    /// True while the chain's read-ahead is accurate enough to go on: always during the
    /// first [`READ_AHEAD_WARMUP_BLOCKS`], then while at least
    /// [`READ_AHEAD_ACCURACY_PERCENT`] of the prefetched blocks were used.
    fn allows(&self) -> bool {
        let issued = self.issued.load(Ordering::Relaxed);
        let used = self.used.load(Ordering::Relaxed);
        issued < READ_AHEAD_WARMUP_BLOCKS || used * 100 >= issued * READ_AHEAD_ACCURACY_PERCENT
    }
}

impl ReadAheadScore {
    /// Counts a demand miss (`spread`: a [`scattered`] one) and says whether it should read
    /// the rest of its block: only when it is scattered and, over the chain's recent
    /// misses (a window of about [`COMPLETE_WINDOW_MISSES`], after as many for warm-up),
    /// at least [`COMPLETE_SCATTERED_PERCENT`] were scattered too. Random reads over a
    /// large disk soon pass that (half their misses are second misses in a block once
    /// completion is on); a boot, whose scattered misses are about 1% of its misses, never
    /// does, so its store bytes stay near its unique bytes.
    fn completes(&self, spread: bool) -> bool {
        let misses = self.misses.fetch_add(1, Ordering::Relaxed) + 1;
        let scattered = if spread {
            self.scattered.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.scattered.load(Ordering::Relaxed)
        };
        if misses >= 2 * COMPLETE_WINDOW_MISSES {
            // Decay: halve both (racing updates may be lost; this is a heuristic).
            self.misses.store(misses / 2, Ordering::Relaxed);
            self.scattered.store(scattered / 2, Ordering::Relaxed);
        }
        spread
            && misses >= COMPLETE_WINDOW_MISSES
            && scattered * 100 >= misses * COMPLETE_SCATTERED_PERCENT
    }
}

/// Interned chain keys. Ids are never reused, so an entry can never be read under another
/// chain's id. `token`'s strong count minus one is the number of live wrappers; it also
/// carries the chain's read-ahead score.
#[derive(Debug, Default)]
struct ChainTable {
    next_id: u64,
    tick: u64,
    by_key: HashMap<ChainKey, ChainEntry>,
}

#[derive(Debug)]
struct ChainEntry {
    id: u64,
    token: Arc<ReadAheadScore>,
    used_tick: u64,
}

impl ChainTable {
    /// The id of `key` (a new one if unknown), a token to hold while wrapped, and the ids of
    /// idle chains forgotten to stay under [`IDLE_CHAINS_MAX`] (their entries must be purged).
    fn intern(&mut self, key: ChainKey) -> (u64, Arc<ReadAheadScore>, Vec<u64>) {
        self.tick += 1;
        if let Some(e) = self.by_key.get_mut(&key) {
            e.used_tick = self.tick;
            return (e.id, e.token.clone(), Vec::new());
        }
        let mut forgotten = Vec::new();
        while self.by_key.len() >= IDLE_CHAINS_MAX {
            let oldest_idle = self
                .by_key
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.token) == 1)
                .min_by_key(|(_, e)| e.used_tick)
                .map(|(k, _)| k.clone());
            let Some(k) = oldest_idle else { break };
            if let Some(e) = self.by_key.remove(&k) {
                forgotten.push(e.id);
            }
        }
        self.next_id += 1;
        let e = ChainEntry {
            id: self.next_id,
            token: Arc::default(),
            used_tick: self.tick,
        };
        let out = (e.id, e.token.clone(), forgotten);
        self.by_key.insert(key, e);
        out
    }
}

/// A read-ahead job: prefetch `blocks` of a chain.
#[derive(Debug)]
struct Job {
    chain: Arc<ChainHandle>,
    blocks: Range<u64>,
}

/// The groups filled by scans, oldest first, and their bytes: past the window, the oldest
/// that no second read touched are evicted.
#[derive(Debug, Default)]
struct ScanWindow {
    /// (a key of the group, the identity of its buffer, its bytes).
    groups: VecDeque<(Key, usize, u64)>,
    bytes: u64,
}

/// Everything the cache handle, wrappers and workers share.
#[derive(Debug)]
struct Shared {
    config: CacheConfig,
    block_bytes: u64,
    /// The unit of a partial block: `block_bytes / 64`, at least [`PAGE_BYTES_MIN`].
    page_bytes: u64,
    /// Blocks per group (1: groups off).
    group_blocks: u64,
    shards: Box<[RwLock<CacheShard>]>,
    counters: Arc<Counters>,
    chains: Mutex<ChainTable>,
    /// Read-ahead queue; `None` when read-ahead is off. Workers exit when it is dropped.
    read_ahead: Option<SyncSender<Job>>,
    /// Group buffers for reuse; `None` when groups are off.
    pool: Option<Arc<BufPool>>,
    /// Huge buffers of a scan's fills ([`SCAN_FILL_BYTES`] rounded up to huge pages), for
    /// reuse; `None` when groups or scans are off.
    scan_pool: Option<Arc<BufPool>>,
    /// Bytes of scan-filled groups kept whatever CLOCK says (0: scans off).
    scan_window_bytes: u64,
    /// The most blocks one store read of a scan fills ([`SCAN_FILL_BYTES`]).
    scan_fill_blocks: u64,
    scans: Mutex<ScanWindow>,
}

/// One wrapped chain: the inner device and its interned id.
#[derive(Debug)]
struct ChainHandle {
    shared: Arc<Shared>,
    id: u64,
    key: ChainKey,
    inner: Arc<dyn BlockDevice>,
    size: u64,
    blocks: u64,
    /// Keeps the chain "live" in the table while any wrapper of it exists; the chain's
    /// read-ahead score.
    score: Arc<ReadAheadScore>,
    /// Long streams through this chain are scans: it is larger than a quarter of the
    /// budget (and scans are on).
    scanned: bool,
    /// The block this wrapper's scan has filled up to (0: none yet). Read-ahead queued
    /// before the stream became a scan can run after the scan went past it and its window
    /// let the blocks go; it skips the blocks below this instead of reading them again.
    scan_end: AtomicU64,
}

impl Shared {
    fn shard_of(&self, key: Key) -> &RwLock<CacheShard> {
        // A group's blocks share a shard, so its entries can leave together.
        let h = (key.chain.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (key.block / self.group_blocks))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        &self.shards[(h >> 32) as usize % self.shards.len()]
    }

    /// Bytes of block `b` of `chain` (the last block may be short).
    fn block_len(&self, chain: &ChainHandle, b: u64) -> u64 {
        self.block_bytes.min(chain.size - b * self.block_bytes)
    }

    /// The mask of every page of block `b` (the last block may have fewer).
    fn block_mask(&self, chain: &ChainHandle, b: u64) -> u64 {
        pages_mask(0, self.block_len(chain, b).div_ceil(self.page_bytes))
    }

    /// The mask of the pages of block `b` that `[start, end)` touches.
    fn need_mask(&self, b: u64, start: u64, end: u64) -> u64 {
        let base = b * self.block_bytes;
        let lo = start.max(base) - base;
        let hi = end.min(base + self.block_bytes) - base;
        pages_mask(lo / self.page_bytes, (hi - 1) / self.page_bytes + 1)
    }

    fn find_or_claim(&self, key: Key, need: u64) -> Found<'_> {
        let found = self
            .shard_of(key)
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .lookup(key);
        match found {
            Lookup::Ready(c, first) | Lookup::Refilling(c, first, _) if c.covers(need) => {
                Found::Ready(c, first)
            }
            Lookup::Loading(f) | Lookup::Refilling(_, _, f) => Found::Wait(f),
            Lookup::Ready(..) | Lookup::Absent => self.claim(key, need),
        }
    }

    /// Claims `key` unless it is loading or ready with every page of `need`.
    fn claim(&self, key: Key, need: u64) -> Found<'_> {
        let flight = Flight::new();
        let claim = self
            .shard_of(key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .claim(key, flight.clone(), |c: &Cached| c.covers(need));
        match claim {
            Claim::Claimed { old } => Found::Claimed(Claimed {
                shared: self,
                key,
                flight,
                old,
                open: true,
            }),
            Claim::Ready(c) => Found::Ready(c, false),
            Claim::Loading(f) => Found::Wait(f),
        }
    }

    /// Claims the absent blocks after the run's last, up to `end` and at most `max` in all,
    /// stopping at the first block that is present.
    fn extend_run<'a>(
        &'a self,
        chain: &ChainHandle,
        run: &mut Vec<Claimed<'a>>,
        end: u64,
        max: u64,
    ) {
        let first = run[0].key.block;
        while (run.len() as u64) < max && first + (run.len() as u64) < end {
            let key = Key {
                chain: chain.id,
                block: first + run.len() as u64,
            };
            match self.claim(key, self.block_mask(chain, key.block)) {
                Found::Claimed(c) if c.old.is_none() => run.push(c),
                // A partial entry (refused by an all-pages need) is put back as it was.
                Found::Claimed(c) => {
                    let old = c.old.clone();
                    if let Some(old) = old {
                        self.publish(c, old, false);
                    }
                    break;
                }
                Found::Ready(..) | Found::Wait(_) => break,
            }
        }
    }

    /// Reads `[lo, hi)` (page-aligned, or ending at the device's end) from the store in one
    /// read, merges it into the claimed run's blocks (the first block's and the last block's
    /// entries may be partial), publishes each, and calls `each(block, entry)`.
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it, so waiters see it too.
    fn fill(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        (lo, hi): (u64, u64),
        prefetched_from: u64,
        scan: bool,
        mut each: impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let first = run[0].key.block;
        let n = run.len() as u64;
        // At most RUN_BLOCKS_LIMIT x BLOCK_BYTES_MAX = 1 GiB, which fits a usize.
        let len = (hi - lo) as usize;
        if n == 1 && run[0].old.is_none() {
            // One block, new: read straight into the buffer the entry keeps.
            let mut buf = Block::zeroed(len, &self.counters);
            if let Err(e) = chain.inner.read_at(&mut buf.bytes, lo) {
                return Err(self.fail_run(run, lo, hi, e));
            }
            self.counters.store_reads.add(1);
            self.counters.store_read_bytes.add(len as u64);
            let base = first * self.block_bytes;
            let valid = self.piece_mask(base, lo, hi);
            let data = if is_zero(&buf.bytes) {
                Data::Zero
            } else {
                Data::bytes(buf, (lo - base) as u32)
            };
            let entry = Cached {
                data,
                valid,
                group: None,
            };
            each(first, &entry);
            for c in run {
                self.publish(c, entry.clone(), first >= prefetched_from);
            }
            return Ok(());
        }
        let whole = lo == first * self.block_bytes
            && hi == (first + n - 1) * self.block_bytes + self.block_len(chain, first + n - 1);
        if self.group_blocks > 1 && whole && run.iter().all(|c| c.old.is_none()) {
            return self.fill_groups(chain, run, prefetched_from, scan, &mut each);
        }
        // Several blocks (or a refill to merge): read into this thread's scratch buffer,
        // then copy each block's piece into its own right-sized buffer.
        let scratch = SCRATCH.with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.take()));
        let mut scratch = match scratch {
            Some(s) if s.len() >= len => s,
            _ => AlignedBuf::zeroed(len),
        };
        let r = chain.inner.read_at(&mut scratch[..len], lo);
        let out = match r {
            Err(e) => Err(self.fail_run(run, lo, hi, e)),
            Ok(()) => {
                self.counters.store_reads.add(1);
                self.counters.store_read_bytes.add(len as u64);
                self.publish_run(
                    chain,
                    run,
                    lo,
                    hi,
                    prefetched_from,
                    &scratch[..len],
                    &mut each,
                )
            }
        };
        if scratch.len() <= SCRATCH_KEEP_BYTES {
            SCRATCH.with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    *s = Some(scratch);
                }
            });
        }
        out
    }

    /// Fills a run of whole new blocks group by group: one store read for the whole run,
    /// into a buffer per group (one vectored read, so the device sees one request however
    /// many groups it spans), which the group's entries share (no copy, and a new buffer's
    /// pages are first touched by the read itself; a pooled one's are resident already).
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it.
    fn fill_groups(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        prefetched_from: u64,
        scan: bool,
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let (bs, g) = (self.block_bytes, self.group_blocks);
        let start = run[0].key.block;
        let end = start + run.len() as u64;
        if scan {
            chain.scan_end.fetch_max(end, Ordering::Relaxed);
        }
        if let Some(pool) = self
            .scan_pool
            .as_ref()
            .filter(|p| scan && (end - start) * bs <= p.buf_len() as u64)
        {
            return self.fill_scan(chain, run, prefetched_from, pool, each);
        }
        // (first block, end block, buffer) of each group's part of the run.
        let mut parts = Vec::new();
        let mut first = start;
        while first < end {
            let stop = ((first / g + 1) * g).min(end);
            let len = ((stop - 1 - first) * bs + self.block_len(chain, stop - 1)) as usize;
            let buf = match &self.pool {
                Some(pool) if pool.buf_len() == len => Block::pooled(pool, &self.counters),
                _ => Block::zeroed(len, &self.counters),
            };
            parts.push((first, stop, buf));
            first = stop;
        }
        let (lo, hi) = (start * bs, (end - 1) * bs + self.block_len(chain, end - 1));
        let read = {
            let mut bufs: Vec<&mut [u8]> = parts.iter_mut().map(|p| &mut *p.2.bytes).collect();
            chain.inner.read_vectored_at(&mut bufs, lo)
        };
        if let Err(e) = read {
            return Err(self.fail_run(run, lo, hi, e));
        }
        self.counters.store_reads.add(1);
        self.counters.store_read_bytes.add(hi - lo);
        let mut claims = run.into_iter();
        for (first, stop, buf) in parts {
            let part: Vec<Claimed<'_>> = claims.by_ref().take((stop - first) as usize).collect();
            let bytes = buf.bytes.len() as u64;
            let zero = is_zero(&buf.bytes);
            let id = buf.bytes.as_ptr() as usize;
            let buf = Arc::new(buf);
            let group = ((part.len() > 1 || scan) && !zero).then_some(Group {
                id,
                first,
                blocks: stop - first,
            });
            let src = (!zero).then_some((&buf, first));
            self.publish_group(chain, part, src, group, prefetched_from, each);
            if scan && !zero {
                let key = Key {
                    chain: chain.id,
                    block: first,
                };
                self.scanned(key, id, bytes);
            }
        }
        Ok(())
    }

    /// Publishes a fill's claimed whole blocks `part` with `group` and hands each to `each`:
    /// as entries sharing `src`'s buffer, whose bytes start with block `src.1`'s, or as `Zero`
    /// entries when `src` is `None` (the part read all zeros).
    fn publish_group(
        &self,
        chain: &ChainHandle,
        part: Vec<Claimed<'_>>,
        src: Option<(&Arc<Block>, u64)>,
        group: Option<Group>,
        prefetched_from: u64,
        each: &mut impl FnMut(u64, &Cached),
    ) {
        for c in part {
            let b = c.key.block;
            let data = match src {
                None => Data::Zero,
                // Within a buffer of a few MiB: fits a u32.
                Some((buf, base)) => Data::Bytes {
                    block: Arc::clone(buf),
                    lo: 0,
                    start: ((b - base) * self.block_bytes) as u32,
                    len: self.block_len(chain, b) as u32,
                },
            };
            let entry = Cached {
                data,
                valid: self.block_mask(chain, b),
                group,
            };
            each(b, &entry);
            self.publish(c, entry, b >= prefetched_from);
        }
    }

    /// Fills a scan's run of whole new blocks (at most [`SCAN_FILL_BYTES`]) with one store
    /// read into one huge buffer from the scan pool, which the run's groups share: the device
    /// gets the run as one request instead of one per MiB (see `aligned.rs`). Each group
    /// still leaves the cache on its own (`scanned`); the buffer goes back to the pool when
    /// the last one has, and a group read again before the window passes it is copied into
    /// a buffer of its own then, so a kept group never holds a whole huge buffer.
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it.
    fn fill_scan(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        prefetched_from: u64,
        pool: &Arc<BufPool>,
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let (bs, g) = (self.block_bytes, self.group_blocks);
        let start = run[0].key.block;
        let end = start + run.len() as u64;
        let (lo, hi) = (start * bs, (end - 1) * bs + self.block_len(chain, end - 1));
        let mut buf = Block::pooled(pool, &self.counters);
        // The caller checked that the run fits the pool's buffers.
        if let Err(e) = chain
            .inner
            .read_at(&mut buf.bytes[..(hi - lo) as usize], lo)
        {
            return Err(self.fail_run(run, lo, hi, e));
        }
        self.counters.store_reads.add(1);
        self.counters.store_read_bytes.add(hi - lo);
        let base = buf.bytes.as_ptr() as usize;
        let buf = Arc::new(buf);
        let mut claims = run.into_iter();
        let mut first = start;
        while first < end {
            let stop = ((first / g + 1) * g).min(end);
            let part: Vec<Claimed<'_>> = claims.by_ref().take((stop - first) as usize).collect();
            // Within the buffer: below its length, which is a few MiB.
            let at = ((first - start) * bs) as usize;
            let len = ((stop - 1 - first) * bs + self.block_len(chain, stop - 1)) as usize;
            let zero = is_zero(&buf.bytes[at..at + len]);
            let group = (!zero).then_some(Group {
                id: base + at,
                first,
                blocks: stop - first,
            });
            let src = (!zero).then_some((&buf, start));
            self.publish_group(chain, part, src, group, prefetched_from, each);
            if !zero {
                let key = Key {
                    chain: chain.id,
                    block: first,
                };
                self.scanned(key, base + at, len as u64);
            }
            first = stop;
        }
        Ok(())
    }

    /// Records a group a scan filled (`key` one of its blocks, `id` the group's id) and
    /// retires the scan's groups past the window: evicted if no second read touched them,
    /// else copied out of the scan's shared buffer (`rehome`).
    fn scanned(&self, key: Key, id: usize, bytes: u64) {
        let mut old = Vec::new();
        {
            let mut w = self.scans.lock().unwrap_or_else(PoisonError::into_inner);
            w.groups.push_back((key, id, bytes));
            w.bytes += bytes;
            while w.bytes > self.scan_window_bytes {
                let Some(g) = w.groups.pop_front() else { break };
                w.bytes -= g.2;
                old.push(g);
            }
        }
        for (key, id, _) in old {
            let r = self
                .shard_of(key)
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .retire_scanned(key, id, |members| self.rehome(members));
            if let Retired::Evicted(n, _) = r {
                self.counters.scan_evictions.add(n);
                self.counters.evictions.add(n);
            }
        }
    }

    /// Copies a kept scan group's entries (`members`, in block order, sharing one buffer)
    /// into a buffer of their own: their new data and group. `None` (nothing to copy) when
    /// no member holds bytes, which a scan's group, all data, never is.
    fn rehome(&self, members: &[(u64, &Cached)]) -> Option<(Vec<Cached>, Group)> {
        let spans = members.iter().filter_map(|(_, c)| match &c.data {
            Data::Bytes {
                block, start, len, ..
            } => Some((block, *start as usize, (*start + *len) as usize)),
            Data::Zero => None,
        });
        let (mut src, mut lo, mut hi) = (None, usize::MAX, 0);
        for (block, s, e) in spans {
            src.get_or_insert(block);
            (lo, hi) = (lo.min(s), hi.max(e));
        }
        let copy = Block::copy_of(&src?.bytes[lo..hi], &self.counters);
        let first = members.first()?.0;
        let group = Group {
            id: copy.bytes.as_ptr() as usize,
            first,
            blocks: members.last()?.0 + 1 - first,
        };
        let copy = Arc::new(copy);
        let data = members
            .iter()
            .map(|(_, c)| Cached {
                data: match &c.data {
                    Data::Bytes {
                        lo: l, start, len, ..
                    } => Data::Bytes {
                        block: Arc::clone(&copy),
                        lo: *l,
                        start: (*start as usize - lo) as u32,
                        len: *len,
                    },
                    Data::Zero => Data::Zero,
                },
                valid: c.valid,
                group: Some(group),
            })
            .collect();
        self.counters.scan_copies.add(1);
        Some((data, group))
    }

    /// Fails every claim of a run whose store read of `[lo, hi)` failed; returns the error.
    fn fail_run(&self, run: Vec<Claimed<'_>>, lo: u64, hi: u64, e: Error) -> Error {
        let msg = format!("store read of {lo:#x}..{hi:#x} failed: {e}");
        for c in run {
            c.fail(e.kind(), msg.clone());
        }
        e
    }

    /// The mask of the pages of the block at `base` that `[lo, hi)` covers (`hi` may end
    /// mid-page at the end of the device).
    fn piece_mask(&self, base: u64, lo: u64, hi: u64) -> u64 {
        pages_mask(
            (lo - base) / self.page_bytes,
            (hi - base).div_ceil(self.page_bytes),
        )
    }

    /// Publishes the blocks of a run whose bytes `[lo, hi)` were read into `src_all`, each
    /// into its own right-sized buffer (or merged into its old entry).
    #[allow(clippy::too_many_arguments)]
    fn publish_run(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        lo: u64,
        hi: u64,
        prefetched_from: u64,
        src_all: &[u8],
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let first = run[0].key.block;
        for (i, mut c) in run.into_iter().enumerate() {
            let b = first + i as u64;
            let base = b * self.block_bytes;
            let (p_lo, p_hi) = (lo.max(base), hi.min(base + self.block_len(chain, b)));
            let piece_mask = self.piece_mask(base, p_lo, p_hi);
            let src = &src_all[(p_lo - lo) as usize..(p_hi - lo) as usize];
            let entry = match c.old.take() {
                None if is_zero(src) => Cached {
                    data: Data::Zero,
                    valid: piece_mask,
                    group: None,
                },
                None => Cached {
                    data: Data::bytes(Block::copy_of(src, &self.counters), (p_lo - base) as u32),
                    valid: piece_mask,
                    group: None,
                },
                Some(old) => self.merge(chain, b, old, src, p_lo - base, piece_mask),
            };
            each(b, &entry);
            self.publish(c, entry, b >= prefetched_from);
        }
        Ok(())
    }

    /// An entry holding `old`'s valid pages and `src` at byte `at` of block `b`.
    fn merge(
        &self,
        chain: &ChainHandle,
        b: u64,
        old: Cached,
        src: &[u8],
        at: u64,
        piece_mask: u64,
    ) -> Cached {
        let valid = old.valid | piece_mask;
        if matches!(old.data, Data::Zero) && is_zero(src) {
            return Cached {
                data: Data::Zero,
                valid,
                group: None,
            };
        }
        let first_page = u64::from(valid.trailing_zeros());
        let end_page = 64 - u64::from(valid.leading_zeros());
        let lo = first_page * self.page_bytes;
        let hi = (end_page * self.page_bytes).min(self.block_len(chain, b));
        let mut own = Block::zeroed((hi - lo) as usize, &self.counters);
        if let Data::Bytes {
            block,
            lo: old_lo,
            start,
            len,
        } = &old.data
        {
            let from = (u64::from(*old_lo) - lo) as usize;
            let (start, len) = (*start as usize, *len as usize);
            own.bytes[from..from + len].copy_from_slice(&block.bytes[start..start + len]);
        }
        let from = (at - lo) as usize;
        own.bytes[from..from + src.len()].copy_from_slice(src);
        Cached {
            data: Data::bytes(own, lo as u32),
            valid,
            group: None,
        }
    }

    fn publish(&self, claim: Claimed<'_>, entry: Cached, prefetched: bool) {
        let p = claim.publish(entry, prefetched);
        self.counters.evictions.add(p.evicted);
    }

    /// A demand read through the cache (bounds already checked, `buf` not empty).
    fn read(&self, chain: &ChainHandle, buf: &mut [u8], offset: u64, scan: bool) -> Result<()> {
        let bs = self.block_bytes;
        let end = offset + buf.len() as u64;
        self.read_with(chain, offset, end, scan, |blk, c| {
            copy_block(buf, offset, blk, bs, c)
        })
    }

    /// A demand read of `[offset, end)` as pieces of the cache's buffers (no copy of the
    /// bytes), filling what is missing first (bounds already checked, not empty).
    fn read_shared(
        &self,
        chain: &ChainHandle,
        offset: u64,
        end: u64,
        scan: bool,
    ) -> Result<Vec<Piece>> {
        let bs = self.block_bytes;
        let mut pieces = Vec::with_capacity(((end - 1) / bs - offset / bs + 1) as usize);
        self.read_with(chain, offset, end, scan, |blk, c| {
            push_piece(&mut pieces, blk, bs, offset, end, c);
        })?;
        Ok(pieces)
    }

    /// The walk of a demand read of `[offset, end)`: hands each block's entry to `sink`, in
    /// block order, once it holds the pages the read needs (filling them first). `scan`:
    /// the read is part of a scan.
    fn read_with(
        &self,
        chain: &ChainHandle,
        offset: u64,
        end: u64,
        scan: bool,
        mut sink: impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let bs = self.block_bytes;
        let last = (end - 1) / bs;
        let mut b = offset / bs;
        // The last lookup waited for a fill of block `b` (counted as a wait, not a hit).
        let mut waited = false;
        while b <= last {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let need = self.need_mask(b, offset, end);
            match self.find_or_claim(key, need) {
                Found::Ready(c, first_use) => {
                    if !std::mem::take(&mut waited) {
                        self.counters.hits.add(1);
                    }
                    if first_use {
                        chain.score.used.fetch_add(1, Ordering::Relaxed);
                        self.counters.read_ahead_used.add(1);
                    }
                    sink(b, &c);
                    b += 1;
                }
                Found::Wait(f) => {
                    self.counters.inflight_waits.add(1);
                    // Then look again: the entry is found ready (a prefetched one counted as
                    // used, so read-ahead that readers wait on is not judged wasted), or, if
                    // the fill was of other pages of the block, the rest is claimed.
                    f.wait()?;
                    waited = true;
                }
                Found::Claimed(c) => {
                    waited = false;
                    let have = c.old.as_ref().map_or(0, |o| o.valid);
                    // A second miss in a block, apart from the pages it holds, reads the
                    // rest of the block: the block is being read at scattered places.
                    let spread = scattered(have, need);
                    let fetch = if self.config.complete_blocks && chain.score.completes(spread) {
                        self.counters.completions.add(1);
                        self.block_mask(chain, b) & !have
                    } else {
                        need & !have
                    };
                    let mut run = vec![c];
                    if fetch == need & !have {
                        // A scan's miss reads on past the request (its next requests are
                        // already on their way): a large store read, as the kernel's
                        // read-ahead makes for a file read through the page cache.
                        let (until, max) = if scan && have == 0 {
                            (chain.blocks, self.scan_fill_blocks)
                        } else {
                            (last + 1, u64::from(self.config.fill_blocks_max))
                        };
                        self.extend_run(chain, &mut run, until, max);
                    }
                    let n = run.len() as u64;
                    let bl = b + n - 1;
                    let ahead = bl.saturating_sub(last);
                    self.counters.misses.add(n - ahead);
                    if ahead > 0 {
                        self.counters.read_ahead_blocks.add(ahead);
                        chain.score.issued.fetch_add(ahead, Ordering::Relaxed);
                    }
                    let lo = b * bs + u64::from(fetch.trailing_zeros()) * self.page_bytes;
                    let need_last = if n == 1 {
                        fetch
                    } else if bl > last {
                        self.block_mask(chain, bl)
                    } else {
                        self.need_mask(bl, offset, end)
                    };
                    let end_page = 64 - u64::from(need_last.leading_zeros());
                    let hi = (bl * bs + end_page * self.page_bytes)
                        .min(bl * bs + self.block_len(chain, bl));
                    // Blocks past the request are published as prefetched and not handed
                    // to the sink.
                    let mut sink_req = |blk: u64, c: &Cached| {
                        if blk <= last {
                            sink(blk, c);
                        }
                    };
                    self.fill(chain, run, (lo, hi), last + 1, scan, &mut sink_req)?;
                    b += n;
                }
            }
        }
        Ok(())
    }

    /// The pieces of `[offset, offset + len)` if every page is ready (hits counted), else
    /// `None`. Never waits, never reads the store, never copies block bytes.
    fn try_read_shared(&self, chain: &ChainHandle, offset: u64, len: u64) -> Option<Vec<Piece>> {
        let bs = self.block_bytes;
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let mut pieces = Vec::with_capacity((last - first + 1) as usize);
        for b in first..=last {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let found = self
                .shard_of(key)
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .lookup(key);
            let (Lookup::Ready(c, first_use) | Lookup::Refilling(c, first_use, _)) = found else {
                return None;
            };
            if !c.covers(self.need_mask(b, offset, end)) {
                return None;
            }
            if first_use {
                chain.score.used.fetch_add(1, Ordering::Relaxed);
                self.counters.read_ahead_used.add(1);
            }
            push_piece(&mut pieces, b, bs, offset, end, &c);
        }
        self.counters.hits.add(last - first + 1);
        Some(pieces)
    }

    /// Prefetches the absent blocks of `blocks` (a read-ahead job). Errors are counted and
    /// dropped: the demand read that needs the block retries and reports.
    fn prefetch(&self, chain: &ChainHandle, blocks: Range<u64>) {
        let mut b = blocks.start.max(chain.scan_end.load(Ordering::Relaxed));
        while b < blocks.end {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let present = self
                .shard_of(key)
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(key);
            if present {
                b += 1;
                continue;
            }
            let c = match self.claim(key, 0) {
                Found::Claimed(c) if c.old.is_none() => c,
                Found::Claimed(c) => {
                    // Cannot happen with an empty need; put the entry back regardless.
                    if let Some(old) = c.old.clone() {
                        self.publish(c, old, false);
                    }
                    b += 1;
                    continue;
                }
                Found::Ready(..) | Found::Wait(_) => {
                    b += 1;
                    continue;
                }
            };
            let mut run = vec![c];
            let max = u64::from(self.config.fill_blocks_max);
            self.extend_run(chain, &mut run, blocks.end, max);
            let n = run.len() as u64;
            self.counters.read_ahead_blocks.add(n);
            chain.score.issued.fetch_add(n, Ordering::Relaxed);
            let lo = b * self.block_bytes;
            let hi = ((b + n) * self.block_bytes).min(chain.size);
            if let Err(e) = self.fill(chain, run, (lo, hi), 0, false, |_, _| {}) {
                self.counters.read_ahead_errors.add(1);
                tracing::debug!(chain = ?chain.key, block = b, error = %e, "read-ahead failed");
                return;
            }
            b += n;
        }
    }
}

/// True when a block holding pages `have` is asked for pages `need` of which some are
/// missing and none of the missing ones borders a held page: a read elsewhere in a block
/// already partly read (random access), not the next read of a stream through it.
fn scattered(have: u64, need: u64) -> bool {
    let missing = need & !have;
    have != 0 && missing != 0 && missing & (have << 1 | have >> 1) == 0
}

/// Bits `lo..hi` set (pages `lo` to `hi - 1`), `hi <= 64`.
fn pages_mask(lo: u64, hi: u64) -> u64 {
    debug_assert!(lo < hi && hi <= 64);
    let upto = if hi >= 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upto & !((1u64 << lo) - 1)
}

/// Appends the part of block `blk` (of `bs` bytes) that overlaps `[offset, end)` to
/// `pieces`, as a piece of the entry's buffer (zeros merge with a zero piece before them).
fn push_piece(pieces: &mut Vec<Piece>, blk: u64, bs: u64, offset: u64, end: u64, c: &Cached) {
    let base = blk * bs;
    let (lo, hi) = (offset.max(base), end.min(base + bs));
    let n = (hi - lo) as usize;
    match &c.data {
        Data::Zero => match pieces.last_mut() {
            Some(Piece::Zero(z)) => *z += n,
            _ => pieces.push(Piece::Zero(n)),
        },
        Data::Bytes {
            block,
            lo: at,
            start,
            ..
        } => pieces.push(Piece::Shared {
            buf: block.clone(),
            start: (lo - base) as usize - *at as usize + *start as usize,
            len: n,
        }),
    }
}

/// Copies the part of block `blk` (of `bs` bytes) that overlaps the request into `buf`.
fn copy_block(buf: &mut [u8], offset: u64, blk: u64, bs: u64, c: &Cached) {
    let block_start = blk * bs;
    let lo = block_start.max(offset);
    let hi = (block_start + bs).min(offset + buf.len() as u64);
    let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
    c.copy_to(dst, (lo - block_start) as usize);
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(job) => job.chain.shared.prefetch(&job.chain, job.blocks),
            Err(_) => return,
        }
    }
}

/// The shared block cache. Cloning gives another handle to the same cache.
#[derive(Clone)]
pub struct BlockCache {
    shared: Arc<Shared>,
}

impl fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockCache")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl BlockCache {
    /// A cache of `budget_bytes` with `block_bytes` granules and default read-ahead.
    ///
    /// # Errors
    /// [`CacheError::InvalidConfig`] for a bad granule; [`CacheError::SpawnWorker`].
    pub fn new(budget_bytes: u64, block_bytes: u32) -> std::result::Result<Self, CacheError> {
        BlockCache::with_config(CacheConfig {
            budget_bytes,
            block_bytes,
            ..CacheConfig::default()
        })
    }

    /// A cache from a full configuration; starts the read-ahead workers.
    ///
    /// # Errors
    /// [`CacheError::InvalidConfig`]; [`CacheError::SpawnWorker`].
    pub fn with_config(config: CacheConfig) -> std::result::Result<Self, CacheError> {
        config.validate()?;
        let block_bytes = u64::from(config.block_bytes);
        let shard_count = (config.budget_bytes / (block_bytes * SHARD_MIN_BLOCKS))
            .clamp(1, SHARDS_MAX as u64) as usize;
        let per_shard = config.budget_bytes / shard_count as u64;
        let shards = (0..shard_count)
            .map(|_| RwLock::new(Shard::new(per_shard)))
            .collect();
        let (tx, rx) = if config.read_ahead_enabled() {
            let (tx, rx) = sync_channel(config.read_ahead_queue);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let threads = config.read_ahead_threads;
        let group_blocks = if per_shard >= GROUPS_PER_SHARD_MIN * GROUP_BYTES {
            (GROUP_BYTES / block_bytes).max(1)
        } else {
            1
        };
        let pool = (group_blocks > 1)
            .then(|| BufPool::new((group_blocks * block_bytes) as usize, POOL_BUFFERS_MAX));
        let scan_window_bytes = config.scan_window_bytes.min(config.budget_bytes / 16);
        let scan_fill_blocks =
            (SCAN_FILL_BYTES / block_bytes).clamp(1, u64::from(crate::RUN_BLOCKS_LIMIT));
        let scan_pool = (group_blocks > 1 && scan_window_bytes > 0).then(|| {
            let len = (scan_fill_blocks * block_bytes).next_multiple_of(HUGE_PAGE_BYTES as u64);
            BufPool::new_huge(len as usize, SCAN_POOL_BUFFERS_MAX)
        });
        let shared = Arc::new(Shared {
            pool,
            scan_pool,
            scan_window_bytes,
            scan_fill_blocks,
            scans: Mutex::default(),
            config,
            block_bytes,
            page_bytes: (block_bytes / 64).max(PAGE_BYTES_MIN),
            group_blocks,
            shards,
            counters: Arc::default(),
            chains: Mutex::default(),
            read_ahead: tx,
        });
        if let Some(rx) = rx {
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..threads {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("ferry-readahead-{i}"))
                    .spawn(move || worker(&rx))
                    .map_err(CacheError::SpawnWorker)?;
            }
        }
        Ok(BlockCache { shared })
    }

    /// Puts a caching, read-only wrapper in front of `dev`, an opened read-only chain whose
    /// identity is `key`. Call once per connection: the wrapper carries that connection's
    /// read-ahead state, while entries are shared by every wrapper of the same key.
    ///
    /// The caller guarantees that nothing writes the chain's files while a key for them is
    /// in use (the key changes when they are written through Ferry's VHDX writer).
    pub fn wrap(&self, key: ChainKey, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        self.wrap_device(key, dev)
    }

    /// [`BlockCache::wrap`], returning the concrete wrapper.
    pub fn wrap_device(&self, key: ChainKey, dev: Arc<dyn BlockDevice>) -> Arc<CachedDevice> {
        let (id, token, forgotten) = self
            .shared
            .chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .intern(key.clone());
        for old in forgotten {
            self.purge(old);
        }
        let geometry = dev.geometry();
        let chain = ChainHandle {
            shared: self.shared.clone(),
            id,
            key,
            inner: dev,
            size: geometry.size,
            blocks: geometry.size.div_ceil(self.shared.block_bytes),
            score: token,
            scanned: self.shared.scan_window_bytes > 0
                && geometry.size > self.shared.config.budget_bytes / SCAN_CHAIN_BUDGET_DIVISOR,
            scan_end: AtomicU64::new(0),
        };
        Arc::new(CachedDevice {
            chain: Arc::new(chain),
            streams: Mutex::default(),
            geometry,
        })
    }

    /// Forgets `key`: drops its entries now; wrappers made later get a fresh id. Use it when
    /// a chain's files are about to change. Returns the entries dropped.
    pub fn invalidate(&self, key: &ChainKey) -> u64 {
        let removed = self
            .shared
            .chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_key
            .remove(key);
        removed.map_or(0, |e| self.purge(e.id))
    }

    fn purge(&self, chain: u64) -> u64 {
        let mut n = 0;
        for shard in &self.shared.shards {
            n += shard
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove_chain(chain)
                .0;
        }
        n
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> BlockCacheStats {
        let c = &self.shared.counters;
        let (mut cached_bytes, mut cached_blocks) = (0, 0);
        for shard in &self.shared.shards {
            let s = shard.read().unwrap_or_else(PoisonError::into_inner);
            cached_bytes += s.charged_bytes();
            cached_blocks += s.ready_len() as u64;
        }
        let chains = self
            .shared
            .chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_key
            .len() as u64;
        BlockCacheStats {
            hits: c.hits.get(),
            misses: c.misses.get(),
            inflight_waits: c.inflight_waits.get(),
            store_reads: c.store_reads.get(),
            store_read_bytes: c.store_read_bytes.get(),
            evictions: c.evictions.get(),
            read_ahead_jobs: c.read_ahead_jobs.get(),
            read_ahead_dropped: c.read_ahead_dropped.get(),
            read_ahead_blocks: c.read_ahead_blocks.get(),
            read_ahead_errors: c.read_ahead_errors.get(),
            read_ahead_refused: c.read_ahead_refused.get(),
            read_ahead_used: c.read_ahead_used.get(),
            completions: c.completions.get(),
            scan_evictions: c.scan_evictions.get(),
            buffers_reused: c.buffers_reused.get(),
            scan_copies: c.scan_copies.get(),
            cached_bytes,
            cached_blocks,
            resident_bytes: c.resident_bytes.get(),
            resident_bytes_max: c.resident_bytes_max.get(),
            budget_bytes: self.shared.config.budget_bytes,
            block_bytes: self.shared.block_bytes,
            chains,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.shared.config
    }
}

/// A read-only, caching view of a chain for one connection (see [`BlockCache::wrap`]).
/// Geometry, allocation map, parent and linkage identity are the inner device's, so a
/// differencing child can attach to it and block status walks through it.
pub struct CachedDevice {
    chain: Arc<ChainHandle>,
    /// This connection's sequential streams (read-ahead detection).
    streams: Mutex<Streams>,
    geometry: Geometry,
}

impl fmt::Debug for CachedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedDevice")
            .field("key", &self.chain.key)
            .field("chain_id", &self.chain.id)
            .field("inner", &self.chain.inner)
            .finish_non_exhaustive()
    }
}

impl CachedDevice {
    /// The key this wrapper caches under.
    pub fn key(&self) -> &ChainKey {
        &self.chain.key
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.chain.inner
    }

    /// Feeds the stream detector and queues read-ahead it asks for. Returns whether the
    /// read is part of a scan.
    fn read_ahead(&self, offset: u64, len: u64) -> bool {
        let shared = &self.chain.shared;
        let window_max = match &shared.read_ahead {
            Some(_) => u64::from(shared.config.read_ahead_blocks_max),
            None => 0,
        };
        let (wanted, span) = {
            let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            let wanted = streams.on_read(
                offset,
                len,
                shared.block_bytes,
                self.chain.blocks,
                window_max,
            );
            (wanted, streams.last_span())
        };
        let scan = self.chain.scanned && span >= SCAN_AFTER_BYTES;
        // A scan's misses read ahead themselves (`SCAN_FILL_BYTES`); a job queued for it
        // could run after the scan passed and its window let the blocks go, and read them
        // again.
        let (Some(tx), Some(blocks), false) = (&shared.read_ahead, wanted, scan) else {
            return scan;
        };
        if !self.chain.score.allows() {
            shared.counters.read_ahead_refused.add(1);
            return scan;
        }
        let job = Job {
            chain: self.chain.clone(),
            blocks,
        };
        match tx.try_send(job) {
            Ok(()) => shared.counters.read_ahead_jobs.add(1),
            Err(TrySendError::Full(_)) => shared.counters.read_ahead_dropped.add(1),
            Err(TrySendError::Disconnected(_)) => {}
        }
        false
    }
}

fn read_only() -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        "cached export is read-only (writes go to a write cache)",
    )
}

impl BlockDevice for CachedDevice {
    fn geometry(&self) -> Geometry {
        self.geometry.clone()
    }

    fn format(&self) -> &'static str {
        self.chain.inner.format()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.geometry.size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let scan = self.read_ahead(offset, buf.len() as u64);
        self.chain.shared.read(&self.chain, buf, offset, scan)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(read_only())
    }

    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn can_write(&self) -> bool {
        false
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        self.chain.inner.map_layer(offset, len)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        self.chain.inner.parent()
    }

    fn parent_ref(&self) -> Option<ParentRef> {
        self.chain.inner.parent_ref()
    }

    fn linkage_id(&self) -> Option<Guid> {
        self.chain.inner.linkage_id()
    }

    fn allocated_bytes(&self) -> Result<u64> {
        self.chain.inner.allocated_bytes()
    }

    fn warnings(&self) -> Vec<String> {
        self.chain.inner.warnings()
    }

    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        Some(self)
    }
}

/// Hits are served from the cache's buffers, shared or copied.
impl disk::FastPath for CachedDevice {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return Some(Ok(()));
        }
        // The shared pieces, copied: one lookup path for both.
        let pieces = match self.try_read_shared(offset, buf.len() as u64)? {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let mut at = 0;
        for p in &pieces {
            let dst = &mut buf[at..at + p.len()];
            match p.bytes() {
                Some(b) => dst.copy_from_slice(b),
                None => dst.fill(0),
            }
            at += p.len();
        }
        Some(Ok(()))
    }

    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(Vec::new()));
        }
        let pieces = self
            .chain
            .shared
            .try_read_shared(&self.chain, offset, len)?;
        let _scan = self.read_ahead(offset, len);
        Some(Ok(pieces))
    }

    fn shares_reads(&self) -> bool {
        true
    }

    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(Vec::new()));
        }
        let scan = self.read_ahead(offset, len);
        Some(
            self.chain
                .shared
                .read_shared(&self.chain, offset, offset + len, scan),
        )
    }

    fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn submit_read(&self, _offset: u64, _len: usize) -> Option<disk::device::Submitted<Vec<u8>>> {
        None
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ChainKey {
        ChainKey::new(name, None)
    }

    #[test]
    fn interning_the_same_key_gives_the_same_id() {
        let mut t = ChainTable::default();
        let (a, _ta, _) = t.intern(key("a"));
        let (b, _tb, _) = t.intern(key("a"));
        assert_eq!(a, b);
    }

    #[test]
    fn idle_chains_past_the_limit_are_forgotten_oldest_first() {
        let mut t = ChainTable::default();
        let (first, token, _) = t.intern(key("0"));
        drop(token);
        for i in 1..IDLE_CHAINS_MAX {
            t.intern(key(&i.to_string()));
        }
        let (_, _, forgotten) = t.intern(key("new"));
        assert_eq!(forgotten, vec![first]);
    }

    #[test]
    fn live_chains_are_not_forgotten() {
        let mut t = ChainTable::default();
        let tokens: Vec<_> = (0..IDLE_CHAINS_MAX)
            .map(|i| t.intern(key(&i.to_string())).1)
            .collect();
        let (_, _, forgotten) = t.intern(key("new"));
        assert!(forgotten.is_empty() && tokens.len() == IDLE_CHAINS_MAX);
    }

    #[test]
    fn zero_detection_sees_a_late_nonzero_byte() {
        let mut b = vec![0u8; 4096];
        b[4095] = 1;
        assert!(!is_zero(&b));
    }

    #[test]
    fn scattered_is_a_miss_apart_from_the_held_pages() {
        // Nothing held: a first miss.
        assert!(!scattered(0, 0b100));
        // Everything needed is held: a hit.
        assert!(!scattered(0b110, 0b100));
        // The next page after the held ones, or the one before: a stream.
        assert!(!scattered(0b0110, 0b1000));
        assert!(!scattered(0b0110, 0b0001));
        // A request overlapping the held pages and going on: a stream.
        assert!(!scattered(0b0110, 0b1110));
        // A gap between the held pages and the missing ones.
        assert!(scattered(0b0001, 0b0100));
        assert!(scattered(1 << 63, 1));
        assert!(scattered(1, 1 << 63));
    }
}
