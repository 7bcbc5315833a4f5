//! The cache's limits and parameters: every bound is a named constant here or a field of
//! [`CacheConfig`], checked by [`CacheConfig::validate`] (STYLE.md §1.3), plus the default
//! budget read from `/proc/meminfo`.
//!
//! Pure apart from [`default_budget_bytes`]'s one file read; it uses no other module of the
//! crate.

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

/// Parameters of a [`BlockCache`](crate::BlockCache).
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

    /// True when read-ahead has both a window and workers.
    pub(crate) fn read_ahead_enabled(&self) -> bool {
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
