//! Making metadata durable: header updates, log entries, flush and close.

use vhdx::header::Header;
use vhdx::log::{NewEntry, SECTOR};

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
        let r = (|| {
            self.storage.write_at(&first.to_bytes(), other.offset())?;
            self.storage.flush()?;
            self.storage
                .write_at(&second.to_bytes(), st.slot.offset())?;
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
                let seq = self.read_state().log_seq + 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mib_log_carries_254_pages() {
        assert_eq!(max_pages(1 << 20), 254);
    }
}
