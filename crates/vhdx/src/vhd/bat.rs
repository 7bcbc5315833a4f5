//! The VHD Block Allocation Table and sector bitmaps (VHD spec, "Block Allocation Table and
//! Data Blocks").
//!
//! ```text
//! BAT:    MaxTableEntries x u32 BE at TableOffset; entry = sector offset of the block,
//!         0xFFFFFFFF = unallocated; padded with 0xFFFFFFFF to a 512-byte multiple.
//! block:  [ sector bitmap: ceil(BlockSize / 512 / 8) rounded up to 512 ][ data: BlockSize ]
//! bitmap: MSB-first, bit 7 of byte 0 = the block's first sector; 1 = stored in this file.
//! ```
//!
//! The bit order is the opposite of VHDX's (LSB-first, `crate::bitmap`); never copy one
//! bitmap into the other.

use super::SECTOR_SIZE;
use super::dynamic::MAX_TABLE_ENTRIES;

/// The BAT entry of a block that is not allocated.
pub const BAT_ENTRY_UNALLOCATED: u32 = 0xFFFF_FFFF;
/// Bytes per BAT entry.
pub const BAT_ENTRY_LEN: usize = 4;

/// Errors decoding a BAT.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// More entries asked for than [`MAX_TABLE_ENTRIES`].
    #[error("bat entry count {entries} exceeds {max}")]
    TooManyEntries {
        /// Entries asked for.
        entries: u32,
        /// The limit.
        max: u32,
    },
    /// Fewer bytes than the entries need.
    #[error("bat truncated: {len} bytes for {entries} entries")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Entries asked for.
        entries: u32,
    },
}

/// A decoded BAT.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bat {
    entries: Vec<u32>,
}

impl Bat {
    /// Decodes the first `entries` big-endian entries of `b`.
    ///
    /// # Errors
    /// `TooManyEntries` above [`MAX_TABLE_ENTRIES`]; `Truncated` when `b` is too short.
    pub fn parse(b: &[u8], entries: u32) -> Result<Bat, Error> {
        if entries > MAX_TABLE_ENTRIES {
            return Err(Error::TooManyEntries {
                entries,
                max: MAX_TABLE_ENTRIES,
            });
        }
        // `entries` is at most 2^24, so the byte count fits usize on every supported target.
        let need = entries as usize * BAT_ENTRY_LEN;
        let Some(b) = b.get(..need) else {
            return Err(Error::Truncated {
                len: b.len(),
                entries,
            });
        };
        let entries = b
            .chunks_exact(BAT_ENTRY_LEN)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Bat { entries })
    }

    /// Builds a BAT from raw entries (for writers and tests).
    pub fn from_entries(entries: Vec<u32>) -> Bat {
        Bat { entries }
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The sector offset of block `index`'s bitmap, or `None` when the block is unallocated or
    /// past the table.
    pub fn block_sector(&self, index: u64) -> Option<u32> {
        let i = usize::try_from(index).ok()?;
        self.entries
            .get(i)
            .copied()
            .filter(|&e| e != BAT_ENTRY_UNALLOCATED)
    }

    /// The number of allocated blocks.
    pub fn allocated_blocks(&self) -> usize {
        self.entries
            .iter()
            .filter(|&&e| e != BAT_ENTRY_UNALLOCATED)
            .count()
    }

    /// Encodes the table padded with unallocated entries to a multiple of 512 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = (self.entries.len() * BAT_ENTRY_LEN).next_multiple_of(512);
        let mut out = vec![0xff; len];
        for (slot, e) in out.chunks_exact_mut(BAT_ENTRY_LEN).zip(&self.entries) {
            slot.copy_from_slice(&e.to_be_bytes());
        }
        out
    }
}

/// The size in bytes of the sector bitmap in front of each block: one bit per sector, rounded
/// up to a whole sector (512 bytes for 2 MiB blocks).
pub fn bitmap_size(block_size: u32) -> u32 {
    let bits = u64::from(block_size).div_ceil(SECTOR_SIZE);
    let len = bits.div_ceil(8).next_multiple_of(SECTOR_SIZE);
    // At most ceil(2^32 / 512 / 8) rounded to 512 = 2^20.
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The file offset of the data of a block whose BAT entry is `sector`.
pub fn block_data_offset(sector: u32, block_size: u32) -> u64 {
    u64::from(sector) * SECTOR_SIZE + u64::from(bitmap_size(block_size))
}

/// True when the bitmap marks `sector` (relative to the block) as stored in this file.
/// Sectors past the bitmap read as not stored.
pub fn sector_present(bitmap: &[u8], sector: u64) -> bool {
    let Ok(byte) = usize::try_from(sector / 8) else {
        return false;
    };
    bitmap
        .get(byte)
        .is_some_and(|b| b & (0x80 >> (sector % 8)) != 0)
}

/// A run of bytes inside one block with the same bitmap state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitmapRun {
    /// True when stored in this file (bit 1), false when it comes from the parent (bit 0).
    pub present: bool,
    /// Length in bytes.
    pub len_bytes: u64,
}

/// Splits `[offset_bytes, offset_bytes + len_bytes)` of a block into maximal runs of equal
/// bitmap state. Bytes past the bitmap's last bit form one run of "not stored". The runs' lengths
/// add up to `len_bytes` (saturated at `u64::MAX - offset_bytes`).
pub fn bitmap_runs(bitmap: &[u8], offset_bytes: u64, len_bytes: u64) -> Vec<BitmapRun> {
    let mut runs: Vec<BitmapRun> = Vec::new();
    let mut push = |present: bool, len_bytes: u64| match runs.last_mut() {
        Some(last) if last.present == present => last.len_bytes += len_bytes,
        _ => runs.push(BitmapRun { present, len_bytes }),
    };
    let end = offset_bytes.saturating_add(len_bytes);
    let bits_end = (bitmap.len() as u64)
        .saturating_mul(8)
        .saturating_mul(SECTOR_SIZE);
    let mut pos = offset_bytes;
    while pos < end {
        if pos >= bits_end {
            push(false, end - pos);
            break;
        }
        let sector = pos / SECTOR_SIZE;
        let next = ((sector + 1) * SECTOR_SIZE).min(end);
        push(sector_present(bitmap, sector), next - pos);
        pos = next;
    }
    runs
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn entries_decode_big_endian() {
        let bat = Bat::parse(&[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff], 2).unwrap();
        assert_eq!((bat.block_sector(0), bat.block_sector(1)), (Some(4), None));
    }

    #[test]
    fn index_past_table_is_unallocated() {
        let bat = Bat::from_entries(vec![4]);
        assert_eq!(bat.block_sector(1), None);
    }

    #[test]
    fn short_table_is_truncated() {
        assert_eq!(
            Bat::parse(&[0; 7], 2),
            Err(Error::Truncated { len: 7, entries: 2 })
        );
    }

    #[test]
    fn absurd_entry_count_is_refused() {
        assert!(matches!(
            Bat::parse(&[], u32::MAX),
            Err(Error::TooManyEntries { .. })
        ));
    }

    #[test]
    fn encoding_pads_with_unallocated() {
        let b = Bat::from_entries(vec![0x0000_0004]).to_bytes();
        assert_eq!(
            (b.len(), &b[..8]),
            (512, &[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff][..])
        );
    }

    #[test]
    fn bitmap_of_2_mib_block_is_one_sector() {
        // 4096 sectors -> 512 bytes of bits, already a whole sector.
        assert_eq!(bitmap_size(2 << 20), 512);
    }

    #[test]
    fn bitmap_of_small_block_rounds_up_to_a_sector() {
        // 512 KiB -> 1024 sectors -> 128 bytes, rounded up to 512.
        assert_eq!(bitmap_size(512 << 10), 512);
    }

    #[test]
    fn bitmap_of_large_block_spans_sectors() {
        // 16 MiB -> 32768 sectors -> 4096 bytes.
        assert_eq!(bitmap_size(16 << 20), 4096);
    }

    #[test]
    fn data_follows_the_bitmap() {
        // The Windows sample's block 0 has its bitmap at sector 159.
        assert_eq!(block_data_offset(159, 2 << 20), 159 * 512 + 512);
    }

    #[test]
    fn bitmap_is_msb_first() {
        let bitmap = [0b1000_0001u8];
        assert!(sector_present(&bitmap, 0) && sector_present(&bitmap, 7));
        assert!(!sector_present(&bitmap, 1) && !sector_present(&bitmap, 8));
    }

    #[test]
    fn runs_split_at_sector_edges() {
        // Sector 0 present, sector 1 absent, sector 2 present; the range starts mid-sector 0.
        let bitmap = [0b1010_0000u8];
        let runs = bitmap_runs(&bitmap, 256, 1024);
        let expected = vec![
            BitmapRun {
                present: true,
                len_bytes: 256,
            },
            BitmapRun {
                present: false,
                len_bytes: 512,
            },
            BitmapRun {
                present: true,
                len_bytes: 256,
            },
        ];
        assert_eq!(runs, expected);
    }

    #[test]
    fn runs_past_the_bitmap_are_absent() {
        let runs = bitmap_runs(&[0xff], 4096 - 512, u64::MAX);
        assert_eq!(
            runs[0],
            BitmapRun {
                present: true,
                len_bytes: 512
            }
        );
        assert!(!runs[1].present);
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64), n in any::<u32>()) {
            let _ = Bat::parse(&b, n);
        }

        #[test]
        fn encode_parse_round_trips(entries in proptest::collection::vec(any::<u32>(), 0..300)) {
            let bat = Bat::from_entries(entries.clone());
            let n = u32::try_from(entries.len()).unwrap();
            prop_assert_eq!(Bat::parse(&bat.to_bytes(), n).unwrap(), bat);
        }

        #[test]
        fn runs_match_a_per_byte_reference(
            bitmap in proptest::collection::vec(any::<u8>(), 0..4),
            offset in 0u64..20_000,
            len in 0u64..20_000,
        ) {
            let runs = bitmap_runs(&bitmap, offset, len);
            let mut naive = Vec::new();
            for byte in offset..offset + len {
                naive.push(sector_present(&bitmap, byte / 512));
            }
            let flat: Vec<bool> = runs
                .iter()
                .flat_map(|r| std::iter::repeat_n(r.present, usize::try_from(r.len_bytes).unwrap()))
                .collect();
            prop_assert_eq!(flat, naive);
            prop_assert!(runs.windows(2).all(|w| w[0].present != w[1].present));
        }
    }
}
