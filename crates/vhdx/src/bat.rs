//! The Block Allocation Table (MS-VHDX 2.5): entry encoding, block states, and the
//! interleave of payload and sector-bitmap entries.
//!
//! ```text
//! chunk 0: PB0 PB1 ... PB(cr-1) SB0 | chunk 1: PBcr ... SB1 | ...
//! chunk_ratio cr = 2^23 * logical_sector_size / block_size
//! ```

use crate::{MAX_BLOCK_SIZE, MIB, MIN_BLOCK_SIZE};

/// Payload block states (MS-VHDX 2.5.1.1).
pub const PAYLOAD_BLOCK_NOT_PRESENT: u8 = 0;
/// Contents undefined (read as zeros, or the parent's in a differencing disk).
pub const PAYLOAD_BLOCK_UNDEFINED: u8 = 1;
/// Reads as zeros.
pub const PAYLOAD_BLOCK_ZERO: u8 = 2;
/// Trimmed; may read zeros or old contents.
pub const PAYLOAD_BLOCK_UNMAPPED: u8 = 3;
/// The 0.95 draft's value for UNMAPPED, still seen in files.
pub const PAYLOAD_BLOCK_UNMAPPED_V095: u8 = 5;
/// Whole block stored at FileOffsetMB.
pub const PAYLOAD_BLOCK_FULLY_PRESENT: u8 = 6;
/// Per sector: the sector bitmap says this file (1) or the parent (0).
pub const PAYLOAD_BLOCK_PARTIALLY_PRESENT: u8 = 7;
/// Sector bitmap block absent.
pub const SB_BLOCK_NOT_PRESENT: u8 = 0;
/// Sector bitmap block present at FileOffsetMB.
pub const SB_BLOCK_PRESENT: u8 = 6;
/// A sector bitmap block is 1 MiB.
pub const SECTOR_BITMAP_BLOCK_LEN: u64 = MIB;

/// Errors of BAT geometry or entries.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A block offset inside the first 1 MiB (over the headers) or overflowing.
    #[error("bat entry {index} points at {offset:#x}, over the file headers")]
    EntryOverHeaders {
        /// Entry index.
        index: u64,
        /// File offset.
        offset: u64,
    },
    /// A state value the spec reserves.
    #[error("bat entry {index} has invalid state {state}")]
    InvalidState {
        /// Entry index.
        index: u64,
        /// State bits.
        state: u8,
    },
    /// The geometry is outside the spec (block size, sector size, or a virtual size of zero
    /// or above 64 TiB).
    #[error("invalid geometry: block size {block_size}, logical sector {sector_size}")]
    InvalidGeometry {
        /// Block size.
        block_size: u32,
        /// Logical sector size.
        sector_size: u32,
    },
    /// The BAT region is too small for the entries the geometry needs.
    #[error("bat region of {region_len} bytes holds fewer than the {needed} entries needed")]
    RegionTooSmall {
        /// Region bytes.
        region_len: u64,
        /// Entries needed.
        needed: u64,
    },
    /// PARTIALLY_PRESENT in a disk without a parent.
    #[error("bat entry {index} is partially present in a disk with no parent")]
    PartialWithoutParent {
        /// Entry index.
        index: u64,
    },
}

/// One 64-bit BAT entry: state in bits 0-2, FileOffsetMB in bits 20-63.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry(pub u64);

impl Entry {
    /// An entry with a state and a (1 MiB aligned) file offset.
    pub fn new(state: u8, file_offset: u64) -> Entry {
        debug_assert_eq!(file_offset % MIB, 0, "bat offsets are 1 MiB aligned");
        Entry((file_offset & !(MIB - 1)) | u64::from(state & 7))
    }

    /// The state bits.
    pub fn state(self) -> u8 {
        (self.0 & 7) as u8
    }

    /// The file offset in bytes.
    pub fn file_offset(self) -> u64 {
        self.0 & !(MIB - 1)
    }
}

/// The BAT geometry of one disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Payload block size.
    pub block_size: u32,
    /// Logical sector size.
    pub logical_sector_size: u32,
    /// Virtual disk size.
    pub virtual_size: u64,
    /// Differencing disk (the BAT counts whole chunks).
    pub has_parent: bool,
}

impl Layout {
    /// Validates and builds a layout.
    ///
    /// # Errors
    /// [`Error::InvalidGeometry`] for block or sector sizes outside the spec.
    pub fn new(
        block_size: u32,
        logical_sector_size: u32,
        virtual_size: u64,
        has_parent: bool,
    ) -> Result<Layout, Error> {
        if !block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
            || !(logical_sector_size == 512 || logical_sector_size == 4096)
            || virtual_size == 0
            || virtual_size > crate::MAX_VIRTUAL_SIZE
        {
            return Err(Error::InvalidGeometry {
                block_size,
                sector_size: logical_sector_size,
            });
        }
        Ok(Layout {
            block_size,
            logical_sector_size,
            virtual_size,
            has_parent,
        })
    }

    /// Payload blocks per sector bitmap block.
    pub fn chunk_ratio(&self) -> u64 {
        ((1u64 << 23) * u64::from(self.logical_sector_size)) / u64::from(self.block_size)
    }

    /// Bytes of virtual disk one chunk covers.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_ratio() * u64::from(self.block_size)
    }

    /// Number of payload blocks.
    pub fn data_blocks(&self) -> u64 {
        self.virtual_size.div_ceil(u64::from(self.block_size))
    }

    /// Number of sector bitmap blocks (chunks).
    pub fn bitmap_blocks(&self) -> u64 {
        self.data_blocks().div_ceil(self.chunk_ratio())
    }

    /// Number of BAT entries (MS-VHDX 2.5).
    pub fn total_entries(&self) -> u64 {
        let d = self.data_blocks();
        if self.has_parent {
            self.bitmap_blocks() * (self.chunk_ratio() + 1)
        } else {
            d + d.saturating_sub(1) / self.chunk_ratio()
        }
    }

    /// The BAT region length this layout needs, rounded up to 1 MiB.
    pub fn region_len(&self) -> u64 {
        // Room for the differencing interleave too, so a dynamic disk can gain a parent.
        let entries = self.bitmap_blocks() * (self.chunk_ratio() + 1);
        (entries * 8).div_ceil(MIB).max(1) * MIB
    }

    /// BAT index of payload block `block`.
    pub fn payload_index(&self, block: u64) -> u64 {
        block + block / self.chunk_ratio()
    }

    /// BAT index of the sector bitmap block of chunk `chunk`.
    pub fn bitmap_index(&self, chunk: u64) -> u64 {
        chunk * (self.chunk_ratio() + 1) + self.chunk_ratio()
    }

    /// Sectors per payload block.
    pub fn sectors_per_block(&self) -> u64 {
        u64::from(self.block_size / self.logical_sector_size)
    }
}

/// Decodes the BAT entries this layout needs from the region bytes and validates them.
///
/// # Errors
/// Region too small, reserved states, offsets over the headers, PARTIALLY_PRESENT without a
/// parent, SB_BLOCK_PRESENT without a parent.
pub fn parse(layout: &Layout, region: &[u8]) -> Result<Vec<Entry>, Error> {
    let needed = layout.total_entries();
    if (region.len() as u64) < needed * 8 {
        return Err(Error::RegionTooSmall {
            region_len: region.len() as u64,
            needed,
        });
    }
    let cr = layout.chunk_ratio();
    let mut out = Vec::with_capacity(needed as usize);
    for (i, c) in region.chunks_exact(8).take(needed as usize).enumerate() {
        let index = i as u64;
        let e = Entry(u64::from_le_bytes(c.try_into().expect("8-byte chunk")));
        let state = e.state();
        let is_sb = index % (cr + 1) == cr;
        let ok = if is_sb {
            state == SB_BLOCK_NOT_PRESENT || (state == SB_BLOCK_PRESENT && layout.has_parent)
        } else {
            !matches!(state, 4) && (state != PAYLOAD_BLOCK_PARTIALLY_PRESENT || layout.has_parent)
        };
        if !ok {
            if state == PAYLOAD_BLOCK_PARTIALLY_PRESENT {
                return Err(Error::PartialWithoutParent { index });
            }
            return Err(Error::InvalidState { index, state });
        }
        let present = if is_sb {
            state == SB_BLOCK_PRESENT
        } else {
            matches!(
                state,
                PAYLOAD_BLOCK_FULLY_PRESENT | PAYLOAD_BLOCK_PARTIALLY_PRESENT
            )
        };
        if present && e.file_offset() < MIB {
            return Err(Error::EntryOverHeaders {
                index,
                offset: e.file_offset(),
            });
        }
        out.push(e);
    }
    Ok(out)
}

/// True when `index` is a sector bitmap entry.
pub fn is_bitmap_index(layout: &Layout, index: u64) -> bool {
    let cr = layout.chunk_ratio();
    index % (cr + 1) == cr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(bs: u32, ss: u32, size: u64, parent: bool) -> Layout {
        Layout::new(bs, ss, size, parent).unwrap()
    }

    #[test]
    fn chunk_ratios_match_the_spec() {
        assert_eq!(layout(32 << 20, 512, 1 << 30, false).chunk_ratio(), 128);
        assert_eq!(layout(1 << 20, 512, 1 << 30, false).chunk_ratio(), 4096);
        assert_eq!(layout(32 << 20, 4096, 1 << 30, false).chunk_ratio(), 1024);
    }

    #[test]
    fn entry_counts_follow_the_interleave() {
        // 1 GiB of 32 MiB blocks: 32 data blocks, no bitmap entry needed inside the data.
        assert_eq!(layout(32 << 20, 512, 1 << 30, false).total_entries(), 32);
        // 1 MiB blocks with chunk ratio 4096, 10 GiB = 10240 blocks: 2 interleaved SB entries.
        assert_eq!(
            layout(1 << 20, 512, 10 << 30, false).total_entries(),
            10240 + 2
        );
        // Differencing disks count whole chunks.
        assert_eq!(layout(32 << 20, 512, 1 << 30, true).total_entries(), 129);
    }

    #[test]
    fn payload_and_bitmap_indices_interleave() {
        let l = layout(1 << 20, 512, 10 << 30, true);
        assert_eq!(l.payload_index(4095), 4095);
        assert_eq!(l.bitmap_index(0), 4096);
        assert_eq!(l.payload_index(4096), 4097);
        assert!(is_bitmap_index(&l, 4096));
    }

    #[test]
    fn entry_encoding() {
        let e = Entry::new(PAYLOAD_BLOCK_FULLY_PRESENT, 8 * MIB);
        assert_eq!(e.0, 0x0080_0006);
        assert_eq!((e.state(), e.file_offset()), (6, 8 * MIB));
    }

    #[test]
    fn block_over_headers_is_refused() {
        let l = layout(1 << 20, 512, 4 << 20, false);
        let mut region = vec![0u8; 32];
        region[0..8].copy_from_slice(
            &Entry(u64::from(PAYLOAD_BLOCK_FULLY_PRESENT))
                .0
                .to_le_bytes(),
        );
        assert_eq!(
            parse(&l, &region),
            Err(Error::EntryOverHeaders {
                index: 0,
                offset: 0
            })
        );
    }

    #[test]
    fn non_power_of_two_block_is_refused() {
        assert!(Layout::new(3 << 20, 512, 1 << 30, false).is_err());
    }
}
