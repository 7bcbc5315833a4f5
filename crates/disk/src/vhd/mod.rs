//! Legacy VHD images: reading fixed, dynamic and differencing files ([`VhdImage`], this
//! module), and writing new dynamic ones (`VhdWriter`, in `writer`, used by the copy
//! operations for VHD output).
//!
//! [`VhdImage`] performs the I/O that the pure codecs in [`vhdx::vhd`] describe. Everything
//! that is read at open is bounded and checked against the file length; block data is read on
//! demand with positional reads only.
//!
//! ```text
//! open:  footer (EOF, else the copy at 0) -> size rule -> dynamic header -> BAT (in memory)
//!        -> parent locator paths (differencing)
//! read:  offset -> block = offset / BlockSize -> BAT entry
//!          unallocated            -> zeros (dynamic) | parent (differencing)
//!          allocated, dynamic     -> file data (the bitmap is not consulted)
//!          allocated, differencing-> per-sector runs from the MSB-first bitmap:
//!                                    1 = file data, 0 = parent
//! ```
//!
//! # Design notes
//!
//! * **Leniency.** A checksum mismatch in the footer or the dynamic header is a warning, not an
//!   error ([`BlockDevice::warnings`]): real files with bad checksums exist and libvhdi opens
//!   them. Any other structural problem fails the open.
//! * **Footer choice.** The copy at the end of the file is preferred. A copy at offset 0 (only
//!   dynamic and differencing disks have one) is used when the end copy does not parse, or when
//!   only the copy at 0 has a good checksum. The old 511-byte footer is tried when the 512-byte
//!   one does not parse.
//! * **Past-EOF pointers.** `Storage::read_at` reads zeros past the end, which would hide a
//!   corrupt BAT entry, so every file read is checked against the length seen at open and fails
//!   with `Corrupt` instead.
//! * **Bitmaps** of differencing disks are read on first use and cached (at most
//!   [`MAX_CACHED_BITMAPS`]; the cache is simply cleared when full). The lock is never held
//!   during I/O: two threads may read the same bitmap, which is harmless for a read-only file.
//! * **Parent.** A differencing disk cannot resolve its parent itself: the caller (the chain
//!   opener) looks at [`BlockDevice::parent_ref`], opens the parent and calls
//!   [`VhdImage::attach_parent`], which checks the UniqueId before the first read.

mod writer;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use vhdx::Guid;
use vhdx::vhd::bat::{bitmap_runs, bitmap_size, block_data_offset};
use vhdx::vhd::dynamic::{self, DYNAMIC_HEADER_LEN};
use vhdx::vhd::footer::{self, FOOTER_LEN, FOOTER_LEN_OLD};
use vhdx::vhd::{Bat, DiskType, DynamicHeader, Footer, Parsed, PlatformCode, SizeRule};

pub(crate) use writer::VhdWriter;
pub use writer::{VHD_BLOCK_SIZE, VHD_SIZE_MAX};

use crate::device::{BlockDevice, Geometry, LayerRun, ParentRef, Source, check_bounds};
use crate::{Error, ErrorKind, Result, Storage};

/// The allocation unit reported for fixed disks, which have no blocks of their own.
pub const FIXED_BLOCK_SIZE: u32 = 2 << 20;
/// The most sector bitmaps kept in memory (512 bytes each for 2 MiB blocks: 2 MiB in all).
pub const MAX_CACHED_BITMAPS: usize = 4096;
/// The VHD sector size.
const SECTOR: u32 = 512;

/// A legacy VHD image opened read-only.
pub struct VhdImage {
    storage: Arc<dyn Storage>,
    /// Used in error messages and to resolve relative parent locators.
    path: Option<PathBuf>,
    /// The file length seen at open; every file read is checked against it.
    file_len: u64,
    footer: Footer,
    /// The virtual size, from [`footer::virtual_size`].
    size: u64,
    layout: Layout,
    warnings: Vec<String>,
    /// Set once by [`VhdImage::attach_parent`]; read by every Parent run.
    parent: OnceLock<Arc<dyn BlockDevice>>,
    /// Block index -> sector bitmap, filled lazily by reads of differencing blocks.
    bitmaps: Mutex<HashMap<u64, Arc<[u8]>>>,
}

/// Fixed disks are flat; dynamic and differencing disks have a header and a BAT.
enum Layout {
    Fixed,
    Sparse(Box<Sparse>),
}

struct Sparse {
    header: DynamicHeader,
    bat: Bat,
    /// Parent locator texts read at open (differencing only), in entry order.
    locator_paths: Vec<(PlatformCode, String)>,
}

/// The footer copy chosen at open.
struct ChosenFooter {
    footer: Footer,
    /// Bytes at the end of the file taken by the footer there: 512, 511 (old Virtual PC), or 0
    /// when the copy at offset 0 was used (sparse disks only).
    end_len: u64,
    /// Which copy was used and why, and bad checksums.
    warnings: Vec<String>,
}

impl VhdImage {
    /// Opens a fixed, dynamic or differencing VHD. `path` is used for messages and to resolve
    /// the parent's relative locator. A differencing disk needs
    /// [`attach_parent`](VhdImage::attach_parent) before reads that reach the parent.
    ///
    /// # Errors
    /// `InvalidFormat` when no footer parses, `Unsupported` for unknown disk types or versions,
    /// `Corrupt` for headers or tables that do not fit the file, `LimitExceeded` for tables or
    /// sizes above the limits, `Io` from the store.
    pub fn open(storage: Arc<dyn Storage>, path: Option<&Path>) -> Result<VhdImage> {
        let name = display_name(path);
        let file_len = storage.len().map_err(|e| e.context(&name))?;
        let chosen = choose_footer(storage.as_ref(), file_len, &name)?;
        let (footer, end_len, mut warnings) = (chosen.footer, chosen.end_len, chosen.warnings);
        if end_len == FOOTER_LEN_OLD as u64 {
            warnings.push("old 511-byte footer at the end of the file".to_string());
        }
        let size = footer::virtual_size(&footer);
        warnings.extend(size_warning(&footer, size));
        let mut image = VhdImage {
            storage,
            path: path.map(Path::to_path_buf),
            file_len,
            footer,
            size,
            layout: Layout::Fixed,
            warnings,
            parent: OnceLock::new(),
            bitmaps: Mutex::new(HashMap::new()),
        };
        if footer.disk_type == DiskType::Fixed {
            // The footer is the last 512 (or 511) bytes; everything before it is data.
            let data_len = file_len.saturating_sub(end_len);
            if size > data_len {
                return Err(image.err(
                    ErrorKind::Corrupt,
                    format!("fixed disk of {size} bytes in a file of {file_len} bytes"),
                ));
            }
        } else {
            let (sparse, more) = image.open_sparse()?;
            image.layout = Layout::Sparse(Box::new(sparse));
            image.warnings.extend(more);
        }
        Ok(image)
    }

    /// The footer in use.
    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// The dynamic disk header (dynamic and differencing disks).
    pub fn dynamic_header(&self) -> Option<&DynamicHeader> {
        match &self.layout {
            Layout::Fixed => None,
            Layout::Sparse(sp) => Some(&sp.header),
        }
    }

    /// Attaches the parent of a differencing disk after checking that its identity
    /// ([`BlockDevice::linkage_id`]) is this disk's ParentUniqueId and that it is not smaller.
    ///
    /// # Errors
    /// `ChainBroken` on a wrong identity or size; `InvalidArgument` when this is not a
    /// differencing disk or a parent is already attached.
    pub fn attach_parent(&self, parent: Arc<dyn BlockDevice>) -> Result<()> {
        let Some(expected) = self.expected_parent_id() else {
            return Err(self.err(ErrorKind::InvalidArgument, "not a differencing disk"));
        };
        let found = parent.linkage_id();
        if found != Some(expected) {
            let found = found.map_or_else(|| "none".to_string(), |g| g.to_string());
            return Err(self.err(
                ErrorKind::ChainBroken,
                format!("parent has unique id {found}, expected {expected}"),
            ));
        }
        if parent.size() < self.size {
            return Err(self.err(
                ErrorKind::ChainBroken,
                format!(
                    "parent of {} bytes is smaller than the {}-byte child",
                    parent.size(),
                    self.size
                ),
            ));
        }
        self.parent
            .set(parent)
            .map_err(|_| self.err(ErrorKind::InvalidArgument, "parent already attached"))
    }

    fn expected_parent_id(&self) -> Option<Guid> {
        match &self.layout {
            Layout::Sparse(sp) if self.footer.disk_type == DiskType::Differencing => {
                Some(sp.header.parent_unique_id)
            }
            _ => None,
        }
    }

    fn is_differencing(&self) -> bool {
        self.footer.disk_type == DiskType::Differencing
    }

    fn name(&self) -> String {
        display_name(self.path.as_deref())
    }

    fn err(&self, kind: ErrorKind, msg: impl fmt::Display) -> Error {
        Error::new(kind, format!("{}: {msg}", self.name()))
    }

    /// Reads `buf.len()` bytes of the file at `offset`, failing with `Corrupt` (not zeros)
    /// when any of them lies past the end of the file.
    fn read_file(&self, buf: &mut [u8], offset: u64, what: &dyn fmt::Display) -> Result<()> {
        let len = buf.len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.file_len => {}
            _ => {
                return Err(self.err(
                    ErrorKind::Corrupt,
                    format!(
                        "{what} at {offset:#x}+{len:#x} lies past the end of the file ({} bytes)",
                        self.file_len
                    ),
                ));
            }
        }
        self.storage
            .read_at(buf, offset)
            .map_err(|e| e.context(self.name()))
    }

    /// Reads and checks the dynamic header, the BAT and the parent locators. Returns the
    /// warnings found on the way.
    fn open_sparse(&self) -> Result<(Sparse, Vec<String>)> {
        let mut raw = vec![0u8; DYNAMIC_HEADER_LEN];
        self.read_file(&mut raw, self.footer.data_offset, &"dynamic header")?;
        let Parsed {
            value: header,
            checksum,
        } = DynamicHeader::parse(&raw).map_err(|e| {
            let kind = dynamic_error_kind(&e);
            let at = self.footer.data_offset;
            Error::with_source(
                kind,
                format!("{}: bad dynamic header at {at:#x}", self.name()),
                e,
            )
        })?;
        let mut warnings = Vec::new();
        if !checksum.is_ok() {
            warnings.push(format!(
                "dynamic header checksum mismatch: stored {:#010x}, computed {:#010x}",
                checksum.stored, checksum.computed
            ));
        }
        let entries = header.entries_for_size(self.size).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("{}: bat too small", self.name()),
                e,
            )
        })?;
        // At most MAX_TABLE_ENTRIES (2^24) entries: a 64 MiB read at worst.
        let mut raw_bat = vec![0u8; entries as usize * 4];
        self.read_file(&mut raw_bat, header.table_offset, &"bat")?;
        let bat = Bat::parse(&raw_bat, entries).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, format!("{}: bad bat", self.name()), e)
        })?;
        let locator_paths = if self.is_differencing() {
            self.read_locators(&header, &mut warnings)
        } else {
            Vec::new()
        };
        Ok((
            Sparse {
                header,
                bat,
                locator_paths,
            },
            warnings,
        ))
    }

    /// Reads each used parent locator's text; unreadable ones become warnings.
    fn read_locators(
        &self,
        header: &DynamicHeader,
        warnings: &mut Vec<String>,
    ) -> Vec<(PlatformCode, String)> {
        let mut out = Vec::new();
        for (index, locator) in header.locators.iter().enumerate() {
            if !locator.is_used() || locator.data_length == 0 {
                continue;
            }
            // data_length is at most MAX_LOCATOR_DATA_LEN (64 KiB), checked by the codec.
            let mut data = vec![0u8; locator.data_length as usize];
            let what = format_args!("parent locator {index}");
            let text = match self.read_file(&mut data, locator.data_offset, &what) {
                Ok(()) => locator
                    .platform_code
                    .decode_path(&data)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match text {
                Ok(text) => out.push((locator.platform_code, text)),
                Err(why) => warnings.push(format!(
                    "ignored parent locator {index} ({:?}): {why}",
                    locator.platform_code
                )),
            }
        }
        out
    }
}

/// The runs of one block slice, plus where the block's data starts in the file.
struct BlockMap {
    /// File offset of the block's first data byte; meaningful only when a run is `Data`, and
    /// `Data` runs appear only for allocated blocks.
    data_offset: u64,
    runs: Vec<LayerRun>,
}

impl VhdImage {
    /// Maps `[within, within + len)` of block `index` (the slice lies inside the block).
    fn block_map(&self, sp: &Sparse, index: u64, within: u64, len: u64) -> Result<BlockMap> {
        let block_size = sp.header.block_size;
        let Some(sector) = sp.bat.block_sector(index) else {
            let source = if self.is_differencing() {
                Source::Parent
            } else {
                Source::Zero
            };
            return Ok(BlockMap {
                data_offset: 0,
                runs: vec![LayerRun { len, source }],
            });
        };
        let data_offset = block_data_offset(sector, block_size);
        if !self.is_differencing() {
            // Dynamic disks: an allocated block is data; the bitmap is not consulted.
            return Ok(BlockMap {
                data_offset,
                runs: vec![LayerRun {
                    len,
                    source: Source::Data,
                }],
            });
        }
        let bitmap = self.bitmap(index, sector, block_size)?;
        let runs = bitmap_runs(&bitmap, within, len)
            .into_iter()
            .map(|r| LayerRun {
                len: r.len_bytes,
                source: if r.present {
                    Source::Data
                } else {
                    Source::Parent
                },
            })
            .collect();
        Ok(BlockMap { data_offset, runs })
    }

    /// The sector bitmap of an allocated block, from the cache or the file.
    fn bitmap(&self, index: u64, sector: u32, block_size: u32) -> Result<Arc<[u8]>> {
        if let Some(cached) = self.lock_bitmaps().get(&index) {
            return Ok(Arc::clone(cached));
        }
        // bitmap_size is at most 64 KiB for the largest block size the codec accepts.
        let mut raw = vec![0u8; bitmap_size(block_size) as usize];
        let at = u64::from(sector) * u64::from(SECTOR);
        self.read_file(
            &mut raw,
            at,
            &format_args!("sector bitmap of block {index}"),
        )?;
        let raw: Arc<[u8]> = raw.into();
        let mut cache = self.lock_bitmaps();
        if cache.len() >= MAX_CACHED_BITMAPS {
            cache.clear();
        }
        cache.insert(index, Arc::clone(&raw));
        Ok(raw)
    }

    fn lock_bitmaps(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<[u8]>>> {
        // The cache only ever holds complete entries, so a panic elsewhere cannot leave it
        // inconsistent: a poisoned lock is safe to reuse.
        self.bitmaps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read_parent(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        match self.parent.get() {
            Some(parent) => parent.read_at(buf, offset),
            None => Err(self.err(
                ErrorKind::ChainBroken,
                format!(
                    "parent not attached (needed for {:#x} bytes at {offset:#x})",
                    buf.len()
                ),
            )),
        }
    }

    fn read_sparse(&self, sp: &Sparse, buf: &mut [u8], offset: u64) -> Result<()> {
        let block = u64::from(sp.header.block_size);
        let mut done = 0usize;
        while done < buf.len() {
            // No overflow: the whole request was bounds-checked against the virtual size.
            let pos = offset + done as u64;
            let (index, within) = (pos / block, pos % block);
            let n = usize::try_from(block - within)
                .unwrap_or(usize::MAX)
                .min(buf.len() - done);
            let map = self.block_map(sp, index, within, n as u64)?;
            let mut at = within;
            for run in map.runs {
                // Each run is part of the n-byte slice, so it fits usize.
                let len = run.len as usize;
                let part = &mut buf[done..done + len];
                match run.source {
                    Source::Zero => part.fill(0),
                    Source::Parent => self.read_parent(part, index * block + at)?,
                    Source::Data => {
                        let what = format_args!("data of block {index}");
                        self.read_file(part, map.data_offset + at, &what)?;
                    }
                }
                done += len;
                at += run.len;
            }
        }
        Ok(())
    }
}

impl BlockDevice for VhdImage {
    fn fast_path(&self) -> Option<&dyn crate::FastPath> {
        None
    }

    fn geometry(&self) -> Geometry {
        let block_size = match &self.layout {
            Layout::Fixed => FIXED_BLOCK_SIZE,
            Layout::Sparse(sp) => sp.header.block_size,
        };
        Geometry {
            size: self.size,
            logical_sector_size: SECTOR,
            physical_sector_size: SECTOR,
            block_size,
        }
    }

    fn format(&self) -> &'static str {
        "vhd"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.size, offset, buf.len() as u64).map_err(|e| e.context(self.name()))?;
        match &self.layout {
            Layout::Fixed => self.read_file(buf, offset, &"fixed disk data"),
            Layout::Sparse(sp) => self.read_sparse(sp, buf, offset),
        }
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        check_bounds(self.size, offset, len).map_err(|e| e.context(self.name()))?;
        let Layout::Sparse(sp) = &self.layout else {
            return Ok(vec![LayerRun {
                len,
                source: Source::Data,
            }]);
        };
        let block = u64::from(sp.header.block_size);
        let mut runs: Vec<LayerRun> = Vec::new();
        let (mut pos, end) = (offset, offset + len);
        while pos < end {
            let (index, within) = (pos / block, pos % block);
            let n = (block - within).min(end - pos);
            for run in self.block_map(sp, index, within, n)?.runs {
                match runs.last_mut() {
                    Some(last) if last.source == run.source => last.len += run.len,
                    _ => runs.push(run),
                }
            }
            pos += n;
        }
        Ok(runs)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        self.parent.get().cloned()
    }

    fn parent_ref(&self) -> Option<ParentRef> {
        let Layout::Sparse(sp) = &self.layout else {
            return None;
        };
        if !self.is_differencing() {
            return None;
        }
        let dir = self.path.as_deref().and_then(Path::parent);
        let by_code = |code: PlatformCode| {
            sp.locator_paths
                .iter()
                .filter(move |(c, _)| *c == code)
                .map(|(_, text)| text.as_str())
        };
        let relative = by_code(PlatformCode::W2ru).filter_map(|t| relative_candidate(dir, t));
        let absolute = by_code(PlatformCode::W2ku).filter_map(absolute_candidate);
        let by_name = parent_file_name(&sp.header.parent_unicode_name).map(|n| join(dir, n));
        let mut paths: Vec<PathBuf> = Vec::new();
        for p in relative.chain(absolute).chain(by_name) {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        Some(ParentRef {
            linkage: vec![sp.header.parent_unique_id],
            paths,
        })
    }

    fn linkage_id(&self) -> Option<Guid> {
        Some(self.footer.unique_id)
    }

    fn allocated_bytes(&self) -> Result<u64> {
        // A VHD file has no internal holes: its length is what it occupies.
        Ok(self.file_len)
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

impl fmt::Debug for VhdImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VhdImage")
            .field("path", &self.path)
            .field("disk_type", &self.footer.disk_type)
            .field("size", &self.size)
            .field("file_len", &self.file_len)
            .field("parent_attached", &self.parent.get().is_some())
            .finish_non_exhaustive()
    }
}

fn display_name(path: Option<&Path>) -> String {
    path.map_or_else(|| "<vhd>".to_string(), |p| p.display().to_string())
}

/// Picks the footer copy to use (see the module's design notes).
fn choose_footer(storage: &dyn Storage, file_len: u64, name: &str) -> Result<ChosenFooter> {
    if file_len < FOOTER_LEN_OLD as u64 {
        return Err(Error::new(
            ErrorKind::InvalidFormat,
            format!("{name}: file of {file_len} bytes is too small for a vhd footer"),
        ));
    }
    let copy_at_zero = || -> Result<Option<Parsed<Footer>>> {
        if file_len < FOOTER_LEN as u64 {
            return Ok(None);
        }
        let parsed = Footer::parse(&read_raw(storage, name, FOOTER_LEN, 0)?).ok();
        Ok(parsed.filter(|p| p.value.disk_type.is_sparse()))
    };
    let checksum_note = |p: &Parsed<Footer>, which: &str| {
        format!(
            "footer {which} has a bad checksum: stored {:#010x}, computed {:#010x}",
            p.checksum.stored, p.checksum.computed
        )
    };
    let chosen = |p: Parsed<Footer>, end_len: usize, warnings: Vec<String>| ChosenFooter {
        footer: p.value,
        end_len: end_len as u64,
        warnings,
    };
    match read_end_footer(storage, file_len, name)? {
        Ok((p, len)) if p.checksum.is_ok() => Ok(chosen(p, len, Vec::new())),
        Ok((p, len)) => {
            let note = checksum_note(&p, "at the end of the file");
            match copy_at_zero()? {
                Some(c) if c.checksum.is_ok() => Ok(chosen(
                    c,
                    len,
                    vec![format!("{note}; using the copy at offset 0")],
                )),
                _ => Ok(chosen(p, len, vec![format!("{note}; used anyway")])),
            }
        }
        Err(e) => match copy_at_zero()? {
            Some(c) => {
                let mut warnings = vec![format!(
                    "footer at the end of the file is invalid ({e}); using the copy at offset 0"
                )];
                if !c.checksum.is_ok() {
                    warnings.push(format!("{}; used anyway", checksum_note(&c, "at offset 0")));
                }
                Ok(chosen(c, 0, warnings))
            }
            None => Err(Error::with_source(
                footer_error_kind(&e),
                format!("{name}: no valid vhd footer at the end of the file or at offset 0"),
                e,
            )),
        },
    }
}

/// The footer at the end of the file and its length: 512 bytes, or 511 in very old Virtual PC
/// files. The outer error is I/O; the inner one is the 512-byte footer's parse error.
fn read_end_footer(
    storage: &dyn Storage,
    file_len: u64,
    name: &str,
) -> Result<std::result::Result<(Parsed<Footer>, usize), footer::Error>> {
    let at = file_len.saturating_sub(FOOTER_LEN as u64);
    let parsed = Footer::parse(&read_raw(storage, name, FOOTER_LEN, at)?);
    if !matches!(parsed, Err(footer::Error::InvalidCookie { .. })) {
        return Ok(parsed.map(|p| (p, FOOTER_LEN)));
    }
    let old_at = file_len.saturating_sub(FOOTER_LEN_OLD as u64);
    match Footer::parse(&read_raw(storage, name, FOOTER_LEN_OLD, old_at)?) {
        Ok(old) => Ok(Ok((old, FOOTER_LEN_OLD))),
        Err(_) => Ok(parsed.map(|p| (p, FOOTER_LEN))),
    }
}

/// Reads `len` bytes at `offset` for footer probing (callers check the file length first).
fn read_raw(storage: &dyn Storage, name: &str, len: usize, offset: u64) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    storage
        .read_at(&mut b, offset)
        .map_err(|e| e.context(name))?;
    Ok(b)
}

fn footer_error_kind(e: &footer::Error) -> ErrorKind {
    match e {
        footer::Error::InvalidCookie { .. } | footer::Error::Truncated { .. } => {
            ErrorKind::InvalidFormat
        }
        footer::Error::InvalidDataOffset { .. } => ErrorKind::Corrupt,
        footer::Error::SizeTooLarge { .. } => ErrorKind::LimitExceeded,
        footer::Error::UnsupportedDiskType { .. } | footer::Error::UnsupportedVersion { .. } => {
            ErrorKind::Unsupported
        }
    }
}

fn dynamic_error_kind(e: &dynamic::Error) -> ErrorKind {
    match e {
        dynamic::Error::TooManyTableEntries { .. } | dynamic::Error::LocatorTooLong { .. } => {
            ErrorKind::LimitExceeded
        }
        dynamic::Error::UnsupportedVersion { .. } => ErrorKind::Unsupported,
        _ => ErrorKind::Corrupt,
    }
}

/// A warning when CurrentSize and the CHS geometry disagree, naming the one that was used.
fn size_warning(footer: &Footer, size: u64) -> Option<String> {
    let g = footer.geometry;
    let chs = g.size_bytes();
    let (cur, creator) = (footer.current_size, footer.creator_app.escape_ascii());
    let geometry = format!("{}/{}/{}", g.cylinders, g.heads, g.sectors_per_track);
    match footer::size_rule(footer) {
        SizeRule::Chs if chs != cur => Some(format!(
            "size {size} taken from the chs geometry {geometry} (creator \"{creator}\"); currentsize is {cur}"
        )),
        SizeRule::CurrentSize if g != vhdx::vhd::Chs::MAX && chs != cur => Some(format!(
            "size {size} taken from currentsize (creator \"{creator}\"); the chs geometry {geometry} gives {chs}"
        )),
        _ => None,
    }
}

fn join(dir: Option<&Path>, rel: &str) -> PathBuf {
    dir.map_or_else(|| PathBuf::from(rel), |d| d.join(rel))
}

/// A `W2ru` locator (`.\parent.vhd`, `..\base\parent.vhd`) resolved against the child's
/// directory. Without a directory the path stays relative.
fn relative_candidate(dir: Option<&Path>, text: &str) -> Option<PathBuf> {
    if is_windows_absolute(text) {
        return absolute_candidate(text);
    }
    let slashed = text.replace('\\', "/");
    let mut rel = slashed.as_str();
    while let Some(rest) = rel.strip_prefix("./") {
        rel = rest;
    }
    (!rel.is_empty()).then(|| join(dir, rel))
}

fn is_windows_absolute(text: &str) -> bool {
    let b = text.as_bytes();
    text.starts_with('\\') || (b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':')
}

/// A `W2ku` locator (`C:\dir\parent.vhd`, `\\?\C:\dir\parent.vhd`) mapped to a Unix path:
/// the long-path prefix and the drive letter are dropped and backslashes become slashes.
fn absolute_candidate(text: &str) -> Option<PathBuf> {
    let t = text.strip_prefix(r"\\?\").unwrap_or(text);
    let b = t.as_bytes();
    let t = if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        &t[2..]
    } else {
        t
    };
    let slashed = t.replace('\\', "/");
    let trimmed = slashed.trim_start_matches('/');
    (!trimmed.is_empty()).then(|| PathBuf::from(format!("/{trimmed}")))
}

/// The file name part of ParentUnicodeName (which Windows fills with a full path).
fn parent_file_name(name: &str) -> Option<&str> {
    name.rsplit(['\\', '/']).next().filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w2ru_dot_prefix_is_stripped() {
        let dir = Path::new("/images");
        assert_eq!(
            relative_candidate(Some(dir), r".\fat-parent.vhd"),
            Some(dir.join("fat-parent.vhd"))
        );
    }

    #[test]
    fn w2ru_parent_directory_is_kept() {
        let dir = Path::new("/images/child");
        assert_eq!(
            relative_candidate(Some(dir), r"..\base\p.vhd"),
            Some(dir.join("../base/p.vhd"))
        );
    }

    #[test]
    fn w2ku_drive_letter_is_stripped() {
        let text = r"C:\Projects\dfvfs\test_data\fat-parent.vhd";
        let expected = PathBuf::from("/Projects/dfvfs/test_data/fat-parent.vhd");
        assert_eq!(absolute_candidate(text), Some(expected));
    }

    #[test]
    fn w2ku_long_path_prefix_is_stripped() {
        assert_eq!(
            absolute_candidate(r"\\?\D:\vm\p.vhd"),
            Some(PathBuf::from("/vm/p.vhd"))
        );
    }

    #[test]
    fn parent_name_keeps_only_the_file_name() {
        assert_eq!(
            parent_file_name(r"C:\Projects\fat-parent.vhd"),
            Some("fat-parent.vhd")
        );
    }

    #[test]
    fn empty_parent_name_gives_no_candidate() {
        assert_eq!(parent_file_name(""), None);
    }
}
