//! The [`BlockDevice`] trait: a virtual disk with positional `&self` I/O, declared
//! capabilities, and an allocation map.

use std::path::PathBuf;
use std::sync::Arc;

use vhdx::Guid;

use crate::{Error, ErrorKind, Result};

/// Where the bytes of a range of one layer come from (not resolving parents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Stored in this layer.
    Data,
    /// Reads as zeros, decided by this layer (does not fall through to a parent).
    Zero,
    /// Not in this layer: the parent's bytes (zeros when there is no parent).
    Parent,
}

/// A run of one layer's map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRun {
    /// Length in bytes.
    pub len: u64,
    /// Its source.
    pub source: Source,
}

/// The allocation state of a range of the whole device (parents resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Holds data somewhere in the chain.
    Data,
    /// Allocated or explicitly zero, reads as zeros.
    Zero,
    /// Unallocated everywhere in the chain; reads as zeros.
    Hole,
}

/// A run of the resolved allocation map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Start offset in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// State.
    pub kind: ExtentKind,
}

/// How a differencing image names its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentRef {
    /// Identities the parent may have (VHDX parent_linkage/parent_linkage2; VHD UniqueId).
    pub linkage: Vec<Guid>,
    /// Candidate paths, in the order to try, already resolved against the child's directory.
    pub paths: Vec<PathBuf>,
}

/// Static facts about a device, for `info` and for mapping to protocol flags.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Geometry {
    /// Virtual size in bytes.
    pub size: u64,
    /// Logical sector size in bytes.
    pub logical_sector_size: u32,
    /// Physical sector size in bytes.
    pub physical_sector_size: u32,
    /// Allocation unit in bytes (VHDX BlockSize, VHD block size, or 1 MiB for raw).
    pub block_size: u32,
}

/// A virtual block device. All methods are positional and take `&self`.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size, sector sizes and allocation unit.
    fn geometry(&self) -> Geometry;

    /// Virtual size in bytes.
    fn size(&self) -> u64 {
        self.geometry().size
    }

    /// A short name of the format ("vhdx", "vhd", "raw").
    fn format(&self) -> &'static str;

    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// `OutOfBounds` past the end; `Io`; `ChainBroken` when a parent is needed and missing.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Writes `buf` at `offset`.
    ///
    /// # Errors
    /// `ReadOnly` unless [`BlockDevice::can_write`].
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            format!("{} device is read-only", self.format()),
        ))
    }

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// Tells the device the range is no longer needed (reads may then return zeros).
    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }

    /// Makes the range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64);
            self.write_at(&zeros[..n as usize], offset + done)?;
            done += n;
        }
        Ok(())
    }

    /// True when writes are accepted.
    fn can_write(&self) -> bool {
        false
    }

    /// This layer's own map of `[offset, offset+len)`, parents not resolved.
    fn map_layer(&self, _offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        Ok(vec![LayerRun {
            len,
            source: Source::Data,
        }])
    }

    /// The parent this layer reads through, once attached.
    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        None
    }

    /// Which parent this image needs, if it is a differencing image.
    fn parent_ref(&self) -> Option<ParentRef> {
        None
    }

    /// The identity children link to (VHDX DataWriteGuid, VHD UniqueId).
    fn linkage_id(&self) -> Option<Guid> {
        None
    }

    /// Bytes of the backing file that hold this layer's data and metadata.
    fn allocated_bytes(&self) -> Result<u64> {
        Ok(self.size())
    }

    /// Non-fatal problems noticed at open (lenient checksum policy, in-memory replay...).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// This device's fast paths: `Some(self)` for a device that implements [`FastPath`],
    /// `None` when every call takes the ordinary path. It has no default, so that a new
    /// device has to decide. A decorator that changes some calls of the device below and
    /// passes the rest on is a [`Filter`](crate::Filter), which answers `Some(self)` and
    /// passes on every fast path it does not define; a layer with data of its own (a
    /// cache) implements [`FastPath`] itself, and adding a method to [`FastPath`] does not
    /// compile until it says what it does with it.
    fn fast_path(&self) -> Option<&dyn FastPath>;
}

/// The optional fast paths of a [`BlockDevice`]: ways to complete a call without a blocking
/// thread (from memory, or by a future another task completes) or with fewer system calls.
/// Each method may decline (`None`), and then nothing was done and the caller makes the
/// ordinary call. None of the methods has a default, on purpose (see
/// [`BlockDevice::fast_path`]): a method added here must be added to
/// [`Filter`](crate::Filter) too, with a default that passes it on, and to
/// `testkit::Fast`, whose tests check every filter and cache against it. Callers go
/// through the methods of the same names on `dyn BlockDevice`, which answer `None` for a
/// device without fast paths.
pub trait FastPath: Send + Sync {
    /// Reads `bufs` one after the other from `offset` on, as [`BlockDevice::read_at`] of
    /// their concatenation would; an image whose range lies in one stretch of its file
    /// reads it with one vectored store read. [`read_each`] is the plain way, for a device
    /// with nothing better to do.
    ///
    /// # Errors
    /// As [`BlockDevice::read_at`].
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()>;

    /// [`BlockDevice::read_at`] if it can complete from memory without waiting on I/O or
    /// on another thread's fill (a block-cache hit); `None` otherwise, and then nothing was
    /// done: the caller makes the ordinary, possibly blocking call. Servers use it to answer
    /// hits on the reactor thread instead of handing them to a blocking pool.
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>>;

    /// The bytes `[offset, offset+len)` as pieces of buffers the device already holds in
    /// memory (a block cache's entries), without copying them, if every byte is there; `None`
    /// otherwise (nothing was done). A server writes the pieces straight to its socket.
    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>>;

    /// True when [`FastPath::try_read_shared`] answers every read the device can serve
    /// from memory, so a caller need not try [`FastPath::try_read_at`] (and fill a buffer
    /// for it) after it declined.
    fn shares_reads(&self) -> bool;

    /// The bytes `[offset, offset+len)` as pieces of buffers the device keeps (a block
    /// cache's entries), reading what is missing first, like [`BlockDevice::read_at`] but
    /// without copying the bytes out; may block. `None` when the device keeps no buffers to
    /// share: the caller reads with [`BlockDevice::read_at`].
    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>>;

    /// [`BlockDevice::write_at`] if it can complete in memory without blocking (a RAM write
    /// cache with room); `None` otherwise, and then nothing was written.
    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>>;

    /// Starts [`BlockDevice::read_at`] of `len` bytes at `offset` and returns its completion
    /// as a future, if the device completes reads without a thread of the caller's waiting
    /// on them (a device that forwards requests over a connection whose replies its own
    /// reader delivers); `None` otherwise (nothing was started). See [`Submitted`].
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>>;

    /// Starts [`BlockDevice::write_at`] of `buf` at `offset` like
    /// [`FastPath::submit_read`]; `None` when it was not started.
    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>>;
}

/// The fast paths of any device, declining (`None`, `false`) where it has none. Decorators
/// and servers call these; they are not meant to be implemented (see [`FastPath`]).
impl<'a> dyn BlockDevice + 'a {
    /// [`FastPath::read_vectored_at`], or [`read_each`] for a device without fast paths.
    ///
    /// # Errors
    /// As [`BlockDevice::read_at`].
    #[inline]
    pub fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        match self.fast_path() {
            Some(f) => f.read_vectored_at(bufs, offset),
            None => read_each(self, bufs, offset),
        }
    }

    /// [`FastPath::try_read_at`]; `None` for a device without fast paths.
    #[inline]
    pub fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        self.fast_path()?.try_read_at(buf, offset)
    }

    /// [`FastPath::try_read_shared`]; `None` for a device without fast paths.
    #[inline]
    pub fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.fast_path()?.try_read_shared(offset, len)
    }

    /// [`FastPath::shares_reads`]; false for a device without fast paths.
    #[inline]
    pub fn shares_reads(&self) -> bool {
        self.fast_path().is_some_and(|f| f.shares_reads())
    }

    /// [`FastPath::read_shared`]; `None` for a device without fast paths.
    #[inline]
    pub fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.fast_path()?.read_shared(offset, len)
    }

    /// [`FastPath::try_write_at`]; `None` for a device without fast paths.
    #[inline]
    pub fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        self.fast_path()?.try_write_at(buf, offset)
    }

    /// [`FastPath::submit_read`]; `None` for a device without fast paths.
    #[inline]
    pub fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        self.fast_path()?.submit_read(offset, len)
    }

    /// [`FastPath::submit_write`]; `None` for a device without fast paths.
    #[inline]
    pub fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        self.fast_path()?.submit_write(buf, offset)
    }
}

/// Reads `bufs` one after the other from `offset` on with [`BlockDevice::read_at`]: the
/// plain [`FastPath::read_vectored_at`].
///
/// # Errors
/// As [`BlockDevice::read_at`].
pub fn read_each(
    dev: &(impl BlockDevice + ?Sized),
    bufs: &mut [&mut [u8]],
    offset: u64,
) -> Result<()> {
    let mut at = offset;
    for b in bufs.iter_mut() {
        dev.read_at(b, at)?;
        at += b.len() as u64;
    }
    Ok(())
}

/// A disk call started by [`FastPath::submit_read`] or [`FastPath::submit_write`].
/// It resolves to `Some(result)`, or to `None` when the device could not finish the call
/// this way (its connection was lost, say): the caller then makes the ordinary blocking
/// call, which may recover (fail over, retry) where a future must not block. A write that
/// resolves to `None` may or may not have landed, and the blocking call writes it again.
pub type Submitted<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<Result<T>>> + Send + 'static>>;

/// An immutable buffer shared between a cache and the readers of its bytes.
pub type SharedBuf = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A part of a [`FastPath::try_read_shared`] or [`FastPath::read_shared`] answer.
#[derive(Clone)]
pub enum Piece {
    /// `len` bytes of `buf` from `start`.
    Shared {
        /// The buffer.
        buf: SharedBuf,
        /// First byte in `buf`.
        start: usize,
        /// Length.
        len: usize,
    },
    /// `len` zero bytes.
    Zero(usize),
}

impl Piece {
    /// The piece's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Piece::Shared { len, .. } | Piece::Zero(len) => *len,
        }
    }

    /// True for an empty piece.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a shared piece; `None` for zeros.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Piece::Shared { buf, start, len } => Some(&(**buf).as_ref()[*start..*start + *len]),
            Piece::Zero(_) => None,
        }
    }
}

impl std::fmt::Debug for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Piece::Shared { start, len, .. } => write!(f, "Shared({start}+{len})"),
            Piece::Zero(len) => write!(f, "Zero({len})"),
        }
    }
}

/// Checks that `[offset, offset+len)` lies inside a device of `size` bytes.
///
/// # Errors
/// `OutOfBounds`.
pub fn check_bounds(size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::new(
            ErrorKind::OutOfBounds,
            format!("access {offset:#x}+{len:#x} past the end of a {size}-byte disk"),
        )),
    }
}

/// The resolved allocation map of `dev` (parents walked), merged into maximal runs.
///
/// # Errors
/// Errors of `map_layer` at any depth.
pub fn extents(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<Vec<Extent>> {
    let mut out: Vec<Extent> = Vec::new();
    let push = |out: &mut Vec<Extent>, e: Extent| {
        if e.len == 0 {
            return;
        }
        match out.last_mut() {
            Some(last) if last.kind == e.kind && last.offset + last.len == e.offset => {
                last.len += e.len;
            }
            _ => out.push(e),
        }
    };
    let mut pos = offset;
    for run in dev.map_layer(offset, len)? {
        match run.source {
            Source::Data => push(
                &mut out,
                Extent {
                    offset: pos,
                    len: run.len,
                    kind: ExtentKind::Data,
                },
            ),
            Source::Zero => push(
                &mut out,
                Extent {
                    offset: pos,
                    len: run.len,
                    kind: ExtentKind::Zero,
                },
            ),
            Source::Parent => match dev.parent() {
                Some(p) => {
                    for e in extents(p.as_ref(), pos, run.len)? {
                        push(&mut out, e);
                    }
                }
                None => push(
                    &mut out,
                    Extent {
                        offset: pos,
                        len: run.len,
                        kind: ExtentKind::Hole,
                    },
                ),
            },
        }
        pos += run.len;
    }
    Ok(out)
}
