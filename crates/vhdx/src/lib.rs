//! Pure codecs for the VHDX format (MS-VHDX v1.00) and the legacy VHD format.
//!
//! This crate does no I/O: every parser takes `&[u8]` and every encoder writes into a
//! caller-owned buffer. The I/O layer (`disk`) reads the bytes, calls these codecs, and trusts
//! what they return, so each parser validates fully: signatures, checksums, reserved fields,
//! overlaps, counts and `offset + len` overflow.
//!
//! # Layout
//!
//! ```text
//! ident     file type identifier ("vhdxfile" + creator)      at 0
//! header    the two headers (4 KiB each)                      at 64 KiB, 128 KiB
//! region    the two region tables (64 KiB each)               at 192 KiB, 256 KiB
//! metadata  metadata table + known items                      in the metadata region
//! parent    parent locator (differencing disks)               a metadata item
//! bat       BAT entries, payload/sector-bitmap interleave     in the BAT region
//! bitmap    sector bitmaps (LSB-first)                        1 MiB sector bitmap blocks
//! log       log entries, descriptors, replay sequence search  in the log region
//! vhd       legacy VHD footer, dynamic header, locators       (big-endian)
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bat;
pub mod bitmap;
pub mod crc;
pub mod guid;
pub mod header;
pub mod ident;
pub mod log;
pub mod metadata;
pub mod parent;
pub mod region;
pub mod vhd;

pub use guid::Guid;

/// 1 MiB, the VHDX allocation granule (regions, log, blocks are 1 MiB aligned).
pub const MIB: u64 = 1 << 20;
/// 64 KiB, the size of the file identifier, header and region table slots.
pub const KIB64: u64 = 64 << 10;
/// Offset of the first header slot (MS-VHDX 2.2.2).
pub const HEADER1_OFFSET: u64 = KIB64;
/// Offset of the second header slot.
pub const HEADER2_OFFSET: u64 = 2 * KIB64;
/// Offset of the first region table (MS-VHDX 2.2.3).
pub const REGION1_OFFSET: u64 = 3 * KIB64;
/// Offset of the second region table.
pub const REGION2_OFFSET: u64 = 4 * KIB64;
/// Largest virtual disk size the spec allows: 64 TiB (MS-VHDX 2.6.2.2).
pub const MAX_VIRTUAL_SIZE: u64 = 64 << 40;
/// Smallest payload block size (MS-VHDX 2.6.2.1).
pub const MIN_BLOCK_SIZE: u32 = 1 << 20;
/// Largest payload block size.
pub const MAX_BLOCK_SIZE: u32 = 256 << 20;

pub(crate) fn le_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4-byte slice"))
}
pub(crate) fn le_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8-byte slice"))
}
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
