//! What the cache keeps per block: [`Cached`], its bytes ([`Data`]: a piece of a
//! [`Block`] buffer, or all zeros) and which of the block's pages it holds.
//!
//! A [`Block`] is a buffer whose bytes are counted in `resident_bytes` while it lives, so
//! the counter follows every buffer the cache holds, cached or in flight. Pure data: no
//! locks and no I/O.

use std::fmt;
use std::sync::Arc;

use crate::aligned::{AlignedBuf, BufPool};
use crate::config::ENTRY_OVERHEAD_BYTES;
use crate::shard::Group;
use crate::stats::Counters;

/// A block buffer whose bytes are counted in `resident_bytes` while it lives. It holds the
/// pages `[lo_page, lo_page + len / page)` of its block (the last may be short at the end of
/// the device).
pub(crate) struct Block {
    /// The buffer.
    pub(crate) bytes: AlignedBuf,
    counters: Arc<Counters>,
}

impl Block {
    /// `len` zero bytes.
    #[inline]
    pub(crate) fn zeroed(len: usize, counters: &Arc<Counters>) -> Block {
        counters.resident_add(len as u64);
        Block {
            bytes: AlignedBuf::zeroed(len),
            counters: counters.clone(),
        }
    }

    /// A buffer of `pool`'s length for a read that overwrites all of it: a reused one when
    /// the pool has one (its bytes are stale until then), else a new mapping.
    #[inline]
    pub(crate) fn pooled(pool: &Arc<BufPool>, counters: &Arc<Counters>) -> Block {
        let (bytes, reused) = pool.take();
        if reused {
            counters.buffers_reused.add(1);
        }
        counters.resident_add(bytes.len() as u64);
        Block {
            bytes,
            counters: counters.clone(),
        }
    }

    /// A copy of `src`.
    #[inline]
    pub(crate) fn copy_of(src: &[u8], counters: &Arc<Counters>) -> Block {
        counters.resident_add(src.len() as u64);
        Block {
            bytes: AlignedBuf::copy_of(src),
            counters: counters.clone(),
        }
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.counters.resident_bytes.sub(self.bytes.len() as u64);
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Block({} bytes)", self.bytes.len())
    }
}

/// A ready block's bytes.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    /// Bytes `[start, start + len)` of a buffer hold the block's bytes from byte `lo` on.
    /// The buffer is the block's own (`start` 0, `len` its length) or a group's.
    Bytes {
        block: Arc<Block>,
        lo: u32,
        start: u32,
        len: u32,
    },
    /// All zeros: no buffer is kept.
    Zero,
}

impl Data {
    /// A block's own buffer, holding its bytes from byte `lo` on.
    #[inline]
    pub(crate) fn bytes(block: Block, lo: u32) -> Data {
        // Block buffers are at most BLOCK_BYTES_MAX (4 MiB).
        let len = block.bytes.len() as u32;
        Data::Bytes {
            block: Arc::new(block),
            lo,
            start: 0,
            len,
        }
    }
}

/// What the cache keeps per block: its bytes and which of its pages they hold. A block
/// fetched for one small read holds only that read's pages, so the store is read for the
/// bytes clients ask for, not whole granules (see the crate's design notes).
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    /// The block's bytes.
    pub(crate) data: Data,
    /// The group whose buffer `data` shares, if any.
    pub(crate) group: Option<Group>,
    /// Bit `i` set: page `i` of the block is valid.
    pub(crate) valid: u64,
}

impl Cached {
    /// Bytes charged to the budget for the entry: its data plus [`ENTRY_OVERHEAD_BYTES`].
    #[inline]
    pub(crate) fn charge_bytes(&self) -> u64 {
        match &self.data {
            Data::Bytes { len, .. } => u64::from(*len) + ENTRY_OVERHEAD_BYTES,
            Data::Zero => ENTRY_OVERHEAD_BYTES,
        }
    }

    /// True when every page of `need` is valid.
    #[inline]
    pub(crate) fn covers(&self, need: u64) -> bool {
        self.valid & need == need
    }

    /// Copies the block's bytes `[at, at + dst.len())` (valid pages) into `dst`.
    #[inline]
    pub(crate) fn copy_to(&self, dst: &mut [u8], at: usize) {
        match &self.data {
            Data::Bytes {
                block,
                lo,
                start,
                len,
            } => {
                // The pair of `well_formed` at publish: a read stays within the bytes the
                // entry holds.
                debug_assert!(
                    at >= *lo as usize && at + dst.len() <= (*lo + *len) as usize,
                    "copy of block bytes {at}+{} outside the entry's {lo}+{len}",
                    dst.len()
                );
                let i = at - *lo as usize + *start as usize;
                dst.copy_from_slice(&block.bytes[i..i + dst.len()]);
            }
            Data::Zero => dst.fill(0),
        }
    }

    /// The bytes the entry holds (from its first valid page on), `None` for zeros. For
    /// assertions: an entry moved to another buffer must read the same.
    pub(crate) fn held_bytes(&self) -> Option<(u32, &[u8])> {
        match &self.data {
            Data::Bytes {
                block,
                lo,
                start,
                len,
            } => Some((*lo, &block.bytes[*start as usize..(*start + *len) as usize])),
            Data::Zero => None,
        }
    }

    /// True when the entry agrees with the pages it says it holds (debug assertions check
    /// it before an entry is published): some page is valid, and a buffer piece starts at
    /// the first valid page, ends within the last one (mid-page only at the end of the
    /// device) and lies inside its [`Block`]. Readers index the buffer by these bounds.
    pub(crate) fn well_formed(&self, page_bytes: u64) -> bool {
        if self.valid == 0 {
            return false;
        }
        let Data::Bytes {
            block,
            lo,
            start,
            len,
        } = &self.data
        else {
            return true;
        };
        let first_page = u64::from(self.valid.trailing_zeros());
        let end_page = 64 - u64::from(self.valid.leading_zeros());
        let hi = u64::from(*lo) + u64::from(*len);
        u64::from(*lo) == first_page * page_bytes
            && hi > (end_page - 1) * page_bytes
            && hi <= end_page * page_bytes
            && *start as usize + *len as usize <= block.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 KiB pages (a 64 KiB block's).
    const PAGE: u64 = 4096;

    fn entry(valid: u64, lo: u32, len: usize) -> Cached {
        let counters = Arc::default();
        Cached {
            data: Data::bytes(Block::zeroed(len, &counters), lo),
            group: None,
            valid,
        }
    }

    #[test]
    fn an_entry_from_its_first_page_to_its_last_is_well_formed() {
        // Pages 2 and 3, the last one short (the device ends 100 bytes into it).
        assert!(entry(0b1100, 8192, 4096 + 100).well_formed(PAGE));
    }

    #[test]
    fn an_entry_whose_buffer_starts_before_its_first_page_is_not() {
        assert!(!entry(0b1100, 4096, 3 * 4096).well_formed(PAGE));
    }

    #[test]
    fn an_entry_whose_buffer_ends_before_its_last_page_is_not() {
        assert!(!entry(0b1100, 8192, 4096).well_formed(PAGE));
    }

    #[test]
    fn an_entry_holding_no_page_is_not() {
        let zero = Cached {
            data: Data::Zero,
            group: None,
            valid: 0,
        };
        assert!(!zero.well_formed(PAGE));
    }
}
