//! Ferry's shared server block cache: a read-only [`disk::BlockDevice`] decorator.
//!
//! One [`BlockCache`] serves every connection of a server. [`BlockCache::wrap`] puts a
//! [`CachedDevice`] in front of an opened read-only chain; wrappers of the same vDisk version
//! (the same [`ChainKey`]) share entries keyed by (chain, block index), so a boot storm of N
//! targets reads each block from the store once.
//!
//! ```text
//!  connection 1 ── CachedDevice ─┐                 ┌── shard 0: map + CLOCK ring ─┐
//!  connection 2 ── CachedDevice ─┼─ (chain, block) ┼── shard 1                    ├─ budget
//!  connection N ── CachedDevice ─┘   single-flight └── shard k                    ┘
//!        │ stream detector                ▲ publish
//!        └── read-ahead jobs ──► bounded queue ──► worker threads ──► inner chain (store)
//! ```
//!
//! What it is not: a write cache. Writes, trims and write-zeroes on a wrapper fail with
//! `ReadOnly`. A writable export keeps its writes in its own differencing file whose parent
//! is a wrapper, so its reads of the golden part still hit the cache.
//!
//! # Design notes
//!
//! * **State encoding.** Each shard holds `HashMap<Key, Entry>` with
//!   `Entry = Loading(Arc<Flight>) | Ready(ring index)`, and a ring of slots
//!   `(key, data, group, charge, clock bit)` with `data = Bytes(Arc<buffer>, range) | Zero`.
//!   A block's life:
//!   `Absent → Loading` (exactly one claimant reads the store; every other reader of that
//!   block waits on the flight's condvar) `→ Ready` (bit clear) `⇄` bit set by a hit,
//!   cleared by the hand `→ Absent` (evicted). A failed fill goes `Loading → Absent` and its
//!   waiters get the error; nothing caches failures. All-zero blocks are kept as `Zero`
//!   (no buffer), so sparse regions cost only the entry.
//! * **Memory bound.** A shard's charged bytes (data plus [`ENTRY_OVERHEAD_BYTES`] per entry,
//!   so entry count is bounded too) never exceed its share of the budget: `publish` evicts
//!   first. Beyond the budget, each reading thread and each read-ahead worker holds at most
//!   one store-read buffer (`fill_blocks_max` blocks, one block when that is 1) and one block
//!   it is copying out, which an eviction may have unlinked meanwhile. Nothing grows per
//!   request: stream state is a fixed array per wrapper and the read-ahead queue is bounded
//!   (a full queue drops the job and counts it).
//! * **Why CLOCK.** A boot storm is hundreds of readers hitting the same hot blocks; a hit
//!   must be a lookup under a shard's read lock plus at most one relaxed store of a bit that
//!   is usually set already. LRU needs a list splice under an exclusive lock on every hit.
//!   CLOCK approximates LRU without it. New entries start with a clear bit, so a one-pass scan
//!   (an `nbdcopy` of a whole export, read-ahead past the end of a file) is evicted first,
//!   while a block read a second time (a second target, a second boot) survives one sweep.
//!   2Q/ARC would resist scans better at the cost of ghost lists; revisit with recorded
//!   traces. nbdkit's cache filter keeps a two-bitmap LRU per device, which does not fit one
//!   budget shared across many chains.
//! * **Granule and pages.** Entries are [`DEFAULT_BLOCK_BYTES`] (64 KiB) blocks, each made
//!   of 64 pages or 4 KiB pages ([`PAGE_BYTES_MIN`]), whichever is larger, with a bit per
//!   page saying whether it is held. A miss fetches only the pages the request touches
//!   (and, when a request spans blocks, one contiguous store read for all of them); a later
//!   read of other pages of the block extends the entry (a *refill*: the entry is taken
//!   out, the missing pages read, and a merged entry published). A block's buffer spans
//!   its held pages only. So the store is read for what clients ask and read-ahead fetches,
//!   never for the rest of a granule: a boot reads ~600 MB in ~70,000 reads (~8.6 KiB
//!   mean), and whole-granule fills read 1.48× a boot trace's unique bytes from the store
//!   with no read-ahead at all (`ferry-bench sim-boot --read-ahead 0`, before pages), now
//!   1.00×. The block stays the unit of lookup, eviction and entry overhead (0.2% at
//!   64 KiB), so a sequential 1 MiB read costs 16 lookups, not 256.
//! * **Completing blocks read at random.** Fetching pages alone makes uniformly random 4 KiB
//!   reads of a large disk (fio's randread; a database) pay one store read per page, up to
//!   16 per block, where the kernel's read-ahead gives nbdkit and qemu-nbd whole runs of
//!   the file per miss. So a *scattered* miss (one in a block that already holds pages,
//!   none of them next to the ones missing) reads the rest of the block in one store read,
//!   while at least [`COMPLETE_SCATTERED_PERCENT`] of the chain's last
//!   ~[`COMPLETE_WINDOW_MISSES`] misses were scattered. Random reads pass that within a few
//!   thousand misses (uniform 4 KiB reads over 2 GiB: 250,000 reads miss 70,000 times
//!   instead of 198,500, `ferry-bench sim-boot --random 250000`); the boot trace's
//!   scattered misses are about 1% of its misses, so it never completes a block and its
//!   store bytes stay at 1.02× its unique bytes (`sim-boot`, 1 and 100 clients).
//! * **Held in RAM once.** Block buffers are aligned to [`disk::DIRECT_ALIGN`], and the
//!   server turns on the store's direct reads (`Chain::direct_reads_all`, `O_DIRECT`), so
//!   an aligned fill goes from the disk into the cache's buffer without passing through (and
//!   staying in) the host's page cache: no second copy of the vDisk in RAM and no
//!   page-cache copy per fill (a sequential `nbdcopy` of a cold 2 GiB export: about 15% less
//!   server CPU, measured with `perf`). Unaligned pieces (a differencing layer's 512-byte
//!   sectors) and file systems without `O_DIRECT` read buffered.
//! * **Groups: one read, one buffer, one departure.** A fill of whole new blocks (a
//!   sequential copy, read-ahead) reads the whole run with one vectored store read
//!   (`BlockDevice::read_vectored_at`, one `preadv`) into a buffer per [`GROUP_BYTES`]-aligned
//!   group, which the group's entries share (`start`/`len` into it). A buffer that large is
//!   an anonymous mapping (or a pooled one, see scans), so the direct read is the first
//!   touch of its pages: no zero-fill, no page-fault trap per 4 KiB, no copy out of a
//!   scratch buffer. Those were most of the server's CPU on a cold `nbdcopy` of 2 GiB (page
//!   faults about 27%, the copy 5%); with groups it used 1.68 CPU-s instead of 2.2 and took
//!   1.43 s instead of 1.54 (medians of three, same machine). A group's blocks share a
//!   shard, and CLOCK evicts a group's entries together, so the memory held follows the
//!   charged bytes (each entry is charged its own bytes): evicting one entry alone would
//!   free nothing while releasing its charge. Publishing a member passes over its own
//!   group's entries unless nothing else is left. Partial blocks and refills keep per-block
//!   buffers, and groups are off when a shard's budget holds fewer than
//!   [`GROUPS_PER_SHARD_MIN`] of them.
//! * **Read-ahead that pays for itself.** Per connection, a byte-exact stream detector
//!   (`stream.rs`) asks for a window once a stream spans 256 KiB of contiguous reads. Per
//!   chain, a score counts the blocks prefetched and those a demand read then used; after
//!   [`READ_AHEAD_WARMUP_BLOCKS`], new read-ahead is refused while fewer than
//!   [`READ_AHEAD_ACCURACY_PERCENT`] of them were used. A sequential copy keeps read-ahead
//!   (everything prefetched is used); a boot, whose files end a few KiB into a block, turns
//!   it off after the warm-up, so the store bytes stay within a few percent of the unique
//!   bytes (the goal is 1.05×). Clients stream their own read-ahead anyway (the guest's
//!   page cache), and a second boot reads from the cache, not the store.
//! * **Scans recycle their own buffers.** A sequential stream that has gone on for
//!   [`SCAN_AFTER_BYTES`] through a chain larger than a quarter of the budget (a whole-disk
//!   copy, a backup, a full antivirus pass from one target) is a *scan*. A scan's miss
//!   reads [`SCAN_FILL_BYTES`] at once (its next requests are on their way) with one read
//!   into one buffer of transparent huge pages, which the fill's groups share: the device
//!   gets one 2 MiB request, where a direct read into 4 KiB pages is cut into requests of
//!   about 1 MiB (a request takes at most 254 segments on a virtio disk). Reading a 2 GiB
//!   file that way, four threads: 3.3-3.6 GB/s into huge pages, 1.4-1.7 GB/s into 4 KiB
//!   pages (same machine; `aligned.rs`). Its groups still go into the cache,
//!   so other readers hit them, but only the last `scan_window_bytes` of them (default
//!   64 MiB, at most a sixteenth of the budget) stay whatever CLOCK says: an older
//!   scan-filled group that no second read touched is evicted at once, and the fill's
//!   buffer goes back to a small pool ([`SCAN_POOL_BUFFERS_MAX`]) that the next scan fill
//!   takes from once all its groups have gone. A group read again before the window passes
//!   it stays, copied into a buffer of its own (`ferry_cache_scan_copies_total`), so a kept
//!   group never holds a whole fill buffer and memory follows the charged bytes. So a
//!   scan neither sweeps the boot set of hundreds of targets out of the cache (PostgreSQL's
//!   ring buffer for large sequential scans, for the same reason) nor faults in fresh
//!   memory for every block it reads. On a cold `nbdcopy` of a 2 GiB export (KVM guest,
//!   2 vCPUs), faulting in 2 GiB of new anonymous pages was half the server's 2.1 CPU-s (a
//!   C program doing only that: 1.05 s; direct reads of the same file into a reused 64 MiB
//!   ring: 0.28 s); with scans the server used 1.25–1.4 CPU-s (2.0–2.3 with scans off,
//!   interleaved runs). A block read a second time while in the window (a second target
//!   streaming the same file close behind) gets its CLOCK bit and stays. The first demand
//!   read of a prefetched block does not set the bit: it is the block's first read. A scan
//!   queues no read-ahead jobs (one run late, after the window let its blocks go, would
//!   read them again). A boot is never a scan (the boot trace's longest contiguous run is
//!   4.3 MB), and a chain that fits in a quarter of the budget is never scanned, so a copy
//!   of it stays whole for the next reader.
//! * **Keys.** A [`ChainKey`] is the top file's path plus its linkage identity (the VHDX
//!   DataWriteGuid, which changes on the first write of any session). A version rewritten in
//!   private mode or a file replaced in the store gets a new key, so stale entries are never
//!   served; they age out. Entries outlive connections, so the next boot hits.
//! * **Sharding.** [`SHARDS_MAX`] shards, chosen by a hash of the chain and the block's
//!   group (the block itself when groups are off), each with an equal
//!   slice of the budget, so misses on different blocks do not serialize on one write lock.
//!   Small budgets get fewer shards (at least [`SHARD_MIN_BLOCKS`] blocks each).

mod aligned;
mod cache;
mod shard;
mod stats;
mod stream;

use std::path::{Path, PathBuf};

pub use cache::{BlockCache, CachedDevice};
pub use stats::BlockCacheStats;
use vhdx::Guid;

/// The default cache granule: 64 KiB (see the design notes).
pub const DEFAULT_BLOCK_BYTES: u32 = 64 << 10;
/// The smallest granule accepted.
pub const BLOCK_BYTES_MIN: u32 = 4 << 10;
/// The largest granule accepted.
pub const BLOCK_BYTES_MAX: u32 = 4 << 20;
/// Bytes charged to the budget per entry on top of its data (map entry, ring slot, Arc).
pub const ENTRY_OVERHEAD_BYTES: u64 = 128;
/// The most shards.
pub const SHARDS_MAX: usize = 16;
/// A shard gets at least this many blocks of budget (small budgets get fewer shards).
pub const SHARD_MIN_BLOCKS: u64 = 256;
/// The largest store read and read-ahead window, in blocks.
pub const RUN_BLOCKS_LIMIT: u32 = 256;
/// Bytes of a *group*: aligned consecutive blocks that a fill of whole new blocks reads
/// with one store read into one buffer, which they share and leave the cache with (see the
/// design notes). nbdcopy's request size.
pub const GROUP_BYTES: u64 = 256 << 10;
/// Groups are used only when a shard's budget holds at least this many of them.
pub const GROUPS_PER_SHARD_MIN: u64 = 8;
/// The most read-ahead worker threads.
pub const READ_AHEAD_THREADS_LIMIT: usize = 16;
/// The deepest read-ahead queue.
pub const READ_AHEAD_QUEUE_LIMIT: usize = 4096;
/// The smallest part of a block the cache fetches and keeps on its own (a "page"): a block
/// is `block_bytes / 64` pages of at least this size, each valid or not.
pub const PAGE_BYTES_MIN: u64 = 4 << 10;
/// Blocks a chain may prefetch before its read-ahead must show it pays off.
pub const READ_AHEAD_WARMUP_BLOCKS: u64 = 128;
/// The share of prefetched blocks (in percent) that demand reads must use for a chain's
/// read-ahead to go on. Below it, new read-ahead is refused (and counted) until enough of
/// what was prefetched is used.
pub const READ_AHEAD_ACCURACY_PERCENT: u64 = 95;
/// The window of a chain's recent demand misses over which the share of scattered ones is
/// judged (see [`CacheConfig::complete_blocks`]); also the warm-up.
pub const COMPLETE_WINDOW_MISSES: u64 = 1024;
/// The share of a chain's recent misses (in percent) that must be scattered (a second miss
/// in a block, apart from the pages it holds) for such misses to read the rest of the block.
pub const COMPLETE_SCATTERED_PERCENT: u64 = 10;
/// A sequential stream becomes a *scan* once it spans this many bytes (see the design
/// notes). The longest run of contiguous reads in the boot trace is 4.3 MB.
pub const SCAN_AFTER_BYTES: u64 = 8 << 20;
/// The most bytes one store read of a scan fills: a scan's miss reads on past the request
/// up to this much (its next requests are already on their way).
pub const SCAN_FILL_BYTES: u64 = 2 << 20;
/// Idle huge buffers of scan fills kept for reuse at most (the same 16 MiB as the group
/// pool's [`POOL_BUFFERS_MAX`]).
pub const SCAN_POOL_BUFFERS_MAX: usize = 8;
/// Only chains larger than the budget divided by this are scanned (a smaller vDisk is
/// cached whole, however it is read).
pub const SCAN_CHAIN_BUDGET_DIVISOR: u64 = 4;
/// Idle group buffers kept for reuse at most (so at most this many × [`GROUP_BYTES`] of
/// mapped memory beyond the budget).
pub const POOL_BUFFERS_MAX: usize = 64;
/// Idle chains (no live wrapper) remembered before the least recently wrapped is dropped
/// with its entries.
pub const IDLE_CHAINS_MAX: usize = 1024;

/// Identifies one read-only vDisk version: the top file of its chain and that file's
/// linkage identity. Wrappers with equal keys share cache entries, so the key must change
/// whenever the chain's bytes can: the VHDX DataWriteGuid does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainKey {
    path: PathBuf,
    linkage: Option<Guid>,
}

impl ChainKey {
    /// A key from a top file's path and its linkage identity.
    pub fn new(path: impl Into<PathBuf>, linkage: Option<Guid>) -> ChainKey {
        ChainKey {
            path: path.into(),
            linkage,
        }
    }

    /// The key of an opened chain: `path` and the top device's `linkage_id()`.
    pub fn of_device(path: impl Into<PathBuf>, top: &dyn disk::BlockDevice) -> ChainKey {
        ChainKey::new(path, top.linkage_id())
    }

    /// The top file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The top file's linkage identity.
    pub fn linkage(&self) -> Option<Guid> {
        self.linkage
    }
}

/// Parameters of a [`BlockCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// RAM budget for cached blocks and their entries. 0 caches nothing (concurrent misses
    /// of one block are still read once).
    pub budget_bytes: u64,
    /// The granule: a power of two from [`BLOCK_BYTES_MIN`] to [`BLOCK_BYTES_MAX`].
    pub block_bytes: u32,
    /// Contiguous misses of one request are read from the store in one read of at most this
    /// many blocks (1 to [`RUN_BLOCKS_LIMIT`]).
    pub fill_blocks_max: u32,
    /// The largest read-ahead window in blocks (0 turns read-ahead off; at most
    /// [`RUN_BLOCKS_LIMIT`]).
    pub read_ahead_blocks_max: u32,
    /// Read-ahead worker threads (0 turns read-ahead off).
    pub read_ahead_threads: usize,
    /// Read-ahead jobs queued at most; a job that does not fit is dropped and counted.
    pub read_ahead_queue: usize,
    /// A miss in a block that holds other pages, none of them next to the missing ones
    /// (random reads within the block), reads the whole rest of the block, while such
    /// misses are at least [`COMPLETE_SCATTERED_PERCENT`] of the chain's recent misses.
    pub complete_blocks: bool,
    /// Bytes of the most recently scan-filled blocks kept cached whatever their CLOCK
    /// state; an older scan-filled block that no second read has touched is evicted, and
    /// its buffer reused by the scan (see the design notes). 0 turns scans off: a long
    /// stream is cached like any other read.
    pub scan_window_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            budget_bytes: 1 << 30,
            block_bytes: DEFAULT_BLOCK_BYTES,
            fill_blocks_max: 16,
            read_ahead_blocks_max: 16,
            read_ahead_threads: 2,
            read_ahead_queue: 64,
            complete_blocks: true,
            scan_window_bytes: 64 << 20,
        }
    }
}

impl CacheConfig {
    /// Checks every field against its limit.
    ///
    /// # Errors
    /// [`CacheError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<(), CacheError> {
        let bad = |what: String| Err(CacheError::InvalidConfig(what));
        if !self.block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&self.block_bytes)
        {
            return bad(format!(
                "block_bytes {} must be a power of two from {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX}",
                self.block_bytes
            ));
        }
        if !(1..=RUN_BLOCKS_LIMIT).contains(&self.fill_blocks_max) {
            return bad(format!(
                "fill_blocks_max {} must be 1 to {RUN_BLOCKS_LIMIT}",
                self.fill_blocks_max
            ));
        }
        if self.read_ahead_blocks_max > RUN_BLOCKS_LIMIT {
            return bad(format!(
                "read_ahead_blocks_max {} exceeds {RUN_BLOCKS_LIMIT}",
                self.read_ahead_blocks_max
            ));
        }
        if self.read_ahead_threads > READ_AHEAD_THREADS_LIMIT {
            return bad(format!(
                "read_ahead_threads {} exceeds {READ_AHEAD_THREADS_LIMIT}",
                self.read_ahead_threads
            ));
        }
        if !(1..=READ_AHEAD_QUEUE_LIMIT).contains(&self.read_ahead_queue) {
            return bad(format!(
                "read_ahead_queue {} must be 1 to {READ_AHEAD_QUEUE_LIMIT}",
                self.read_ahead_queue
            ));
        }
        Ok(())
    }

    fn read_ahead_enabled(&self) -> bool {
        self.read_ahead_blocks_max > 0 && self.read_ahead_threads > 0
    }
}

/// Errors of building a cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A configuration field is out of range.
    #[error("invalid block cache config: {0}")]
    InvalidConfig(String),
    /// A read-ahead worker thread could not be started.
    #[error("start read-ahead worker")]
    SpawnWorker(#[source] std::io::Error),
}

/// A quarter of `MemTotal` from the text of `/proc/meminfo`, the default budget.
pub fn quarter_of_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next() {
        Some("kB") => 1024,
        None => 1,
        Some(_) => return None,
    };
    n.checked_mul(unit).map(|b| b / 4)
}

/// The default budget: a quarter of this machine's RAM, or 1 GiB when `/proc/meminfo` cannot
/// be read.
pub fn default_budget_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| quarter_of_mem_total(&s))
        .unwrap_or(1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert!(CacheConfig::default().validate().is_ok());
    }

    #[test]
    fn block_bytes_not_power_of_two_is_rejected() {
        let c = CacheConfig {
            block_bytes: 96 << 10,
            ..CacheConfig::default()
        };
        assert!(matches!(c.validate(), Err(CacheError::InvalidConfig(_))));
    }

    #[test]
    fn meminfo_quarter_of_mem_total() {
        let text = "MemTotal:       16384 kB\nMemFree:         1024 kB\n";
        assert_eq!(quarter_of_mem_total(text), Some(4096 * 1024));
    }

    #[test]
    fn meminfo_without_mem_total_is_none() {
        assert_eq!(quarter_of_mem_total("MemFree: 1 kB\n"), None);
    }
}
