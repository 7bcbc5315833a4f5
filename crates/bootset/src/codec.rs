//! The encoded form of a [`BootSet`]. Little-endian throughout:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "FERRYBS1"
//!      8     2  format version (1)
//!     10     2  flags (0)
//!     12     4  page bytes (4096)
//!     16     4  boots (1..=BOOTS_MAX)
//!     20     4  extent count N (0..=EXTENTS_MAX)
//!     24     8  virtual size
//!     32     4  version number
//!     36    16  stamp
//!     52     2  name length L (1..=NAME_BYTES_MAX)
//!     54     L  vDisk name (UTF-8)
//!   54+L  16*N  extents: offset u64, length u32, first-read ms u32
//!      …     4  CRC-32C (Castagnoli) of every byte before it
//! ```

use crate::set::{
    BOOTS_MAX, BootSet, EXTENT_BYTES_MAX, EXTENTS_MAX, Extent, Identity, NAME_BYTES_MAX,
    PAGE_BYTES, SET_BYTES_MAX,
};

/// The first eight bytes of an encoded set.
pub const MAGIC: [u8; 8] = *b"FERRYBS1";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes before the name.
pub const HEADER_BYTES: usize = 54;
const EXTENT_BYTES: usize = 16;
const CRC_BYTES: usize = 4;
/// [`PAGE_BYTES`] as its field is written.
const PAGE_BYTES_U32: u32 = 4096;
const _: () = assert!(PAGE_BYTES_U32 as u64 == PAGE_BYTES);

/// Why bytes are not a valid boot set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Boots is 0 or above [`BOOTS_MAX`].
    #[error("boots {0} outside 1..={BOOTS_MAX}")]
    BadBoots(u32),
    /// The checksum does not match.
    #[error("checksum {found:#010x}, expected {expected:#010x}")]
    BadChecksum {
        /// Stored.
        found: u32,
        /// Computed.
        expected: u32,
    },
    /// An extent is empty, too long, unaligned, or past the virtual size.
    #[error("extent {index} ({offset:#x}+{len:#x}) is invalid: {why}")]
    BadExtent {
        /// Its index.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// Flags other than 0.
    #[error("unknown flags {0:#06x}")]
    BadFlags(u16),
    /// Not a boot set.
    #[error("not a boot set (bad magic)")]
    BadMagic,
    /// The name is empty, too long or not UTF-8.
    #[error("vdisk name is invalid: {0}")]
    BadName(&'static str),
    /// A page size other than [`PAGE_BYTES`].
    #[error("page size {0}, expected {PAGE_BYTES}")]
    BadPageBytes(u32),
    /// The bytes end early or go on past the checksum.
    #[error("length {found} bytes, expected {expected}")]
    BadLength {
        /// Given.
        found: usize,
        /// What the header implies.
        expected: usize,
    },
    /// Extents are not ordered by time.
    #[error("extent {0} is earlier than the one before it")]
    OutOfOrder(usize),
    /// Two extents overlap.
    #[error("extents overlap at {0:#x}")]
    Overlap(u64),
    /// More extents than [`EXTENTS_MAX`].
    #[error("{0} extents (limit {EXTENTS_MAX})")]
    TooManyExtents(u32),
    /// The set covers more than [`SET_BYTES_MAX`].
    #[error("set covers more than {SET_BYTES_MAX} bytes")]
    TooManyBytes,
    /// A format version this crate does not read.
    #[error("format version {0}, expected {FORMAT_VERSION}")]
    UnknownVersion(u16),
}

/// The encoded length of a set with a `name_len`-byte name and `extents` extents.
pub const fn encoded_len(name_len: usize, extents: usize) -> usize {
    HEADER_BYTES + name_len + extents * EXTENT_BYTES + CRC_BYTES
}

impl BootSet {
    /// The encoded bytes. A set built by this crate always decodes back to itself; a name
    /// longer than [`NAME_BYTES_MAX`] is cut at a character boundary.
    pub fn encode(&self) -> Vec<u8> {
        let mut name = self.identity.vdisk.as_str();
        while name.len() > NAME_BYTES_MAX {
            let mut cut = NAME_BYTES_MAX;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name = &name[..cut];
        }
        let mut out = Vec::with_capacity(encoded_len(name.len(), self.extents.len()));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&PAGE_BYTES_U32.to_le_bytes());
        out.extend_from_slice(&self.boots.to_le_bytes());
        // At most EXTENTS_MAX (< 2^32) for a valid set; more saturates and fails decoding.
        let count = u32::try_from(self.extents.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&self.identity.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.identity.version.to_le_bytes());
        out.extend_from_slice(&self.identity.stamp);
        // At most NAME_BYTES_MAX (< 2^16): cut above.
        let name_len = u16::try_from(name.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&name_len.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        for e in &self.extents {
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.extend_from_slice(&e.t_ms.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and fully validates an encoded set.
    ///
    /// # Errors
    /// [`DecodeError`]; never panics.
    pub fn decode(bytes: &[u8]) -> Result<BootSet, DecodeError> {
        let header = bytes.get(..HEADER_BYTES).ok_or(DecodeError::BadLength {
            found: bytes.len(),
            expected: HEADER_BYTES,
        })?;
        if header[..8] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = u16_at(header, 8);
        if version != FORMAT_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let flags = u16_at(header, 10);
        if flags != 0 {
            return Err(DecodeError::BadFlags(flags));
        }
        let page = u32_at(header, 12);
        if u64::from(page) != PAGE_BYTES {
            return Err(DecodeError::BadPageBytes(page));
        }
        let boots = u32_at(header, 16);
        if boots == 0 || boots > BOOTS_MAX {
            return Err(DecodeError::BadBoots(boots));
        }
        let count = u32_at(header, 20);
        let n = usize::try_from(count)
            .ok()
            .filter(|&n| n <= EXTENTS_MAX)
            .ok_or(DecodeError::TooManyExtents(count))?;
        let name_len = usize::from(u16_at(header, 52));
        if name_len == 0 || name_len > NAME_BYTES_MAX {
            return Err(DecodeError::BadName("length outside 1..=255"));
        }
        let expected = encoded_len(name_len, n);
        if bytes.len() != expected {
            return Err(DecodeError::BadLength {
                found: bytes.len(),
                expected,
            });
        }
        let body = expected - CRC_BYTES;
        let found = u32_at(bytes, body);
        let computed = crc32c::crc32c(&bytes[..body]);
        if found != computed {
            return Err(DecodeError::BadChecksum {
                found,
                expected: computed,
            });
        }
        let name = std::str::from_utf8(&bytes[HEADER_BYTES..HEADER_BYTES + name_len])
            .map_err(|_| DecodeError::BadName("not UTF-8"))?;
        let mut stamp = [0u8; 16];
        stamp.copy_from_slice(&header[36..52]);
        let identity = Identity {
            vdisk: name.to_string(),
            version: u32_at(header, 32),
            size_bytes: u64_at(header, 24),
            stamp,
        };
        let at = HEADER_BYTES + name_len;
        let extents = (0..n)
            .map(|i| {
                let o = at + i * EXTENT_BYTES;
                Extent {
                    offset: u64_at(bytes, o),
                    len: u32_at(bytes, o + 8),
                    t_ms: u32_at(bytes, o + 12),
                }
            })
            .collect();
        let set = BootSet {
            identity,
            boots,
            extents,
        };
        check_extents(&set)?;
        Ok(set)
    }
}

/// The invariants of a set's extents (see the crate docs).
fn check_extents(set: &BootSet) -> Result<(), DecodeError> {
    let size = set.identity.size_bytes;
    let mut total = 0u64;
    let mut prev_t = 0;
    for (index, e) in set.extents.iter().enumerate() {
        let bad = |why| DecodeError::BadExtent {
            index,
            offset: e.offset,
            len: e.len,
            why,
        };
        let len = u64::from(e.len);
        if len == 0 || len > EXTENT_BYTES_MAX {
            return Err(bad("length"));
        }
        let end = e.offset.checked_add(len).ok_or_else(|| bad("overflow"))?;
        if end > size {
            return Err(bad("past the virtual size"));
        }
        if e.offset % PAGE_BYTES != 0 || (len % PAGE_BYTES != 0 && end != size) {
            return Err(bad("not page-aligned"));
        }
        if e.t_ms < prev_t {
            return Err(DecodeError::OutOfOrder(index));
        }
        prev_t = e.t_ms;
        total += len;
        if total > SET_BYTES_MAX {
            return Err(DecodeError::TooManyBytes);
        }
    }
    let mut runs: Vec<(u64, u64)> = set.extents.iter().map(|e| (e.offset, e.end())).collect();
    runs.sort_unstable();
    for w in runs.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(DecodeError::Overlap(w[1].0));
        }
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::set::{Recorder, merge};

    fn id(size: u64) -> Identity {
        Identity {
            vdisk: "golden".into(),
            version: 2,
            size_bytes: size,
            stamp: [9; 16],
        }
    }

    fn sample() -> BootSet {
        let mut r = Recorder::new(1 << 30, 1000);
        r.read(0, 512, 0);
        r.read(1 << 20, 64 << 10, 5);
        r.finish(id(1 << 30)).unwrap()
    }

    #[test]
    fn a_set_round_trips() {
        let s = sample();
        assert_eq!(BootSet::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn a_flipped_byte_fails_the_checksum() {
        let mut b = sample().encode();
        b[60] ^= 1;
        assert!(matches!(
            BootSet::decode(&b),
            Err(DecodeError::BadChecksum { .. })
        ));
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut b = sample().encode();
        b.push(0);
        assert!(matches!(
            BootSet::decode(&b),
            Err(DecodeError::BadLength { .. })
        ));
    }

    #[test]
    fn an_extent_past_the_virtual_size_is_refused() {
        let mut s = sample();
        s.identity.size_bytes = 4096;
        assert!(matches!(
            BootSet::decode(&s.encode()),
            Err(DecodeError::BadExtent { index: 1, .. })
        ));
    }

    #[test]
    fn overlapping_extents_are_refused() {
        let mut s = sample();
        s.extents[1].offset = 0;
        assert_eq!(BootSet::decode(&s.encode()), Err(DecodeError::Overlap(0)));
    }

    #[test]
    fn a_huge_extent_count_is_refused_before_allocating() {
        let mut b = sample().encode();
        b[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            BootSet::decode(&b),
            Err(DecodeError::TooManyExtents(u32::MAX))
        );
    }

    fn reads() -> impl Strategy<Value = Vec<(u64, u64, u32)>> {
        prop::collection::vec((0u64..(4 << 20), 1u64..(256 << 10), 0u32..10_000), 0..60)
    }

    fn record(reads: &[(u64, u64, u32)], size: u64) -> Option<BootSet> {
        let mut r = Recorder::new(size, RECORD_PAGES_MAX_TEST);
        for &(o, l, t) in reads {
            r.read(o, l, t);
        }
        r.finish(id(size))
    }

    const RECORD_PAGES_MAX_TEST: usize = 1 << 16;

    fn pages_of(s: &BootSet) -> std::collections::BTreeSet<u64> {
        s.extents
            .iter()
            .flat_map(|e| e.offset / PAGE_BYTES..e.end().div_ceil(PAGE_BYTES))
            .collect()
    }

    proptest! {
        #[test]
        fn recorded_sets_round_trip(reads in reads(), size in 1u64..(5 << 20)) {
            if let Some(s) = record(&reads, size) {
                prop_assert_eq!(BootSet::decode(&s.encode()), Ok(s));
            }
        }

        #[test]
        fn a_recorded_set_covers_exactly_the_pages_read(reads in reads()) {
            let size = 5 << 20;
            let want: std::collections::BTreeSet<u64> = reads
                .iter()
                .flat_map(|&(o, l, _)| o / PAGE_BYTES..(o + l).min(size).div_ceil(PAGE_BYTES))
                .collect();
            let got = record(&reads, size).map(|s| pages_of(&s)).unwrap_or_default();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn a_merge_is_the_union_and_decodes(a in reads(), b in reads()) {
            let size = 5 << 20;
            let sets: Vec<_> = [record(&a, size), record(&b, size)].into_iter().flatten().collect();
            if let Ok(m) = merge(&sets) {
                let union: std::collections::BTreeSet<u64> = sets.iter().flat_map(pages_of).collect();
                prop_assert_eq!(pages_of(&m), union);
                prop_assert_eq!(m.boots as usize, sets.len());
                prop_assert_eq!(BootSet::decode(&m.encode()), Ok(m));
            }
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
            let _ = BootSet::decode(&bytes);
        }

        #[test]
        fn decode_of_a_mutated_set_never_panics(i in 0usize..200, v in any::<u8>()) {
            let mut b = sample().encode();
            let i = i % b.len();
            b[i] = v;
            // Fix the checksum so the structural checks run too.
            let body = b.len() - 4;
            let crc = crc32c::crc32c(&b[..body]);
            b[body..].copy_from_slice(&crc.to_le_bytes());
            let _ = BootSet::decode(&b);
        }
    }
}
