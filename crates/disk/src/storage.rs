//! Positional byte storage under an image file. `std::fs::File` is the real one; tests inject
//! `testkit::SimDisk`, which keeps written and durable bytes apart to simulate crashes.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{Error, Result};

/// A file-like positional store. All methods take `&self`; implementations are `Send + Sync`.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`; bytes past the end read as zero.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Reads `bufs` one after the other from `offset` on, as [`Storage::read_at`] of their
    /// concatenation would. The default reads them one by one; a file reads them with one
    /// vectored read where it can, so the device sees one large request instead of several.
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        let mut at = offset;
        for b in bufs.iter_mut() {
            self.read_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Writes all of `buf` at `offset`, growing the store if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;
    /// The current length in bytes.
    fn len(&self) -> Result<u64>;
    /// True when the store is empty.
    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Truncates or extends (with zeros) to `len`.
    fn set_len(&self, len: u64) -> Result<()>;
    /// Makes `[offset, offset+len)` read as zeros, freeing space where the store can.
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        write_zeros(self, offset, len)
    }
    /// Tells the store that reads will jump around (a chain layer read through a merge or a
    /// server), so the host should not read ahead; the default does nothing.
    fn advise_random(&self) -> Result<()> {
        Ok(())
    }
    /// From now on, reads whose buffer address, offset and length are multiples of
    /// [`DIRECT_ALIGN`] bypass the host's page cache (`O_DIRECT`), where the store can: for
    /// files read through a cache of Ferry's own, which would otherwise be held twice in RAM
    /// and copied once more. Other reads stay buffered. `Ok(false)` when the store cannot
    /// (the default; a file system without `O_DIRECT`, such as tmpfs).
    ///
    /// # Errors
    /// Failures other than "not supported" of opening the direct handle.
    fn direct_reads(&self) -> Result<bool> {
        Ok(false)
    }
    /// Reserves real space for `[offset, offset+len)` (fallocate), where the store can.
    fn allocate(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    /// True when an overwrite of whole pages the store already holds is a copy into the
    /// host's page cache (a local or mounted file), so a caller may make it on a thread that
    /// must not block long, behind a [`crate::inline::InlineGate`]. False by default.
    fn inline_overwrites(&self) -> bool {
        false
    }
    /// The next offset at or after `offset` that may hold data (SEEK_DATA), if the store knows.
    fn next_data(&self, offset: u64) -> Result<Option<u64>> {
        Ok(Some(offset))
    }
    /// The next offset at or after `offset` that starts a hole (SEEK_HOLE); the length if none.
    fn next_hole(&self, _offset: u64) -> Result<u64> {
        self.len()
    }
}

/// Writes `len` zero bytes at `offset`, 1 MiB at a time (hole punching's fallback).
fn write_zeros<S: Storage + ?Sized>(s: &S, offset: u64, len: u64) -> Result<()> {
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        s.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// The alignment of buffer address, offset and length that reads need to go around the page
/// cache once [`Storage::direct_reads`] is on (4 KiB: every logical block size up to 4Kn).
pub const DIRECT_ALIGN: usize = 4096;

/// A real file.
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    /// The same file opened `O_DIRECT` (read-only), once [`Storage::direct_reads`] asked.
    direct: std::sync::OnceLock<File>,
    /// Writes are made in pieces of at most this many bytes.
    write_piece: usize,
}

/// The largest write [`FileStorage::with_small_folios`] hands the kernel at once.
pub const SMALL_FOLIO_WRITE_BYTES: usize = 64 << 10;

impl FileStorage {
    /// Wraps an open file.
    pub fn new(file: File) -> FileStorage {
        FileStorage {
            file,
            direct: std::sync::OnceLock::new(),
            write_piece: usize::MAX,
        }
    }

    /// For files that take small scattered overwrites after large writes (write caches,
    /// private images): writes are made in pieces of at most [`SMALL_FOLIO_WRITE_BYTES`].
    ///
    /// The page cache sizes a folio by the write that creates it, and an overwrite of 4 KiB
    /// inside a large folio costs the file system work for every block of the folio, so it
    /// grows with the size of the write that made the folio (the figures measured on ext4,
    /// with their date, are in docs/target.md, "Large folios"). A 64 KiB piece keeps
    /// sequential writes at one system call per 64 KiB.
    #[must_use]
    pub fn with_small_folios(mut self) -> FileStorage {
        self.write_piece = SMALL_FOLIO_WRITE_BYTES;
        self
    }

    /// Reads into `buf` at `offset` through the direct handle when there is one and the
    /// read is aligned; `None` when it is not for the direct handle (the caller reads
    /// buffered). A direct read the file system refuses (`EINVAL`) is `None` too.
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        let d = self.direct.get()?;
        let aligned = |addr: usize, len: usize, off: u64| {
            addr.is_multiple_of(DIRECT_ALIGN)
                && len.is_multiple_of(DIRECT_ALIGN)
                && off.is_multiple_of(DIRECT_ALIGN as u64)
        };
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            if !aligned(rest.as_ptr() as usize, rest.len(), offset + done as u64) {
                // A short read left the rest unaligned: finish buffered.
                return Some(self.read_buffered(rest, offset + done as u64));
            }
            match d.read_at(rest, offset + done as u64) {
                Ok(0) => {
                    rest.fill(0);
                    return Some(Ok(()));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                    return if done == 0 {
                        None
                    } else {
                        Some(self.read_buffered(&mut buf[done..], offset + done as u64))
                    };
                }
                Err(e) => return Some(Err(Error::io(format!("direct read at {offset:#x}"), e))),
            }
        }
        Some(Ok(()))
    }

    fn read_buffered(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(format!("read at {offset:#x}"), e)),
            }
        }
        Ok(())
    }

    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Storage for FileStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if let Some(r) = self.read_direct(buf, offset) {
            return r;
        }
        self.read_buffered(buf, offset)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        // One direct `preadv` when every piece is aligned; whatever it leaves (a short
        // read, EOF, a refusal) is finished piece by piece.
        let mut done = 0usize;
        if let Some(d) = self.direct.get()
            && bufs.len() > 1
            && offset.is_multiple_of(DIRECT_ALIGN as u64)
            && bufs.iter().all(|b| {
                (b.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
                    && b.len().is_multiple_of(DIRECT_ALIGN)
            })
        {
            let mut iov: Vec<std::io::IoSliceMut<'_>> = bufs
                .iter_mut()
                .map(|b| std::io::IoSliceMut::new(b))
                .collect();
            loop {
                match rustix::io::preadv(d, &mut iov, offset) {
                    Ok(n) => {
                        done = n;
                        break;
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::INVAL) => break,
                    Err(e) => {
                        return Err(Error::io(
                            format!("direct vectored read at {offset:#x}"),
                            e.into(),
                        ));
                    }
                }
            }
        }
        let mut at = offset;
        for b in bufs.iter_mut() {
            let len = b.len();
            if done >= len {
                done -= len;
            } else {
                self.read_at(&mut b[done..], at + done as u64)?;
                done = 0;
            }
            at += len as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut at = offset;
        for piece in buf.chunks(self.write_piece) {
            self.file
                .write_all_at(piece, at)
                .map_err(|e| Error::io(format!("write at {at:#x}"), e))?;
            at += piece.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io("fsync", e))
    }

    fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| Error::io("stat", e))?
            .len())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| Error::io(format!("truncate to {len}"), e))
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        use rustix::fs::{FallocateFlags, fallocate};
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match fallocate(&self.file, flags, offset, len) {
            Ok(()) => Ok(()),
            // Filesystems without hole punching get zeros written instead.
            Err(rustix::io::Errno::OPNOTSUPP) => write_zeros(self, offset, len),
            Err(e) => Err(Error::io(format!("punch hole at {offset:#x}"), e.into())),
        }
    }

    fn inline_overwrites(&self) -> bool {
        true
    }

    fn advise_random(&self) -> Result<()> {
        use rustix::fs::{Advice, fadvise};
        fadvise(&self.file, 0, None, Advice::Random).map_err(|e| Error::io("fadvise", e.into()))
    }

    fn direct_reads(&self) -> Result<bool> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        if self.direct.get().is_some() {
            return Ok(true);
        }
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path);
        match f {
            Ok(f) => {
                let _ = self.direct.set(f);
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                Ok(false)
            }
            Err(e) => Err(Error::io("open O_DIRECT", e)),
        }
    }

    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        use rustix::fs::{FallocateFlags, fallocate};
        match fallocate(&self.file, FallocateFlags::KEEP_SIZE, offset, len) {
            Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            Err(e) => Err(Error::io(
                format!("allocate {len} bytes at {offset:#x}"),
                e.into(),
            )),
        }
    }

    fn next_data(&self, offset: u64) -> Result<Option<u64>> {
        use rustix::fs::{SeekFrom, seek};
        match seek(&self.file, SeekFrom::Data(offset)) {
            Ok(o) => Ok(Some(o)),
            Err(rustix::io::Errno::NXIO) => Ok(None),
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => Ok(Some(offset)),
            Err(e) => Err(Error::io("seek data", e.into())),
        }
    }

    fn next_hole(&self, offset: u64) -> Result<u64> {
        use rustix::fs::{SeekFrom, seek};
        match seek(&self.file, SeekFrom::Hole(offset)) {
            Ok(o) => Ok(o),
            Err(_) => self.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_folio_writes_land_whole_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("f"))
            .unwrap();
        let s = FileStorage::new(f).with_small_folios();
        // Three whole pieces and a short one, at an odd offset.
        let len = 3 * SMALL_FOLIO_WRITE_BYTES + 1000;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        s.write_at(&data, 777).unwrap();
        s.write_at(&[], 5).unwrap();
        assert_eq!(s.len().unwrap(), 777 + len as u64);
        let mut back = vec![0u8; len];
        s.read_at(&mut back, 777).unwrap();
        assert!(back == data);
    }
}
