//! The state the cache handle, its wrappers and the read-ahead workers share ([`Shared`]),
//! one wrapped chain ([`ChainHandle`]), and the arithmetic of blocks, pages and shards
//! that every path uses.
//!
//! The read paths live in `read.rs` and the fills in `fill.rs`, both as further
//! `impl Shared` blocks; this module is below them and calls neither. It is also where an
//! entry is published ([`Shared::publish`]): every fill's entries pass through it.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, RwLock};

use disk::BlockDevice;

use crate::aligned::BufPool;
use crate::chain::{ChainKey, ChainTable, ReadAheadScore};
use crate::config::CacheConfig;
use crate::entry::Cached;
use crate::flight::{self, CacheShard, Claimed, Found};
use crate::shard::Key;
use crate::stats::Counters;

/// A read-ahead job: prefetch `blocks` of a chain.
#[derive(Debug)]
pub(crate) struct Job {
    /// The chain to prefetch from.
    pub(crate) chain: Arc<ChainHandle>,
    /// Its blocks to prefetch (those present are skipped).
    pub(crate) blocks: Range<u64>,
}

/// The groups filled by scans, oldest first, and their bytes: past the window, the oldest
/// that no second read touched are evicted. Invariant: `bytes` is the sum of the groups'
/// bytes and, between calls, at most the window.
#[derive(Debug, Default)]
pub(crate) struct ScanWindow {
    /// (a key of the group, the identity of its buffer, its bytes).
    pub(crate) groups: VecDeque<(Key, usize, u64)>,
    /// The groups' bytes.
    pub(crate) bytes: u64,
}

/// Everything the cache handle, wrappers and workers share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The configuration, validated.
    pub(crate) config: CacheConfig,
    /// The granule, in bytes.
    pub(crate) block_bytes: u64,
    /// The unit of a partial block: `block_bytes / 64`, at least
    /// [`PAGE_BYTES_MIN`](crate::config::PAGE_BYTES_MIN).
    pub(crate) page_bytes: u64,
    /// Blocks per group (1: groups off).
    pub(crate) group_blocks: u64,
    /// The shards, each under its own lock (see [`Shared::shard_of`]).
    pub(crate) shards: Box<[RwLock<CacheShard>]>,
    /// Counters, shared with every block buffer (which counts its resident bytes).
    pub(crate) counters: Arc<Counters>,
    /// The chains known, live or idle.
    pub(crate) chains: Mutex<ChainTable>,
    /// Read-ahead queue; `None` when read-ahead is off. Workers exit when it is dropped.
    pub(crate) read_ahead: Option<SyncSender<Job>>,
    /// Group buffers for reuse; `None` when groups are off.
    pub(crate) pool: Option<Arc<BufPool>>,
    /// Huge buffers of a scan's fills
    /// ([`SCAN_FILL_BYTES`](crate::config::SCAN_FILL_BYTES) rounded up to huge pages), for
    /// reuse; `None` when groups or scans are off.
    pub(crate) scan_pool: Option<Arc<BufPool>>,
    /// Bytes of scan-filled groups kept whatever CLOCK says (0: scans off).
    pub(crate) scan_window_bytes: u64,
    /// The most blocks one store read of a scan fills
    /// ([`SCAN_FILL_BYTES`](crate::config::SCAN_FILL_BYTES)).
    pub(crate) scan_fill_blocks: u64,
    /// The groups scans filled, within or past the window.
    pub(crate) scans: Mutex<ScanWindow>,
}

/// One wrapped chain: the inner device and its interned id.
#[derive(Debug)]
pub(crate) struct ChainHandle {
    /// The cache.
    pub(crate) shared: Arc<Shared>,
    /// The chain's interned id (never reused).
    pub(crate) id: u64,
    /// The chain's key.
    pub(crate) key: ChainKey,
    /// The chain itself (the store).
    pub(crate) inner: Arc<dyn BlockDevice>,
    /// The chain's size in bytes.
    pub(crate) size: u64,
    /// The chain's size in blocks (the last may be short).
    pub(crate) blocks: u64,
    /// Keeps the chain "live" in the table while any wrapper of it exists; the chain's
    /// read-ahead score.
    pub(crate) score: Arc<ReadAheadScore>,
    /// Long streams through this chain are scans: it is larger than a quarter of the
    /// budget (and scans are on).
    pub(crate) scanned: bool,
    /// The block this wrapper's scan has filled up to (0: none yet). Read-ahead queued
    /// before the stream became a scan can run after the scan went past it and its window
    /// let the blocks go; it skips the blocks below this instead of reading them again.
    pub(crate) scan_end: AtomicU64,
}

impl Shared {
    /// The shard of `key`.
    #[inline]
    pub(crate) fn shard_of(&self, key: Key) -> &RwLock<CacheShard> {
        // A group's blocks share a shard, so its entries can leave together.
        let h = (key.chain.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (key.block / self.group_blocks))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        &self.shards[(h >> 32) as usize % self.shards.len()]
    }

    /// Bytes of block `b` of `chain` (the last block may be short).
    #[inline]
    pub(crate) fn block_len(&self, chain: &ChainHandle, b: u64) -> u64 {
        self.block_bytes.min(chain.size - b * self.block_bytes)
    }

    /// The mask of every page of block `b` (the last block may have fewer).
    #[inline]
    pub(crate) fn block_mask(&self, chain: &ChainHandle, b: u64) -> u64 {
        pages_mask(0, self.block_len(chain, b).div_ceil(self.page_bytes))
    }

    /// The mask of the pages of block `b` that `[start, end)` touches.
    #[inline]
    pub(crate) fn need_mask(&self, b: u64, start: u64, end: u64) -> u64 {
        let base = b * self.block_bytes;
        let lo = start.max(base) - base;
        let hi = end.min(base + self.block_bytes) - base;
        pages_mask(lo / self.page_bytes, (hi - 1) / self.page_bytes + 1)
    }

    /// The mask of the pages of the block at `base` that `[lo, hi)` covers (`hi` may end
    /// mid-page at the end of the device).
    #[inline]
    pub(crate) fn piece_mask(&self, base: u64, lo: u64, hi: u64) -> u64 {
        pages_mask(
            (lo - base) / self.page_bytes,
            (hi - base).div_ceil(self.page_bytes),
        )
    }

    /// Looks `key` up, claiming it if it lacks pages of `need` (see `flight.rs`).
    #[inline]
    pub(crate) fn find_or_claim(&self, key: Key, need: u64) -> Found<'_> {
        flight::find_or_claim(self.shard_of(key), key, need)
    }

    /// Claims `key` unless it is loading or ready with every page of `need`.
    #[inline]
    pub(crate) fn claim(&self, key: Key, need: u64) -> Found<'_> {
        flight::claim(self.shard_of(key), key, need)
    }

    /// Publishes a fill's `entry` for its claim (`prefetched`: by read-ahead), counting
    /// what its room cost in evictions.
    pub(crate) fn publish(&self, claim: Claimed<'_>, entry: Cached, prefetched: bool) {
        debug_assert!(
            entry.well_formed(self.page_bytes),
            "{:?}: a published entry holds the pages it claims: {entry:?}",
            claim.key
        );
        let p = claim.publish(entry, prefetched);
        self.counters.evictions.add(p.evicted);
    }
}

/// Bits `lo..hi` set (pages `lo` to `hi - 1`), `hi <= 64`.
#[inline]
fn pages_mask(lo: u64, hi: u64) -> u64 {
    debug_assert!(lo < hi && hi <= 64);
    let upto = if hi >= 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upto & !((1u64 << lo) - 1)
}
