//! Partition tables: the MBR (four primary entries) and GPT (protective MBR, primary header at
//! LBA 1, entries array), as pure functions over bytes the caller read. No I/O.
//!
//! The caller reads sector 0 and hands it to [`parse_mbr`]. [`Sector0::NoTable`] means no
//! table (a whole-disk filesystem, or an empty disk); [`Sector0::Mbr`] lists the primary
//! partitions; [`Sector0::Protective`] says a GPT follows: the caller reads LBA 1 for
//! [`parse_gpt_header`], then the bytes [`GptHeader::entries_span`] names for
//! [`parse_gpt_entries`]. Every value is checked (signatures, both CRC32s, bounds inside the
//! disk and the usable range, overlaps, entry counts and sizes), so the caller can trust a
//! parsed [`Partition`]. Extended (logical) MBR partitions are not followed; their slots are
//! skipped.

use std::fmt;

/// Bytes of the MBR this module reads (the boot sector's first 512 bytes).
pub const MBR_BYTES: usize = 512;
/// The boot signature at offset 510 of an MBR.
pub const MBR_SIGNATURE: [u8; 2] = [0x55, 0xAA];
/// The partition type of a GPT protective MBR entry.
pub const MBR_TYPE_PROTECTIVE: u8 = 0xEE;
/// MBR partition types of extended partitions (containers of logical ones, not followed).
pub const MBR_TYPES_EXTENDED: [u8; 3] = [0x05, 0x0F, 0x85];
/// The signature at the start of a GPT header.
pub const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// The smallest GPT header (UEFI 2.x: 92 bytes).
pub const GPT_HEADER_BYTES_MIN: u32 = 92;
/// Most GPT entries accepted (the usual table has 128).
pub const GPT_ENTRIES_MAX: u32 = 256;
/// The smallest GPT entry size (UEFI: 128 × 2^n).
pub const GPT_ENTRY_BYTES_MIN: u32 = 128;
/// Largest GPT entry size accepted.
pub const GPT_ENTRY_BYTES_MAX: u32 = 1024;
/// Sector sizes accepted.
pub const SECTOR_SIZES: [u32; 2] = [512, 4096];

/// A GUID as stored on disk (the first three fields little-endian).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guid(pub [u8; 16]);

impl Guid {
    /// The unused-entry GUID.
    pub const ZERO: Guid = Guid([0; 16]);
    /// "Linux filesystem data".
    pub const LINUX_FS: Guid =
        Guid::from_fields(0x0FC6_3DAF, 0x8483, 0x4772, 0x8E79_3D69_D847_7DE4);
    /// EFI System Partition.
    pub const EFI_SYSTEM: Guid =
        Guid::from_fields(0xC12A_7328, 0xF81F, 0x11D2, 0xBA4B_00A0_C93E_C93B);

    /// The GUID written as `d1-d2-d3-d4`, `d4` being the last 8 bytes big-endian.
    pub const fn from_fields(d1: u32, d2: u16, d3: u16, d4: u64) -> Guid {
        let a = d1.to_le_bytes();
        let b = d2.to_le_bytes();
        let c = d3.to_le_bytes();
        let d = d4.to_be_bytes();
        Guid([
            a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5],
            d[6], d[7],
        ])
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-",
            b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9]
        )?;
        b[10..].iter().try_for_each(|x| write!(f, "{x:02x}"))
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A partition's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartType {
    /// An MBR system id.
    Mbr(u8),
    /// A GPT partition type GUID.
    Gpt(Guid),
}

/// One partition, checked to lie inside the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Its number as Linux names it (`/dev/sdaN`): the MBR slot or GPT entry index, from 1.
    pub number: u32,
    /// First byte on the disk.
    pub start: u64,
    /// Length in bytes (never 0).
    pub len: u64,
    /// Its type.
    pub part_type: PartType,
    /// The PARTUUID Linux gives it: the GPT unique partition GUID, or `SSSSSSSS-NN` (disk
    /// signature and number) on an MBR disk.
    pub partuuid: String,
    /// The GPT partition name (empty names are `None`); MBR partitions have none.
    pub name: Option<String>,
}

/// What sector 0 holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sector0 {
    /// No boot signature: no table (a whole-disk filesystem or an empty disk).
    NoTable,
    /// An MBR with these primary partitions (empty slots and extended ones left out).
    Mbr {
        /// The disk signature at offset 440.
        disk_signature: u32,
        /// The primary partitions, by slot.
        partitions: Vec<Partition>,
    },
    /// A protective MBR: the disk has a GPT.
    Protective,
}

/// What is wrong with an MBR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MbrError {
    /// A slot's status byte is neither 0x00 nor 0x80 (not a partition table).
    #[error("mbr slot {slot}: status byte {status:#04x} is neither 0x00 nor 0x80")]
    BadStatus {
        /// The slot (1-4).
        slot: u32,
        /// The byte.
        status: u8,
    },
    /// A partition ends past the end of the disk.
    #[error(
        "mbr partition {number} ends at byte {end}, past the end of the {disk_bytes}-byte disk"
    )]
    PastEnd {
        /// The partition number.
        number: u32,
        /// Its end in bytes (saturated).
        end: u64,
        /// The disk's size.
        disk_bytes: u64,
    },
    /// The buffer is shorter than [`MBR_BYTES`].
    #[error("mbr needs {MBR_BYTES} bytes, got {len}")]
    Short {
        /// Bytes given.
        len: usize,
    },
    /// The sector size is not one of [`SECTOR_SIZES`].
    #[error("sector size {0} is neither 512 nor 4096")]
    SectorSize(u32),
}

/// A parsed, checked GPT header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptHeader {
    /// The disk GUID.
    pub disk_guid: Guid,
    /// First usable LBA.
    pub first_usable: u64,
    /// Last usable LBA (inclusive).
    pub last_usable: u64,
    /// LBA of the entries array.
    pub entries_lba: u64,
    /// Number of entries.
    pub entries_count: u32,
    /// Bytes per entry.
    pub entry_bytes: u32,
    /// CRC32 of the entries array.
    pub entries_crc: u32,
}

impl GptHeader {
    /// The entries array: its byte offset on the disk and its length. The length is at most
    /// `GPT_ENTRIES_MAX * GPT_ENTRY_BYTES_MAX`; [`parse_gpt_header`] checked it lies inside
    /// the disk.
    pub fn entries_span(&self, sector_size: u32) -> (u64, usize) {
        debug_assert!(
            self.entries_count <= GPT_ENTRIES_MAX && self.entry_bytes <= GPT_ENTRY_BYTES_MAX,
            "a parsed header's entries ({} of {} bytes) are bounded",
            self.entries_count,
            self.entry_bytes
        );
        let len = self.entries_count as usize * self.entry_bytes as usize;
        (self.entries_lba * u64::from(sector_size), len)
    }
}

/// What is wrong with a GPT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GptError {
    /// The header does not start with `EFI PART`.
    #[error("gpt header at lba 1 has no \"EFI PART\" signature")]
    BadSignature,
    /// The entries array's CRC32 does not match the header's.
    #[error("gpt entries crc32 is {actual:#010x}, the header says {expected:#010x}")]
    EntriesCrc {
        /// From the header.
        expected: u32,
        /// Computed.
        actual: u32,
    },
    /// The entries array does not lie between LBA 2 and the first usable LBA or ends past
    /// the disk.
    #[error(
        "gpt entries array at lba {lba} ({bytes} bytes) is not inside the disk's metadata area"
    )]
    EntriesOutside {
        /// Its LBA.
        lba: u64,
        /// Its length.
        bytes: u64,
    },
    /// More entries than [`GPT_ENTRIES_MAX`] or none.
    #[error("gpt has {0} entries; 1 to {GPT_ENTRIES_MAX} are accepted")]
    EntryCount(u32),
    /// An entry size that is not 128 × 2^n up to [`GPT_ENTRY_BYTES_MAX`].
    #[error(
        "gpt entry size {0} is not a power of two from {GPT_ENTRY_BYTES_MIN} to {GPT_ENTRY_BYTES_MAX}"
    )]
    EntrySize(u32),
    /// The header's CRC32 does not match.
    #[error("gpt header crc32 is {actual:#010x}, the header says {expected:#010x}")]
    HeaderCrc {
        /// From the header.
        expected: u32,
        /// Computed.
        actual: u32,
    },
    /// The header size is below 92 or above the sector size.
    #[error("gpt header size {0} is outside 92..=sector size")]
    HeaderSize(u32),
    /// The header's own LBA is not 1.
    #[error("gpt primary header says it is at lba {0}, not 1")]
    MyLba(u64),
    /// Two partitions share sectors.
    #[error("gpt partitions {a} and {b} overlap")]
    Overlap {
        /// The first.
        a: u32,
        /// The second.
        b: u32,
    },
    /// A partition lies (partly) outside the usable LBAs, or ends before it starts.
    #[error(
        "gpt partition {number} (lba {start}..={end}) is not inside the usable lbas {first}..={last}"
    )]
    PartitionOutside {
        /// Its number.
        number: u32,
        /// Its first LBA.
        start: u64,
        /// Its last LBA.
        end: u64,
        /// First usable LBA.
        first: u64,
        /// Last usable LBA.
        last: u64,
    },
    /// The sector size is not one of [`SECTOR_SIZES`].
    #[error("sector size {0} is neither 512 nor 4096")]
    SectorSize(u32),
    /// A buffer is shorter than the structure it should hold.
    #[error("gpt {what} needs {need} bytes, got {got}")]
    Short {
        /// The structure.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The usable range is empty or does not lie inside the disk.
    #[error("gpt usable lbas {first}..={last} are not inside the {sectors}-sector disk")]
    UsableRange {
        /// First usable LBA.
        first: u64,
        /// Last usable LBA.
        last: u64,
        /// Sectors of the disk.
        sectors: u64,
    },
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn guid_at(b: &[u8], at: usize) -> Guid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    Guid(g)
}

/// CRC-32 (IEEE 802.3, as GPT uses).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(bytes)
}

/// Parses sector 0 of a disk of `disk_bytes` bytes with `sector_size`-byte sectors.
///
/// # Errors
/// [`MbrError`] naming the bad slot or partition.
pub fn parse_mbr(sector0: &[u8], sector_size: u32, disk_bytes: u64) -> Result<Sector0, MbrError> {
    if !SECTOR_SIZES.contains(&sector_size) {
        return Err(MbrError::SectorSize(sector_size));
    }
    if sector0.len() < MBR_BYTES {
        return Err(MbrError::Short { len: sector0.len() });
    }
    if sector0[510..512] != MBR_SIGNATURE {
        return Ok(Sector0::NoTable);
    }
    let slots = (0..4u32).map(|i| &sector0[446 + 16 * i as usize..462 + 16 * i as usize]);
    let mut partitions = Vec::new();
    for (i, e) in slots.enumerate() {
        let number = i as u32 + 1;
        let status = e[0];
        if status != 0 && status != 0x80 {
            // A FAT or ext boot sector with 0x55AA but no table lands here.
            return Err(MbrError::BadStatus {
                slot: number,
                status,
            });
        }
        let kind = e[4];
        if kind == MBR_TYPE_PROTECTIVE {
            return Ok(Sector0::Protective);
        }
        let start_lba = u64::from(le32(e, 8));
        let sectors = u64::from(le32(e, 12));
        if kind == 0 || sectors == 0 || MBR_TYPES_EXTENDED.contains(&kind) {
            continue;
        }
        let ss = u64::from(sector_size);
        // u32 LBAs times a 4096-byte sector fit in u64.
        let start = start_lba * ss;
        let len = sectors * ss;
        let end = start + len;
        if end > disk_bytes {
            return Err(MbrError::PastEnd {
                number,
                end,
                disk_bytes,
            });
        }
        partitions.push(Partition {
            number,
            start,
            len,
            part_type: PartType::Mbr(kind),
            partuuid: String::new(),
            name: None,
        });
    }
    let disk_signature = le32(sector0, 440);
    for p in &mut partitions {
        p.partuuid = format!("{disk_signature:08x}-{:02x}", p.number);
    }
    Ok(Sector0::Mbr {
        disk_signature,
        partitions,
    })
}

/// Parses and checks the primary GPT header (`lba1` = the sector at LBA 1).
///
/// # Errors
/// [`GptError`] naming the field that is wrong.
pub fn parse_gpt_header(
    lba1: &[u8],
    sector_size: u32,
    disk_bytes: u64,
) -> Result<GptHeader, GptError> {
    if !SECTOR_SIZES.contains(&sector_size) {
        return Err(GptError::SectorSize(sector_size));
    }
    if lba1.len() < sector_size as usize {
        return Err(GptError::Short {
            what: "header sector",
            need: sector_size as usize,
            got: lba1.len(),
        });
    }
    if &lba1[0..8] != GPT_SIGNATURE {
        return Err(GptError::BadSignature);
    }
    let header_size = le32(lba1, 12);
    if header_size < GPT_HEADER_BYTES_MIN || header_size > sector_size {
        return Err(GptError::HeaderSize(header_size));
    }
    let expected = le32(lba1, 16);
    let mut copy = lba1[..header_size as usize].to_vec();
    copy[16..20].fill(0);
    let actual = crc32(&copy);
    if actual != expected {
        return Err(GptError::HeaderCrc { expected, actual });
    }
    let my_lba = le64(lba1, 24);
    if my_lba != 1 {
        return Err(GptError::MyLba(my_lba));
    }
    let sectors = disk_bytes / u64::from(sector_size);
    let first_usable = le64(lba1, 40);
    let last_usable = le64(lba1, 48);
    if first_usable < 2 || first_usable > last_usable || last_usable >= sectors {
        return Err(GptError::UsableRange {
            first: first_usable,
            last: last_usable,
            sectors,
        });
    }
    let entries_lba = le64(lba1, 72);
    let entries_count = le32(lba1, 80);
    let entry_bytes = le32(lba1, 84);
    if entries_count == 0 || entries_count > GPT_ENTRIES_MAX {
        return Err(GptError::EntryCount(entries_count));
    }
    if !entry_bytes.is_power_of_two()
        || !(GPT_ENTRY_BYTES_MIN..=GPT_ENTRY_BYTES_MAX).contains(&entry_bytes)
    {
        return Err(GptError::EntrySize(entry_bytes));
    }
    // The primary array lies after the header and before the first usable LBA.
    let bytes = u64::from(entries_count) * u64::from(entry_bytes);
    let array_sectors = bytes.div_ceil(u64::from(sector_size));
    if entries_lba < 2
        || entries_lba
            .checked_add(array_sectors)
            .is_none_or(|end| end > first_usable)
    {
        return Err(GptError::EntriesOutside {
            lba: entries_lba,
            bytes,
        });
    }
    Ok(GptHeader {
        disk_guid: guid_at(lba1, 56),
        first_usable,
        last_usable,
        entries_lba,
        entries_count,
        entry_bytes,
        entries_crc: le32(lba1, 88),
    })
}

/// Parses the GPT entries array `bytes` (as [`GptHeader::entries_span`] names it) into the
/// used partitions, numbered by entry index from 1.
///
/// # Errors
/// [`GptError::EntriesCrc`], a partition outside the usable range, or two that overlap.
pub fn parse_gpt_entries(
    header: &GptHeader,
    bytes: &[u8],
    sector_size: u32,
) -> Result<Vec<Partition>, GptError> {
    let (_, need) = header.entries_span(sector_size);
    if bytes.len() < need {
        return Err(GptError::Short {
            what: "entries array",
            need,
            got: bytes.len(),
        });
    }
    let array = &bytes[..need];
    let actual = crc32(array);
    if actual != header.entries_crc {
        return Err(GptError::EntriesCrc {
            expected: header.entries_crc,
            actual,
        });
    }
    let ss = u64::from(sector_size);
    let mut out: Vec<(u64, u64, Partition)> = Vec::new();
    for (i, e) in array.chunks_exact(header.entry_bytes as usize).enumerate() {
        let part_type = guid_at(e, 0);
        if part_type == Guid::ZERO {
            continue;
        }
        let number = i as u32 + 1;
        let start = le64(e, 32);
        let end = le64(e, 40);
        if start < header.first_usable || end < start || end > header.last_usable {
            return Err(GptError::PartitionOutside {
                number,
                start,
                end,
                first: header.first_usable,
                last: header.last_usable,
            });
        }
        if let Some((_, _, other)) = out.iter().find(|(s, e2, _)| start <= *e2 && *s <= end) {
            return Err(GptError::Overlap {
                a: other.number,
                b: number,
            });
        }
        let units: Vec<u16> = (0..36)
            .map(|k| le16(e, 56 + 2 * k))
            .take_while(|&u| u != 0)
            .collect();
        let name = String::from_utf16_lossy(&units);
        // last_usable < disk sectors, so these products fit in u64.
        debug_assert!(start <= end, "checked above: a partition is never empty");
        out.push((
            start,
            end,
            Partition {
                number,
                start: start * ss,
                len: (end - start + 1) * ss,
                part_type: PartType::Gpt(part_type),
                partuuid: guid_at(e, 16).to_string(),
                name: (!name.is_empty()).then_some(name),
            },
        ));
    }
    Ok(out.into_iter().map(|(_, _, p)| p).collect())
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
