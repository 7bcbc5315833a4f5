//! The VHDX log (MS-VHDX 2.3): entries, descriptors, data sectors, and the search for the
//! active sequence that replay applies.
//!
//! # Design notes
//!
//! The log is a circular buffer of 4 KiB sectors. An entry is a header sector holding the
//! entry header and descriptors, more descriptor sectors when needed, then one data sector per
//! data descriptor. Replay takes the *active sequence*: the run of valid entries (each with the
//! header's LogGuid, consecutive sequence numbers, each starting where the previous ended)
//! whose head has the highest sequence number and whose head's `tail` points at an entry of the
//! run; it applies the run from that tail entry to the head. Entries of other GUIDs are left
//! from older logs and are ignored. This module only decides; the I/O layer applies.

use crate::crc::crc32c_with_hole;
use crate::{Guid, le_u32, le_u64, put_u32, put_u64};

/// `"loge"`.
pub const ENTRY_SIGNATURE: u32 = 0x6567_6F6C;
/// `"zero"`.
pub const ZERO_SIGNATURE: u32 = 0x6F72_657A;
/// `"desc"`.
pub const DATA_DESC_SIGNATURE: u32 = 0x6373_6564;
/// `"data"`.
pub const DATA_SECTOR_SIGNATURE: u32 = 0x6174_6164;
/// Log sector size.
pub const SECTOR: usize = 4096;
/// Entry header size.
pub const ENTRY_HEADER_LEN: usize = 64;
/// Descriptor size.
pub const DESCRIPTOR_LEN: usize = 32;

/// Why a candidate entry is not valid (replay skips it; `check` reports it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Descriptor count does not fit the entry.
    #[error("log entry with {count} descriptors does not fit in {length} bytes")]
    BadDescriptorCount {
        /// DescriptorCount.
        count: u32,
        /// EntryLength.
        length: u32,
    },
    /// A descriptor is malformed (signature, alignment, sequence).
    #[error("log entry descriptor {index} is invalid")]
    BadDescriptor {
        /// Which descriptor.
        index: usize,
    },
    /// EntryLength is zero, not a multiple of 4 KiB, or longer than the log.
    #[error("log entry length {0:#x} is invalid")]
    BadLength(u32),
    /// A data sector's signature or sequence is wrong.
    #[error("log data sector {index} is invalid")]
    BadDataSector {
        /// Which data sector.
        index: usize,
    },
    /// The checksum does not match.
    #[error("log entry checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    InvalidChecksum {
        /// Stored.
        stored: u32,
        /// Computed.
        computed: u32,
    },
    /// Not "loge".
    #[error("no log entry signature")]
    InvalidSignature,
    /// The log length is not a positive multiple of 4 KiB.
    #[error("log length {0:#x} is invalid")]
    BadLogLength(usize),
    /// Validating the candidate entries would checksum too many bytes (a crafted log).
    #[error("log has too many overlapping candidate entries to validate")]
    TooComplex,
    /// Sequence number zero.
    #[error("log entry sequence number is zero")]
    ZeroSequence,
    /// A write of the log ends past what the file may grow to during replay.
    #[error(
        "log entry {sequence} descriptor {index}: FileOffset {file_offset:#x} + {len:#x} bytes \
         ends past the {file_len}-byte file plus the {LOG_GROWTH_MAX}-byte replay growth limit"
    )]
    WriteBeyondFile {
        /// The entry's SequenceNumber.
        sequence: u64,
        /// Which descriptor.
        index: usize,
        /// Its FileOffset.
        file_offset: u64,
        /// Its length.
        len: u64,
        /// The file's real length.
        file_len: u64,
    },
    /// LastFileOffset asks for a file longer than the file and the entry's own writes reach.
    #[error(
        "log entry {sequence}: LastFileOffset {last_file_offset:#x} lies past both the \
         {file_len}-byte file and the end of the entry's writes (at most {allowed:#x})"
    )]
    LastFileOffsetTooFar {
        /// The entry's SequenceNumber.
        sequence: u64,
        /// LastFileOffset.
        last_file_offset: u64,
        /// The file's real length.
        file_len: u64,
        /// The largest LastFileOffset accepted.
        allowed: u64,
    },
    /// Belongs to another log.
    #[error("log entry belongs to log {found}, not {expected}")]
    WrongLogGuid {
        /// The entry's GUID.
        found: Guid,
        /// The header's.
        expected: Guid,
    },
}

/// One write that replay performs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Write a 4 KiB sector.
    Data {
        /// File offset (4 KiB aligned).
        file_offset: u64,
        /// The sector's bytes.
        sector: Box<[u8]>,
    },
    /// Write zeros.
    Zero {
        /// File offset (4 KiB aligned).
        file_offset: u64,
        /// Bytes (multiple of 4 KiB).
        len: u64,
    },
}

/// A valid, decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Offset in the log where it starts.
    pub log_offset: u64,
    /// EntryLength.
    pub length: u32,
    /// Tail: log offset of the oldest entry still needed.
    pub tail: u32,
    /// SequenceNumber.
    pub sequence_number: u64,
    /// FlushedFileOffset.
    pub flushed_file_offset: u64,
    /// LastFileOffset.
    pub last_file_offset: u64,
    /// Its writes, in descriptor order.
    pub writes: Vec<Write>,
}

/// What replay must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Entries of the active sequence, oldest first.
    pub entries: Vec<Entry>,
}

impl Replay {
    /// The head entry's FlushedFileOffset: the file must be at least this long.
    pub fn flushed_file_offset(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.flushed_file_offset)
    }

    /// The head entry's LastFileOffset: extend the file to at least this.
    pub fn last_file_offset(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.last_file_offset)
    }

    /// Checks the replay against the file's real length `file_len` and returns the length
    /// the file has after it (never less than `file_len`). A log may legitimately grow the
    /// file a little (metadata written to space allocated just before a crash), so every
    /// write must end within `file_len` + [`LOG_GROWTH_MAX`], and each entry's
    /// LastFileOffset within the file or its own writes' end (rounded up to 1 MiB, as
    /// allocations are). A crafted log cannot stretch the file, or a read-only view of it,
    /// to reach BAT entries far past the real data.
    ///
    /// # Errors
    /// [`Error::WriteBeyondFile`]; [`Error::LastFileOffsetTooFar`].
    pub fn check_extent(&self, file_len: u64) -> Result<u64, Error> {
        let limit = file_len.saturating_add(LOG_GROWTH_MAX);
        let mut reach = file_len;
        for e in &self.entries {
            let mut entry_end = 0u64;
            for (index, w) in e.writes.iter().enumerate() {
                let (file_offset, len) = match w {
                    Write::Data { file_offset, .. } => (*file_offset, SECTOR as u64),
                    Write::Zero { file_offset, len } => (*file_offset, *len),
                };
                let end = file_offset.checked_add(len).filter(|&end| end <= limit);
                let Some(end) = end else {
                    return Err(Error::WriteBeyondFile {
                        sequence: e.sequence_number,
                        index,
                        file_offset,
                        len,
                        file_len,
                    });
                };
                entry_end = entry_end.max(end);
            }
            let rounded = entry_end
                .checked_next_multiple_of(crate::MIB)
                .unwrap_or(u64::MAX);
            let allowed = file_len.max(rounded);
            if e.last_file_offset > allowed {
                return Err(Error::LastFileOffsetTooFar {
                    sequence: e.sequence_number,
                    last_file_offset: e.last_file_offset,
                    file_len,
                    allowed,
                });
            }
            reach = reach.max(e.last_file_offset).max(entry_end);
        }
        Ok(reach)
    }
}

/// The most a log replay may grow a file past its real length (a write's end, or
/// LastFileOffset): more than one allocation of the largest block plus its bitmap.
pub const LOG_GROWTH_MAX: u64 = 2 * crate::MAX_BLOCK_SIZE as u64;

fn circular(log: &[u8], off: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = off % log.len();
    while out.len() < len {
        let n = (len - out.len()).min(log.len() - pos);
        out.extend_from_slice(&log[pos..pos + n]);
        pos = (pos + n) % log.len();
    }
    out
}

/// Decodes and validates the entry at `off` of the (whole) log buffer `log`.
///
/// # Errors
/// Every reason an entry is not valid.
pub fn parse_entry(log: &[u8], off: usize, log_guid: Guid) -> Result<Entry, Error> {
    if log.is_empty() || !log.len().is_multiple_of(SECTOR) {
        return Err(Error::BadLogLength(log.len()));
    }
    let head = circular(log, off, SECTOR);
    if le_u32(&head, 0) != ENTRY_SIGNATURE {
        return Err(Error::InvalidSignature);
    }
    let length = le_u32(&head, 8);
    if length == 0 || !(length as usize).is_multiple_of(SECTOR) || length as usize > log.len() {
        return Err(Error::BadLength(length));
    }
    let guid = Guid::read(&head, 32);
    if guid != log_guid {
        return Err(Error::WrongLogGuid {
            found: guid,
            expected: log_guid,
        });
    }
    let b = circular(log, off, length as usize);
    let stored = le_u32(&b, 4);
    let computed = crc32c_with_hole(&b, 4);
    if stored != computed {
        return Err(Error::InvalidChecksum { stored, computed });
    }
    let seq = le_u64(&b, 16);
    if seq == 0 {
        return Err(Error::ZeroSequence);
    }
    let count = le_u32(&b, 24);
    let desc_bytes = (count as usize)
        .checked_mul(DESCRIPTOR_LEN)
        .and_then(|x| x.checked_add(ENTRY_HEADER_LEN))
        .filter(|&x| x <= length as usize)
        .ok_or(Error::BadDescriptorCount { count, length })?;
    let desc_sectors = desc_bytes.div_ceil(SECTOR);
    let mut data_index = 0usize;
    let mut writes = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let d = &b[ENTRY_HEADER_LEN + DESCRIPTOR_LEN * index..][..DESCRIPTOR_LEN];
        let file_offset = le_u64(d, 16);
        if le_u64(d, 24) != seq || !file_offset.is_multiple_of(SECTOR as u64) {
            return Err(Error::BadDescriptor { index });
        }
        match le_u32(d, 0) {
            ZERO_SIGNATURE => {
                let len = le_u64(d, 8);
                if !len.is_multiple_of(SECTOR as u64) || file_offset.checked_add(len).is_none() {
                    return Err(Error::BadDescriptor { index });
                }
                writes.push(Write::Zero { file_offset, len });
            }
            DATA_DESC_SIGNATURE => {
                let at = (desc_sectors + data_index) * SECTOR;
                if at + SECTOR > length as usize {
                    return Err(Error::BadDescriptorCount { count, length });
                }
                let s = &b[at..at + SECTOR];
                let sector_seq = (u64::from(le_u32(s, 4)) << 32) | u64::from(le_u32(s, 4092));
                if le_u32(s, 0) != DATA_SECTOR_SIGNATURE || sector_seq != seq {
                    return Err(Error::BadDataSector { index: data_index });
                }
                let mut sector = vec![0u8; SECTOR].into_boxed_slice();
                sector[..8].copy_from_slice(&d[8..16]);
                sector[8..4092].copy_from_slice(&s[8..4092]);
                sector[4092..].copy_from_slice(&d[4..8]);
                writes.push(Write::Data {
                    file_offset,
                    sector,
                });
                data_index += 1;
            }
            _ => return Err(Error::BadDescriptor { index }),
        }
    }
    Ok(Entry {
        log_offset: off as u64,
        length,
        tail: le_u32(&b, 12),
        sequence_number: seq,
        flushed_file_offset: le_u64(&b, 48),
        last_file_offset: le_u64(&b, 56),
        writes,
    })
}

/// How many times the log's length the validation of candidate entries may checksum before
/// the log is refused as too complex (a crafted log of overlapping entries claiming the whole
/// buffer would otherwise cost slots × length; real logs stay under 2×).
pub const CHECKSUM_BUDGET_FACTOR: usize = 16;

/// Finds the active sequence of the log (MS-VHDX 2.3.3). `None` when no valid sequence exists.
///
/// Runs are walked only from entries that no valid entry continues into, so each run is
/// walked once; the active sequence is cut from the head's tail entry to the head.
///
/// # Errors
/// [`Error::BadLogLength`] for a log buffer that is not whole sectors;
/// [`Error::TooComplex`] when candidate entries would checksum more than
/// [`CHECKSUM_BUDGET_FACTOR`] × the log length.
pub fn find_active(log: &[u8], log_guid: Guid) -> Result<Option<Replay>, Error> {
    if log.is_empty() || !log.len().is_multiple_of(SECTOR) {
        return Err(Error::BadLogLength(log.len()));
    }
    let slots = log.len() / SECTOR;
    let mut budget = log.len().saturating_mul(CHECKSUM_BUDGET_FACTOR);
    let mut valid: Vec<Option<Entry>> = Vec::with_capacity(slots);
    for i in 0..slots {
        let at = i * SECTOR;
        let plausible = le_u32(log, at) == ENTRY_SIGNATURE && Guid::read(log, at + 32) == log_guid;
        if plausible {
            let claimed = (le_u32(log, at + 8) as usize).min(log.len());
            budget = budget.checked_sub(claimed).ok_or(Error::TooComplex)?;
        }
        valid.push(if plausible {
            parse_entry(log, at, log_guid).ok()
        } else {
            None
        });
    }
    let next_slot = |i: usize, e: &Entry| ((i * SECTOR + e.length as usize) % log.len()) / SECTOR;
    let continues =
        |from: &Entry, to: &Entry| from.sequence_number.checked_add(1) == Some(to.sequence_number);
    let mut has_pred = vec![false; slots];
    for (i, e) in valid.iter().enumerate() {
        if let Some(e) = e {
            let j = next_slot(i, e);
            if valid[j].as_ref().is_some_and(|n| continues(e, n)) {
                has_pred[j] = true;
            }
        }
    }
    let mut best: Option<Vec<usize>> = None;
    for start in 0..slots {
        if valid[start].is_none() || has_pred[start] {
            continue;
        }
        let mut run = vec![start];
        while run.len() < slots {
            let last = *run.last().expect("run is never empty");
            let e = valid[last].as_ref().expect("runs hold valid entries");
            let j = next_slot(last, e);
            match &valid[j] {
                Some(n) if continues(e, n) => run.push(j),
                _ => break,
            }
        }
        let head = valid[*run.last().expect("non-empty")]
            .as_ref()
            .expect("valid");
        let Some(tail_at) = run
            .iter()
            .position(|&i| (i * SECTOR) as u64 == u64::from(head.tail))
        else {
            continue;
        };
        let candidate = run.split_off(tail_at);
        let seq_of = |r: &[usize]| {
            valid[*r.last().expect("non-empty")]
                .as_ref()
                .expect("valid")
                .sequence_number
        };
        let better = best.as_ref().is_none_or(|b| {
            let (bh, ch) = (seq_of(b), seq_of(&candidate));
            ch > bh || (ch == bh && candidate.len() > b.len())
        });
        if better {
            best = Some(candidate);
        }
    }
    Ok(best.map(|idx| Replay {
        entries: idx
            .into_iter()
            .map(|i| valid[i].take().expect("valid"))
            .collect(),
    }))
}

/// The fields of an entry to encode.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    /// SequenceNumber (> 0).
    pub sequence_number: u64,
    /// Tail log offset.
    pub tail: u32,
    /// The log's GUID.
    pub log_guid: Guid,
    /// FlushedFileOffset.
    pub flushed_file_offset: u64,
    /// LastFileOffset.
    pub last_file_offset: u64,
    /// 4 KiB sectors to write: (file offset, 4096 bytes).
    pub data: &'a [(u64, &'a [u8])],
    /// Zero ranges: (file offset, length), both 4 KiB multiples.
    pub zeros: &'a [(u64, u64)],
}

impl NewEntry<'_> {
    /// The encoded entry length.
    pub fn encoded_len(&self) -> usize {
        let count = self.data.len() + self.zeros.len();
        (ENTRY_HEADER_LEN + DESCRIPTOR_LEN * count).div_ceil(SECTOR) * SECTOR
            + self.data.len() * SECTOR
    }

    /// Encodes the entry, checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.encoded_len();
        let mut b = vec![0u8; len];
        let count = self.data.len() + self.zeros.len();
        let desc_sectors = (ENTRY_HEADER_LEN + DESCRIPTOR_LEN * count).div_ceil(SECTOR);
        let seq = self.sequence_number;
        put_u32(&mut b, 0, ENTRY_SIGNATURE);
        put_u32(&mut b, 8, len as u32);
        put_u32(&mut b, 12, self.tail);
        put_u64(&mut b, 16, seq);
        put_u32(&mut b, 24, count as u32);
        self.log_guid.write(&mut b, 32);
        put_u64(&mut b, 48, self.flushed_file_offset);
        put_u64(&mut b, 56, self.last_file_offset);
        let mut d = ENTRY_HEADER_LEN;
        for &(file_offset, len) in self.zeros {
            put_u32(&mut b, d, ZERO_SIGNATURE);
            put_u64(&mut b, d + 8, len);
            put_u64(&mut b, d + 16, file_offset);
            put_u64(&mut b, d + 24, seq);
            d += DESCRIPTOR_LEN;
        }
        for (i, &(file_offset, sector)) in self.data.iter().enumerate() {
            assert_eq!(
                sector.len(),
                SECTOR,
                "log data writes are whole 4 KiB sectors"
            );
            put_u32(&mut b, d, DATA_DESC_SIGNATURE);
            b[d + 4..d + 8].copy_from_slice(&sector[4092..]);
            b[d + 8..d + 16].copy_from_slice(&sector[..8]);
            put_u64(&mut b, d + 16, file_offset);
            put_u64(&mut b, d + 24, seq);
            d += DESCRIPTOR_LEN;
            let s = (desc_sectors + i) * SECTOR;
            put_u32(&mut b, s, DATA_SECTOR_SIGNATURE);
            put_u32(&mut b, s + 4, (seq >> 32) as u32);
            b[s + 8..s + 4092].copy_from_slice(&sector[8..4092]);
            put_u32(&mut b, s + 4092, seq as u32);
        }
        let crc = crc32c_with_hole(&b, 4);
        put_u32(&mut b, 4, crc);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Guid = Guid([0x11; 16]);

    fn entry(seq: u64, tail: u32, fill: u8) -> Vec<u8> {
        let sector = vec![fill; SECTOR];
        let data = [(0x20_0000u64, sector.as_slice())];
        NewEntry {
            sequence_number: seq,
            tail,
            log_guid: G,
            flushed_file_offset: 1 << 22,
            last_file_offset: 1 << 22,
            data: &data,
            zeros: &[(0x30_0000, 8192)],
        }
        .encode()
    }

    #[test]
    fn round_trip() {
        let mut log = vec![0u8; 64 * 1024];
        let e = entry(5, 0, 0xab);
        log[..e.len()].copy_from_slice(&e);
        let parsed = parse_entry(&log, 0, G).unwrap();
        assert_eq!(parsed.sequence_number, 5);
        assert_eq!(
            parsed.writes[0],
            Write::Zero {
                file_offset: 0x30_0000,
                len: 8192
            }
        );
        assert_eq!(
            parsed.writes[1],
            Write::Data {
                file_offset: 0x20_0000,
                sector: vec![0xab; SECTOR].into()
            }
        );
    }

    fn replay_of(last_file_offset: u64, data_at: u64) -> Replay {
        let sector = vec![1u8; SECTOR];
        let data = [(data_at, sector.as_slice())];
        let e = NewEntry {
            sequence_number: 1,
            tail: 0,
            log_guid: G,
            flushed_file_offset: 1 << 22,
            last_file_offset,
            data: &data,
            zeros: &[],
        }
        .encode();
        Replay {
            entries: vec![parse_entry(&e, 0, G).unwrap()],
        }
    }

    #[test]
    fn log_may_grow_the_file_to_its_writes_reach() {
        // A write just past the 4 MiB file, and LastFileOffset at the 1 MiB above it.
        let r = replay_of(5 << 20, 4 << 20);
        assert_eq!(r.check_extent(4 << 20).unwrap(), 5 << 20);
        assert_eq!(
            replay_of(4 << 20, 0).check_extent(4 << 20).unwrap(),
            4 << 20
        );
    }

    #[test]
    fn last_file_offset_past_file_and_writes_is_refused() {
        let r = replay_of(1 << 40, 0x20_0000);
        let e = r.check_extent(4 << 20).unwrap_err();
        assert!(matches!(e, Error::LastFileOffsetTooFar { .. }), "{e}");
        assert!(
            e.to_string().contains("LastFileOffset 0x10000000000"),
            "{e}"
        );
    }

    #[test]
    fn write_far_past_the_file_is_refused() {
        let r = replay_of(4 << 20, 1 << 40);
        let e = r.check_extent(4 << 20).unwrap_err();
        assert!(matches!(e, Error::WriteBeyondFile { index: 0, .. }), "{e}");
    }

    #[test]
    fn zero_range_that_wraps_is_refused() {
        let r = Replay {
            entries: vec![Entry {
                log_offset: 0,
                length: 4096,
                tail: 0,
                sequence_number: 1,
                flushed_file_offset: 0,
                last_file_offset: 0,
                writes: vec![Write::Zero {
                    file_offset: u64::MAX - 4095,
                    len: 8192,
                }],
            }],
        };
        assert!(matches!(
            r.check_extent(4 << 20),
            Err(Error::WriteBeyondFile { .. })
        ));
    }

    #[test]
    fn other_guid_is_ignored() {
        let mut log = vec![0u8; 64 * 1024];
        let e = entry(5, 0, 1);
        log[..e.len()].copy_from_slice(&e);
        assert_eq!(find_active(&log, Guid([0x22; 16])).unwrap(), None);
    }

    #[test]
    fn active_sequence_is_the_highest_run_from_its_tail() {
        let mut log = vec![0u8; 64 * 1024];
        let a = entry(7, 0, 1);
        let b = entry(8, 0, 2);
        let stale = entry(3, 0x8000, 9);
        log[..a.len()].copy_from_slice(&a);
        log[a.len()..a.len() + b.len()].copy_from_slice(&b);
        log[0x8000..0x8000 + stale.len()].copy_from_slice(&stale);
        let r = find_active(&log, G).unwrap().unwrap();
        let seqs: Vec<u64> = r.entries.iter().map(|e| e.sequence_number).collect();
        assert_eq!(seqs, vec![7, 8]);
    }

    #[test]
    fn torn_head_falls_back_to_previous_entry() {
        let mut log = vec![0u8; 64 * 1024];
        let a = entry(7, 0, 1);
        let mut b = entry(8, 0, 2);
        b[5000] ^= 0xff;
        log[..a.len()].copy_from_slice(&a);
        log[a.len()..a.len() + b.len()].copy_from_slice(&b);
        let r = find_active(&log, G).unwrap().unwrap();
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.entries[0].sequence_number, 7);
    }

    /// A valid entry with sequence number u64::MAX followed by another valid entry: the run
    /// walk computed `u64::MAX + 1` and panicked (overflow) under debug assertions. Found with
    /// fuzz target `vhdx_log` (GUID + this 8 KiB log as its input).
    #[test]
    fn max_sequence_number_does_not_overflow() {
        let mut log = vec![0u8; 8192];
        let last = entry_of_len(u64::MAX, 0);
        let next = entry_of_len(1, 4096);
        log[..4096].copy_from_slice(&last);
        log[4096..].copy_from_slice(&next);
        let r = find_active(&log, G).unwrap().unwrap();
        assert_eq!(r.entries.len(), 1);
    }

    /// A one-sector entry (no data descriptors) with the given sequence number and tail.
    fn entry_of_len(seq: u64, tail: u32) -> Vec<u8> {
        NewEntry {
            sequence_number: seq,
            tail,
            log_guid: G,
            flushed_file_offset: 1 << 22,
            last_file_offset: 1 << 22,
            data: &[],
            zeros: &[],
        }
        .encode()
    }

    #[test]
    fn log_of_overlapping_whole_buffer_claims_is_refused() {
        // Every slot claims to be an entry as long as the whole log: validating them all
        // would checksum slots × length bytes.
        let mut log = vec![0u8; 64 * SECTOR];
        for slot in 0..64 {
            let at = slot * SECTOR;
            put_u32(&mut log, at, ENTRY_SIGNATURE);
            put_u32(&mut log, at + 8, (64 * SECTOR) as u32);
            G.write(&mut log, at + 32);
        }
        assert_eq!(find_active(&log, G), Err(Error::TooComplex));
    }

    #[test]
    fn entry_wrapping_the_buffer_parses() {
        let mut log = vec![0u8; 16 * 1024];
        let e = entry(2, 12 * 1024, 3);
        assert_eq!(e.len(), 8192);
        log[12 * 1024..].copy_from_slice(&e[..4096]);
        log[..4096].copy_from_slice(&e[4096..]);
        let r = find_active(&log, G).unwrap().unwrap();
        assert_eq!(r.entries[0].log_offset, 12 * 1024);
    }
}
