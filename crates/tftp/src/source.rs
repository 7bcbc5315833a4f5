//! Where served files come from: the [`FileSource`] trait (the server asks it for a path and
//! gets a [`TftpFile`]: a size and positioned reads) and [`DirSource`], a directory tree.
//!
//! [`DirSource`] keeps every path inside its root: a leading `/` is stripped, a `..`
//! component is refused before any system call, and the file is opened with `openat2(2)`
//! and `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` relative to the root's descriptor, so a
//! symlink may point within the root but never out of it. On kernels without `openat2`
//! (before 5.6) the path is walked one component at a time with `O_NOFOLLOW`, which refuses
//! every symlink. The open is non-blocking and the descriptor must be a regular file
//! (`fstat`), so a FIFO or a device in the root cannot stall the server.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::packet::ErrorCode;

/// Positioned reads of a file's bytes.
pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; 0 means end of file.
    ///
    /// # Errors
    /// The underlying I/O error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for Arc<[u8]> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

/// A file opened for one transfer: its size (answered to `tsize` and fixing the block
/// count) and its bytes.
#[derive(Clone)]
pub struct TftpFile {
    size: u64,
    data: Arc<dyn ReadAt>,
}

impl std::fmt::Debug for TftpFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TftpFile")
            .field("size", &self.size)
            .finish()
    }
}

impl TftpFile {
    /// A file of `size` bytes read through `data`.
    pub fn new(size: u64, data: Arc<dyn ReadAt>) -> TftpFile {
        TftpFile { size, data }
    }

    /// Bytes in memory (generated content, such as a script).
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> TftpFile {
        let bytes: Arc<[u8]> = bytes.into();
        TftpFile {
            size: bytes.len() as u64,
            data: Arc::new(bytes),
        }
    }

    /// An open file; its size now is the size served.
    ///
    /// # Errors
    /// `fstat` failing.
    pub fn from_file(file: File) -> io::Result<TftpFile> {
        let size = file.metadata()?.len();
        Ok(TftpFile {
            size,
            data: Arc::new(file),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Fills `buf` from `offset`.
    ///
    /// # Errors
    /// I/O errors, and `UnexpectedEof` if the file ends early (it shrank while served).
    pub fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.data.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Why a file cannot be served. The server answers with [`OpenError::error_code`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// No such file.
    #[error("file not found")]
    NotFound,
    /// Not a regular file (a directory, FIFO, device or socket).
    #[error("not a regular file")]
    NotRegular,
    /// The path leaves the root or is not allowed.
    #[error("path refused: {reason}")]
    Refused {
        /// Why, for logs.
        reason: &'static str,
    },
    /// Permission denied by the file system.
    #[error("permission denied")]
    PermissionDenied,
    /// Another I/O error.
    #[error("open failed")]
    Io(#[source] io::Error),
}

impl OpenError {
    /// The TFTP error code answered.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            OpenError::NotFound => ErrorCode::FileNotFound,
            OpenError::NotRegular | OpenError::Refused { .. } | OpenError::PermissionDenied => {
                ErrorCode::AccessViolation
            }
            OpenError::Io(_) => ErrorCode::NotDefined,
        }
    }

    /// True for a path the source refused on purpose (counted as `path_refused`).
    pub fn is_refusal(&self) -> bool {
        matches!(self, OpenError::NotRegular | OpenError::Refused { .. })
    }
}

/// Files the server can serve.
pub trait FileSource: Send + Sync + 'static {
    /// Opens `path` (as the client sent it) for `peer`. Called on the blocking pool.
    ///
    /// # Errors
    /// [`OpenError`]; the server answers it with an ERROR packet.
    fn open(&self, path: &str, peer: SocketAddr) -> Result<TftpFile, OpenError>;
}

/// Serves the regular files under one directory.
#[derive(Debug)]
pub struct DirSource {
    root: OwnedFd,
    root_path: PathBuf,
}

/// The path relative to the root: leading `/`s stripped; `..` components and empty paths
/// refused.
pub fn relative_path(path: &str) -> Result<&str, OpenError> {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Err(OpenError::Refused {
            reason: "empty path",
        });
    }
    if rel.split('/').any(|c| c == "..") {
        return Err(OpenError::Refused {
            reason: "'..' component",
        });
    }
    Ok(rel)
}

fn file_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY
}

fn map_errno(e: rustix::io::Errno) -> OpenError {
    use rustix::io::Errno;
    match e {
        Errno::NOENT | Errno::NOTDIR | Errno::NAMETOOLONG => OpenError::NotFound,
        Errno::XDEV | Errno::LOOP => OpenError::Refused {
            reason: "leaves the root or follows a symlink out",
        },
        Errno::ACCESS | Errno::PERM => OpenError::PermissionDenied,
        Errno::NXIO => OpenError::NotRegular,
        e => OpenError::Io(e.into()),
    }
}

impl DirSource {
    /// Serves `root` (which must be a directory; opened now and held).
    ///
    /// # Errors
    /// Opening `root` fails.
    pub fn new(root: &Path) -> io::Result<DirSource> {
        let fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(DirSource {
            root: fd,
            root_path: root.to_path_buf(),
        })
    }

    /// The directory served.
    pub fn root(&self) -> &Path {
        &self.root_path
    }

    fn open_beneath(&self, rel: &str) -> Result<OwnedFd, OpenError> {
        match rustix::fs::openat2(
            &self.root,
            rel,
            file_flags(),
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => Ok(fd),
            Err(rustix::io::Errno::NOSYS) => self.open_no_follow(rel),
            Err(e) => Err(map_errno(e)),
        }
    }

    /// The walk for kernels without `openat2`: every component opened with `O_NOFOLLOW`.
    fn open_no_follow(&self, rel: &str) -> Result<OwnedFd, OpenError> {
        let parts: Vec<&str> = rel
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let Some((last, dirs)) = parts.split_last() else {
            return Err(OpenError::NotRegular);
        };
        let mut dir: Option<OwnedFd> = None;
        for c in dirs {
            let at = dir.as_ref().unwrap_or(&self.root);
            let next = rustix::fs::openat(
                at,
                *c,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(map_errno)?;
            dir = Some(next);
        }
        let at = dir.as_ref().unwrap_or(&self.root);
        rustix::fs::openat(at, *last, file_flags() | OFlags::NOFOLLOW, Mode::empty())
            .map_err(map_errno)
    }

    fn open_path(&self, path: &str, no_follow_walk: bool) -> Result<TftpFile, OpenError> {
        let rel = relative_path(path)?;
        let fd = if no_follow_walk {
            self.open_no_follow(rel)?
        } else {
            self.open_beneath(rel)?
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(OpenError::Io)?;
        if !meta.is_file() {
            return Err(OpenError::NotRegular);
        }
        TftpFile::from_file(file).map_err(OpenError::Io)
    }
}

impl FileSource for DirSource {
    fn open(&self, path: &str, _peer: SocketAddr) -> Result<TftpFile, OpenError> {
        self.open_path(path, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    fn read_all(f: &TftpFile) -> Vec<u8> {
        let mut v = vec![0; usize::try_from(f.size()).unwrap()];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    /// root/{a.bin, sub/b.bin, sub/in -> ../a.bin, out -> /etc/hostname-ish, fifo, dir/}
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.bin"), b"aaa").unwrap();
        std::fs::write(root.join("sub/b.bin"), b"bb").unwrap();
        std::fs::write(t.path().join("secret"), b"secret").unwrap();
        std::os::unix::fs::symlink("../a.bin", root.join("sub/in")).unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("out_rel")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        (t, root)
    }

    #[test]
    fn serves_files_inside_the_root() {
        let (_t, root) = tree();
        let s = DirSource::new(&root).unwrap();
        for walk in [false, true] {
            assert_eq!(read_all(&s.open_path("a.bin", walk).unwrap()), b"aaa");
            assert_eq!(read_all(&s.open_path("/sub/b.bin", walk).unwrap()), b"bb");
            assert_eq!(
                read_all(&s.open_path("//sub/./b.bin", walk).unwrap()),
                b"bb"
            );
        }
        // A symlink within the root is followed by openat2 (not by the fallback walk).
        assert_eq!(read_all(&s.open("sub/in", peer()).unwrap()), b"aaa");
        assert!(matches!(
            s.open_path("sub/in", true),
            Err(OpenError::Refused { .. })
        ));
    }

    #[test]
    fn refuses_escapes_fifos_and_directories() {
        let (_t, root) = tree();
        let s = DirSource::new(&root).unwrap();
        for walk in [false, true] {
            for p in ["../secret", "sub/../../secret", "/../secret", "..", "", "/"] {
                assert!(
                    matches!(s.open_path(p, walk), Err(OpenError::Refused { .. })),
                    "{p}"
                );
            }
            for p in ["out", "out_rel"] {
                let e = s.open_path(p, walk).unwrap_err();
                assert!(matches!(e, OpenError::Refused { .. }), "{p}: {e:?}");
                assert!(e.is_refusal());
            }
            assert!(matches!(
                s.open_path("fifo", walk),
                Err(OpenError::NotRegular)
            ));
            assert!(matches!(
                s.open_path("sub", walk),
                Err(OpenError::NotRegular)
            ));
            assert!(matches!(
                s.open_path("nope", walk),
                Err(OpenError::NotFound)
            ));
            assert!(matches!(
                s.open_path("a.bin/x", walk),
                Err(OpenError::NotFound)
            ));
        }
        assert_eq!(
            OpenError::NotFound.error_code(),
            crate::packet::ErrorCode::FileNotFound
        );
    }

    #[test]
    fn bytes_and_short_files() {
        let f = TftpFile::from_bytes(vec![1u8, 2, 3]);
        assert_eq!(f.size(), 3);
        let mut b = [0; 2];
        f.read_exact_at(&mut b, 1).unwrap();
        assert_eq!(b, [2, 3]);
        let mut past = [0; 2];
        assert_eq!(
            f.read_exact_at(&mut past, 2).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
