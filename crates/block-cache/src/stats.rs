//! Counters of the cache, and the snapshot the metrics endpoint renders.

use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonic or gauge counter; relaxed ordering (counters order nothing).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sub(&self, n: u64) {
        let before = self.0.fetch_sub(n, Ordering::Relaxed);
        // Only gauges go down, by what they went up by earlier (a buffer's bytes when it
        // is dropped, added when it was made): never below zero.
        debug_assert!(before >= n, "gauge below zero: {before} - {n}");
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters, shared by the cache, its wrappers, workers and block buffers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub probes: Counter,
    pub hits: Counter,
    pub misses: Counter,
    pub inflight_waits: Counter,
    pub store_reads: Counter,
    pub store_read_bytes: Counter,
    pub evictions: Counter,
    pub read_ahead_jobs: Counter,
    pub read_ahead_dropped: Counter,
    pub read_ahead_blocks: Counter,
    pub read_ahead_errors: Counter,
    pub read_ahead_refused: Counter,
    pub read_ahead_used: Counter,
    pub completions: Counter,
    pub scan_evictions: Counter,
    pub buffers_reused: Counter,
    pub scan_copies: Counter,
    pub warm_bytes: Counter,
    /// Bytes of block buffers alive (cached, in flight, or being copied out).
    pub resident_bytes: Counter,
    /// The high-water mark of `resident_bytes`.
    pub resident_bytes_max: Counter,
}

impl Counters {
    pub fn resident_add(&self, n: u64) {
        let now = self.resident_bytes.0.fetch_add(n, Ordering::Relaxed) + n;
        self.resident_bytes_max.0.fetch_max(now, Ordering::Relaxed);
    }
}

/// A snapshot of the cache's counters. Hits, misses and waits count blocks, not requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCacheStats {
    /// Reads looked up without waiting or filling (`try_read_shared`, `try_read_at`), hit
    /// or not: a server probes once per request it may serve from memory, so a cold read
    /// that then fills through `read_shared` counts one probe and one miss.
    pub probes: u64,
    /// Block lookups served from a ready entry.
    pub hits: u64,
    /// Blocks a reader had to fill from the store itself.
    pub misses: u64,
    /// Block lookups that waited for another reader's (or read-ahead's) fill.
    pub inflight_waits: u64,
    /// Reads issued to the store (one per coalesced run of blocks).
    pub store_reads: u64,
    /// Bytes read from the store.
    pub store_read_bytes: u64,
    /// Entries evicted to stay within the budget.
    pub evictions: u64,
    /// Read-ahead jobs queued.
    pub read_ahead_jobs: u64,
    /// Read-ahead jobs dropped because the queue was full.
    pub read_ahead_dropped: u64,
    /// Blocks filled by read-ahead.
    pub read_ahead_blocks: u64,
    /// Read-ahead fills that failed (the demand read retries and reports).
    pub read_ahead_errors: u64,
    /// Read-ahead jobs not issued because the chain's read-ahead was not paying off.
    pub read_ahead_refused: u64,
    /// Prefetched blocks that a demand read later used.
    pub read_ahead_used: u64,
    /// Misses that read the rest of a block already partly held, because the block was being
    /// read at scattered places (see `CacheConfig::complete_blocks`).
    pub completions: u64,
    /// Entries evicted because a scan went on past them and no second read touched them
    /// (also counted in `evictions`).
    pub scan_evictions: u64,
    /// Group fills that reused a pooled buffer instead of mapping new memory.
    pub buffers_reused: u64,
    /// Groups a scan filled that were read again before its window passed them, and so were
    /// copied out of the scan's shared buffer into one of their own to stay cached.
    pub scan_copies: u64,
    /// Bytes read from the store by warms (a boot set read ahead of a boot).
    pub warm_bytes: u64,
    /// Bytes charged to the budget now (data plus per-entry overhead).
    pub cached_bytes: u64,
    /// Entries cached now.
    pub cached_blocks: u64,
    /// Bytes of block buffers alive now, cached or not.
    pub resident_bytes: u64,
    /// The most `resident_bytes` has been.
    pub resident_bytes_max: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// The granule.
    pub block_bytes: u64,
    /// Chains the cache knows (live or idle).
    pub chains: u64,
}
