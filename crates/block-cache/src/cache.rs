//! The cache handle: [`BlockCache`] builds the shared state and starts the read-ahead
//! workers, wraps chains into [`CachedDevice`]s, forgets chains, and snapshots the
//! counters.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use disk::BlockDevice;

use crate::aligned::{BufPool, HUGE_PAGE_BYTES};
use crate::chain::ChainKey;
use crate::config::{
    CacheConfig, CacheError, GROUP_BYTES, GROUPS_PER_SHARD_MIN, PAGE_BYTES_MIN, POOL_BUFFERS_MAX,
    RUN_BLOCKS_LIMIT, SCAN_CHAIN_BUDGET_DIVISOR, SCAN_FILL_BYTES, SCAN_POOL_BUFFERS_MAX,
    SHARD_MIN_BLOCKS, SHARDS_MAX,
};
use crate::device::CachedDevice;
use crate::read::worker;
use crate::shard::Shard;
use crate::shared::{ChainHandle, Shared};
use crate::stats::BlockCacheStats;

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
            (SCAN_FILL_BYTES / block_bytes).clamp(1, u64::from(RUN_BLOCKS_LIMIT));
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
        Arc::new(CachedDevice::new(Arc::new(chain), geometry))
    }

    /// Forgets `key`: drops its entries now; wrappers made later get a fresh id. Use it when
    /// a chain's files are about to change. Returns the entries dropped.
    pub fn invalidate(&self, key: &ChainKey) -> u64 {
        let removed = self
            .shared
            .chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        removed.map_or(0, |id| self.purge(id))
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
            .len() as u64;
        BlockCacheStats {
            probes: c.probes.get(),
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
            warm_bytes: c.warm_bytes.get(),
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
