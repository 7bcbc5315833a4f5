//! Finds and reads a vDisk version's kernel and initramfs in the version's own filesystem,
//! read through the image chain, so a version with a kernel update boots its own kernel.
//!
//! ```text
//!   find(dev) ──► volume::volumes ──► partition (pure: MBR, GPT)    whole disk | partitions
//!       │                                                            (at most VOLUMES_MAX)
//!       └──► volume::open_ext (ext4-view over BlockDevice, reads kept inside the volume)
//!               └──► root fs? (/etc + /sbin or /usr)   kernel: /vmlinuz, /boot/vmlinuz links,
//!                    cmdline (names: pure)             else the highest vmlinuz-VERSION in
//!                                                      /boot (root) or / (a /boot partition)
//! ```
//!
//! **ext2/3/4 is read with the [`ext4_view`] crate** (crates.io `ext4-view`, MIT/Apache-2.0):
//! a read-only, `no_std`-capable reader written defensively for untrusted images (checked
//! arithmetic, bounded caches, symlink-loop and path-length limits, metadata checksums
//! verified). It takes its bytes through a small `Ext4Read` trait, which this crate
//! implements over [`disk::BlockDevice`] at a partition's offset. The partition tables are
//! parsed here by a pure codec ([`partition`]), fuzzed like Ferry's other parsers.
//!
//! Every input is bounded: [`partition::GPT_ENTRIES_MAX`], [`volume::VOLUMES_MAX`],
//! [`find::DIR_ENTRIES_MAX`], [`find::CONFIG_BYTES_MAX`] and [`BOOT_FILE_BYTES_MAX`]; a
//! crafted table or filesystem gives an error, never a panic.

#![warn(missing_docs)]

pub mod find;
pub mod names;
pub mod partition;
pub mod volume;

pub use find::{BootFile, BootFiles, RootFs, find, read};
pub use volume::TableKind;

/// The largest kernel or initramfs [`read`] is meant to be given as `max_bytes`.
pub const BOOT_FILE_BYTES_MAX: u64 = 512 << 20;

/// Why the boot files could not be found or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootFilesError {
    /// Reading the disk failed.
    #[error("read the disk")]
    Disk(#[from] disk::Error),
    /// A file is larger than the caller allows.
    #[error("{path} on the {volume} is {size} bytes, more than the {max} allowed")]
    FileTooLarge {
        /// Its volume.
        volume: String,
        /// Its path.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// `ext4-view` refused a filesystem or a file in it.
    #[error("ext filesystem on the {volume}")]
    Fs {
        /// "partition N" or "whole disk".
        volume: String,
        /// What `ext4-view` said.
        #[source]
        source: ext4_view::Ext4Error,
    },
    /// The GPT is broken.
    #[error("gpt partition table")]
    Gpt(#[from] partition::GptError),
    /// The MBR is broken.
    #[error("mbr partition table")]
    Mbr(#[from] partition::MbrError),
    /// No filesystem holds a kernel.
    #[error("no kernel found: partitions tried: {}", tried.join("; "))]
    NoKernel {
        /// Each volume looked at and why it gave no kernel.
        tried: Vec<String>,
    },
    /// A boot file names a partition the disk does not have (or no ext filesystem on it).
    #[error("the disk has no {volume} with an ext filesystem")]
    NoVolume {
        /// "partition N" or "whole disk".
        volume: String,
    },
    /// A boot file's path is not a regular file.
    #[error("{path} on the {volume} is not a regular file")]
    NotAFile {
        /// Its volume.
        volume: String,
        /// Its path.
        path: String,
    },
    /// A boot file's path leads out of `/boot` (its symlinks resolved inside the
    /// filesystem): not served.
    #[error("{path} on the {volume} leads out of /boot: not served")]
    OutsideBoot {
        /// Its volume.
        volume: String,
        /// The path asked for.
        path: String,
    },
    /// A file changed size while it was read.
    #[error("{path} on the {volume} gave {got} bytes, its inode says {size}")]
    ShortRead {
        /// Its volume.
        volume: String,
        /// Its path.
        path: String,
        /// The size in the inode.
        size: u64,
        /// Bytes read.
        got: u64,
    },
}
