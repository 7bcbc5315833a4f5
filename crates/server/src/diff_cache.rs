//! Server-side write caches ("server cache" and "server cache, persistent" in DESIGN.md):
//! a [`DiffCache`] is one device's differencing VHDX on the server. Also the private-image
//! writer, and the file locks that keep one writer per file.
//!
//! Not to be confused with the target's `write_cache::WriteCache` (RAM and an overflow
//! file on the device): this one lives on the server, in a differencing file per device,
//! hence the name.
//!
//! ```text
//!   <write_cache_dir>/<device>/<vdisk>.<version>.avhdx              server cache: made on
//!        │ parent (attached in memory)                              open, deleted on release
//!        ▼
//!   CachedDevice ──► <store>/<vdisk>.<version file>  (read-only chain, shared block cache)
//!
//!   <write_cache_dir>/<device>/<vdisk>.<version>.persistent.avhdx   persistent: kept, and
//!                                                                   reopened if its parent
//!                                                                   linkage still matches
//! ```
//!
//! A diff cache is a differencing VHDX made like `disk::version::new_version` (linked to
//! the parent's DataWriteGuid, locator pointing at the store file) but with
//! [`DIFF_CACHE_BLOCK_BYTES`] blocks: a guest's scattered small writes then allocate 2 MiB,
//! not the golden image's 32 MiB. Its parent is attached in memory to the caller's
//! (cached) device after the identity check of `VhdxImage::attach_parent`, so the golden
//! part of every read comes from the shared block cache. Flush is durable (the VHDX log
//! commit), which is what a persistent cache needs across a server crash.
//!
//! Persistent and non-persistent files have different names on purpose: connecting a
//! device in server-cache mode must never discard its persistent cache.
//!
//! Locks: the writer holds `flock(LOCK_EX|LOCK_NB)` on the file it writes, through the very
//! descriptor the image uses, so the lock lives exactly as long as the image; read-only
//! users hold `LOCK_SH` on the store file they read. The registry also keeps an in-process
//! table, because on NFS `flock` becomes a POSIX lock, which does not exclude the same
//! process.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use contract::DeviceName;
use disk::device::Submitted;
use disk::vhdx::{CreateOptions, ParentSpec, VhdxImage};
use disk::{BlockDevice, FileStorage, Storage};
use rustix::fs::{FlockOperation, flock};

/// The payload block size of diff-cache files (Hyper-V's for differencing disks).
pub const DIFF_CACHE_BLOCK_BYTES: u32 = 2 << 20;
/// Attempts to lock a path whose file is being replaced by another writer.
const LOCK_ATTEMPTS: usize = 4;
/// The most entries the startup sweep looks at.
const SWEEP_ENTRIES_MAX: usize = 100_000;
/// The suffix of persistent diff-cache files.
const PERSISTENT_SUFFIX: &str = ".persistent.avhdx";

/// Errors of diff caches and private images.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiffCacheError {
    /// Another writer (in this process or another) holds the file.
    #[error("{} is in use by another writer", .0.display())]
    Busy(PathBuf),
    /// A persistent cache exists but does not fit its parent (the version was rewritten).
    #[error("persistent write cache {} does not fit its parent", path.display())]
    ParentChanged {
        /// The cache file.
        path: PathBuf,
        /// The mismatch.
        #[source]
        source: disk::Error,
    },
    /// A file-system call failed.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The image library failed.
    #[error("{}", path.display())]
    Disk {
        /// The image.
        path: PathBuf,
        /// The cause.
        #[source]
        source: disk::Error,
    },
}

/// The mode of a write-cache file (a device's writes): the server's user only.
pub const CACHE_FILE_MODE: u32 = 0o600;

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DiffCacheError {
    let path = path.to_path_buf();
    move |source| DiffCacheError::Io { op, path, source }
}

fn disk_err(path: &Path) -> impl FnOnce(disk::Error) -> DiffCacheError {
    let path = path.to_path_buf();
    move |source| DiffCacheError::Disk { path, source }
}

/// Takes a non-blocking flock; a held lock is [`DiffCacheError::Busy`].
fn try_flock(file: &File, op: FlockOperation, path: &Path) -> Result<(), DiffCacheError> {
    match flock(file, op) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(DiffCacheError::Busy(path.to_path_buf())),
        Err(e) => Err(io_err("lock", path)(e.into())),
    }
}

/// A shared lock on a store file, held while a read-only user serves it. Dropping it
/// closes the descriptor, which releases the lock.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Takes `LOCK_SH` on `path`.
    ///
    /// # Errors
    /// [`DiffCacheError::Busy`] while a writer holds it; `Io`.
    pub fn shared(path: &Path) -> Result<FileLock, DiffCacheError> {
        // Non-blocking, and only a regular file: a FIFO named like a vDisk must not hold
        // the opening thread forever.
        let file = File::options()
            .read(true)
            .custom_flags(disk::file::nonblocking_flags())
            .open(path)
            .map_err(io_err("open", path))?;
        let file = disk::file::require_file(file, path, disk::file::Accept::Regular)
            .map_err(disk_err(path))?;
        try_flock(&file, FlockOperation::NonBlockingLockShared, path)?;
        Ok(FileLock { _file: file })
    }
}

/// Opens `path` read-write (creating it when `create`) and takes `LOCK_EX` on it. Retries
/// when the path was unlinked or replaced between the open and the lock (a discarded cache
/// deleted by its previous writer), so the lock is always on the file the path names.
///
/// # Errors
/// [`DiffCacheError::Busy`]; `Io`.
pub fn lock_for_write(path: &Path, create: bool) -> Result<File, DiffCacheError> {
    for _ in 0..LOCK_ATTEMPTS {
        let file = File::options()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .custom_flags(disk::file::nonblocking_flags())
            .mode(CACHE_FILE_MODE)
            .open(path)
            .map_err(io_err("open", path))?;
        let file = disk::file::require_file(file, path, disk::file::Accept::Regular)
            .map_err(disk_err(path))?;
        try_flock(&file, FlockOperation::NonBlockingLockExclusive, path)?;
        let held = file.metadata().map_err(io_err("stat", path))?;
        let named = std::fs::metadata(path);
        if named.is_ok_and(|m| m.dev() == held.dev() && m.ino() == held.ino()) {
            return Ok(file);
        }
    }
    Err(DiffCacheError::Busy(path.to_path_buf()))
}

/// Whether a diff cache outlives its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// "Server cache": made on open, deleted on release.
    Discard,
    /// "Server cache, persistent": kept across connections and server restarts.
    Persistent,
}

/// One device's open diff cache: a writable differencing VHDX over the version it sits on.
#[derive(Debug)]
pub struct DiffCache {
    image: Arc<VhdxImage>,
    path: PathBuf,
    retention: Retention,
}

/// Where an opened diff cache lives and whom it serves.
#[derive(Debug, Clone, Copy)]
pub struct DiffCacheTarget<'a> {
    /// The write-cache directory (`[store] write_cache_dir`).
    pub dir: &'a Path,
    /// The device name (a directory of `dir`).
    pub device: &'a DeviceName,
    /// The vDisk name.
    pub vdisk: &'a str,
    /// The version the cache sits on.
    pub version: u32,
    /// Discard or persistent.
    pub retention: Retention,
}

impl DiffCacheTarget<'_> {
    /// The cache file's path.
    pub fn path(&self) -> PathBuf {
        let name = match self.retention {
            Retention::Discard => format!("{}.{}.avhdx", self.vdisk, self.version),
            Retention::Persistent => {
                format!("{}.{}{PERSISTENT_SUFFIX}", self.vdisk, self.version)
            }
        };
        self.dir.join(self.device.as_str()).join(name)
    }
}

impl DiffCache {
    /// Opens the diff cache of `target` over `parent` (a cached read-only chain whose top
    /// file is `parent_path`): a fresh file in discard mode (any leftover is overwritten);
    /// in persistent mode the existing file, or a new one.
    ///
    /// # Errors
    /// `Busy` while another connection holds the file; `ParentChanged`
    /// when a persistent cache links to another parent identity or size; `Disk`, `Io`.
    pub fn open(
        target: DiffCacheTarget<'_>,
        parent: Arc<dyn BlockDevice>,
        parent_path: &Path,
    ) -> Result<DiffCache, DiffCacheError> {
        let path = target.path();
        let dir = target.dir.join(target.device.as_str());
        std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        let file = lock_for_write(&path, true)?;
        let meta = file.metadata().map_err(io_err("stat", &path))?;
        // A device's writes are its own: tighten a cache an older server left readable.
        if meta.permissions().mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(CACHE_FILE_MODE))
                .map_err(io_err("chmod", &path))?;
        }
        let len = meta.len();
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(file).with_small_folios());
        if target.retention == Retention::Discard || len == 0 {
            storage.set_len(0).map_err(disk_err(&path))?;
            let opts = create_options(parent.as_ref(), parent_path, &path)?;
            disk::vhdx::create(&storage, &opts).map_err(disk_err(&path))?;
        }
        let opts = disk::vhdx::OpenOptions {
            writable: true,
            path: Some(path.clone()),
        };
        let image = VhdxImage::open(storage, opts).map_err(disk_err(&path))?;
        let changed = |source| DiffCacheError::ParentChanged {
            path: path.clone(),
            source,
        };
        if image.size() != parent.size() {
            return Err(changed(disk::Error::new(
                disk::ErrorKind::ChainBroken,
                format!(
                    "cache is {} bytes, parent {} bytes",
                    image.size(),
                    parent.size()
                ),
            )));
        }
        image.attach_parent(parent).map_err(changed)?;
        Ok(DiffCache {
            image: Arc::new(image),
            path,
            retention: target.retention,
        })
    }

    /// The image (a writable differencing VHDX over the cached parent).
    pub fn image(&self) -> &Arc<VhdxImage> {
        &self.image
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Discard or persistent.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Commits and closes the image, then deletes the file in discard mode. The lock is
    /// released when the last holder of the image drops it.
    ///
    /// # Errors
    /// The close's error (a discard cache is deleted anyway); `Io` of the delete.
    pub fn release(self) -> Result<(), DiffCacheError> {
        let closed = self.image.close().map_err(disk_err(&self.path));
        if self.retention == Retention::Discard {
            std::fs::remove_file(&self.path).map_err(io_err("delete", &self.path))?;
        }
        closed
    }
}

/// The creation parameters of a diff cache over `parent`, as `disk::version` makes a
/// version, with diff-cache-sized blocks.
fn create_options(
    parent: &dyn BlockDevice,
    parent_path: &Path,
    child: &Path,
) -> Result<CreateOptions, DiffCacheError> {
    let g = parent.geometry();
    let Some(linkage) = parent.linkage_id() else {
        return Err(disk_err(parent_path)(disk::Error::new(
            disk::ErrorKind::Unsupported,
            "a write cache needs a vhdx or vhd parent with an identity",
        )));
    };
    Ok(CreateOptions {
        size: g.size,
        block_size: DIFF_CACHE_BLOCK_BYTES,
        logical_sector_size: g.logical_sector_size,
        physical_sector_size: g.physical_sector_size,
        parent: Some(ParentSpec {
            linkage,
            relative_path: disk::version::relative_path(child, parent_path),
            absolute_path: parent_path.display().to_string(),
        }),
        ..CreateOptions::default()
    })
}

/// Opens a store file for its one private-mode writer: `LOCK_EX` on the file, then a
/// writable open (a dirty log is replayed). A differencing image still needs its parent
/// attached.
///
/// # Errors
/// `Busy`; `Disk`, `Io`.
pub fn open_private(path: &Path) -> Result<VhdxImage, DiffCacheError> {
    let file = lock_for_write(path, false)?;
    let opts = disk::vhdx::OpenOptions {
        writable: true,
        path: Some(path.to_path_buf()),
    };
    VhdxImage::open(Arc::new(FileStorage::new(file).with_small_folios()), opts)
        .map_err(disk_err(path))
}

/// Deletes the discard-mode caches left in `dir` by a server that stopped without
/// releasing them (persistent caches and files in use are kept). Returns how many.
///
/// # Errors
/// `Io` reading the directory.
pub fn sweep_discarded(dir: &Path) -> Result<u64, DiffCacheError> {
    let mut removed = 0;
    let mut seen = 0;
    for device in std::fs::read_dir(dir).map_err(io_err("read directory", dir))? {
        let device = device.map_err(io_err("read directory", dir))?.path();
        if !device.is_dir() {
            continue;
        }
        let entries = std::fs::read_dir(&device).map_err(io_err("read directory", &device))?;
        for entry in entries {
            seen += 1;
            if seen > SWEEP_ENTRIES_MAX {
                return Ok(removed);
            }
            let path = entry.map_err(io_err("read directory", &device))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(".avhdx") || name.ends_with(PERSISTENT_SUFFIX) {
                continue;
            }
            if lock_for_write(&path, false).is_ok() {
                std::fs::remove_file(&path).map_err(io_err("delete", &path))?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Bytes and requests written through [`WritesCounted`] devices.
#[derive(Debug, Default)]
pub struct WriteCounters {
    /// Payload bytes written.
    pub bytes: AtomicU64,
    /// Write requests.
    pub writes: AtomicU64,
}

impl WriteCounters {
    /// Counts one write of `len` bytes.
    fn count(&self, len: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
    }
}

/// A decorator that counts the write requests and bytes a writable export (a diff cache
/// or a private image) takes, for the registry's per-mode metrics. Reads pass through
/// uncounted.
#[derive(Debug)]
pub struct WritesCounted {
    inner: Arc<dyn BlockDevice>,
    counters: Arc<WriteCounters>,
}

impl WritesCounted {
    /// Counts writes to `inner` into `counters`.
    pub fn new(inner: Arc<dyn BlockDevice>, counters: Arc<WriteCounters>) -> WritesCounted {
        WritesCounted { inner, counters }
    }

    fn count(&self, len: usize) {
        self.counters.count(len);
    }
}

/// Writes that complete, on every path, are counted; every other call is the inner
/// device's.
impl disk::Filter for WritesCounted {
    fn next(&self) -> &dyn BlockDevice {
        &*self.inner
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> disk::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.count(buf.len());
        Ok(())
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<disk::Result<()>> {
        let r = self.inner.try_write_at(buf, offset)?;
        if r.is_ok() {
            self.count(buf.len());
        }
        Some(r)
    }

    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        let call = self.inner.submit_write(buf, offset)?;
        let (counters, len) = (Arc::clone(&self.counters), buf.len());
        Some(Box::pin(async move {
            let r = call.await?;
            if r.is_ok() {
                counters.count(len);
            }
            Some(r)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistent_and_discard_caches_have_different_files() {
        let device = DeviceName::new("pc1").unwrap();
        let t = |retention| DiffCacheTarget {
            dir: Path::new("/wc"),
            device: &device,
            vdisk: "golden",
            version: 2,
            retention,
        };
        assert_eq!(
            (
                t(Retention::Discard).path(),
                t(Retention::Persistent).path()
            ),
            (
                PathBuf::from("/wc/pc1/golden.2.avhdx"),
                PathBuf::from("/wc/pc1/golden.2.persistent.avhdx")
            )
        );
    }
}
