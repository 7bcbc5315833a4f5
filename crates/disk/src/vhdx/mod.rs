//! VHDX images: open (with log replay), create, read, write, trim, flush, differencing.
//!
//! # Design notes
//!
//! * **Metadata in memory.** The BAT is loaded at open; sector bitmaps are loaded per chunk
//!   when first needed. Reads compute a mapping under a read lock and do the data I/O after
//!   releasing it ([`io`]).
//! * **Data in place, metadata through the log.** Payload bytes are written straight to their
//!   block. BAT and sector-bitmap changes are made in memory and marked dirty; `flush` commits
//!   them ([`commit`]): fsync (data and earlier in-place metadata become durable), write one
//!   log entry at log offset 0 holding every dirty 4 KiB page, fsync, then write the pages in
//!   place. Every entry is a sequence of one whose tail is itself, and the next entry is
//!   written only after an fsync made the previous one's in-place writes durable, so replay
//!   of whichever entry survives a crash is always correct, and a torn entry fails its CRC.
//!   A commit of more pages than one entry holds (254 with a 1 MiB log) is split into several
//!   entries and is not atomic; the pages go in an order that keeps every prefix consistent
//!   (sector bitmap pages first, then BAT pages from last to first, since a chunk's bitmap
//!   entry follows its payload entries). Only unflushed changes can be cut this way.
//! * **Payload I/O errors** are returned to the caller without poisoning (the metadata is
//!   untouched); failures of metadata writes and of fsync poison.
//! * **Headers** change through the two-slot protocol: the non-current slot gets seq+1, fsync,
//!   then the other slot gets seq+2, fsync. A torn header write leaves the other copy current.
//!   Before the first write of a session the header gets a new FileWriteGuid, DataWriteGuid
//!   and LogGuid; `close` commits and sets LogGuid back to zero.
//! * **New blocks** are appended at the 1 MiB-aligned end of the file, which reads as zeros.
//!   In a differencing disk a partial write to an absent block makes it PARTIALLY_PRESENT and
//!   sets its sector bits; other sectors keep reading from the parent.
//! * **Fail-stop.** A failed write or fsync of metadata poisons the image; every later
//!   operation returns `Poisoned`.
//! * **Paired assertions** (`debug_assert!`s and `if cfg!(debug_assertions)` checks, free in
//!   release builds; the crash tests run them): an allocated BAT entry decodes to the state
//!   and 1 MiB-aligned offset allocated, inside the file and clear of the fixed structures,
//!   as `open` will require (`io`); a header update's two copies decode and an open would
//!   choose the new one, with a higher sequence number; a log entry decodes under the
//!   header's LogGuid with the next sequence number and exactly the pages committed
//!   (`commit`); `create`'s headers and BAT decode as written (`create`).

mod commit;
mod create;
mod io;
mod open;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub use create::{CreateOptions, ParentSpec, create};
pub use open::MAX_LOG_LEN;
pub(crate) use open::fixed_structures;
use vhdx::bat::{Entry, Layout};
use vhdx::header::{Header, Slot};
use vhdx::metadata::Metadata;
use vhdx::parent::ParentLocator;
use vhdx::region::RegionTable;
use vhdx::{Guid, bat};

use crate::device::{BlockDevice, FastPath, Geometry, LayerRun, ParentRef, Piece, Submitted};
use crate::{Error, ErrorKind, Result, Storage};

/// How to open an image.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Open for writing (replays a dirty log into the file).
    pub writable: bool,
    /// The image's path, used to resolve a parent's relative path.
    pub path: Option<PathBuf>,
}

/// Mutable metadata state, under one lock.
#[derive(Debug)]
struct State {
    bat: Vec<Entry>,
    /// Loaded sector bitmaps by chunk, 1 MiB each.
    bitmaps: HashMap<u64, Box<[u8]>>,
    header: Header,
    slot: Slot,
    /// Dirty 4 KiB pages of the BAT region, by page index.
    dirty_bat: BTreeSet<u64>,
    /// Dirty 4 KiB pages of sector bitmaps: (chunk, page index in the 1 MiB block).
    dirty_bitmap: BTreeSet<(u64, u64)>,
    /// Where the next block goes (1 MiB aligned, at or past the end of the file).
    file_end: u64,
    /// Log sequence number of the last entry written.
    log_seq: u64,
    /// True once this session changed the header GUIDs (first write).
    session_started: bool,
}

/// An open VHDX image.
pub struct VhdxImage {
    storage: Arc<dyn Storage>,
    path: Option<PathBuf>,
    writable: bool,
    layout: Layout,
    meta: Metadata,
    regions: RegionTable,
    locator: Option<ParentLocator>,
    parent: OnceLock<Arc<dyn BlockDevice>>,
    state: RwLock<State>,
    /// Serializes allocation, bitmap loading for writes, and commits.
    alloc: Mutex<()>,
    poisoned: AtomicBool,
    /// Times overwrites made on the caller's thread ([`crate::FastPath::try_write_at`]).
    inline: crate::inline::InlineGate,
    warnings: Vec<String>,
    creator: String,
}

impl std::fmt::Debug for VhdxImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhdxImage")
            .field("path", &self.path)
            .field("writable", &self.writable)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

/// A summary of the image's structures, for `info` and `check`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Details {
    /// Creator string of the file identifier.
    pub creator: String,
    /// Fixed (LeaveBlocksAllocated).
    pub fixed: bool,
    /// Differencing.
    pub has_parent: bool,
    /// Current header sequence number.
    pub sequence_number: u64,
    /// DataWriteGuid.
    pub data_write_guid: String,
    /// Log region offset and length.
    pub log: (u64, u32),
    /// BAT region offset and length.
    pub bat_region: (u64, u32),
    /// Metadata region offset and length.
    pub metadata_region: (u64, u32),
    /// Counts of payload blocks by state name.
    pub block_states: Vec<(String, u64)>,
    /// Present sector bitmap blocks.
    pub bitmap_blocks: u64,
    /// The parent locator's pairs.
    pub parent_locator: Vec<(String, String)>,
    /// File length.
    pub file_len: u64,
}

pub(crate) fn state_name(state: u8) -> &'static str {
    match state {
        bat::PAYLOAD_BLOCK_NOT_PRESENT => "not_present",
        bat::PAYLOAD_BLOCK_UNDEFINED => "undefined",
        bat::PAYLOAD_BLOCK_ZERO => "zero",
        bat::PAYLOAD_BLOCK_UNMAPPED | bat::PAYLOAD_BLOCK_UNMAPPED_V095 => "unmapped",
        bat::PAYLOAD_BLOCK_FULLY_PRESENT => "fully_present",
        bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT => "partially_present",
        _ => "reserved",
    }
}

impl VhdxImage {
    /// The geometry from the metadata.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The decoded metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The path given at open.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// A copy of the BAT.
    pub fn bat(&self) -> Vec<Entry> {
        self.read_state().bat.clone()
    }

    /// The current header.
    pub fn header(&self) -> Header {
        self.read_state().header
    }

    /// The region table.
    pub fn regions(&self) -> RegionTable {
        self.regions
    }

    /// The underlying store.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The parent locator of a differencing image.
    pub fn locator(&self) -> Option<&ParentLocator> {
        self.locator.as_ref()
    }

    /// Structure summary.
    ///
    /// # Errors
    /// When the file length cannot be read.
    pub fn details(&self) -> Result<Details> {
        let st = self.read_state();
        let mut counts: Vec<(String, u64)> = Vec::new();
        let mut bitmap_blocks = 0;
        for (i, e) in st.bat.iter().enumerate() {
            if bat::is_bitmap_index(&self.layout, i as u64) {
                bitmap_blocks += u64::from(e.state() == bat::SB_BLOCK_PRESENT);
                continue;
            }
            let name = state_name(e.state());
            match counts.iter_mut().find(|(n, _)| n == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name.to_string(), 1)),
            }
        }
        Ok(Details {
            creator: self.creator.clone(),
            fixed: self.meta.leave_blocks_allocated,
            has_parent: self.meta.has_parent,
            sequence_number: st.header.sequence_number,
            data_write_guid: st.header.data_write_guid.to_string(),
            log: (st.header.log_offset, st.header.log_length),
            bat_region: (self.regions.bat.offset, self.regions.bat.length),
            metadata_region: (self.regions.metadata.offset, self.regions.metadata.length),
            block_states: counts,
            bitmap_blocks,
            parent_locator: self
                .locator
                .as_ref()
                .map(|l| l.pairs.clone())
                .unwrap_or_default(),
            file_len: self.storage.len()?,
        })
    }

    /// Attaches the parent of a differencing image after checking its identity.
    ///
    /// # Errors
    /// `ChainBroken` when the parent's DataWriteGuid matches neither linkage, the logical
    /// sector sizes differ, or a parent is already attached; `InvalidArgument` when this
    /// image has no parent.
    pub fn attach_parent(&self, parent: Arc<dyn BlockDevice>) -> Result<()> {
        let Some(loc) = &self.locator else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "image is not differencing",
            ));
        };
        let accepted: Vec<Guid> = [loc.linkage(), loc.linkage2()]
            .into_iter()
            .flatten()
            .collect();
        let id = parent.linkage_id();
        if !id.is_some_and(|id| accepted.contains(&id)) {
            let found = id.map_or("none".to_string(), |g| g.to_string());
            let want: Vec<String> = accepted.iter().map(Guid::to_string).collect();
            return Err(Error::new(
                ErrorKind::ChainBroken,
                format!(
                    "parent identity mismatch: parent has {found}, child links to {}",
                    want.join(" or ")
                ),
            ));
        }
        let pg = parent.geometry();
        if pg.logical_sector_size != self.meta.logical_sector_size {
            return Err(Error::new(
                ErrorKind::ChainBroken,
                format!(
                    "parent logical sector size {} differs from the child's {}",
                    pg.logical_sector_size, self.meta.logical_sector_size
                ),
            ));
        }
        self.parent
            .set(parent)
            .map_err(|_| Error::new(ErrorKind::ChainBroken, "parent already attached"))
    }

    /// Commits, makes everything durable and marks the log clean. Call before dropping a
    /// writable image; dropping without `close` leaves a dirty log that the next open replays.
    ///
    /// # Errors
    /// I/O failures (the image is then poisoned).
    pub fn close(&self) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.commit_and_clean()
    }

    /// Rewrites both header copies with the current header (repairs a bad or stale copy).
    ///
    /// # Errors
    /// `ReadOnly`; I/O failures (the image is then poisoned).
    pub fn rewrite_headers(&self) -> Result<()> {
        if !self.writable {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                "vhdx image opened read-only",
            ));
        }
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.read_state().header;
        self.update_header(h)
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Poisoned,
                "image poisoned by an earlier durability failure",
            ));
        }
        Ok(())
    }

    /// Runs a durability-critical step; a failure poisons the image.
    fn durable<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.poisoned.store(true, Ordering::Release);
        }
        r
    }
}

impl BlockDevice for VhdxImage {
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.meta.virtual_size,
            logical_sector_size: self.meta.logical_sector_size,
            physical_sector_size: self.meta.physical_sector_size,
            block_size: self.meta.block_size,
        }
    }

    fn format(&self) -> &'static str {
        "vhdx"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_impl(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_impl(buf, offset)
    }

    fn flush(&self) -> Result<()> {
        self.flush_impl()
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.discard_impl(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.discard_impl(offset, len, false)
    }

    fn can_write(&self) -> bool {
        self.writable
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        self.map_layer_impl(offset, len)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        self.parent.get().cloned()
    }

    fn parent_ref(&self) -> Option<ParentRef> {
        let loc = self.locator.as_ref()?;
        let linkage = [loc.linkage(), loc.linkage2()]
            .into_iter()
            .flatten()
            .collect();
        let dir = self
            .path
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        let mut paths = Vec::new();
        if let Some(rel) = loc.get("relative_path") {
            paths.push(dir.join(windows_to_unix(rel, true)));
        }
        for key in ["absolute_win32_path", "volume_path"] {
            if let Some(abs) = loc.get(key) {
                let p = PathBuf::from(windows_to_unix(abs, false));
                paths.push(p.clone());
                if let Some(name) = p.file_name() {
                    paths.push(dir.join(name));
                }
            }
        }
        paths.dedup();
        Some(ParentRef { linkage, paths })
    }

    fn linkage_id(&self) -> Option<Guid> {
        Some(self.read_state().header.data_write_guid)
    }

    fn allocated_bytes(&self) -> Result<u64> {
        let st = self.read_state();
        let mut bytes = 0u64;
        for (i, e) in st.bat.iter().enumerate() {
            if bat::is_bitmap_index(&self.layout, i as u64) {
                if e.state() == bat::SB_BLOCK_PRESENT {
                    bytes += bat::SECTOR_BITMAP_BLOCK_LEN;
                }
            } else if matches!(
                e.state(),
                bat::PAYLOAD_BLOCK_FULLY_PRESENT | bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT
            ) {
                bytes += u64::from(self.meta.block_size);
            }
        }
        Ok(bytes)
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

/// A VHDX image reads a range that lies in one stretch of its file with one vectored store
/// read, and overwrites sectors it already holds without blocking on allocation.
impl FastPath for VhdxImage {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        self.read_vectored_impl(bufs, offset)
    }

    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<Piece>>> {
        None
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        self.try_write_impl(buf, offset)
    }

    fn submit_read(&self, _offset: u64, _len: usize) -> Option<Submitted<Vec<u8>>> {
        None
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<Submitted<()>> {
        None
    }
}

impl Drop for VhdxImage {
    fn drop(&mut self) {
        if self.writable
            && !self.poisoned.load(Ordering::Acquire)
            && let Err(e) = self.commit_and_clean()
        {
            tracing::warn!(error = %e, "closing vhdx image failed; the log will be replayed on next open");
        }
    }
}

/// Maps a Windows path from a parent locator to a Unix one: backslashes become slashes,
/// and `\\?\`, `\\?\Volume{...}` and drive-letter prefixes are dropped.
pub(crate) fn windows_to_unix(p: &str, relative: bool) -> String {
    let mut s = p.trim_end_matches('\0').to_string();
    if let Some(rest) = s.strip_prefix("\\\\?\\") {
        s = rest.to_string();
    }
    if s.starts_with("Volume{") {
        s = s
            .find('}')
            .map_or(String::new(), |i| s[i + 1..].to_string());
    }
    let b = s.as_bytes();
    if b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic() {
        s = s[2..].to_string();
    }
    let s = s.replace('\\', "/");
    if relative {
        s.trim_start_matches("./").to_string()
    } else {
        s
    }
}
