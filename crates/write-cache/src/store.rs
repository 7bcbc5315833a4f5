//! Where evicted blocks go: the overflow store, behind a trait so tests can run the cache
//! over memory with an injected size limit, and production over a file.
//!
//! The overflow file is a flat array of block-sized slots (slot `n` at byte `n * block`),
//! with no header: the cache is not persistent, and the file is created unlinked
//! (`O_TMPFILE`), so it is empty at every start and gone when the process ends, even after
//! a crash. Layout in docs/target.md.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;

/// Positional storage of overflow slots.
pub trait OverflowStore: Send + Sync + std::fmt::Debug {
    /// Reads `buf.len()` bytes at `offset`; bytes never written read as zeros.
    ///
    /// # Errors
    /// The store's I/O errors.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes `buf` at `offset`. A full store fails with `ErrorKind::StorageFull`.
    ///
    /// # Errors
    /// The store's I/O errors.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every completed write durable.
    ///
    /// # Errors
    /// The store's I/O errors.
    fn flush(&self) -> io::Result<()>;
}

/// An unlinked file in a directory.
#[derive(Debug)]
pub struct FileStore {
    file: File,
}

impl FileStore {
    /// Creates an anonymous file in `dir` (`O_TMPFILE`, or a file unlinked right away where
    /// the filesystem lacks it).
    ///
    /// # Errors
    /// The directory is missing or not writable.
    pub fn create_in(dir: &Path) -> io::Result<FileStore> {
        Ok(FileStore {
            file: tempfile::tempfile_in(dir)?,
        })
    }
}

impl OverflowStore for FileStore {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // A slot past the end of the file was never written: zeros (pread returns short).
        let mut done = 0;
        while done < buf.len() {
            let n = self.file.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                buf[done..].fill(0);
                break;
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Memory with a byte limit: a write past `limit_bytes` fails with `StorageFull`, as a full
/// filesystem does. For tests and simulation.
#[derive(Debug)]
pub struct MemStore {
    data: Mutex<Vec<u8>>,
    limit_bytes: u64,
}

impl MemStore {
    /// An empty store that holds at most `limit_bytes`.
    pub fn new(limit_bytes: u64) -> MemStore {
        MemStore {
            data: Mutex::new(Vec::new()),
            limit_bytes,
        }
    }
}

impl OverflowStore for MemStore {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let data = self.data.lock();
        for (i, b) in buf.iter_mut().enumerate() {
            let at = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .saturating_add(i);
            *b = data.get(at).copied().unwrap_or(0);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        if end > self.limit_bytes {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        // end <= limit_bytes, which the caller sized to memory.
        let (start, end) = (offset as usize, end as usize);
        let mut data = self.data.lock();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_store_past_limit_is_storage_full() {
        let s = MemStore::new(4096);
        let e = s.write_at(&[1; 512], 4096 - 256).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    }

    #[test]
    fn mem_store_unwritten_reads_zeros() {
        let s = MemStore::new(8192);
        s.write_at(&[7; 16], 0).unwrap();
        let mut buf = [9u8; 32];
        s.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..16], &[7; 16]);
        assert_eq!(&buf[16..], &[0; 16]);
    }
}
