//! Making metadata durable: header updates, log entries, flush and close.

use vhdx::header::{self, Header, Slot};
use vhdx::log::{self, NewEntry, SECTOR};

use super::VhdxImage;
use super::create::random_guid;
use crate::Result;

/// The most 4 KiB pages one log entry of `log_len` bytes can carry.
fn max_pages(log_len: u64) -> usize {
    let mut n = (log_len as usize / SECTOR).saturating_sub(1);
    while n > 0 && ((64 + 32 * n).div_ceil(SECTOR) + n) * SECTOR > log_len as usize {
        n -= 1;
    }
    n
}

impl VhdxImage {
    /// Writes `new` through the two-slot protocol. Caller holds `alloc` (or is `open`).
    pub(super) fn update_header(&self, new: Header) -> Result<()> {
        let mut st = self.write_state();
        let seq = st.header.sequence_number + 1;
        let other = st.slot.other();
        let first = Header {
            sequence_number: seq,
            ..new
        };
        let second = Header {
            sequence_number: seq + 1,
            ..new
        };
        let (first_bytes, second_bytes) = (first.to_bytes(), second.to_bytes());
        if cfg!(debug_assertions) {
            assert_header_update(&st.header, st.slot, &first_bytes, &second_bytes, &second);
        }
        let r = (|| {
            self.storage.write_at(&first_bytes, other.offset())?;
            self.storage.flush()?;
            self.storage.write_at(&second_bytes, st.slot.offset())?;
            self.storage.flush()
        })();
        self.durable(r)?;
        st.header = second;
        Ok(())
    }

    /// Before the first change of a session: new FileWriteGuid, DataWriteGuid and LogGuid.
    pub(super) fn start_session(&self) -> Result<()> {
        if self.read_state().session_started {
            return Ok(());
        }
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let h = {
            let st = self.read_state();
            if st.session_started {
                return Ok(());
            }
            st.header
        };
        let new = Header {
            file_write_guid: random_guid(),
            data_write_guid: random_guid(),
            log_guid: random_guid(),
            ..h
        };
        self.update_header(new)?;
        let mut st = self.write_state();
        st.session_started = true;
        st.log_seq = 0;
        Ok(())
    }

    /// Collects the dirty pages as (file offset, 4 KiB bytes), in commit order. A commit of
    /// more pages than one log entry holds is not atomic, so the order keeps every entry
    /// boundary valid: sector bitmap pages first, then BAT pages from last to first, because a
    /// chunk's sector bitmap entry follows its payload entries and must be committed no later
    /// than a PARTIALLY_PRESENT entry that needs it.
    fn dirty_pages(&self) -> Vec<(u64, Vec<u8>)> {
        let st = self.read_state();
        let mut pages = Vec::with_capacity(st.dirty_bat.len() + st.dirty_bitmap.len());
        for &(chunk, p) in &st.dirty_bitmap {
            let sb = st.bat[self.layout.bitmap_index(chunk) as usize];
            // Without its bitmap block, the page would be committed over the file identifier.
            debug_assert!(
                sb.state() == vhdx::bat::SB_BLOCK_PRESENT && sb.file_offset() >= vhdx::MIB,
                "dirty sector bitmap page {p} of chunk {chunk} has no bitmap block"
            );
            let bm = &st.bitmaps[&chunk];
            let at = (p as usize) * SECTOR;
            pages.push((
                sb.file_offset() + p * SECTOR as u64,
                bm[at..at + SECTOR].to_vec(),
            ));
        }
        for &p in st.dirty_bat.iter().rev() {
            let mut page = vec![0u8; SECTOR];
            let first = (p as usize) * (SECTOR / 8);
            for (i, e) in st.bat.iter().skip(first).take(SECTOR / 8).enumerate() {
                page[i * 8..i * 8 + 8].copy_from_slice(&e.0.to_le_bytes());
            }
            debug_assert!(
                (p + 1) * SECTOR as u64 <= u64::from(self.regions.bat.length),
                "dirty bat page {p} lies past the bat region"
            );
            pages.push((self.regions.bat.offset + p * SECTOR as u64, page));
        }
        pages
    }

    /// Commits dirty metadata through the log. Caller holds `alloc`.
    fn commit_locked(&self) -> Result<()> {
        let pages = self.dirty_pages();
        if pages.is_empty() {
            let r = self.storage.flush();
            return self.durable(r);
        }
        let (log_offset, log_len, log_guid) = {
            let st = self.read_state();
            (
                st.header.log_offset,
                u64::from(st.header.log_length),
                st.header.log_guid,
            )
        };
        for chunk in pages.chunks(max_pages(log_len).max(1)) {
            let r = (|| {
                // Data, and the previous entry's in-place writes, become durable before this
                // entry may overwrite the previous one at log offset 0.
                self.storage.flush()?;
                let file_len = self.storage.len()?;
                let prev_seq = self.read_state().log_seq;
                let seq = prev_seq + 1;
                let data: Vec<(u64, &[u8])> =
                    chunk.iter().map(|(o, p)| (*o, p.as_slice())).collect();
                let entry = NewEntry {
                    sequence_number: seq,
                    tail: 0,
                    log_guid,
                    flushed_file_offset: file_len,
                    last_file_offset: file_len,
                    data: &data,
                    zeros: &[],
                }
                .encode();
                if cfg!(debug_assertions) {
                    let current_guid = self.read_state().header.log_guid;
                    assert_log_entry(&entry, (log_len, current_guid), prev_seq, seq, &data);
                }
                self.storage.write_at(&entry, log_offset)?;
                self.storage.flush()?;
                for (at, page) in chunk {
                    self.storage.write_at(page, *at)?;
                }
                self.write_state().log_seq = seq;
                Ok(())
            })();
            self.durable(r)?;
        }
        let mut st = self.write_state();
        st.dirty_bat.clear();
        st.dirty_bitmap.clear();
        Ok(())
    }

    pub(super) fn flush_impl(&self) -> Result<()> {
        self.check_poisoned()?;
        if !self.writable {
            return Ok(());
        }
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        self.commit_locked()
    }

    /// Commits pending metadata, then sets the DataWriteGuid through a header update.
    /// Compaction uses it after its last write: the rewritten file holds the same data, so it
    /// keeps the identity its children link to (the first write of a session changed it).
    ///
    /// # Errors
    /// `ReadOnly`; `Poisoned`; I/O failures (the image is then poisoned).
    pub fn set_data_write_guid(&self, guid: vhdx::Guid) -> Result<()> {
        self.check_poisoned()?;
        if !self.writable {
            return Err(crate::Error::new(
                crate::ErrorKind::ReadOnly,
                "vhdx image opened read-only",
            ));
        }
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        self.commit_locked()?;
        let h = self.read_state().header;
        self.update_header(Header {
            data_write_guid: guid,
            ..h
        })
    }

    /// Commit, fsync the in-place writes, then mark the log clean.
    pub(super) fn commit_and_clean(&self) -> Result<()> {
        self.check_poisoned()?;
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        self.commit_locked()?;
        let h = self.read_state().header;
        if h.log_guid.is_zero() {
            return Ok(());
        }
        let r = self.storage.flush();
        self.durable(r)?;
        self.update_header(Header {
            log_guid: vhdx::Guid::ZERO,
            ..h
        })?;
        self.write_state().session_started = false;
        Ok(())
    }
}

/// Debug builds only: the two header copies `update_header` is about to write (`first` into
/// the slot other than `slot`, then `second` into `slot`) both decode, `second` to `want`, and
/// an open after both writes would choose `second` in `slot`, with a sequence number above the
/// `old` current header's.
fn assert_header_update(old: &Header, slot: Slot, first: &[u8], second: &[u8], want: &Header) {
    let parsed = Header::parse(second).expect("the new current header decodes");
    assert_eq!(&parsed, want, "header round trip");
    assert!(
        Header::parse(first).is_ok(),
        "the first header copy decodes"
    );
    let (at_64k, at_128k) = match slot {
        Slot::First => (second, first),
        Slot::Second => (first, second),
    };
    let chosen = header::choose(at_64k, at_128k).expect("both header copies are valid");
    assert_eq!(chosen.slot, slot, "the current header stays in its slot");
    assert_eq!(&chosen.header, want, "an open would choose the new header");
    assert!(
        chosen.header.sequence_number > old.sequence_number,
        "header sequence {} after {}",
        chosen.header.sequence_number,
        old.sequence_number
    );
}

/// Debug builds only: the encoded log `entry` fits the `log_len`-byte log, and replay would
/// accept it under the header's current LogGuid `log_guid` (non-zero: a session is open) with
/// sequence number `seq`, above the previous entry's `prev_seq`, carrying exactly `data`, all
/// of it inside the file length the entry records.
fn assert_log_entry(
    entry: &[u8],
    (log_len, log_guid): (u64, vhdx::Guid),
    prev_seq: u64,
    seq: u64,
    data: &[(u64, &[u8])],
) {
    assert!(
        !log_guid.is_zero(),
        "log entry {seq} written outside a session"
    );
    assert!(
        entry.len() as u64 <= log_len,
        "log entry of {} bytes in a {log_len}-byte log",
        entry.len()
    );
    let parsed = log::parse_entry(entry, 0, log_guid).expect("the log entry decodes");
    assert_eq!(parsed.sequence_number, seq, "log entry sequence number");
    assert!(seq > prev_seq, "log sequence {seq} after {prev_seq}");
    assert_eq!(
        parsed.writes.len(),
        data.len(),
        "log entry {seq} descriptors"
    );
    for (w, &(at, page)) in parsed.writes.iter().zip(data) {
        let log::Write::Data {
            file_offset,
            sector,
        } = w
        else {
            panic!("log entry {seq}: a zero descriptor where a page was written");
        };
        assert_eq!(
            (*file_offset, &sector[..]),
            (at, page),
            "log entry {seq} page"
        );
        assert!(
            at + SECTOR as u64 <= parsed.flushed_file_offset,
            "log entry {seq} writes {at:#x}, past the file's {:#x} bytes",
            parsed.flushed_file_offset
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mib_log_carries_254_pages() {
        assert_eq!(max_pages(1 << 20), 254);
    }
}
