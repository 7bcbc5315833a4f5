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
//! lib.rs        these notes; the public surface (re-exports)
//! device.rs     impl BlockDevice for WriteCache: the decorator over the paths below
//! write.rs      writes in place, inserts (RAM or Disk mode, read-modify-write), trim, zeroes
//! read.rs       which blocks a range holds; reads from RAM, zeros or overflow (and try_)
//! evict.rs      RAM slots for inserts: free ones, or CLOCK victims moved to overflow
//! overflow.rs   overflow I/O, slot stripes, ENOSPC vs poison on a failed write
//! cache.rs      WriteCache's state, new, usage, bounds and poison, block arithmetic;
//!               the design notes (invariants) of all the paths
//! config.rs     Mode, Config, ConfigError, block size limits
//! index.rs      block → Entry{Ram(slot) | Disk(slot) | Zero, generation}, lock-free table
//! arena.rs      RAM slots (RwLock + owner each), chunked growth, free list
//! disk_slots.rs overflow slots: growth up to the budget, free list
//! policy.rs     CLOCK eviction (pure)
//! store.rs      OverflowStore trait: FileStore (unlinked file), MemStore (tests)
//! copy.rs       streaming copies into RAM slots
//! tests.rs      unit tests of the decorator
//! ```
//!
//! Files depend only downward, with no cycle ("uses" includes calling methods another file
//! adds to `WriteCache`):
//!
//! ```text
//! device ──► write ──► evict ──► overflow ──► cache ──► config ──► index
//!   └──────► read ─────────────────┘
//! device   ──► cache, overflow, config, index
//! write    ──► overflow, cache, arena, copy, config, index
//! read     ──► cache, index
//! evict    ──► cache, arena, config, index
//! overflow ──► index, store
//! cache    ──► arena, disk_slots, index, policy, store
//! index, arena, disk_slots, policy, store, copy: no file of the crate
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
mod config;
mod copy;
mod device;
mod disk_slots;
mod evict;
mod index;
mod overflow;
pub mod policy;
mod read;
pub mod store;
#[cfg(test)]
mod tests;
mod write;

pub use cache::{Usage, WriteCache};
pub use config::{
    BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, Config, ConfigError, DEFAULT_BLOCK_BYTES, Mode,
};
pub use index::SLOTS_MAX;
pub use store::{FileStore, MemStore, OverflowStore};
