//! The cache file's layout: a header page, one 64-byte slot header per slot, a CRC-32C
//! per 4 KiB page of every slot, then the slots' data, each `block_bytes`. Pure: geometry from a byte budget, and the word
//! offsets of every field. Every value is a little-endian `u64` word read and written
//! through `AtomicU64` (the file is only ever touched through atomics).
//!
//! ```text
//!  word 0   MAGIC "FERRYHC1"            header page (4096 bytes = 512 words)
//!       1   LAYOUT_VERSION
//!       2   block_bytes
//!       3   slots (a multiple of WAYS)
//!       4   tick: the host-wide use clock (LRU stamps)
//!       5.. HOST_COUNTERS: hits, fills, fill_bytes, waits, stolen, torn
//!  page 1.. slot headers, 8 words each:
//!           seq | key_lo | key_hi | block | len<<32|pid | reserved | fill_ms | used
//!  then     page CRCs: slot i's page p at crc_offset + (i * pages + p) * 8 (one a word)
//!  then     slot data, slot i at data_offset + i * block_bytes (page aligned)
//! ```

/// "FERRYHC1", little endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"FERRYHC1");
/// The layout of this file; a file of another layout is refused (made by another Ferry).
pub const LAYOUT_VERSION: u64 = 1;
/// Bytes of the header page.
pub const HEADER_BYTES: u64 = 4096;
/// Words of one slot header.
pub const SLOT_WORDS: u64 = 8;
/// Bytes of one slot header.
pub const SLOT_HEADER_BYTES: u64 = SLOT_WORDS * 8;
/// The unit of the checksums: a read checks the CRC-32C of each page it touches.
pub const PAGE_BYTES: u64 = 4096;
/// Slots of one set: a block may live in any slot of the set its key and index hash to.
pub const WAYS: u64 = 8;
/// The smallest cache block (one page).
pub const BLOCK_BYTES_MIN: u64 = 4096;
/// The largest cache block.
pub const BLOCK_BYTES_MAX: u64 = 1 << 20;
/// The default cache block: 64 KiB, 16 pages, so a boot's small reads near each other
/// come from one server request (see the crate docs).
pub const BLOCK_BYTES_DEFAULT: u64 = 64 << 10;
/// The smallest cache: one set of the smallest blocks, plus headers.
pub const CACHE_BYTES_MIN: u64 = 1 << 20;
/// The largest cache (RAM on a hypervisor host is large, but not this large).
pub const CACHE_BYTES_MAX: u64 = 1 << 40;

/// Word indexes of the header.
pub mod header {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// [`super::LAYOUT_VERSION`].
    pub const VERSION: usize = 1;
    /// Bytes of each slot's data.
    pub const BLOCK_BYTES: usize = 2;
    /// Slots.
    pub const SLOTS: usize = 3;
    /// The use clock.
    pub const TICK: usize = 4;
    /// Host-wide counters (every agent adds to them).
    pub const HITS: usize = 5;
    /// Blocks filled from a server.
    pub const FILLS: usize = 6;
    /// Bytes filled from a server.
    pub const FILL_BYTES: usize = 7;
    /// Reads that waited for another agent's fill.
    pub const WAITS: usize = 8;
    /// Fills taken over from an agent that died or stalled.
    pub const STOLEN: usize = 9;
    /// Slots whose bytes did not match their checksum (a fill raced by a takeover).
    pub const TORN: usize = 10;
}

/// Word indexes inside a slot header.
pub mod slot {
    /// Sequence: even = stable, odd = being filled.
    pub const SEQ: usize = 0;
    /// The version key's low half; 0 (both halves) = empty.
    pub const KEY_LO: usize = 1;
    /// The version key's high half.
    pub const KEY_HI: usize = 2;
    /// The block index inside the version.
    pub const BLOCK: usize = 3;
    /// Valid bytes (high 32 bits) and the filling process id (low 32 bits).
    pub const LEN_PID: usize = 4;
    /// Unused (0).
    pub const RESERVED: usize = 5;
    /// When the fill began (CLOCK_MONOTONIC ms: the same clock in every process).
    pub const FILL_MS: usize = 6;
    /// Last use, from the header's tick (eviction picks the least recent of a set).
    pub const USED: usize = 7;
}

/// The shape of one cache file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of each slot's data.
    pub block_bytes: u64,
    /// Slots (a multiple of [`WAYS`]).
    pub slots: u64,
}

/// Why a budget makes no cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// Not a power of two in [`BLOCK_BYTES_MIN`]..=[`BLOCK_BYTES_MAX`].
    #[error("cache block {0} is not a power of two from 4 KiB to 1 MiB")]
    InvalidBlock(u64),
    /// Outside [`CACHE_BYTES_MIN`]..=[`CACHE_BYTES_MAX`].
    #[error("cache size {0} is not from 1 MiB to 1 TiB")]
    InvalidSize(u64),
    /// The budget holds less than one set.
    #[error("cache size {bytes} holds less than {WAYS} blocks of {block_bytes}")]
    TooSmall {
        /// The budget.
        bytes: u64,
        /// The block.
        block_bytes: u64,
    },
}

impl Geometry {
    /// The most slots of `block_bytes` that fit in `bytes` with their headers.
    ///
    /// # Errors
    /// [`GeometryError`].
    pub fn for_budget(bytes: u64, block_bytes: u64) -> Result<Geometry, GeometryError> {
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(GeometryError::InvalidBlock(block_bytes));
        }
        if !(CACHE_BYTES_MIN..=CACHE_BYTES_MAX).contains(&bytes) {
            return Err(GeometryError::InvalidSize(bytes));
        }
        // Two pages of rounding for the header page and the data's alignment.
        let room = bytes.saturating_sub(2 * HEADER_BYTES);
        let per_slot = block_bytes + SLOT_HEADER_BYTES + 8 * (block_bytes / PAGE_BYTES);
        let slots = room / per_slot / WAYS * WAYS;
        if slots == 0 {
            return Err(GeometryError::TooSmall { bytes, block_bytes });
        }
        Ok(Geometry { block_bytes, slots })
    }

    /// The geometry a header states, if it is one this code could have made.
    pub fn from_header(block_bytes: u64, slots: u64) -> Option<Geometry> {
        let g = Geometry { block_bytes, slots };
        let ok = block_bytes.is_power_of_two()
            && (BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
            && slots > 0
            && slots.is_multiple_of(WAYS)
            && g.file_bytes().is_some_and(|b| b <= CACHE_BYTES_MAX);
        ok.then_some(g)
    }

    /// Pages of one block.
    pub fn pages(&self) -> u64 {
        self.block_bytes / PAGE_BYTES
    }

    /// Where the page CRCs begin (8-byte aligned).
    pub fn crc_offset(&self) -> u64 {
        HEADER_BYTES + self.slots * SLOT_HEADER_BYTES
    }

    /// Where slot data begins (page aligned).
    pub fn data_offset(&self) -> u64 {
        (self.crc_offset() + self.slots * self.pages() * 8).next_multiple_of(HEADER_BYTES)
    }

    /// Bytes of the whole file; `None` on overflow.
    pub fn file_bytes(&self) -> Option<u64> {
        let headers = self.slots.checked_mul(SLOT_HEADER_BYTES)?;
        let crcs = self.slots.checked_mul(self.pages() * 8)?;
        let data = self.slots.checked_mul(self.block_bytes)?;
        HEADER_BYTES
            .checked_add(headers)?
            .checked_add(crcs)?
            .checked_next_multiple_of(HEADER_BYTES)?
            .checked_add(data)
    }

    /// The word holding the CRC of page `p` of slot `i`.
    pub fn crc_word(&self, i: u64, p: u64) -> usize {
        (self.crc_offset() / 8 + i * self.pages() + p) as usize
    }

    /// Sets of [`WAYS`] slots.
    pub fn sets(&self) -> u64 {
        self.slots / WAYS
    }

    /// The word index of field `field` of slot `i`'s header.
    pub fn slot_word(&self, i: u64, field: usize) -> usize {
        // Bounded by the file size, which fits the address space once mapped.
        ((HEADER_BYTES / 8) + i * SLOT_WORDS) as usize + field
    }

    /// The word index of the first data word of slot `i`.
    pub fn data_word(&self, i: u64) -> usize {
        ((self.data_offset() + i * self.block_bytes) / 8) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gib_of_64k_blocks_fits_its_budget() {
        let g = Geometry::for_budget(1 << 30, BLOCK_BYTES_DEFAULT).unwrap();
        assert_eq!(g.slots % WAYS, 0);
        assert!(g.file_bytes().unwrap() <= 1 << 30);
        // Headers take 64 of every 64 KiB + 64 bytes: close to 16,384 slots.
        assert!(g.slots > 16_300, "{}", g.slots);
    }

    #[test]
    fn block_not_a_power_of_two_is_refused() {
        assert_eq!(
            Geometry::for_budget(1 << 30, 3 * 4096),
            Err(GeometryError::InvalidBlock(3 * 4096))
        );
    }

    #[test]
    fn header_with_slots_not_a_multiple_of_ways_is_refused() {
        assert_eq!(Geometry::from_header(65536, WAYS + 1), None);
        assert!(Geometry::from_header(65536, WAYS).is_some());
    }

    #[test]
    fn data_is_page_aligned_after_the_headers() {
        let g = Geometry::for_budget(8 << 20, 4096).unwrap();
        assert_eq!(g.data_offset() % HEADER_BYTES, 0);
        assert!(g.data_offset() >= g.crc_offset() + g.slots * g.pages() * 8);
    }
}
