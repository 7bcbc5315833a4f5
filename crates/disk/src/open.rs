//! Opening any image by path: format detection by magic, and differencing chains resolved
//! through parent locators with identity checks, a depth limit and cycle detection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::raw::RawDisk;
use crate::vhd::VhdImage;
use crate::vhdx::{self, VhdxImage};
use crate::{BlockDevice, Error, ErrorKind, FileStorage, Result, Storage, file};

/// The deepest chain opened (base + 63 versions).
pub const MAX_CHAIN_DEPTH: usize = 64;

/// An image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// VHDX (MS-VHDX).
    Vhdx,
    /// Legacy VHD.
    Vhd,
    /// Raw bytes.
    Raw,
}

impl Format {
    /// The format a path's extension names, if any.
    pub fn from_extension(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "vhdx" | "avhdx" => Some(Format::Vhdx),
            "vhd" | "avhd" => Some(Format::Vhd),
            "img" | "raw" | "bin" => Some(Format::Raw),
            _ => None,
        }
    }

    /// Parses a `--format` value.
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown name.
    pub fn parse(s: &str) -> Result<Format> {
        match s.to_ascii_lowercase().as_str() {
            "vhdx" => Ok(Format::Vhdx),
            "vhd" | "vpc" => Ok(Format::Vhd),
            "raw" | "img" => Ok(Format::Raw),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown format {s:?} (vhdx, vhd, raw)"),
            )),
        }
    }
}

/// Detects a file's format from its bytes: "vhdxfile" at 0, or a "conectix" footer at 0 or
/// at the end. Anything else is raw only when the extension (or a block device) says so.
///
/// # Errors
/// `InvalidFormat` when nothing matches; `Io`.
pub fn detect(path: &Path, storage: &dyn Storage) -> Result<Format> {
    let len = storage.len()?;
    let mut head = [0u8; 8];
    storage.read_at(&mut head, 0)?;
    if &head == b"vhdxfile" {
        return Ok(Format::Vhdx);
    }
    if &head == b"conectix" {
        return Ok(Format::Vhd);
    }
    if len >= 512 {
        let mut tail = [0u8; 8];
        storage.read_at(&mut tail, len - 512)?;
        if &tail == b"conectix" {
            return Ok(Format::Vhd);
        }
        storage.read_at(&mut tail, len - 511)?;
        if &tail == b"conectix" {
            return Ok(Format::Vhd);
        }
    }
    if Format::from_extension(path) == Some(Format::Raw) || is_block_device(path) {
        return Ok(Format::Raw);
    }
    Err(Error::new(
        ErrorKind::InvalidFormat,
        format!(
            "{}: not a vhdx or vhd image (no signature) and not named .img/.raw",
            path.display()
        ),
    ))
}

fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// One opened image of a chain.
#[derive(Debug, Clone)]
pub enum Image {
    /// A VHDX image.
    Vhdx(Arc<VhdxImage>),
    /// A VHD image.
    Vhd(Arc<VhdImage>),
    /// A raw image.
    Raw(Arc<RawDisk>),
}

impl Image {
    /// As a block device.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        match self {
            Image::Vhdx(i) => i.clone(),
            Image::Vhd(i) => i.clone(),
            Image::Raw(i) => i.clone(),
        }
    }

    fn attach_parent(&self, parent: Arc<dyn BlockDevice>) -> Result<()> {
        match self {
            Image::Vhdx(i) => i.attach_parent(parent),
            Image::Vhd(i) => i.attach_parent(parent),
            Image::Raw(_) => Err(Error::new(
                ErrorKind::InvalidArgument,
                "raw images have no parent",
            )),
        }
    }
}

/// A layer of an opened chain.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Where it was opened from.
    pub path: PathBuf,
    /// Its format.
    pub format: Format,
    /// The image.
    pub image: Image,
}

/// An opened chain, top first.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Layers from the top (the image named) to the base.
    pub layers: Vec<Layer>,
}

impl Chain {
    /// The top as a block device (reads resolve through the whole chain).
    pub fn top(&self) -> Arc<dyn BlockDevice> {
        self.layers[0].image.device()
    }

    /// Turns off host read-ahead on every layer under the top: reads of a chain jump
    /// between layers by sector bitmap, and read-ahead on a parent would read the ranges a
    /// child overrides.
    ///
    /// # Errors
    /// I/O failures of the advice call.
    pub fn advise_random_below_top(&self) -> Result<()> {
        self.advise_random_from(1)
    }

    /// Turns off host read-ahead on every layer, the top included: for chains served behind
    /// a block cache, which does its own read-ahead.
    ///
    /// # Errors
    /// I/O failures of the advice call.
    pub fn advise_random_all(&self) -> Result<()> {
        self.advise_random_from(0)
    }

    /// Reads of every layer's file that are aligned to [`crate::DIRECT_ALIGN`] bypass the
    /// host's page cache from now on (see [`Storage::direct_reads`]): for chains served
    /// behind a block cache, so their bytes are held in RAM once. Returns how many layers
    /// could (file systems without `O_DIRECT` keep buffered reads).
    ///
    /// # Errors
    /// Failures other than "not supported" of opening a direct handle.
    pub fn direct_reads_all(&self) -> Result<usize> {
        let mut n = 0;
        for layer in &self.layers {
            if let Image::Vhdx(i) = &layer.image
                && i.storage().direct_reads()?
            {
                n += 1;
            }
        }
        Ok(n)
    }

    fn advise_random_from(&self, first: usize) -> Result<()> {
        for layer in &self.layers[first..] {
            if let Image::Vhdx(i) = &layer.image {
                i.storage().advise_random()?;
            }
        }
        Ok(())
    }

    /// Commits and cleanly closes a writable VHDX top.
    ///
    /// # Errors
    /// I/O failures.
    pub fn close(&self) -> Result<()> {
        match &self.layers[0].image {
            Image::Vhdx(i) => i.close(),
            other => other.device().flush(),
        }
    }
}

/// Options for [`open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Open the top image for writing (parents are always read-only).
    pub writable: bool,
    /// Force a format instead of detecting it.
    pub format: Option<Format>,
}

/// Opens a file as storage, never blocking: a FIFO, socket, character device or directory
/// is refused before any read (see [`crate::file::open_file`]); a block device is accepted
/// (a raw image may be a disk).
///
/// # Errors
/// `NotFound`, `NotRegularFile` or `Io`, naming the path.
pub fn open_storage(path: &Path, writable: bool) -> Result<Arc<dyn Storage>> {
    let f = file::open_file(path, writable, file::Accept::RegularOrBlock)?;
    Ok(Arc::new(FileStorage::new(f)))
}

/// Opens one image without resolving its parent.
///
/// # Errors
/// Format and I/O errors, with the path in the message.
pub fn open_one(path: &Path, opts: OpenOptions) -> Result<Layer> {
    let storage = open_storage(path, opts.writable)?;
    open_one_on(path, storage, opts)
}

/// Opens one image from `storage` already opened from `path`.
fn open_one_on(path: &Path, storage: Arc<dyn Storage>, opts: OpenOptions) -> Result<Layer> {
    let format = match opts.format {
        Some(f) => f,
        None => detect(path, storage.as_ref())?,
    };
    let ctx = |e: Error| e.context(path.display());
    let image = match format {
        Format::Vhdx => {
            let o = vhdx::OpenOptions {
                writable: opts.writable,
                path: Some(path.to_path_buf()),
            };
            Image::Vhdx(Arc::new(VhdxImage::open(storage, o).map_err(ctx)?))
        }
        Format::Vhd => {
            if opts.writable {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: vhd images are read-only; convert to vhdx to write",
                        path.display()
                    ),
                ));
            }
            Image::Vhd(Arc::new(VhdImage::open(storage, Some(path)).map_err(ctx)?))
        }
        Format::Raw => Image::Raw(Arc::new(
            RawDisk::open(storage, opts.writable).map_err(ctx)?,
        )),
    };
    Ok(Layer {
        path: path.to_path_buf(),
        format,
        image,
    })
}

/// How a chain's layers are opened: the path a layer is known by (for cycle checks and
/// [`Layer::path`]) and its storage.
type Opener<'a> = dyn Fn(&Path, bool) -> Result<(PathBuf, Arc<dyn Storage>)> + 'a;

/// Opens an image and its whole parent chain.
///
/// # Errors
/// `ChainBroken` for a missing parent, an identity mismatch, a cycle, or a chain deeper than
/// [`MAX_CHAIN_DEPTH`]; format and I/O errors of any layer.
pub fn open(path: &Path, opts: OpenOptions) -> Result<Chain> {
    open_chain(path, opts, &|p, writable| {
        let storage = open_storage(p, writable)?;
        Ok((p.to_path_buf(), storage))
    })
}

/// Opens an image and its whole parent chain with every layer confined to `root` (a
/// canonical directory): each layer, the top included, is opened by
/// [`file::open_beneath`], so a parent locator naming a file outside `root` (directly, by
/// `..` or through a symlink) is refused with the same text whether or not that file
/// exists, and nothing but a regular file is opened. Layers are known by their canonical
/// paths.
///
/// # Errors
/// As [`open`]; the top's own `OutsideRoot`, `NotFound` or `NotRegularFile`.
pub fn open_confined(root: &Path, path: &Path, opts: OpenOptions) -> Result<Chain> {
    open_chain(path, opts, &|p, writable| {
        let (real, f) = file::open_beneath(root, p, writable)?;
        Ok((real, Arc::new(FileStorage::new(f)) as Arc<dyn Storage>))
    })
}

/// Gives the storage of a layer in place of the file itself: for stores whose bytes are not
/// (all) in the file a confined open finds, such as a bucket read through a local tier. The
/// path confinement of [`open_confined_with`] still holds: the opener is called only with a
/// file already opened inside the root.
pub trait StorageOpener: Send + Sync + std::fmt::Debug {
    /// The storage of the layer at `path` (canonical, inside the root), opened as `file`.
    ///
    /// # Errors
    /// Whatever keeps the layer from opening (it is reported with the path).
    fn open(&self, path: &Path, file: std::fs::File, writable: bool) -> Result<Arc<dyn Storage>>;
}

/// As [`open_confined`], with every layer's storage given by `storages`.
///
/// # Errors
/// As [`open_confined`], and the opener's.
pub fn open_confined_with(
    root: &Path,
    path: &Path,
    opts: OpenOptions,
    storages: &dyn StorageOpener,
) -> Result<Chain> {
    open_chain(path, opts, &|p, writable| {
        let (real, f) = file::open_beneath(root, p, writable)?;
        let storage = storages.open(&real, f, writable)?;
        Ok((real, storage))
    })
}

/// As [`open_one`] on a file inside `root`, with the storage given by `storages`.
///
/// # Errors
/// As [`open_one`], and the opener's.
pub fn open_one_confined_with(
    root: &Path,
    path: &Path,
    opts: OpenOptions,
    storages: &dyn StorageOpener,
) -> Result<Layer> {
    let (real, f) = file::open_beneath(root, path, opts.writable)?;
    let storage = storages.open(&real, f, opts.writable)?;
    open_one_on(&real, storage, opts)
}

fn open_chain(path: &Path, opts: OpenOptions, opener: &Opener<'_>) -> Result<Chain> {
    let (top_path, storage) = opener(path, opts.writable)?;
    let top = open_one_on(&top_path, storage, opts)?;
    let mut layers = vec![top];
    let mut seen = vec![canonical(&top_path)];
    loop {
        let cur = layers.last().expect("chain has a top");
        let Some(pref) = cur.image.device().parent_ref() else {
            break;
        };
        if layers.len() >= MAX_CHAIN_DEPTH {
            return Err(Error::new(
                ErrorKind::ChainBroken,
                format!(
                    "{}: chain deeper than the limit of {MAX_CHAIN_DEPTH}",
                    path.display()
                ),
            ));
        }
        let mut tried = Vec::new();
        let mut found = None;
        for cand in &pref.paths {
            // The candidate is opened (never blocking, confined when the opener is) before
            // anything is read from it; a candidate that does not open is reported and the
            // next is tried.
            let (cand_path, storage) = match opener(cand, false) {
                Ok(o) => o,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    tried.push(format!("{} (not found)", cand.display()));
                    continue;
                }
                Err(e) => {
                    tried.push(format!("({e})"));
                    continue;
                }
            };
            if seen.contains(&canonical(&cand_path)) {
                return Err(Error::new(
                    ErrorKind::ChainBroken,
                    format!(
                        "{}: parent chain has a cycle at {}",
                        cur.path.display(),
                        cand.display()
                    ),
                ));
            }
            // A candidate that exists but does not open (another file, a damaged image) is
            // reported and the next candidate is tried.
            let parent = match open_one_on(&cand_path, storage, OpenOptions::default()) {
                Ok(p) => p,
                Err(e) => {
                    tried.push(format!("{} ({e})", cand.display()));
                    continue;
                }
            };
            match cur.image.attach_parent(parent.image.device()) {
                Ok(()) => {
                    found = Some(parent);
                    break;
                }
                Err(e) => tried.push(format!("{} ({e})", cand.display())),
            }
        }
        let Some(parent) = found else {
            return Err(Error::new(
                ErrorKind::ChainBroken,
                format!(
                    "{}: parent not found; tried: {}",
                    cur.path.display(),
                    tried.join("; ")
                ),
            ));
        };
        seen.push(canonical(&parent.path));
        layers.push(parent);
    }
    // Parents attach bottom-up implicitly: each attach above used an already-opened device
    // whose own parent is attached in the next iteration (reads go through Arc links).
    Ok(Chain { layers })
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
