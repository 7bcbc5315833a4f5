//! Opening image files without trusting the path: no open may block (a FIFO or a device
//! named where an image was expected), and a confined open reaches only files beneath a
//! root directory, whatever symlinks or parent locators say.
//!
//! ```text
//!   open_file(path)            O_NONBLOCK open → fstat → regular (or block device) → clear O_NONBLOCK
//!   open_beneath(root, path)   no ".." → canonical path inside root? → openat2(root, rel,
//!                              RESOLVE_BENEATH | NO_SYMLINKS) (or an O_NOFOLLOW walk)
//!                              → fstat → regular only → clear O_NONBLOCK
//! ```
//!
//! A path that is outside the root gets one error text whether or not anything exists
//! there ([`outside`]), so a parent locator cannot be used to probe the host's file system.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::{Error, ErrorKind, Result};

/// The most path components a confined open walks (the fallback when `openat2` is missing).
pub const CONFINED_COMPONENTS_MAX: usize = 64;

/// What kinds of file an open accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// Only regular files (the store: images are files).
    Regular,
    /// Regular files and block devices (the CLI: a raw image may be a disk).
    RegularOrBlock,
}

/// Opens `path` for reading (and writing when `writable`) without ever blocking: the open
/// is non-blocking, the file's type is checked with `fstat` before any read, and
/// `O_NONBLOCK` is cleared again on the descriptor returned.
///
/// # Errors
/// `NotFound` when nothing is there; `NotRegularFile` naming the path and what it is
/// (FIFO, socket, character device, directory, or a block device when `accept` is
/// [`Accept::Regular`]); `Io`.
pub fn open_file(path: &Path, writable: bool, accept: Accept) -> Result<File> {
    let file = File::options()
        .read(true)
        .write(writable)
        .custom_flags(nonblocking_flags())
        .open(path)
        .map_err(|e| open_error(path, e))?;
    require_file(file, path, accept)
}

/// The extra open flags of a safe open: `O_NONBLOCK` (a FIFO opens at once instead of
/// waiting for a writer) and `O_NOCTTY`. Pass them to [`std::os::unix::fs::OpenOptionsExt::
/// custom_flags`] and hand the file to [`require_file`].
pub fn nonblocking_flags() -> i32 {
    (OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32
}

/// Checks with `fstat` that `file` (opened with [`nonblocking_flags`]) is of a kind `accept`
/// allows, then clears `O_NONBLOCK` so reads and writes behave as usual.
///
/// # Errors
/// `NotRegularFile` naming `path` and what it is; `Io`.
pub fn require_file(file: File, path: &Path, accept: Accept) -> Result<File> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    let t = meta.file_type();
    let what = if t.is_file() {
        None
    } else if t.is_block_device() {
        (accept == Accept::Regular).then_some("a block device")
    } else if t.is_fifo() {
        Some("a fifo")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    };
    if let Some(what) = what {
        return Err(Error::new(
            ErrorKind::NotRegularFile,
            format!("{}: is {what}, not a regular file", path.display()),
        ));
    }
    let flags = rustix::fs::fcntl_getfl(&file)
        .map_err(|e| Error::io(format!("get flags of {}", path.display()), e.into()))?;
    rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)
        .map_err(|e| Error::io(format!("set flags of {}", path.display()), e.into()))?;
    Ok(file)
}

fn open_error(path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::with_source(
            ErrorKind::NotFound,
            format!("{}: not found", path.display()),
            e,
        )
    } else {
        Error::io(format!("open {}", path.display()), e)
    }
}

/// The one error of a path outside `root`, the same whether or not anything exists there.
pub fn outside(root: &Path, path: &Path) -> Error {
    Error::new(
        ErrorKind::OutsideRoot,
        format!(
            "{}: outside {} (only files inside it may be opened)",
            path.display(),
            root.display()
        ),
    )
}

/// The canonical form of `path` when it lies inside `root` (a canonical directory); a
/// relative `path` is taken from `root`. Nothing is opened.
///
/// # Errors
/// [`ErrorKind::OutsideRoot`] (always the text of [`outside`]) when `path` has a `..`
/// component, resolves outside `root`, or does not resolve and its nearest existing
/// ancestor is outside `root`; [`ErrorKind::NotFound`] when it does not exist but would be
/// inside `root`.
pub fn confine(root: &Path, path: &Path) -> Result<PathBuf> {
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(outside(root, path));
    }
    let joined = root.join(path);
    match std::fs::canonicalize(&joined) {
        Ok(real) if real.starts_with(root) => Ok(real),
        Ok(_) => Err(outside(root, path)),
        Err(_) => {
            // Whether the missing path would be inside `root` is decided by its nearest
            // ancestor that exists, so an outside path answers `outside` either way.
            let inside = joined
                .ancestors()
                .skip(1)
                .find_map(|a| std::fs::canonicalize(a).ok())
                .is_some_and(|a| a.starts_with(root));
            if inside {
                Err(Error::new(
                    ErrorKind::NotFound,
                    format!("{}: not found", path.display()),
                ))
            } else {
                Err(outside(root, path))
            }
        }
    }
}

/// Opens `path` only if it is a regular file inside `root` (a canonical directory): the
/// path is checked with [`confine`] first, then opened relative to `root` with `openat2`
/// (`RESOLVE_BENEATH`, no symlinks; a walk of `O_NOFOLLOW` opens where `openat2` is
/// missing), so a symlink swapped in after the check is refused, not followed. The open
/// never blocks (see [`open_file`]). Returns the canonical path and the file.
///
/// Every server and farm open of a store file or a chain layer should go through this.
/// `root` must be canonical (as `std::fs::canonicalize` gives it): against any other
/// spelling every path is refused, never admitted.
///
/// # Errors
/// As [`confine`]; `NotRegularFile`; `Io`.
pub fn open_beneath(root: &Path, path: &Path, writable: bool) -> Result<(PathBuf, File)> {
    let real = confine(root, path)?;
    let rel = real.strip_prefix(root).map_err(|_| outside(root, path))?;
    if rel.as_os_str().is_empty() {
        return Err(Error::new(
            ErrorKind::NotRegularFile,
            format!("{}: is a directory, not a regular file", path.display()),
        ));
    }
    let mode = if writable {
        OFlags::RDWR
    } else {
        OFlags::RDONLY
    };
    let flags = mode | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("open {}", root.display()), e.into()))?;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(&dir, rel, flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS | Errno::PERM) => walk_nofollow(&dir, rel, flags),
        r => r,
    };
    let fd = fd.map_err(|e| match e {
        // A symlink or a cross-root path appeared after the check.
        Errno::LOOP | Errno::XDEV | Errno::NOTDIR => outside(root, path),
        e => open_error(path, e.into()),
    })?;
    let file = require_file(File::from(fd), path, Accept::Regular)?;
    Ok((real, file))
}

/// Opens `rel` under `dir` one component at a time, following no symlink.
fn walk_nofollow(
    dir: &std::os::fd::OwnedFd,
    rel: &Path,
    flags: OFlags,
) -> rustix::io::Result<std::os::fd::OwnedFd> {
    let parts: Vec<_> = rel.components().collect();
    if parts.len() > CONFINED_COMPONENTS_MAX
        || parts.iter().any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(Errno::XDEV);
    }
    let mut cur: Option<std::os::fd::OwnedFd> = None;
    for (i, c) in parts.iter().enumerate() {
        let at = cur.as_ref().unwrap_or(dir);
        let last = i + 1 == parts.len();
        let f = if last {
            flags | OFlags::NOFOLLOW
        } else {
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
        };
        cur = Some(rustix::fs::openat(at, c.as_os_str(), f, Mode::empty())?);
    }
    cur.ok_or(Errno::INVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let r = std::fs::canonicalize(d.path()).unwrap();
        (d, r)
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let (_d, r) = root();
        let p = r.join("pipe.vhdx");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = open_file(&p, false, Accept::RegularOrBlock).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotRegularFile, "{e}");
        assert!(e.to_string().contains("pipe.vhdx: is a fifo"), "{e}");
        let e = open_beneath(&r, &p, false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotRegularFile, "{e}");
    }

    #[test]
    fn regular_file_opens_blocking_again() {
        let (_d, r) = root();
        let p = r.join("a.vhdx");
        std::fs::write(&p, b"x").unwrap();
        let f = open_file(&p, false, Accept::Regular).unwrap();
        let flags = rustix::fs::fcntl_getfl(&f).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK));
        let (real, _) = open_beneath(&r, &p, true).unwrap();
        assert_eq!(real, p);
    }

    #[test]
    fn outside_paths_get_one_text_whether_or_not_they_exist() {
        let (_d, r) = root();
        let (_o, other) = root();
        let there = other.join("there.vhdx");
        std::fs::write(&there, b"x").unwrap();
        let missing = other.join("missing.vhdx");
        let a = open_beneath(&r, &there, false).unwrap_err();
        let b = open_beneath(&r, &missing, false).unwrap_err();
        assert_eq!(a.kind(), ErrorKind::OutsideRoot);
        assert_eq!(b.kind(), ErrorKind::OutsideRoot);
        let strip = |e: &Error, p: &Path| e.to_string().replace(&p.display().to_string(), "P");
        assert_eq!(strip(&a, &there), strip(&b, &missing));
        let gone = Path::new("/nonexistent-ferry-dir/x.vhdx");
        let c = open_beneath(&r, gone, false).unwrap_err();
        assert_eq!(strip(&c, gone), strip(&a, &there));
    }

    #[test]
    fn dot_dot_is_refused_even_when_it_lands_inside() {
        let (_d, r) = root();
        std::fs::create_dir(r.join("sub")).unwrap();
        std::fs::write(r.join("a.vhdx"), b"x").unwrap();
        let e = open_beneath(&r, &r.join("sub/../a.vhdx"), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutsideRoot);
    }

    #[test]
    fn symlink_out_of_the_root_is_refused() {
        let (_d, r) = root();
        let (_o, other) = root();
        std::fs::write(other.join("t.vhdx"), b"x").unwrap();
        std::os::unix::fs::symlink(other.join("t.vhdx"), r.join("l.vhdx")).unwrap();
        let e = open_beneath(&r, &r.join("l.vhdx"), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutsideRoot, "{e}");
    }

    #[test]
    fn missing_file_inside_is_not_found() {
        let (_d, r) = root();
        let e = open_beneath(&r, &r.join("none.vhdx"), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn walk_opens_without_following_symlinks() {
        let (_d, r) = root();
        std::fs::create_dir(r.join("sub")).unwrap();
        std::fs::write(r.join("sub/a"), b"x").unwrap();
        std::os::unix::fs::symlink(r.join("sub/a"), r.join("l")).unwrap();
        let dir = rustix::fs::open(&r, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let flags = OFlags::RDONLY | OFlags::NONBLOCK;
        assert!(walk_nofollow(&dir, Path::new("sub/a"), flags).is_ok());
        assert_eq!(
            walk_nofollow(&dir, Path::new("l"), flags).unwrap_err(),
            Errno::LOOP
        );
    }
}
