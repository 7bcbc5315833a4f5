//! Writing dynamic VHD files: the output side of `convert`, `capture` and `merge` when the
//! output format is VHD (see `VHDX-VHD-NOTES.md` B.1-B.4). The reader is [`super::VhdImage`].
//!
//! # Design notes
//!
//! * **Append only.** A block is allocated the first time a write reaches it, at the end of
//!   what has been written so far; blocks are never moved or freed.
//! * **Metadata last.** The BAT lives in memory and is written with the dynamic header and
//!   both footers by [`VhdWriter::finish`]. VHD has no journal, so nothing would make an
//!   earlier copy crash-safe, and an output whose copy fails is removed anyway.
//! * **Invariants** (checked by `debug_assert!`s, free in release builds): a block's BAT entry
//!   decodes, through the codec, to the data offset the writer used; blocks lie past the BAT,
//!   do not overlap and start on a sector; the footer, the dynamic header and the BAT decode to
//!   what was encoded, and describe the size and the blocks written.

use std::sync::Arc;

use vhdx::Guid;

use crate::device::{self, BlockDevice};
use crate::{Error, ErrorKind, Result, Storage};

/// The largest VHD written: 2040 GiB, qemu's limit (`VHD_MAX_SECTORS`), below Hyper-V's 2 TiB.
pub const VHD_SIZE_MAX: u64 = 0xff00_0000 * 512;
/// The block size of the VHDs written (the format's default).
pub const VHD_BLOCK_SIZE: u32 = vhdx::vhd::dynamic::DEFAULT_BLOCK_SIZE;
/// Where the BAT of a written VHD starts: after the footer copy (512) and the dynamic header.
const VHD_BAT_OFFSET: u64 = 512 + 1024;

/// A dynamic VHD being written (see `VHDX-VHD-NOTES.md` B.1–B.4).
///
/// Layout: footer copy at 0, dynamic header at 512, BAT at 1536, then the blocks in the order
/// they are first written, each a 512-byte all-ones sector bitmap followed by its data (the
/// data 4 KiB aligned, hence 3.5 KiB of padding per block), then the footer. The BAT lives in
/// memory until [`VhdWriter::finish`] writes it with the headers: VHD has no journal, and an
/// output that fails is removed anyway. CurrentSize is exact and the creator is `win `, so
/// Hyper-V, qemu and Ferry all take the size from CurrentSize, not from the CHS geometry.
#[derive(Debug)]
pub(crate) struct VhdWriter {
    storage: Arc<dyn Storage>,
    size: u64,
    /// BAT entries (sector offsets of the blocks' bitmaps) and the offset of the next block.
    /// Written by the pipeline's writer; read by `finish` after it.
    alloc: std::sync::Mutex<(Vec<u32>, u64)>,
}

impl VhdWriter {
    /// Checks that a VHD can hold `size` bytes.
    #[allow(
        clippy::manual_is_multiple_of,
        reason = "u64::is_multiple_of needs Rust 1.87; MSRV is 1.85"
    )]
    pub(crate) fn check_size(size: u64) -> Result<()> {
        if size == 0 || size > VHD_SIZE_MAX || size % 512 != 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("vhd size {size} must be a multiple of 512 between 512 bytes and 2040 GiB"),
            ));
        }
        Ok(())
    }

    /// A writer of a `size`-byte dynamic VHD into `storage` (empty; [`Self::check_size`]
    /// passed). Nothing is written before the first block.
    pub(crate) fn new(storage: Arc<dyn Storage>, size: u64) -> VhdWriter {
        let entries = size.div_ceil(u64::from(VHD_BLOCK_SIZE));
        let first = Self::block_start(VHD_BAT_OFFSET + Self::bat_len(entries));
        let entries = vec![vhdx::vhd::bat::BAT_ENTRY_UNALLOCATED; entries as usize];
        VhdWriter {
            storage,
            size,
            alloc: std::sync::Mutex::new((entries, first)),
        }
    }

    /// The first block start at or after `at` whose data (after the 512-byte bitmap) is 4 KiB
    /// aligned.
    fn block_start(at: u64) -> u64 {
        (at + 512).next_multiple_of(4096) - 512
    }

    fn bitmap_len() -> u64 {
        u64::from(vhdx::vhd::bat::bitmap_size(VHD_BLOCK_SIZE))
    }

    /// The bytes of a BAT of `entries` entries, padded to a whole sector.
    fn bat_len(entries: u64) -> u64 {
        (entries * 4).next_multiple_of(512)
    }

    /// The file offset of the data of `block`, allocating the block when `allocate`.
    fn block_data(&self, block: u64, allocate: bool) -> Result<Option<u64>> {
        let mut st = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let entry = st.0[block as usize];
        if entry != vhdx::vhd::bat::BAT_ENTRY_UNALLOCATED {
            return Ok(Some(u64::from(entry) * 512 + Self::bitmap_len()));
        }
        if !allocate {
            return Ok(None);
        }
        let at = st.1;
        let sector = u32::try_from(at / 512).map_err(|_| {
            Error::new(
                ErrorKind::LimitExceeded,
                "vhd file offset past 2 TiB of sectors",
            )
        })?;
        // A sector of BAT_ENTRY_UNALLOCATED would make the block read as unallocated; the size
        // limit keeps every block start below it.
        debug_assert_ne!(
            sector,
            vhdx::vhd::bat::BAT_ENTRY_UNALLOCATED,
            "block {block}"
        );
        debug_assert_eq!(
            u64::from(sector) * 512,
            at,
            "block {block} starts on a sector"
        );
        debug_assert!(
            at >= VHD_BAT_OFFSET + Self::bat_len(st.0.len() as u64),
            "block {block} at {at:#x} overlaps the bat"
        );
        self.storage
            .write_at(&vec![0xff; Self::bitmap_len() as usize], at)?;
        st.0[block as usize] = sector;
        st.1 = Self::block_start(at + Self::bitmap_len() + u64::from(VHD_BLOCK_SIZE));
        // Paired with the checks above: the entry decodes, the way a reader decodes it, to the
        // data offset returned, 4 KiB aligned, and the next block starts past this one.
        let data = at + Self::bitmap_len();
        debug_assert_eq!(
            vhdx::vhd::bat::block_data_offset(st.0[block as usize], VHD_BLOCK_SIZE),
            data,
            "bat entry of block {block}"
        );
        debug_assert_eq!(data % 4096, 0, "data of block {block} is 4 KiB aligned");
        debug_assert!(st.1 >= data + u64::from(VHD_BLOCK_SIZE), "block {block}");
        Ok(Some(data))
    }

    /// Calls `f(block data offset if any, offset in buf, offset in block, len)` per block.
    fn per_block(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        mut f: impl FnMut(Option<u64>, usize, usize) -> Result<()>,
    ) -> Result<()> {
        device::check_bounds(self.size, offset, len)?;
        let bs = u64::from(VHD_BLOCK_SIZE);
        let mut pos = offset;
        while pos < offset + len {
            let n = (bs - pos % bs).min(offset + len - pos);
            let at = self.block_data(pos / bs, allocate)?.map(|d| d + pos % bs);
            f(at, (pos - offset) as usize, n as usize)?;
            pos += n;
        }
        Ok(())
    }

    /// Writes the BAT, the dynamic header and both footers, then fsyncs.
    ///
    /// # Errors
    /// I/O failures of the store.
    pub(crate) fn finish(&self) -> Result<()> {
        use vhdx::vhd::{Bat, Chs, DiskType, DynamicHeader, Footer, Locator, chs_for_size};
        let (entries, end) = self.alloc.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let count = u32::try_from(entries.len()).expect("at most 2040 GiB / 2 MiB entries");
        let header = DynamicHeader {
            data_offset: u64::MAX,
            table_offset: VHD_BAT_OFFSET,
            header_version: vhdx::vhd::dynamic::HEADER_VERSION,
            max_table_entries: count,
            block_size: VHD_BLOCK_SIZE,
            parent_unique_id: Guid::ZERO,
            parent_timestamp: 0,
            parent_unicode_name: String::new(),
            locators: [Locator::UNUSED; vhdx::vhd::dynamic::LOCATOR_COUNT],
        };
        let since_2000 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                d.as_secs()
                    .saturating_sub(vhdx::vhd::footer::VHD_EPOCH_UNIX_SECONDS)
            });
        let footer = Footer {
            features: vhdx::vhd::footer::FEATURE_RESERVED,
            file_format_version: vhdx::vhd::footer::FILE_FORMAT_VERSION,
            data_offset: 512,
            timestamp: u32::try_from(since_2000).unwrap_or(u32::MAX),
            creator_app: *b"win ",
            creator_version: 0x000A_0000,
            creator_host_os: *b"Wi2k",
            original_size: self.size,
            current_size: self.size,
            geometry: if self.size > Chs::MAX.size_bytes() {
                Chs::MAX
            } else {
                chs_for_size(self.size)
            },
            disk_type: DiskType::Dynamic,
            unique_id: Guid::from_random(*uuid::Uuid::new_v4().as_bytes()),
            saved_state: 0,
        };
        let bat = Bat::from_entries(entries);
        let (bat_bytes, header_bytes, footer_bytes) =
            (bat.to_bytes(), header.to_bytes(), footer.to_bytes());
        if cfg!(debug_assertions) {
            self.assert_metadata(
                (&footer, &footer_bytes),
                (&header, &header_bytes),
                (&bat, &bat_bytes),
                end,
            );
        }
        self.storage.write_at(&bat_bytes, VHD_BAT_OFFSET)?;
        self.storage.write_at(&header_bytes, 512)?;
        self.storage.write_at(&footer_bytes, 0)?;
        // The data of the last block may end before `end`; the footer goes after all of it.
        self.storage.write_at(&footer_bytes, end)?;
        self.storage.set_len(end + 512)?;
        self.storage.flush()
    }

    /// Debug builds only: the metadata `finish` is about to write decodes to what was encoded
    /// and agrees with itself and with the blocks written (a reader would take the size from
    /// the footer and find every block through the header's BAT, inside the file).
    fn assert_metadata(
        &self,
        (footer, footer_bytes): (&vhdx::vhd::Footer, &[u8]),
        (header, header_bytes): (&vhdx::vhd::DynamicHeader, &[u8]),
        (bat, bat_bytes): (&vhdx::vhd::Bat, &[u8]),
        end: u64,
    ) {
        let f = vhdx::vhd::Footer::parse(footer_bytes).expect("the footer written parses");
        assert!(f.checksum.is_ok(), "footer checksum");
        assert_eq!(&f.value, footer, "footer round trip");
        assert_eq!(
            vhdx::vhd::virtual_size(&f.value),
            self.size,
            "size read back"
        );
        assert_eq!(
            f.value.data_offset, 512,
            "the dynamic header is written at 512"
        );
        let h = vhdx::vhd::DynamicHeader::parse(header_bytes).expect("the header written parses");
        assert!(h.checksum.is_ok(), "dynamic header checksum");
        assert_eq!(&h.value, header, "dynamic header round trip");
        assert_eq!(
            h.value.table_offset, VHD_BAT_OFFSET,
            "the bat is written there"
        );
        let count = h
            .value
            .entries_for_size(self.size)
            .expect("the bat covers the size");
        let decoded = vhdx::vhd::Bat::parse(bat_bytes, count).expect("the bat written parses");
        assert_eq!(&decoded, bat, "bat round trip");
        let first = Self::block_start(VHD_BAT_OFFSET + Self::bat_len(u64::from(count)));
        let block_len = Self::bitmap_len() + u64::from(h.value.block_size);
        let mut starts: Vec<u64> = (0..u64::from(count))
            .filter_map(|index| decoded.block_sector(index))
            .map(|sector| u64::from(sector) * 512)
            .collect();
        starts.sort_unstable();
        for w in starts.windows(2) {
            assert!(
                w[0] + block_len <= w[1],
                "blocks at {:#x} and {:#x} overlap",
                w[0],
                w[1]
            );
        }
        if let (Some(&lo), Some(&hi)) = (starts.first(), starts.last()) {
            assert!(lo >= first, "a block at {lo:#x} lies over the bat");
            assert!(
                hi + block_len <= end,
                "a block at {hi:#x} ends past the footer at {end:#x}"
            );
        }
    }
}

impl BlockDevice for VhdWriter {
    fn fast_path(&self) -> Option<&dyn crate::FastPath> {
        None
    }

    fn geometry(&self) -> device::Geometry {
        device::Geometry {
            size: self.size,
            logical_sector_size: 512,
            physical_sector_size: 512,
            block_size: VHD_BLOCK_SIZE,
        }
    }

    fn format(&self) -> &'static str {
        "vhd"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.per_block(offset, buf.len() as u64, false, |at, rel, n| match at {
            Some(at) => self.storage.read_at(&mut buf[rel..rel + n], at),
            None => {
                buf[rel..rel + n].fill(0);
                Ok(())
            }
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.per_block(offset, buf.len() as u64, true, |at, rel, n| {
            let at = at.expect("per_block allocates when asked to");
            self.storage.write_at(&buf[rel..rel + n], at)
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        // Unallocated blocks read as zeros; allocated ones get zeros written.
        let zeros = vec![0u8; len.min(u64::from(VHD_BLOCK_SIZE)) as usize];
        self.per_block(offset, len, false, |at, _, n| match at {
            Some(at) => self.storage.write_at(&zeros[..n], at),
            None => Ok(()),
        })
    }

    fn can_write(&self) -> bool {
        true
    }
}
