//! Opening the cache: create the file once per host and user (atomically: built under a
//! temporary name, then hard-linked into place), or attach to the one that exists after
//! checking who made it and who may read it; or map private memory.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::OpenError;
use crate::cache::{HostCache, LocalCounters};
use crate::layout::{Geometry, LAYOUT_VERSION, MAGIC, header};
use crate::map::Region;

/// The cache file's name in its directory for user `uid`: one cache per user, so two
/// users' agents never meet in one file (and one cannot squat the other's name).
pub fn file_name(uid: u32) -> String {
    format!("ferry-host-cache-{uid}")
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn usize_of(bytes: u64) -> Result<usize, OpenError> {
    usize::try_from(bytes)
        .map_err(|_| OpenError::Geometry(crate::GeometryError::InvalidSize(bytes)))
}

impl HostCache {
    /// Opens this user's host cache in `dir` (e.g. `/dev/shm`), creating it with a budget
    /// of `bytes` in blocks of `block_bytes` when it does not exist. An existing cache
    /// keeps the geometry its creator chose.
    ///
    /// # Errors
    /// [`OpenError`]: a file made by another user, readable or writable by others, not a
    /// regular file, of another layout, or an I/O failure.
    pub fn open(dir: &Path, bytes: u64, block_bytes: u64) -> Result<HostCache, OpenError> {
        let geo = Geometry::for_budget(bytes, block_bytes)?;
        let path = dir.join(file_name(euid()));
        // Two rounds: a cache created by another agent between our open and our link.
        for _ in 0..2 {
            match attach(&path) {
                Err(OpenError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                other => return other,
            }
            match create(dir, &path, geo) {
                Err(OpenError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                other => return other,
            }
        }
        attach(&path)
    }

    /// A cache in this process's own memory (no sharing): the prefetch's target when no
    /// host cache is configured.
    ///
    /// # Errors
    /// An invalid budget, or no memory.
    pub fn private(bytes: u64, block_bytes: u64) -> Result<HostCache, OpenError> {
        let geo = Geometry::for_budget(bytes, block_bytes)?;
        let len = usize_of(geo.file_bytes().unwrap_or(u64::MAX))?;
        let region = Region::anonymous(len).map_err(|source| OpenError::Io {
            path: PathBuf::from("(anonymous)"),
            source,
        })?;
        let c = HostCache::over(region, geo, None);
        c.write_header();
        Ok(c)
    }

    fn over(region: Region, geo: Geometry, path: Option<PathBuf>) -> HostCache {
        HostCache {
            region,
            geo,
            path,
            local: LocalCounters::default(),
            pid: std::process::id(),
        }
    }

    fn write_header(&self) {
        let w = self.region.words();
        w[header::VERSION].store(LAYOUT_VERSION, Ordering::Relaxed);
        w[header::BLOCK_BYTES].store(self.geo.block_bytes, Ordering::Relaxed);
        w[header::SLOTS].store(self.geo.slots, Ordering::Relaxed);
        w[header::MAGIC].store(MAGIC, Ordering::Release);
    }
}

/// Builds the file under a temporary name and links it into place (fails with
/// `AlreadyExists` when another agent won).
fn create(dir: &Path, path: &Path, geo: Geometry) -> Result<HostCache, OpenError> {
    let tmp = dir.join(format!(".{}.{}.tmp", file_name(euid()), std::process::id()));
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| OpenError::Io { path: p, source }
    };
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_nofollow())
        .open(&tmp)
        .map_err(io(&tmp))?;
    let built = (|| {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        let len = geo.file_bytes().unwrap_or(u64::MAX);
        file.set_len(len)?;
        let region = Region::file(
            file.try_clone()?,
            usize::try_from(len).map_err(std::io::Error::other)?,
        )?;
        Ok::<_, std::io::Error>(region)
    })();
    let region = match built {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&tmp)(e));
        }
    };
    let cache = HostCache::over(region, geo, Some(path.to_path_buf()));
    cache.write_header();
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(io(path))?;
    tracing::info!(path = %path.display(), slots = geo.slots, block_bytes = geo.block_bytes,
        "host cache created");
    Ok(cache)
}

/// `O_NOFOLLOW`: the cache's name is never followed to a file elsewhere.
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Opens the existing file after checking its owner, mode and header.
fn attach(path: &Path) -> Result<HostCache, OpenError> {
    let io = |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file: File = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc_nofollow())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(40) => OpenError::NotRegular(path.to_path_buf()), // ELOOP: a symlink
            _ => io(e),
        })?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular(path.to_path_buf()));
    }
    if meta.uid() != euid() {
        return Err(OpenError::ForeignOwner {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    if meta.mode() & 0o007 != 0 {
        return Err(OpenError::OpenToOthers {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o777,
        });
    }
    let len = usize_of(meta.len())?;
    if len < crate::layout::HEADER_BYTES as usize {
        return Err(OpenError::BadHeader(path.to_path_buf()));
    }
    let region = Region::file(file, len).map_err(io)?;
    let w = region.words();
    let geo = (w[header::MAGIC].load(Ordering::Acquire) == MAGIC
        && w[header::VERSION].load(Ordering::Relaxed) == LAYOUT_VERSION)
        .then(|| {
            Geometry::from_header(
                w[header::BLOCK_BYTES].load(Ordering::Relaxed),
                w[header::SLOTS].load(Ordering::Relaxed),
            )
        })
        .flatten()
        .filter(|g| g.file_bytes() == Some(meta.len()))
        .ok_or_else(|| OpenError::BadHeader(path.to_path_buf()))?;
    Ok(HostCache::over(region, geo, Some(path.to_path_buf())))
}
