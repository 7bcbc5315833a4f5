//! The dynamic disk header (VHD spec, "Dynamic Disk Header Format"): 1024 bytes at the
//! footer's DataOffset (normally 512) in dynamic and differencing files, and its eight parent
//! locator entries.
//!
//! ```text
//!   0 cookie "cxsparse"       8 data offset (unused)   16 table offset (BAT)
//!  24 header version         28 max table entries     32 block size      36 checksum
//!  40 parent unique id (16)  56 parent timestamp      60 reserved
//!  64 parent unicode name (512, UTF-16BE)
//! 576 8 x parent locator (24): code, data space, data length, reserved, data offset
//! 768 reserved (256)
//! ```

use super::{
    Checksum, Parsed, SECTOR_SIZE, be_u32, be_u64, bytes, checksum, put_be_u32, put_be_u64,
};
use crate::Guid;

/// The size of the dynamic disk header.
pub const DYNAMIC_HEADER_LEN: usize = 1024;
/// Cookie: `"cxsparse"`.
pub const DYNAMIC_COOKIE: [u8; 8] = *b"cxsparse";
/// HeaderVersion 1.0 (major in the high 16 bits).
pub const HEADER_VERSION: u32 = 0x0001_0000;
/// The default block size, 2 MiB.
pub const DEFAULT_BLOCK_SIZE: u32 = 2 << 20;
/// The smallest block size accepted: one sector.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// The largest block size accepted, 256 MiB (its sector bitmap is 64 KiB).
pub const MAX_BLOCK_SIZE: u32 = 256 << 20;
/// The most BAT entries accepted: 16 Mi entries, a 64 MiB table in memory (2 MiB blocks need
/// only 1 Mi entries for the 2 TiB maximum disk).
pub const MAX_TABLE_ENTRIES: u32 = 1 << 24;
/// The longest parent locator data accepted, 64 KiB (a Windows path of 32767 UTF-16 units fits).
pub const MAX_LOCATOR_DATA_LEN: u32 = 64 << 10;
/// The number of parent locator entries.
pub const LOCATOR_COUNT: usize = 8;
/// Characters (UTF-16 code units) in ParentUnicodeName.
pub const PARENT_NAME_UNITS: usize = 256;
/// Offset of the checksum field.
const CHECKSUM_OFFSET: usize = 36;
/// Offset of ParentUnicodeName.
const PARENT_NAME_OFFSET: usize = 64;
/// Offset of the first parent locator entry.
const LOCATOR_OFFSET: usize = 576;
/// Size of one parent locator entry.
const LOCATOR_LEN: usize = 24;

/// Errors decoding a dynamic header or locator data. A checksum mismatch is not an error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// BlockSize is not a power of two in [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`].
    #[error("bad block size {block_size}: not a power of two from 512 bytes to 256 MiB")]
    InvalidBlockSize {
        /// BlockSize.
        block_size: u32,
    },
    /// Not `"cxsparse"`.
    #[error("bad dynamic header cookie {found:?}")]
    InvalidCookie {
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// Locator data that is not valid UTF-16.
    #[error("locator path of platform {code:#010x} is not valid utf-16")]
    InvalidLocatorText {
        /// The platform code.
        code: u32,
    },
    /// A locator whose data offset plus length overflows.
    #[error("parent locator {index} at {offset:#x} length {length:#x} overflows")]
    LocatorOverflow {
        /// Entry index (0..8).
        index: usize,
        /// PlatformDataOffset.
        offset: u64,
        /// PlatformDataLength.
        length: u32,
    },
    /// A locator longer than [`MAX_LOCATOR_DATA_LEN`].
    #[error("parent locator {index} length {length} exceeds {max} bytes")]
    LocatorTooLong {
        /// Entry index (0..8).
        index: usize,
        /// PlatformDataLength.
        length: u32,
        /// The limit.
        max: u32,
    },
    /// The table ends past the largest offset (TableOffset + 4 × MaxTableEntries overflows).
    #[error("bat at {offset:#x} with {entries} entries overflows")]
    TableOffsetOverflow {
        /// TableOffset.
        offset: u64,
        /// MaxTableEntries.
        entries: u32,
    },
    /// The BAT has fewer entries than the disk size needs.
    #[error("bat has {entries} entries but a {size}-byte disk needs {needed}")]
    TableTooSmall {
        /// MaxTableEntries.
        entries: u32,
        /// Entries the size needs.
        needed: u64,
        /// The virtual size.
        size: u64,
    },
    /// MaxTableEntries above [`MAX_TABLE_ENTRIES`].
    #[error("bat entry count {entries} exceeds {max}")]
    TooManyTableEntries {
        /// MaxTableEntries.
        entries: u32,
        /// The limit.
        max: u32,
    },
    /// Fewer than 1024 bytes given.
    #[error("dynamic header truncated: {len} bytes")]
    Truncated {
        /// Bytes given.
        len: usize,
    },
    /// A header major version other than 1.
    #[error("unsupported dynamic header version {version:#010x}")]
    UnsupportedVersion {
        /// HeaderVersion.
        version: u32,
    },
}

/// PlatformCode of a parent locator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlatformCode {
    /// 0: the entry is unused.
    None,
    /// `Wi2r`: deprecated relative Windows path (ANSI).
    Wi2r,
    /// `Wi2k`: deprecated absolute Windows path (ANSI).
    Wi2k,
    /// `W2ru`: relative Windows path, UTF-16LE.
    W2ru,
    /// `W2ku`: absolute Windows path, UTF-16LE.
    W2ku,
    /// `Mac `: Mac OS alias blob.
    Mac,
    /// `MacX`: file URL, UTF-8.
    MacX,
    /// Any other value, kept as found.
    Other(u32),
}

impl PlatformCode {
    /// Decodes the on-disk value.
    pub fn from_u32(v: u32) -> PlatformCode {
        match &v.to_be_bytes() {
            [0, 0, 0, 0] => PlatformCode::None,
            b"Wi2r" => PlatformCode::Wi2r,
            b"Wi2k" => PlatformCode::Wi2k,
            b"W2ru" => PlatformCode::W2ru,
            b"W2ku" => PlatformCode::W2ku,
            b"Mac " => PlatformCode::Mac,
            b"MacX" => PlatformCode::MacX,
            _ => PlatformCode::Other(v),
        }
    }

    /// The on-disk value.
    pub fn to_u32(self) -> u32 {
        let tag = match self {
            PlatformCode::None => return 0,
            PlatformCode::Other(v) => return v,
            PlatformCode::Wi2r => b"Wi2r",
            PlatformCode::Wi2k => b"Wi2k",
            PlatformCode::W2ru => b"W2ru",
            PlatformCode::W2ku => b"W2ku",
            PlatformCode::Mac => b"Mac ",
            PlatformCode::MacX => b"MacX",
        };
        u32::from_be_bytes(*tag)
    }

    /// Decodes a locator's path bytes: UTF-16LE for `W2ru`/`W2ku`, ANSI or UTF-8 (decoded
    /// lossily as UTF-8) for the others. The text ends at the first NUL; an odd trailing byte
    /// of UTF-16 is ignored.
    ///
    /// # Errors
    /// `InvalidLocatorText` for UTF-16 with unpaired surrogates.
    pub fn decode_path(self, data: &[u8]) -> Result<String, Error> {
        match self {
            PlatformCode::W2ru | PlatformCode::W2ku => {
                let units: Vec<u16> = data
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .take_while(|&u| u != 0)
                    .collect();
                String::from_utf16(&units).map_err(|_| Error::InvalidLocatorText {
                    code: self.to_u32(),
                })
            }
            _ => {
                let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                Ok(String::from_utf8_lossy(&data[..end]).into_owned())
            }
        }
    }
}

/// One parent locator entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locator {
    /// PlatformCode.
    pub platform_code: PlatformCode,
    /// PlatformDataSpace as stored: sectors per the spec, but Windows writes bytes (see
    /// [`Locator::data_space_bytes`]).
    pub data_space: u32,
    /// PlatformDataLength in bytes.
    pub data_length: u32,
    /// PlatformDataOffset: absolute file offset of the data.
    pub data_offset: u64,
}

impl Locator {
    /// An unused entry.
    pub const UNUSED: Locator = Locator {
        platform_code: PlatformCode::None,
        data_space: 0,
        data_length: 0,
        data_offset: 0,
    };

    /// True when PlatformCode is not 0.
    pub fn is_used(&self) -> bool {
        self.platform_code != PlatformCode::None
    }

    /// The space reserved for the data in bytes: a value above 511 is taken as bytes (what
    /// Windows writes), a smaller one as sectors (what the spec says).
    pub fn data_space_bytes(&self) -> u64 {
        if self.data_space > 511 {
            u64::from(self.data_space)
        } else {
            u64::from(self.data_space) * SECTOR_SIZE
        }
    }

    fn parse(b: &[u8], index: usize) -> Result<Locator, Error> {
        let locator = Locator {
            platform_code: PlatformCode::from_u32(be_u32(b, 0)),
            data_space: be_u32(b, 4),
            data_length: be_u32(b, 8),
            data_offset: be_u64(b, 16),
        };
        if !locator.is_used() {
            return Ok(locator);
        }
        let (offset, length) = (locator.data_offset, locator.data_length);
        if length > MAX_LOCATOR_DATA_LEN {
            return Err(Error::LocatorTooLong {
                index,
                length,
                max: MAX_LOCATOR_DATA_LEN,
            });
        }
        if offset.checked_add(u64::from(length)).is_none() {
            return Err(Error::LocatorOverflow {
                index,
                offset,
                length,
            });
        }
        Ok(locator)
    }

    fn encode(&self, b: &mut [u8]) {
        put_be_u32(b, 0, self.platform_code.to_u32());
        put_be_u32(b, 4, self.data_space);
        put_be_u32(b, 8, self.data_length);
        put_be_u32(b, 12, 0);
        put_be_u64(b, 16, self.data_offset);
    }
}

/// One decoded dynamic disk header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicHeader {
    /// DataOffset: unused, 0xFFFFFFFFFFFFFFFF.
    pub data_offset: u64,
    /// TableOffset: absolute offset of the BAT.
    pub table_offset: u64,
    /// HeaderVersion (major 1).
    pub header_version: u32,
    /// MaxTableEntries: BAT entries present.
    pub max_table_entries: u32,
    /// BlockSize in bytes, a power of two (default 2 MiB).
    pub block_size: u32,
    /// ParentUniqueId: the parent footer's UniqueId (differencing disks).
    pub parent_unique_id: Guid,
    /// ParentTimeStamp: the parent's modification time, seconds since 2000 (not enforced).
    pub parent_timestamp: u32,
    /// ParentUnicodeName, decoded from UTF-16BE up to the first NUL (unpaired surrogates
    /// become U+FFFD).
    pub parent_unicode_name: String,
    /// The eight parent locator entries.
    pub locators: [Locator; LOCATOR_COUNT],
}

impl DynamicHeader {
    /// Parses a dynamic header from the first 1024 bytes of `b`.
    ///
    /// A checksum mismatch does not fail: it is reported in [`Parsed::checksum`].
    ///
    /// # Errors
    /// Short input, cookie, version, block size, table size and placement, and locators.
    pub fn parse(b: &[u8]) -> Result<Parsed<DynamicHeader>, Error> {
        let Some(b) = b.get(..DYNAMIC_HEADER_LEN) else {
            return Err(Error::Truncated { len: b.len() });
        };
        let cookie: [u8; 8] = bytes(b, 0);
        if cookie != DYNAMIC_COOKIE {
            return Err(Error::InvalidCookie { found: cookie });
        }
        let version = be_u32(b, 24);
        if version >> 16 != HEADER_VERSION >> 16 {
            return Err(Error::UnsupportedVersion { version });
        }
        let block_size = be_u32(b, 32);
        if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
        {
            return Err(Error::InvalidBlockSize { block_size });
        }
        let entries = be_u32(b, 28);
        if entries > MAX_TABLE_ENTRIES {
            return Err(Error::TooManyTableEntries {
                entries,
                max: MAX_TABLE_ENTRIES,
            });
        }
        let table_offset = be_u64(b, 16);
        if table_offset.checked_add(u64::from(entries) * 4).is_none() {
            return Err(Error::TableOffsetOverflow {
                offset: table_offset,
                entries,
            });
        }
        let mut locators = [Locator::UNUSED; LOCATOR_COUNT];
        for (index, slot) in locators.iter_mut().enumerate() {
            let off = LOCATOR_OFFSET + index * LOCATOR_LEN;
            *slot = Locator::parse(&b[off..off + LOCATOR_LEN], index)?;
        }
        let header = DynamicHeader {
            data_offset: be_u64(b, 8),
            table_offset,
            header_version: version,
            max_table_entries: entries,
            block_size,
            parent_unique_id: Guid::from_be_bytes(bytes(b, 40)),
            parent_timestamp: be_u32(b, 56),
            parent_unicode_name: decode_name(&b[PARENT_NAME_OFFSET..LOCATOR_OFFSET]),
            locators,
        };
        let checksum = Checksum {
            stored: be_u32(b, CHECKSUM_OFFSET),
            computed: checksum(b, CHECKSUM_OFFSET),
        };
        Ok(Parsed {
            value: header,
            checksum,
        })
    }

    /// The number of BAT entries a disk of `virtual_size` bytes uses: ceil(size / BlockSize).
    /// A reader loads only these; extra entries are ignored.
    ///
    /// # Errors
    /// `TableTooSmall` when MaxTableEntries cannot cover the size.
    pub fn entries_for_size(&self, virtual_size: u64) -> Result<u32, Error> {
        let needed = virtual_size.div_ceil(u64::from(self.block_size));
        match u32::try_from(needed) {
            Ok(n) if n <= self.max_table_entries => Ok(n),
            _ => Err(Error::TableTooSmall {
                entries: self.max_table_entries,
                needed,
                size: virtual_size,
            }),
        }
    }

    /// Encodes into the first 1024 bytes of `out`, checksum included. ParentUnicodeName is
    /// cut to 256 UTF-16 code units.
    ///
    /// # Panics
    /// When `out` is shorter than 1024 bytes (a caller bug: the buffer is the caller's).
    pub fn encode(&self, out: &mut [u8]) {
        let b = &mut out[..DYNAMIC_HEADER_LEN];
        b.fill(0);
        b[0..8].copy_from_slice(&DYNAMIC_COOKIE);
        put_be_u64(b, 8, self.data_offset);
        put_be_u64(b, 16, self.table_offset);
        put_be_u32(b, 24, self.header_version);
        put_be_u32(b, 28, self.max_table_entries);
        put_be_u32(b, 32, self.block_size);
        b[40..56].copy_from_slice(&self.parent_unique_id.0);
        put_be_u32(b, 56, self.parent_timestamp);
        let name = &mut b[PARENT_NAME_OFFSET..LOCATOR_OFFSET];
        for (slot, unit) in name
            .chunks_exact_mut(2)
            .zip(self.parent_unicode_name.encode_utf16())
        {
            slot.copy_from_slice(&unit.to_be_bytes());
        }
        for (index, locator) in self.locators.iter().enumerate() {
            let off = LOCATOR_OFFSET + index * LOCATOR_LEN;
            locator.encode(&mut b[off..off + LOCATOR_LEN]);
        }
        let sum = checksum(b, CHECKSUM_OFFSET);
        put_be_u32(b, CHECKSUM_OFFSET, sum);
    }

    /// Encodes into a fresh 1024-byte vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; DYNAMIC_HEADER_LEN];
        self.encode(&mut v);
        v
    }
}

/// Decodes ParentUnicodeName: UTF-16BE up to the first NUL, lossily.
fn decode_name(b: &[u8]) -> String {
    let units = b
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0);
    char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SAMPLE: &[u8; 1024] = include_bytes!("../../testdata/dynamic_disk_header.1");

    fn header_with(block_size: u32, entries: u32) -> Vec<u8> {
        let mut b = SAMPLE.to_vec();
        b[28..32].copy_from_slice(&entries.to_be_bytes());
        b[32..36].copy_from_slice(&block_size.to_be_bytes());
        b
    }

    #[test]
    fn libvhdi_header_parses_with_good_checksum() {
        let parsed = DynamicHeader::parse(SAMPLE).unwrap();
        let h = &parsed.value;
        assert_eq!(
            parsed.checksum,
            Checksum {
                stored: 0xFFFF_E1C1,
                computed: 0xFFFF_E1C1
            }
        );
        assert_eq!(
            (h.table_offset, h.max_table_entries, h.block_size),
            (0x600, 256, 2 << 20)
        );
        assert_eq!(
            h.parent_unique_id.to_string(),
            "d49c5c80-350a-4a89-898a-5ad6d10f6578"
        );
        assert_eq!(h.parent_unicode_name, "dynamic.vhd");
    }

    #[test]
    fn libvhdi_header_locators_decode() {
        let h = DynamicHeader::parse(SAMPLE).unwrap().value;
        // Entries 0-3 are unused; entry 4: W2ku, space 0x200 (taken as 512 bytes), 42 bytes at
        // 0x1200.
        let w2ku = Locator {
            platform_code: PlatformCode::W2ku,
            data_space: 0x200,
            data_length: 42,
            data_offset: 0x1200,
        };
        assert!(!h.locators[0].is_used());
        assert_eq!(h.locators[4], w2ku);
        assert_eq!(h.locators[4].data_space_bytes(), 512);
        assert_eq!(h.locators[5].platform_code, PlatformCode::W2ru);
        assert_eq!(h.locators[7].platform_code, PlatformCode::Wi2r);
    }

    #[test]
    fn libvhdi_header_reencodes_byte_identical() {
        let h = DynamicHeader::parse(SAMPLE).unwrap().value;
        assert_eq!(h.to_bytes(), SAMPLE.to_vec());
    }

    #[test]
    fn bad_checksum_is_reported_not_refused() {
        let mut b = SAMPLE.to_vec();
        b[1000] = 2;
        let parsed = DynamicHeader::parse(&b).unwrap();
        assert_eq!(
            parsed.checksum,
            Checksum {
                stored: 0xFFFF_E1C1,
                computed: 0xFFFF_E1BF
            }
        );
    }

    #[test]
    fn non_power_of_two_block_size_is_refused() {
        let b = header_with(3 << 20, 256);
        assert_eq!(
            DynamicHeader::parse(&b),
            Err(Error::InvalidBlockSize {
                block_size: 3 << 20
            })
        );
    }

    #[test]
    fn absurd_table_entries_are_refused() {
        let b = header_with(2 << 20, u32::MAX);
        assert_eq!(
            DynamicHeader::parse(&b),
            Err(Error::TooManyTableEntries {
                entries: u32::MAX,
                max: MAX_TABLE_ENTRIES
            })
        );
    }

    #[test]
    fn bad_cookie_is_refused() {
        let mut b = SAMPLE.to_vec();
        b[0] = b'C';
        assert_eq!(
            DynamicHeader::parse(&b),
            Err(Error::InvalidCookie {
                found: *b"Cxsparse"
            })
        );
    }

    #[test]
    fn overflowing_table_offset_is_refused() {
        let mut b = SAMPLE.to_vec();
        b[16..24].copy_from_slice(&(u64::MAX - 8).to_be_bytes());
        assert!(matches!(
            DynamicHeader::parse(&b),
            Err(Error::TableOffsetOverflow { .. })
        ));
    }

    #[test]
    fn overflowing_locator_is_refused() {
        let mut b = SAMPLE.to_vec();
        // Entry 4 (W2ku) has its PlatformDataOffset at 576 + 4 * 24 + 16.
        b[688..696].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(
            DynamicHeader::parse(&b),
            Err(Error::LocatorOverflow { index: 4, .. })
        ));
    }

    #[test]
    fn short_input_is_truncated() {
        assert_eq!(
            DynamicHeader::parse(&SAMPLE[..1023]),
            Err(Error::Truncated { len: 1023 })
        );
    }

    #[test]
    fn entries_for_size_rounds_up() {
        let h = DynamicHeader::parse(SAMPLE).unwrap().value;
        // dfvfs-ext2.vhd: 4212736 bytes need 3 blocks of 2 MiB.
        assert_eq!(h.entries_for_size(4_212_736), Ok(3));
    }

    #[test]
    fn table_too_small_for_size_is_refused() {
        let h = DynamicHeader::parse(SAMPLE).unwrap().value;
        // 256 entries of 2 MiB cover 512 MiB, not one byte more.
        assert!(matches!(
            h.entries_for_size((512 << 20) + 1),
            Err(Error::TableTooSmall { .. })
        ));
    }

    #[test]
    fn w2ru_path_decodes_utf16le() {
        let data: Vec<u8> = ".\\fat-parent.vhd"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(
            PlatformCode::W2ru.decode_path(&data).unwrap(),
            ".\\fat-parent.vhd"
        );
    }

    #[test]
    fn wi2k_path_decodes_ansi_up_to_nul() {
        assert_eq!(
            PlatformCode::Wi2k.decode_path(b"C:\\a.vhd\0junk").unwrap(),
            "C:\\a.vhd"
        );
    }

    #[test]
    fn unpaired_surrogate_is_invalid_utf16() {
        let data = 0xD800u16.to_le_bytes();
        assert!(PlatformCode::W2ku.decode_path(&data).is_err());
    }

    #[test]
    fn platform_codes_round_trip() {
        assert_eq!(PlatformCode::from_u32(0x5732_7275), PlatformCode::W2ru);
        assert_eq!(PlatformCode::MacX.to_u32(), 0x4D61_6358);
        assert_eq!(PlatformCode::from_u32(7), PlatformCode::Other(7));
    }

    fn arb_locator() -> impl Strategy<Value = Locator> {
        (
            any::<u32>(),
            any::<u32>(),
            0..=MAX_LOCATOR_DATA_LEN,
            0u64..1 << 62,
        )
            .prop_map(|(code, data_space, data_length, data_offset)| Locator {
                platform_code: PlatformCode::from_u32(code),
                data_space,
                data_length,
                data_offset,
            })
    }

    fn arb_header() -> impl Strategy<Value = DynamicHeader> {
        (
            (
                any::<u64>(),
                0u64..1 << 62,
                0u32..0x1_0000,
                0..=MAX_TABLE_ENTRIES,
                9u32..=28,
            ),
            (
                any::<[u8; 16]>(),
                any::<u32>(),
                "[a-zA-Z0-9 .:\\\\é]{0,200}",
            ),
            proptest::array::uniform8(arb_locator()),
        )
            .prop_map(|(a, b, locators)| DynamicHeader {
                data_offset: a.0,
                table_offset: a.1,
                header_version: HEADER_VERSION | a.2,
                max_table_entries: a.3,
                block_size: 1 << a.4,
                parent_unique_id: Guid::from_be_bytes(b.0),
                parent_timestamp: b.1,
                parent_unicode_name: b.2,
                locators,
            })
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = DynamicHeader::parse(&b);
        }

        #[test]
        fn parse_never_panics_past_the_cookie(tail in proptest::collection::vec(any::<u8>(), 1016)) {
            let mut b = DYNAMIC_COOKIE.to_vec();
            b.extend_from_slice(&tail);
            let _ = DynamicHeader::parse(&b);
        }

        #[test]
        fn encode_parse_round_trips(h in arb_header()) {
            let parsed = DynamicHeader::parse(&h.to_bytes()).unwrap();
            prop_assert!(parsed.checksum.is_ok());
            prop_assert_eq!(parsed.value, h);
        }
    }
}
