//! The region table (MS-VHDX 2.2.3): where the BAT and metadata regions are.

use crate::crc::crc32c_with_hole;
use crate::guid::g;
use crate::{Guid, MIB, le_u32, le_u64, put_u32, put_u64};

/// `"regi"` as a little-endian u32.
pub const REGION_SIGNATURE: u32 = 0x6967_6572;
/// The checksum covers the full 64 KiB slot.
pub const REGION_TABLE_LEN: usize = 64 * 1024;
/// The spec's cap on entries.
pub const MAX_ENTRIES: u32 = 2047;
/// BAT region GUID.
pub const BAT_GUID: Guid = g("2DC27766-F623-4200-9D64-115E9BFD4A08");
/// Metadata region GUID.
pub const METADATA_GUID: Guid = g("8B7CA206-4790-4B9A-B8FE-575F050F886E");

/// Errors decoding a region table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A region is not 1 MiB aligned, is empty, lies in the first 1 MiB, or overflows.
    #[error("region {guid} at {offset:#x} length {length:#x} is misplaced")]
    BadPlacement {
        /// Region GUID.
        guid: Guid,
        /// FileOffset.
        offset: u64,
        /// Length.
        length: u32,
    },
    /// The same GUID appears twice.
    #[error("region {0} listed twice")]
    DuplicateRegion(Guid),
    /// EntryCount above 2047 or beyond the table.
    #[error("region table entry count {0} exceeds {MAX_ENTRIES}")]
    EntryCountTooLarge(u32),
    /// Checksum mismatch.
    #[error("bad region table checksum: stored {stored:#010x}, computed {computed:#010x}")]
    InvalidChecksum {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// Not "regi".
    #[error("bad region table signature {0:#010x}")]
    InvalidSignature(u32),
    /// A required region is absent.
    #[error("required region {0} missing")]
    MissingRegion(&'static str),
    /// Two regions overlap.
    #[error("regions {a} and {b} overlap")]
    RegionOverlap {
        /// One region.
        a: Guid,
        /// The other.
        b: Guid,
    },
    /// Fewer than 64 KiB given.
    #[error("region table truncated: {0} bytes")]
    Truncated(usize),
    /// An unknown region with the Required flag.
    #[error("unknown required region {0}")]
    UnknownRequiredRegion(Guid),
}

/// One region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Byte offset in the file (1 MiB aligned).
    pub offset: u64,
    /// Length in bytes (multiple of 1 MiB).
    pub length: u32,
    /// The Required flag.
    pub required: bool,
}

impl Region {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(u64::from(self.length))
    }
}

/// A decoded region table: the two known regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionTable {
    /// The BAT region.
    pub bat: Region,
    /// The metadata region.
    pub metadata: Region,
}

impl RegionTable {
    /// Parses and validates a 64 KiB region table.
    ///
    /// # Errors
    /// Signature, checksum, count, alignment, overlap, duplicates and required regions.
    pub fn parse(b: &[u8]) -> Result<RegionTable, Error> {
        if b.len() < REGION_TABLE_LEN {
            return Err(Error::Truncated(b.len()));
        }
        let b = &b[..REGION_TABLE_LEN];
        let sig = le_u32(b, 0);
        if sig != REGION_SIGNATURE {
            return Err(Error::InvalidSignature(sig));
        }
        let stored = le_u32(b, 4);
        let computed = crc32c_with_hole(b, 4);
        if stored != computed {
            return Err(Error::InvalidChecksum { stored, computed });
        }
        let count = le_u32(b, 8);
        if count > MAX_ENTRIES {
            return Err(Error::EntryCountTooLarge(count));
        }
        let mut seen: Vec<(Guid, Region)> = Vec::new();
        for i in 0..count as usize {
            let e = 16 + 32 * i;
            let guid = Guid::read(b, e);
            let r = Region {
                offset: le_u64(b, e + 16),
                length: le_u32(b, e + 24),
                required: le_u32(b, e + 28) & 1 != 0,
            };
            let len = u64::from(r.length);
            if !r.offset.is_multiple_of(MIB)
                || len % MIB != 0
                || len == 0
                || r.offset < MIB
                || r.offset.checked_add(len).is_none()
            {
                return Err(Error::BadPlacement {
                    guid,
                    offset: r.offset,
                    length: r.length,
                });
            }
            if guid != BAT_GUID && guid != METADATA_GUID && r.required {
                return Err(Error::UnknownRequiredRegion(guid));
            }
            for (og, o) in &seen {
                if *og == guid {
                    return Err(Error::DuplicateRegion(guid));
                }
                if r.offset < o.end() && o.offset < r.end() {
                    return Err(Error::RegionOverlap { a: *og, b: guid });
                }
            }
            seen.push((guid, r));
        }
        let find = |guid| seen.iter().find(|(g, _)| *g == guid).map(|(_, r)| *r);
        Ok(RegionTable {
            bat: find(BAT_GUID).ok_or(Error::MissingRegion("bat"))?,
            metadata: find(METADATA_GUID).ok_or(Error::MissingRegion("metadata"))?,
        })
    }

    /// Encodes the table into a 64 KiB buffer (both known regions, Required set).
    pub fn encode(&self, out: &mut [u8]) {
        let b = &mut out[..REGION_TABLE_LEN];
        b.fill(0);
        put_u32(b, 0, REGION_SIGNATURE);
        put_u32(b, 8, 2);
        for (i, (guid, r)) in [(BAT_GUID, self.bat), (METADATA_GUID, self.metadata)]
            .iter()
            .enumerate()
        {
            let e = 16 + 32 * i;
            guid.write(b, e);
            put_u64(b, e + 16, r.offset);
            put_u32(b, e + 24, r.length);
            put_u32(b, e + 28, u32::from(r.required));
        }
        let crc = crc32c_with_hole(b, 4);
        put_u32(b, 4, crc);
    }

    /// Encodes into a fresh 64 KiB vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; REGION_TABLE_LEN];
        self.encode(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RegionTable {
        RegionTable {
            bat: Region {
                offset: 3 * MIB,
                length: MIB as u32,
                required: true,
            },
            metadata: Region {
                offset: 2 * MIB,
                length: MIB as u32,
                required: true,
            },
        }
    }

    #[test]
    fn libvhdi_region_table_parses() {
        let mut b = include_bytes!("../testdata/region_table.1").to_vec();
        b.resize(REGION_TABLE_LEN, 0);
        let t = RegionTable::parse(&b).unwrap();
        assert_eq!(t.bat.offset, 3 * MIB);
        assert_eq!(le_u32(&b, 4), 0xC66B_8CAE);
    }

    #[test]
    fn round_trip() {
        assert_eq!(RegionTable::parse(&sample().to_bytes()).unwrap(), sample());
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let t = RegionTable {
            metadata: Region {
                offset: 3 * MIB,
                length: 2 * MIB as u32,
                required: true,
            },
            ..sample()
        };
        assert!(matches!(
            RegionTable::parse(&t.to_bytes()),
            Err(Error::RegionOverlap { .. })
        ));
    }

    #[test]
    fn region_in_first_mib_is_refused() {
        let t = RegionTable {
            bat: Region {
                offset: 0,
                length: MIB as u32,
                required: true,
            },
            ..sample()
        };
        assert!(matches!(
            RegionTable::parse(&t.to_bytes()),
            Err(Error::BadPlacement { .. })
        ));
    }
}
