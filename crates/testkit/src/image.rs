//! A sparse in-memory byte image: what each of [`SimDisk`](crate::SimDisk)'s two views (live and
//! durable) is made of.
//!
//! # Design notes
//!
//! The image is a length plus a map from block index to a [`BLOCK_BYTES`] block. Absent blocks
//! are holes and read as zeros, so a simulated 1 TiB fixed disk costs only the blocks written,
//! and `next_data` / `next_hole` answer at block granularity the way SEEK_DATA / SEEK_HOLE do
//! on a filesystem with 4 KiB blocks. A flat `Vec<u8>` was rejected: `set_len` of a large
//! image would allocate all of it, and holes would be invisible.
//!
//! Invariants (checked by [`Image::check_invariants`] in tests):
//! * no block starts at or past `len`;
//! * the bytes of the last, partial block past `len` are zero, so growing the image again
//!   reads zeros there without extra work.

use std::collections::BTreeMap;

/// Allocation granule: the block size of the simulated filesystem.
pub(crate) const BLOCK_BYTES: u64 = 4096;

/// A sparse byte image.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Image {
    /// Logical length in bytes.
    len: u64,
    /// Allocated blocks by index; each holds exactly `BLOCK_BYTES` bytes.
    blocks: BTreeMap<u64, Box<[u8]>>,
}

/// The block index and the in-block range of each piece of `[offset, offset + len)`.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / BLOCK_BYTES;
        let start = (pos % BLOCK_BYTES) as usize;
        let n = (end - pos).min(BLOCK_BYTES - start as u64) as usize;
        let done = (pos - offset) as usize;
        pos += n as u64;
        Some((index, start, n, done))
    })
}

fn zero_block() -> Box<[u8]> {
    vec![0u8; BLOCK_BYTES as usize].into_boxed_slice()
}

impl Image {
    /// An image holding `bytes`; all-zero blocks start as holes (like `cp --sparse=always`).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Image {
        let mut image = Image {
            len: bytes.len() as u64,
            blocks: BTreeMap::new(),
        };
        for (index, chunk) in bytes.chunks(BLOCK_BYTES as usize).enumerate() {
            if chunk.iter().any(|&b| b != 0) {
                let mut block = zero_block();
                block[..chunk.len()].copy_from_slice(chunk);
                image.blocks.insert(index as u64, block);
            }
        }
        image
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// How many blocks hold data.
    pub(crate) fn allocated_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Fills `buf` from `offset`; holes and bytes past the end read as zeros.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) {
        for (index, start, n, done) in pieces(offset, buf.len() as u64) {
            let out = &mut buf[done..done + n];
            match self.blocks.get(&index) {
                Some(block) => out.copy_from_slice(&block[start..start + n]),
                None => out.fill(0),
            }
        }
    }

    /// Writes `data` at `offset`, growing the image if it ends past `len`. The caller checks
    /// that `offset + data.len()` does not overflow.
    pub(crate) fn write(&mut self, data: &[u8], offset: u64) {
        for (index, start, n, done) in pieces(offset, data.len() as u64) {
            let block = self.blocks.entry(index).or_insert_with(zero_block);
            block[start..start + n].copy_from_slice(&data[done..done + n]);
        }
        if !data.is_empty() {
            self.len = self.len.max(offset + data.len() as u64);
        }
    }

    /// Truncates or extends (with zeros) to `len`.
    pub(crate) fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(BLOCK_BYTES);
            self.blocks.split_off(&first_gone);
            let tail = (len % BLOCK_BYTES) as usize;
            if let Some(block) = self
                .blocks
                .get_mut(&(len / BLOCK_BYTES))
                .filter(|_| tail != 0)
            {
                block[tail..].fill(0);
            }
        }
        self.len = len;
    }

    /// Makes `[offset, offset + len)` read as zeros without changing the length (like
    /// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`). Whole blocks become holes.
    pub(crate) fn punch_hole(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len);
        if offset >= end {
            return;
        }
        for (index, start, n, _) in pieces(offset, end - offset) {
            if n as u64 == BLOCK_BYTES {
                self.blocks.remove(&index);
            } else if let Some(block) = self.blocks.get_mut(&index) {
                block[start..start + n].fill(0);
            }
        }
    }

    /// SEEK_DATA: the first offset at or after `offset` inside an allocated block; `None` at
    /// or past the end, or when only holes follow.
    pub(crate) fn next_data(&self, offset: u64) -> Option<u64> {
        if offset >= self.len {
            return None;
        }
        let index = offset / BLOCK_BYTES;
        let (&first, _) = self.blocks.range(index..).next()?;
        Some(if first == index {
            offset
        } else {
            first * BLOCK_BYTES
        })
    }

    /// SEEK_HOLE: the first offset at or after `offset` in a hole, counting the end as a hole.
    /// At or past the end it returns the length, as `disk::FileStorage` does.
    pub(crate) fn next_hole(&self, offset: u64) -> u64 {
        if offset >= self.len {
            return self.len;
        }
        let mut index = offset / BLOCK_BYTES;
        if !self.blocks.contains_key(&index) {
            return offset;
        }
        for (&i, _) in self.blocks.range(index + 1..) {
            if i != index + 1 {
                break;
            }
            index = i;
        }
        ((index + 1) * BLOCK_BYTES).min(self.len)
    }

    /// The whole image as a flat vector.
    ///
    /// # Panics
    /// When the length does not fit in memory's address space (`usize`).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let len = usize::try_from(self.len).expect("image length fits in usize");
        let mut out = vec![0u8; len];
        self.read(&mut out, 0);
        out
    }

    /// Asserts the invariants of the design notes.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        if let Some((&last, block)) = self.blocks.last_key_value() {
            assert!(
                last * BLOCK_BYTES < self.len,
                "block {last} starts past len {}",
                self.len
            );
            let tail = (self.len - last * BLOCK_BYTES).min(BLOCK_BYTES) as usize;
            assert!(
                block[tail..].iter().all(|&b| b == 0),
                "bytes past len are not zero"
            );
        }
        assert!(
            self.blocks
                .values()
                .all(|b| b.len() == BLOCK_BYTES as usize)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_across_blocks_reads_back() {
        let mut image = Image::default();
        // 10 bytes straddling the first block boundary at 4096.
        image.write(&[7; 10], 4090);
        let mut buf = [0u8; 12];
        image.read(&mut buf, 4089);
        assert_eq!(buf, [0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0]);
        assert_eq!((image.len(), image.allocated_blocks()), (4100, 2));
        image.check_invariants();
    }

    #[test]
    fn empty_write_past_end_does_not_grow() {
        let mut image = Image::default();
        image.write(&[], 1 << 20);
        assert_eq!(image.len(), 0);
    }

    #[test]
    fn shrink_then_grow_reads_zeros() {
        let mut image = Image::from_bytes(&[9; 8192]);
        image.set_len(100);
        image.check_invariants();
        image.set_len(8192);
        assert_eq!(image.to_vec()[..101], [[9; 100].as_slice(), &[0]].concat());
        assert_eq!(image.to_vec()[100..], [0; 8092]);
    }

    #[test]
    fn zero_blocks_of_from_bytes_are_holes() {
        // Block 0 zero, block 1 data, block 2 zero.
        let mut bytes = vec![0u8; 3 * 4096];
        bytes[5000] = 1;
        let image = Image::from_bytes(&bytes);
        assert_eq!(image.next_data(0), Some(4096));
        assert_eq!(image.next_hole(4096), 8192);
        assert_eq!(image.to_vec(), bytes);
    }

    #[test]
    fn punch_hole_frees_whole_blocks_and_zeros_partial_ones() {
        let mut image = Image::from_bytes(&[1; 3 * 4096]);
        // From the middle of block 0 to the middle of block 2: block 1 is freed.
        image.punch_hole(2048, 8192);
        assert_eq!(image.allocated_blocks(), 2);
        assert_eq!(image.to_vec()[2047..2049], [1, 0]);
        assert_eq!(image.to_vec()[10239..10241], [0, 1]);
        assert_eq!(image.len(), 3 * 4096);
    }

    #[test]
    fn punch_hole_past_end_keeps_size() {
        let mut image = Image::from_bytes(&[1; 4096]);
        image.punch_hole(0, 1 << 30);
        assert_eq!((image.len(), image.allocated_blocks()), (4096, 0));
    }

    #[test]
    fn seek_past_end() {
        let image = Image::from_bytes(&[1; 4096]);
        assert_eq!(image.next_data(4096), None);
        assert_eq!(image.next_hole(5000), 4096);
    }

    #[test]
    fn next_hole_stops_at_a_partial_last_block() {
        let image = Image::from_bytes(&[1; 5000]);
        assert_eq!(image.next_hole(10), 5000);
    }
}
