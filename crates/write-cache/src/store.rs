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
use std::time::Instant;

use parking_lot::Mutex;

pub use disk::inline::{INLINE_BACKOFF, INLINE_WRITE_SLOW, Now};

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

    /// [`Self::read_at`] if the store can do it without waiting for a device (the bytes
    /// are in memory); `None` otherwise, with `buf` in any state.
    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<io::Result<()>> {
        None
    }

    /// [`Self::write_at`] of bytes the store already holds (an overwrite in place) if the
    /// store can do it without waiting for a device; `None` otherwise, having written
    /// nothing.
    fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<io::Result<()>> {
        None
    }
}

/// An unlinked file in a directory.
///
/// Its inline paths run on the caller's thread (the NBD server's reactor):
/// * `try_read_at` is `preadv2(RWF_NOWAIT)`: the kernel answers from the page cache or
///   says it would wait (`EAGAIN`), never blocks.
/// * `try_write_at` is a plain `pwrite` of whole pages, which the caller takes only to
///   overwrite bytes the file already holds, behind a [`disk::inline::InlineGate`] (see
///   there: a write that took over [`INLINE_WRITE_SLOW`] turns inline writes off for
///   [`INLINE_BACKOFF`]).
pub struct FileStore {
    file: File,
    page: u64,
    inline: disk::inline::InlineGate,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("file", &self.file)
            .field("inline", &self.inline)
            .finish_non_exhaustive()
    }
}

impl FileStore {
    /// Creates an anonymous file in `dir` (`O_TMPFILE`, or a file unlinked right away where
    /// the filesystem lacks it).
    ///
    /// # Errors
    /// The directory is missing or not writable.
    pub fn create_in(dir: &Path) -> io::Result<FileStore> {
        FileStore::with_clock(dir, Box::new(Instant::now))
    }

    /// [`Self::create_in`] with the clock that times inline writes.
    ///
    /// # Errors
    /// The directory is missing or not writable.
    pub fn with_clock(dir: &Path, now: Now) -> io::Result<FileStore> {
        Ok(FileStore {
            file: tempfile::tempfile_in(dir)?,
            page: rustix::param::page_size() as u64,
            inline: disk::inline::InlineGate::with_clock(now),
        })
    }

    /// The whole of a local block device (a diskless machine's spare disk or partition),
    /// opened exclusively (`O_EXCL` on a block device fails while anything has it mounted
    /// or open exclusively). Its old contents are never read: the cache reads only slots it
    /// wrote in this run. Its size bounds the store (a write past its end fails
    /// `StorageFull`, as a full file system does).
    ///
    /// # Errors
    /// The device cannot be opened, is in use, or is not a block device.
    pub fn on_device(path: &Path) -> io::Result<(FileStore, u64)> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(rustix::fs::OFlags::EXCL.bits() as i32)
            .open(path)?;
        if !file.metadata()?.file_type().is_block_device() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a block device", path.display()),
            ));
        }
        let bytes = file.seek(SeekFrom::End(0))?;
        Ok((
            FileStore {
                file,
                page: rustix::param::page_size() as u64,
                inline: disk::inline::InlineGate::with_clock(Box::new(Instant::now)),
            },
            bytes,
        ))
    }
}

/// True when `path` names a block device (the overflow is then the device itself, not a
/// file in a directory).
pub fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
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

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
        use rustix::io::{Errno, ReadWriteFlags, preadv2};
        let mut done = 0;
        while done < buf.len() {
            let mut iov = [io::IoSliceMut::new(&mut buf[done..])];
            match preadv2(
                &self.file,
                &mut iov,
                offset + done as u64,
                ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                // Not in the page cache (or no RWF_NOWAIT here): the blocking path reads.
                Err(Errno::AGAIN | Errno::OPNOTSUPP) => return None,
                Err(e) => return Some(Err(e.into())),
            }
        }
        Some(Ok(()))
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<io::Result<()>> {
        if !offset.is_multiple_of(self.page) || !(buf.len() as u64).is_multiple_of(self.page) {
            return None;
        }
        self.inline
            .run("overflow write", || self.file.write_all_at(buf, offset))
    }
}

/// Memory with a byte limit: a write past `limit_bytes` fails with `StorageFull`, as a full
/// filesystem does. For tests and simulation.
#[derive(Debug)]
pub struct MemStore {
    data: Mutex<Vec<u8>>,
    limit_bytes: u64,
    inline: bool,
}

impl MemStore {
    /// An empty store that holds at most `limit_bytes`; its inline paths always succeed.
    pub fn new(limit_bytes: u64) -> MemStore {
        MemStore {
            data: Mutex::new(Vec::new()),
            limit_bytes,
            inline: true,
        }
    }

    /// [`Self::new`] whose inline paths always decline, as a store that would wait does.
    pub fn without_inline(limit_bytes: u64) -> MemStore {
        MemStore {
            inline: false,
            ..MemStore::new(limit_bytes)
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

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
        self.inline.then(|| self.read_at(buf, offset))
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<io::Result<()>> {
        self.inline.then(|| self.write_at(buf, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[test]
    fn mem_store_past_limit_is_storage_full() {
        let s = MemStore::new(4096);
        let e = s.write_at(&[1; 512], 4096 - 256).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    }

    /// A clock that moves 20 ms (over `INLINE_WRITE_SLOW`) at every look, so every inline
    /// write looks slow.
    fn crawling_clock() -> Now {
        let t0 = Instant::now();
        let ticks = AtomicU64::new(0);
        Box::new(move || {
            t0 + Duration::from_millis(20) * ticks.fetch_add(1, Ordering::Relaxed) as u32
        })
    }

    #[test]
    fn file_store_slow_inline_write_turns_inline_writes_off() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::with_clock(dir.path(), crawling_clock()).unwrap();
        let page = vec![1u8; s.page as usize];
        assert!(matches!(s.try_write_at(&page, 0), Some(Ok(()))));
        assert!(s.try_write_at(&page, 0).is_none());
    }

    #[test]
    fn file_store_inline_write_of_part_of_a_page_declines() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::create_in(dir.path()).unwrap();
        assert!(s.try_write_at(&[1u8; 512], 0).is_none());
    }

    #[test]
    fn file_store_inline_read_reads_what_was_written_then_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::create_in(dir.path()).unwrap();
        s.write_at(&[5u8; 100], 0).unwrap();
        let mut buf = [9u8; 200];
        // Just written, so in the page cache: RWF_NOWAIT answers.
        assert!(matches!(s.try_read_at(&mut buf, 0), Some(Ok(()))));
        assert_eq!(&buf[..100], &[5u8; 100]);
        assert_eq!(&buf[100..], &[0u8; 100]);
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
