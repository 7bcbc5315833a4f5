//! The metadata region (MS-VHDX 2.6): its table and the system items.

use crate::guid::g;
use crate::{Guid, MAX_BLOCK_SIZE, MAX_VIRTUAL_SIZE, MIN_BLOCK_SIZE, le_u16, le_u32, le_u64};
use crate::{put_u16, put_u32, put_u64};

/// `"metadata"` as a little-endian u64.
pub const METADATA_SIGNATURE: u64 = 0x6174_6164_6174_656D;
/// The table occupies the first 64 KiB of the region.
pub const TABLE_LEN: usize = 64 * 1024;
/// The spec's cap on entries.
pub const MAX_ENTRIES: u16 = 2047;
/// The spec's cap on one item's length.
pub const MAX_ITEM_LEN: u32 = 1 << 20;

/// File Parameters item.
pub const FILE_PARAMETERS: Guid = g("CAA16737-FA36-4D43-B3B6-33F0AA44E76B");
/// Virtual Disk Size item.
pub const VIRTUAL_DISK_SIZE: Guid = g("2FA54224-CD1B-4876-B211-5DBED83BF4B8");
/// Virtual Disk ID (Page 83 data) item.
pub const PAGE83: Guid = g("BECA12AB-B2E6-4523-93EF-C309E000C746");
/// Logical Sector Size item.
pub const LOGICAL_SECTOR_SIZE: Guid = g("8141BF1D-A96F-4709-BA47-F233A8FAAB5F");
/// Physical Sector Size item.
pub const PHYSICAL_SECTOR_SIZE: Guid = g("CDA348C7-445D-4471-9CC9-E9885251C556");
/// Parent Locator item.
pub const PARENT_LOCATOR: Guid = g("A8D35F2D-B30B-454D-ABF7-D3D84834AB0C");

const FLAG_IS_VIRTUAL_DISK: u32 = 2;
const FLAG_IS_REQUIRED: u32 = 4;

/// Errors decoding the metadata region.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// BlockSize not a power of two in 1..=256 MiB.
    #[error("invalid block size {0} (must be a power of two from 1 MiB to 256 MiB)")]
    BadBlockSize(u32),
    /// Sector size not 512 or 4096.
    #[error("invalid {which} sector size {value} (must be 512 or 4096)")]
    BadSectorSize {
        /// "logical" or "physical".
        which: &'static str,
        /// The value.
        value: u32,
    },
    /// Virtual size zero, above 64 TiB or not a multiple of the logical sector size.
    #[error("invalid virtual disk size {0}")]
    BadVirtualSize(u64),
    /// The same item appears twice.
    #[error("metadata item {0} listed twice")]
    DuplicateItem(Guid),
    /// Too many entries.
    #[error("metadata entry count {0} exceeds {MAX_ENTRIES}")]
    EntryCountTooLarge(u16),
    /// Not "metadata".
    #[error("bad metadata table signature {0:#018x}")]
    InvalidSignature(u64),
    /// An item lies outside the region, inside the table, overlaps another, or is too long.
    #[error("metadata item {guid} at {offset:#x} length {length} is misplaced")]
    ItemMisplaced {
        /// Item GUID.
        guid: Guid,
        /// Offset in the region.
        offset: u32,
        /// Length.
        length: u32,
    },
    /// A required system item is absent.
    #[error("required metadata item {0} missing")]
    MissingItem(&'static str),
    /// An item is shorter than its content.
    #[error("metadata item {0} too short")]
    ShortItem(&'static str),
    /// Fewer bytes than the table.
    #[error("metadata region truncated: {0} bytes")]
    Truncated(usize),
    /// An unknown item has IsRequired.
    #[error("unknown required metadata item {0}")]
    UnknownRequiredItem(Guid),
}

/// The decoded system metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Payload block size in bytes.
    pub block_size: u32,
    /// LeaveBlocksAllocated (a fixed disk).
    pub leave_blocks_allocated: bool,
    /// HasParent (a differencing disk).
    pub has_parent: bool,
    /// Virtual disk size in bytes.
    pub virtual_size: u64,
    /// Page 83 identifier.
    pub page83: Guid,
    /// Logical sector size.
    pub logical_sector_size: u32,
    /// Physical sector size.
    pub physical_sector_size: u32,
    /// The raw parent locator item, present on differencing disks.
    pub parent_locator: Option<Vec<u8>>,
}

impl Metadata {
    /// Parses the metadata region (`b` is the region's bytes, at least the 64 KiB table plus
    /// whatever the items reference).
    ///
    /// # Errors
    /// Table signature and count, item placement and overlap, unknown required items, and
    /// the values of every known item.
    pub fn parse(b: &[u8]) -> Result<Metadata, Error> {
        if b.len() < TABLE_LEN {
            return Err(Error::Truncated(b.len()));
        }
        let sig = le_u64(b, 0);
        if sig != METADATA_SIGNATURE {
            return Err(Error::InvalidSignature(sig));
        }
        let count = le_u16(b, 10);
        if count > MAX_ENTRIES {
            return Err(Error::EntryCountTooLarge(count));
        }
        let mut items: Vec<(Guid, u32, u32)> = Vec::new();
        for i in 0..usize::from(count) {
            let e = 32 + 32 * i;
            let guid = Guid::read(b, e);
            let (offset, length, flags) = (le_u32(b, e + 16), le_u32(b, e + 20), le_u32(b, e + 24));
            let end = u64::from(offset) + u64::from(length);
            let misplaced = Error::ItemMisplaced {
                guid,
                offset,
                length,
            };
            if length != 0 && ((offset as usize) < TABLE_LEN || end > b.len() as u64) {
                return Err(misplaced);
            }
            if length > MAX_ITEM_LEN {
                return Err(misplaced);
            }
            for &(og, oo, ol) in &items {
                if og == guid {
                    return Err(Error::DuplicateItem(guid));
                }
                let oend = u64::from(oo) + u64::from(ol);
                if length != 0 && ol != 0 && u64::from(offset) < oend && u64::from(oo) < end {
                    return Err(misplaced);
                }
            }
            let known = [
                FILE_PARAMETERS,
                VIRTUAL_DISK_SIZE,
                PAGE83,
                LOGICAL_SECTOR_SIZE,
                PHYSICAL_SECTOR_SIZE,
                PARENT_LOCATOR,
            ];
            if flags & FLAG_IS_REQUIRED != 0 && !known.contains(&guid) {
                return Err(Error::UnknownRequiredItem(guid));
            }
            items.push((guid, offset, length));
        }
        let item = |guid: Guid, name: &'static str, min: u32| -> Result<&[u8], Error> {
            let &(_, off, len) = items
                .iter()
                .find(|(g, _, _)| *g == guid)
                .ok_or(Error::MissingItem(name))?;
            if len < min {
                return Err(Error::ShortItem(name));
            }
            Ok(&b[off as usize..(off + len) as usize])
        };
        let fp = item(FILE_PARAMETERS, "file parameters", 8)?;
        let block_size = le_u32(fp, 0);
        let flags = le_u32(fp, 4);
        if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
        {
            return Err(Error::BadBlockSize(block_size));
        }
        let logical_sector_size = le_u32(item(LOGICAL_SECTOR_SIZE, "logical sector size", 4)?, 0);
        let physical_sector_size =
            le_u32(item(PHYSICAL_SECTOR_SIZE, "physical sector size", 4)?, 0);
        for (which, value) in [
            ("logical", logical_sector_size),
            ("physical", physical_sector_size),
        ] {
            if value != 512 && value != 4096 {
                return Err(Error::BadSectorSize { which, value });
            }
        }
        let virtual_size = le_u64(item(VIRTUAL_DISK_SIZE, "virtual disk size", 8)?, 0);
        if virtual_size == 0
            || virtual_size > MAX_VIRTUAL_SIZE
            || !virtual_size.is_multiple_of(u64::from(logical_sector_size))
        {
            return Err(Error::BadVirtualSize(virtual_size));
        }
        let page83 = Guid::read(item(PAGE83, "page 83 data", 16)?, 0);
        let has_parent = flags & 2 != 0;
        let parent_locator = if has_parent {
            Some(item(PARENT_LOCATOR, "parent locator", 20)?.to_vec())
        } else {
            None
        };
        Ok(Metadata {
            block_size,
            leave_blocks_allocated: flags & 1 != 0,
            has_parent,
            virtual_size,
            page83,
            logical_sector_size,
            physical_sector_size,
            parent_locator,
        })
    }

    /// Encodes the table and items into `out` (the start of the region, at least
    /// 64 KiB + 40 bytes + the parent locator). Items follow the table at 64 KiB.
    pub fn encode(&self, out: &mut [u8]) {
        let base = TABLE_LEN as u32;
        let loc_len = self.parent_locator.as_ref().map_or(0, |l| l.len());
        out[..TABLE_LEN + 40 + loc_len].fill(0);
        put_u64(out, 0, METADATA_SIGNATURE);
        let mut entries: Vec<(Guid, u32, u32, u32)> = vec![
            (FILE_PARAMETERS, base, 8, FLAG_IS_REQUIRED),
            (
                VIRTUAL_DISK_SIZE,
                base + 8,
                8,
                FLAG_IS_REQUIRED | FLAG_IS_VIRTUAL_DISK,
            ),
            (
                PAGE83,
                base + 16,
                16,
                FLAG_IS_REQUIRED | FLAG_IS_VIRTUAL_DISK,
            ),
            (
                LOGICAL_SECTOR_SIZE,
                base + 32,
                4,
                FLAG_IS_REQUIRED | FLAG_IS_VIRTUAL_DISK,
            ),
            (
                PHYSICAL_SECTOR_SIZE,
                base + 36,
                4,
                FLAG_IS_REQUIRED | FLAG_IS_VIRTUAL_DISK,
            ),
        ];
        if let Some(loc) = &self.parent_locator {
            let len = u32::try_from(loc.len()).expect("parent locator fits in u32");
            entries.push((
                PARENT_LOCATOR,
                base + 40,
                len,
                FLAG_IS_REQUIRED | FLAG_IS_VIRTUAL_DISK,
            ));
            out[TABLE_LEN + 40..TABLE_LEN + 40 + loc.len()].copy_from_slice(loc);
        }
        put_u16(out, 10, entries.len() as u16);
        for (i, (guid, off, len, flags)) in entries.iter().enumerate() {
            let e = 32 + 32 * i;
            guid.write(out, e);
            put_u32(out, e + 16, *off);
            put_u32(out, e + 20, *len);
            put_u32(out, e + 24, *flags);
        }
        let t = TABLE_LEN;
        let flags = u32::from(self.leave_blocks_allocated) | (u32::from(self.has_parent) << 1);
        put_u32(out, t, self.block_size);
        put_u32(out, t + 4, flags);
        put_u64(out, t + 8, self.virtual_size);
        self.page83.write(out, t + 16);
        put_u32(out, t + 32, self.logical_sector_size);
        put_u32(out, t + 36, self.physical_sector_size);
    }

    /// Bytes [`Metadata::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        TABLE_LEN + 40 + self.parent_locator.as_ref().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        Metadata {
            block_size: 32 << 20,
            leave_blocks_allocated: false,
            has_parent: false,
            virtual_size: 1 << 30,
            page83: Guid([3; 16]),
            logical_sector_size: 512,
            physical_sector_size: 4096,
            parent_locator: None,
        }
    }

    fn encoded(m: &Metadata) -> Vec<u8> {
        let mut v = vec![0u8; 1 << 20];
        m.encode(&mut v);
        v
    }

    #[test]
    fn round_trip() {
        assert_eq!(Metadata::parse(&encoded(&sample())).unwrap(), sample());
    }

    #[test]
    fn round_trip_with_parent() {
        let m = Metadata {
            has_parent: true,
            parent_locator: Some(vec![7; 100]),
            ..sample()
        };
        assert_eq!(Metadata::parse(&encoded(&m)).unwrap(), m);
    }

    #[test]
    fn block_size_not_power_of_two_is_refused() {
        let m = Metadata {
            block_size: 3 << 20,
            ..sample()
        };
        assert_eq!(
            Metadata::parse(&encoded(&m)),
            Err(Error::BadBlockSize(3 << 20))
        );
    }

    #[test]
    fn libvhdi_table_header_parses_signature() {
        let b = include_bytes!("../testdata/metadata_table_header.1");
        assert_eq!(le_u64(b, 0), METADATA_SIGNATURE);
        assert_eq!(le_u16(b, 10), 5);
    }

    /// Found by fuzz target `vhdx_metadata` on the metadata of `qemu-img create -f vhdx 64M`
    /// (8 MiB blocks, 512-byte sectors): `encode` zero-filled 64 bytes of items, not the 40
    /// it writes, so a buffer of `encoded_len()` bytes was 24 bytes short and it panicked.
    #[test]
    fn encode_fits_in_encoded_len_bytes() {
        let m = Metadata {
            block_size: 8 << 20,
            virtual_size: 64 << 20,
            logical_sector_size: 512,
            physical_sector_size: 512,
            ..sample()
        };
        let mut v = vec![0u8; m.encoded_len()];
        m.encode(&mut v);
        assert_eq!(Metadata::parse(&v).unwrap(), m);
    }

    #[test]
    fn unknown_required_item_is_refused() {
        let mut v = encoded(&sample());
        g("11111111-2222-3333-4444-555555555555").write(&mut v, 32);
        assert!(matches!(
            Metadata::parse(&v),
            Err(Error::UnknownRequiredItem(_))
        ));
    }
}
