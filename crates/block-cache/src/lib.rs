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
//!   1.00× (measured 2026-11-22). The block stays the unit of lookup, eviction and entry overhead (0.2% at
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
//!   store bytes stay at 1.02× its unique bytes (`sim-boot`, 1 and 100 clients; 2026-11-22).
//! * **Held in RAM once.** Block buffers are aligned to [`disk::DIRECT_ALIGN`], and the
//!   server turns on the store's direct reads (`Chain::direct_reads_all`, `O_DIRECT`), so
//!   an aligned fill goes from the disk into the cache's buffer without passing through (and
//!   staying in) the host's page cache: no second copy of the vDisk in RAM and no
//!   page-cache copy per fill (a sequential `nbdcopy` of a cold 2 GiB export: about 15% less
//!   server CPU, measured with `perf`). Unaligned pieces (a differencing layer's 512-byte
//!   sectors) and file systems without `O_DIRECT` read buffered.
//! * **Groups: one read, one buffer, one departure.** A fill of whole new blocks (a
//!   sequential copy, read-ahead) reads the whole run with one vectored store read
//!   (`FastPath::read_vectored_at`, one `preadv`) into a buffer per [`GROUP_BYTES`]-aligned
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
//!   pages (same machine, 2026-11-25; `aligned.rs`). Its groups still go into the cache,
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
//! * **Checked in debug builds.** The state machines carry paired `debug_assert!`s (free in
//!   release builds; the tests run with them on): a claimant publishes or abandons only a
//!   key pending on its own flight, and the key is no longer pending when its waiters wake;
//!   a flight ends once; a published entry's buffer spans exactly its valid pages, and every
//!   copy or shared piece read out of it stays inside them; a run is consecutive claimed
//!   blocks, every claim of a group or scan fill is published, and a group's entries are
//!   its blocks; a group leaves its shard whole, and a rehomed group reads as before; the
//!   scan window's bytes are its groups' and within the window; eviction releases exactly
//!   the charge it reports and a reused ring slot is empty; resident bytes never go below
//!   zero. A shard checks all its invariants at once when it drops a chain.
//!
//! # Layout
//!
//! ```text
//! lib.rs     these notes; the public surface (re-exports)
//! cache.rs   BlockCache: builds the shared state, starts the read-ahead workers, wraps
//!            chains, forgets them (invalidate, idle purge), snapshots the counters
//! device.rs  CachedDevice, the BlockDevice decorator: bounds, stream detection, read-ahead
//!            jobs, then a read through the cache; everything else is the inner device's
//! read.rs    demand reads (the hit path, waits, misses), prefetch, the read-ahead worker
//! fill.rs    store reads into a claimed run: per block, per group, a scan's huge buffer;
//!            merging refills; the scan window (retire or rehome a scan's old groups)
//! shared.rs  Shared (what every path shares), ChainHandle (one wrapped chain), the block,
//!            page and shard arithmetic, and Shared::publish, which every entry goes through
//! flight.rs  single-flight: claim a block, wait on a Flight, publish or abandon, then wake
//! entry.rs   Cached (a block's entry: Data and valid pages), Block (a counted buffer)
//! chain.rs   ChainKey, the table interning keys to ids, a chain's read-ahead score
//! shard.rs   one shard: key map, CLOCK ring, groups (pure, generic over data and token)
//! stream.rs  a connection's sequential-stream detector (pure)
//! aligned.rs direct-I/O aligned buffers (heap, mapped, huge pages) and buffer pools
//! stats.rs   live counters and the BlockCacheStats snapshot
//! config.rs  the limits (constants), CacheConfig and its validation, CacheError
//! warm.rs    warms: a known range (a boot set) read in ahead of its readers
//! ```
//!
//! Files depend only downward, with no cycle ("uses" includes calling methods another file
//! adds to `Shared`):
//!
//! ```text
//! cache  ──► device ──► warm, read ──► fill ──► shared ──► flight ──► entry
//! cache  ──► read, shared, chain, shard, aligned, stats, config
//! device ──► shared, chain, stream, config
//! read   ──► flight, entry, chain, shard
//! warm   ──► fill, flight, shard, shared
//! fill   ──► flight, entry, shard, aligned
//! shared ──► entry, chain, shard, stats, aligned, config
//! flight ──► shard
//! entry  ──► shard, stats, aligned, config
//! chain  ──► config
//! shard, stream, aligned, stats, config: no file of the crate
//! ```

#![warn(missing_docs)]

mod aligned;
mod cache;
mod chain;
mod config;
mod device;
mod entry;
mod fill;
mod flight;
mod read;
mod shard;
mod shared;
mod stats;
mod stream;
mod warm;

pub use cache::BlockCache;
pub use chain::ChainKey;
pub use config::{
    BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, COMPLETE_SCATTERED_PERCENT, COMPLETE_WINDOW_MISSES,
    CacheConfig, CacheError, DEFAULT_BLOCK_BYTES, ENTRY_OVERHEAD_BYTES, GROUP_BYTES,
    GROUPS_PER_SHARD_MIN, IDLE_CHAINS_MAX, PAGE_BYTES_MIN, POOL_BUFFERS_MAX,
    READ_AHEAD_ACCURACY_PERCENT, READ_AHEAD_QUEUE_LIMIT, READ_AHEAD_THREADS_LIMIT,
    READ_AHEAD_WARMUP_BLOCKS, RUN_BLOCKS_LIMIT, SCAN_AFTER_BYTES, SCAN_CHAIN_BUDGET_DIVISOR,
    SCAN_FILL_BYTES, SCAN_POOL_BUFFERS_MAX, SHARD_MIN_BLOCKS, SHARDS_MAX, default_budget_bytes,
    quarter_of_mem_total,
};
pub use device::CachedDevice;
pub use stats::BlockCacheStats;
