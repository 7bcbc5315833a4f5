//! The cache's parameters: block size limits, [`Mode`], [`Config`] and [`ConfigError`].
//! Pure data; `WriteCache::new` validates a `Config` against these.

use crate::index::SLOTS_MAX;

/// The default cache block in bytes.
pub const DEFAULT_BLOCK_BYTES: u32 = 4096;
/// The smallest cache block in bytes (one sector).
pub const BLOCK_BYTES_MIN: u32 = 512;
/// The largest cache block in bytes.
pub const BLOCK_BYTES_MAX: u32 = 1 << 20;

/// Where writes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// RAM only, a fixed budget.
    Ram,
    /// RAM, least recently used blocks moved to the overflow store when full.
    RamOverflow,
    /// The overflow store only.
    Disk,
}

/// Configuration of a write cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Mode.
    pub mode: Mode,
    /// Cache block in bytes: a power of two in `BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX`.
    pub block_bytes: u32,
    /// RAM budget in bytes (ignored in `Disk` mode). Rounded down to whole blocks.
    pub ram_bytes_max: u64,
    /// Overflow budget in bytes (`RamOverflow`, `Disk`); the filesystem may fill first.
    pub overflow_bytes_max: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Ram,
            block_bytes: DEFAULT_BLOCK_BYTES,
            ram_bytes_max: 1 << 30,
            overflow_bytes_max: 1 << 40,
        }
    }
}

/// Why a write cache could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The block size is not a power of two in range.
    #[error(
        "cache block of {bytes} bytes is not a power of two in {BLOCK_BYTES_MIN}..={BLOCK_BYTES_MAX}"
    )]
    InvalidBlockSize {
        /// The value given.
        bytes: u32,
    },
    /// The mode needs an overflow store and none was given.
    #[error("mode {mode:?} needs an overflow store")]
    MissingStore {
        /// The mode.
        mode: Mode,
    },
    /// A budget needs more slots than an entry can address.
    #[error("{what} budget of {bytes} bytes is over {SLOTS_MAX} blocks")]
    TooManySlots {
        /// "RAM" or "overflow".
        what: &'static str,
        /// The budget.
        bytes: u64,
    },
}
