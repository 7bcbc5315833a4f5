//! Legacy VHD structures (big-endian): footer, dynamic disk header, parent locators, BAT.
//!
//! This is the "Virtual PC" format (VHD specification v1.0, 2006), read through the same
//! pure-codec rules as the VHDX modules: every parser takes `&[u8]`, never does I/O, and never
//! panics on any input. The I/O layer (`disk::vhd`) reads the bytes and trusts what these
//! parsers return.
//!
//! # Layout
//!
//! ```text
//! fixed:        [ data (CurrentSize bytes) ][ footer 512 ]
//! dynamic and   [ footer copy 512 ][ dynamic header 1024 ][ locator data, BAT ... ]
//! differencing: [ block: bitmap (512) + data (BlockSize) ] ... [ footer 512 ]
//! ```
//!
//! * [`footer`]: the 512-byte footer ("conectix"), the disk type and the size rule.
//! * [`dynamic`]: the 1024-byte dynamic disk header ("cxsparse") and its parent locators.
//! * [`bat`]: BAT entries (sector offsets of blocks) and the MSB-first sector bitmaps.
//!
//! # Checksums
//!
//! Both headers carry a one's-complement checksum. The parsers do not fail on a mismatch:
//! they return it in a [`Parsed`] next to the value, because Ferry's policy for VHD is "lenient
//! read with a warning" (real files with bad checksums exist and other readers open them).
//! Encoders always write a correct checksum.

pub mod bat;
pub mod dynamic;
pub mod footer;

pub use bat::{Bat, BitmapRun};
pub use dynamic::{DynamicHeader, Locator, PlatformCode};
pub use footer::{Chs, DiskType, Footer, SizeRule, chs_for_size, size_rule, virtual_size};

/// Bytes in a VHD sector; the format has no other sector size.
pub const SECTOR_SIZE: u64 = 512;

/// A stored checksum next to the one computed over the bytes that were parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checksum {
    /// The value stored in the structure.
    pub stored: u32,
    /// The value computed over the structure with the checksum field taken as zero.
    pub computed: u32,
}

impl Checksum {
    /// True when the stored value matches the computed one.
    pub fn is_ok(&self) -> bool {
        self.stored == self.computed
    }
}

/// A parsed structure plus the verdict on its checksum (see the module docs on leniency).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<T> {
    /// The decoded structure.
    pub value: T,
    /// The stored and computed checksums.
    pub checksum: Checksum,
}

/// The VHD checksum: the one's complement of the byte sum of `buf`, with the four bytes at
/// `field` taken as zero (VHD spec, "Checksum").
///
/// A `field` past the end of `buf` simply excludes nothing.
pub fn checksum(buf: &[u8], field: usize) -> u32 {
    let sum = buf.iter().enumerate().fold(0u32, |acc, (i, &byte)| {
        if (field..field.saturating_add(4)).contains(&i) {
            acc
        } else {
            acc.wrapping_add(u32::from(byte))
        }
    });
    !sum
}

/// Reads a big-endian u32; the caller guarantees `off + 4 <= b.len()`.
pub(crate) fn be_u32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads a big-endian u64; the caller guarantees `off + 8 <= b.len()`.
pub(crate) fn be_u64(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(v)
}

/// Reads `N` bytes; the caller guarantees `off + N <= b.len()`.
pub(crate) fn bytes<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut v = [0u8; N];
    v.copy_from_slice(&b[off..off + N]);
    v
}

/// Writes a big-endian u32; the caller guarantees `off + 4 <= b.len()`.
pub(crate) fn put_be_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian u64; the caller guarantees `off + 8 <= b.len()`.
pub(crate) fn put_be_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_skips_its_field() {
        // Sum of the bytes outside the field is 1 + 2 = 3; the field's 0xFF bytes are ignored.
        let buf = [1u8, 0xff, 0xff, 0xff, 0xff, 2];
        assert_eq!(checksum(&buf, 1), !3u32);
    }

    #[test]
    fn checksum_field_past_end_is_harmless() {
        assert_eq!(checksum(&[1, 2], usize::MAX), !3u32);
    }
}
