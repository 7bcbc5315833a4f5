//! One read cache per host, shared by every `ferry target` agent on it: the blocks of the
//! vDisk versions they boot, so N machines booting one version fetch each block from the
//! servers once per host, not N times.
//!
//! # What it is
//!
//! A file of fixed size (default `/dev/shm/ferry-host-cache-UID`, so RAM: tmpfs), mode
//! 0600, mapped shared by each agent. It holds fixed-size slots (64 KiB by default) in
//! sets of [`layout::WAYS`]; a block of a version may live in any slot of the set that its
//! [`VersionKey`] and block index hash to, and the least recently used slot of a set is
//! refilled. Its size is fixed when the first agent creates it (`--host-cache-size`), so
//! it is bounded in RAM; pages are touched only as slots fill.
//!
//! ```text
//!  agent A ─┐                         ┌─ header: magic, geometry, host counters
//!  agent B ─┼─ mmap(MAP_SHARED) ──►   ├─ slot headers: seq | key | block | len,pid | used
//!  agent C ─┘                         ├─ page CRC-32Cs
//!                                     └─ slot data
//! ```
//!
//! # Why a shared-memory file
//!
//! * **vs a host daemon:** nothing to install or supervise, no socket hop and no copy
//!   through another process per read, and no single process whose crash stops every
//!   machine on the host. Agents come and go; the file stays (tmpfs, until reboot or
//!   `rm`).
//! * **vs a cache file on disk:** the data is read-only copies of server bytes, useless
//!   after a host reboot (the versions are on the servers) and wanted at RAM speed during
//!   a boot storm; a disk file would add write-back I/O to the host's disks for nothing. A
//!   directory on disk still works (`--host-cache DIR`), with the page cache in front.
//! * **Crash safety without locks:** every slot is a seqlock with a CRC-32C per 4 KiB page
//!   (see `cache.rs`): an agent killed (SIGKILL) mid-fill leaves a slot odd, which the next
//!   agent takes over once the filler's pid is gone; an agent killed mid-read changes
//!   nothing. No lock exists that a dead process could hold.
//!
//! # What it holds
//!
//! Only read-only version data, keyed by [`VersionKey`]: a digest of the vDisk, version,
//! size and whatever else identifies the bytes (the farm's vDisk id). A device's own
//! writes stay in its own write cache, above this one; the server cache modes (whose
//! export carries the device's writes) never use it.
//!
//! # Security
//!
//! The file is created 0600 under a name with the user's uid, with `O_NOFOLLOW`, and an
//! existing file is refused unless it is a regular file owned by the same user and closed
//! to others ([`OpenError::ForeignOwner`], [`OpenError::OpenToOthers`]). Anyone who can
//! write the file could feed agents wrong bytes: that is the user running the agents (or
//! root). A file's bytes are never trusted for bounds: lengths are clamped, and the
//! geometry must be one this code could have made.

#![warn(missing_docs)]

mod cache;
mod file;
pub mod layout;
mod map;

pub use cache::{Claim, FILL_STALE, FILL_WAIT_MAX, Fill, HostCache, Lookup};
pub use file::file_name;
pub use layout::{BLOCK_BYTES_DEFAULT, Geometry, GeometryError};

/// The default directory of the host cache: tmpfs, so RAM.
pub const DEFAULT_DIR: &str = "/dev/shm";
/// The default budget of a host cache (the file's size).
pub const DEFAULT_BYTES: u64 = 2 << 30;

/// The identity of the bytes of one vDisk version: equal keys must mean equal bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionKey {
    lo: u64,
    hi: u64,
}

/// What identifies a version's bytes (see [`VersionKey::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionIdentity<'a> {
    /// The vDisk's name.
    pub vdisk: &'a str,
    /// The version number.
    pub version: u64,
    /// The virtual size in bytes.
    pub size_bytes: u64,
    /// Anything else that changes when the bytes do: the farm's vDisk id (a deleted and
    /// recreated vDisk of the same name gets a new one), a version's creation stamp or
    /// content digest. Empty when nothing more is known.
    pub extra: &'a [u8],
}

impl VersionKey {
    /// The key of `id`: 128 bits of BLAKE3 over its fields, each length-prefixed.
    pub fn new(id: &VersionIdentity<'_>) -> VersionKey {
        let mut h = blake3::Hasher::new();
        h.update(b"ferry host cache version key v1\0");
        for part in [id.vdisk.as_bytes(), id.extra] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(&id.version.to_le_bytes());
        h.update(&id.size_bytes.to_le_bytes());
        let d = h.finalize();
        let b = d.as_bytes();
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        // 0 marks an empty slot.
        VersionKey {
            lo: word(0) | 1,
            hi: word(8),
        }
    }

    /// The key as hex (for status and logs).
    pub fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.hi, self.lo)
    }
}

/// Counters of one agent's use of the cache, and of the host's (every agent's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Block reads answered from the cache by this process.
    pub hits: u64,
    /// Bytes of those.
    pub hit_bytes: u64,
    /// Block reads the cache did not hold.
    pub misses: u64,
    /// Reads that waited for another process's fill.
    pub waits: u64,
    /// Blocks this process filled from a server.
    pub fills: u64,
    /// Bytes of those.
    pub fill_bytes: u64,
    /// Slots found torn (a checksum mismatch) and refetched.
    pub torn: u64,
    /// Fills taken over from a process that died or stalled.
    pub stolen: u64,
    /// Hits of every agent on the host since the cache was created.
    pub host_hits: u64,
    /// Fills of every agent.
    pub host_fills: u64,
    /// Bytes of every agent's fills: what the host read from the servers through it.
    pub host_fill_bytes: u64,
    /// Waits of every agent.
    pub host_waits: u64,
}

/// Why the cache did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file is another user's.
    #[error("host cache {} belongs to uid {uid}, not to this user; refusing it", path.display())]
    ForeignOwner {
        /// The file.
        path: std::path::PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// Others may read or write the file.
    #[error("host cache {} has mode {mode:o}, open to other users; refusing it", path.display())]
    OpenToOthers {
        /// The file.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A symlink, directory or device where the file should be.
    #[error("host cache {} is not a regular file", .0.display())]
    NotRegular(std::path::PathBuf),
    /// Not a host cache of this layout.
    #[error("{} is not a Ferry host cache of layout {}", .0.display(), layout::LAYOUT_VERSION)]
    BadHeader(std::path::PathBuf),
    /// An invalid budget or block.
    #[error("invalid host cache size")]
    Geometry(#[from] GeometryError),
    /// The file could not be created, opened or mapped.
    #[error("host cache {}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
