//! Boot sets: what a boot of one vDisk version reads, in the order it reads it.
//!
//! A [`BootSet`] is the [`Identity`] of the version it was recorded on, how many boots it
//! was merged from, and an ordered list of [`Extent`]s (offset, length, first-read time in
//! ms since the boot's first read). The server records the first boots of a version
//! ([`Recorder`]), merges them ([`merge`]), keeps the result beside the version (or in the
//! farm), and reads it into its block cache ahead of the next boot.
//!
//! What it is not: an I/O layer. This crate has no file, socket, clock or thread: the caller
//! passes every read with its time, and stores the bytes [`BootSet::encode`] returns.
//!
//! # Design notes
//!
//! * **Pages.** A set is kept at [`PAGE_BYTES`] granularity (the server cache's page): a
//!   read marks the pages it touches, and a page read again keeps its first time. Extents
//!   are page-aligned (the last one may end at the version's virtual size), never overlap,
//!   and are ordered by first-read time, then offset. Pages that are next to each other on
//!   the disk *and* in that order are one extent, so a prefetcher issues one large read for
//!   a contiguous run.
//! * **Merging.** A page's time in a merged set is the (lower, weighted by each input's boot
//!   count) median of its times in the inputs that hold it; the merged set is the union of
//!   their pages. A page read by one boot only is kept: a boot set that misses a page costs
//!   a demand read; one page too many costs one page of store read.
//! * **Identity.** The vDisk name, version number, virtual size and a 16-byte *stamp* that
//!   changes whenever the version's bytes can (the VHDX DataWriteGuid, or for other formats
//!   a digest of the file's device, inode, length and mtime). A set whose identity differs
//!   from the opened version's is never applied: a set recorded for version N is not read
//!   for N+1, nor for an N deleted and recreated.
//! * **Strict codec.** Every count is bounded by a named limit before anything is
//!   allocated, the checksum covers every byte before it, and a decoded set satisfies every
//!   invariant above, so the I/O layer trusts a decoded value.
//!
//! # Layout
//!
//! ```text
//! lib.rs     these notes; the public surface
//! set.rs     Identity, Extent, BootSet, Recorder, merge, OffsetIndex
//! codec.rs   encode/decode, the byte layout, DecodeError
//! ```

#![warn(missing_docs, clippy::cast_possible_truncation)]

mod codec;
mod set;

pub use codec::{DecodeError, FORMAT_VERSION, HEADER_BYTES, MAGIC, encoded_len};
pub use set::{
    BOOTS_MAX, BootSet, EXTENT_BYTES_MAX, EXTENTS_MAX, Extent, Identity, MergeError,
    NAME_BYTES_MAX, OffsetIndex, PAGE_BYTES, RECORD_PAGES_MAX, Recorder, SET_BYTES_MAX, merge,
};
