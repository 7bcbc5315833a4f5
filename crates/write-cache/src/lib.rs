//! Ferry's target write caches: the machine's own writes, kept apart from the golden image.
//!
//! A [`WriteCache`] is a [`disk::BlockDevice`] decorator over `next` (the vDisk as streamed
//! from the server, read-only). Writes land in the cache; reads come from the cache where it
//! holds the block and from `next` elsewhere. Three modes (DESIGN.md, "Write-cache modes"):
//!
//! ```text
//!   Mode::Ram          RAM tier only; full → ENOSPC (LimitExceeded), counted and logged
//!   Mode::RamOverflow  RAM tier; full → CLOCK victim written to the overflow store, freed
//!                      reads: RAM → overflow → next; overflow full → ENOSPC
//!   Mode::Disk         overflow store only, written in place; flush = fdatasync
//! ```
//!
//! What it is not: persistent. A cache starts empty, and the overflow file is unlinked
//! from the start, so a restart (a new `WriteCache`) reads the golden image again.
//!
//! # Layout
//!
//! ```text
//! cache.rs   WriteCache: the read, write, trim and eviction paths
//! index.rs   block → Entry{Ram(slot) | Disk(slot) | Zero, generation}, lock-free table
//! arena.rs   RAM slots (RwLock + owner each), chunked growth, free list
//! policy.rs  CLOCK eviction (pure)
//! store.rs   OverflowStore trait: FileStore (unlinked file), MemStore (tests)
//! ```
//!
//! # Granularity
//!
//! The cache block is [`DEFAULT_BLOCK_BYTES`] (4 KiB), configurable from 512 B to 1 MiB.
//! 4 KiB is the guest's page and filesystem block, so the VDI workload's 4 KiB writes are
//! whole blocks: no read-modify-write against the server and no amplification in RAM or in
//! the overflow file. docs/target.md gives the measurement.

#![warn(missing_docs)]

mod arena;
mod cache;
mod copy;
mod index;
pub mod policy;
pub mod store;

pub use cache::{Usage, WriteCache};
pub use index::SLOTS_MAX;
pub use store::{FileStore, MemStore, OverflowStore};

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
