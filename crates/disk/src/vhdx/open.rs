//! Opening a VHDX file: identifier, headers, log replay, region table, metadata, BAT, and the
//! structural checks that make every later BAT lookup trustworthy.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use vhdx::bat::{self, Layout};
use vhdx::header::{self, HEADER_LEN};
use vhdx::ident::{IDENT_LEN, Ident};
use vhdx::log::{self, Replay, Write};
use vhdx::metadata::Metadata;
use vhdx::parent::ParentLocator;
use vhdx::region::{REGION_TABLE_LEN, RegionTable};
use vhdx::{MIB, REGION1_OFFSET, REGION2_OFFSET};

use super::{OpenOptions, State, VhdxImage};
use crate::overlay::OverlayStorage;
use crate::{Error, ErrorKind, Result, Storage};

/// The largest log this implementation reads into memory (the spec allows up to 4 GiB; real
/// writers use 1 MiB).
pub const MAX_LOG_LEN: u64 = 256 * MIB;
/// The largest metadata region read into memory.
pub const MAX_METADATA_REGION_LEN: u64 = 64 * MIB;
/// The most BAT entries accepted (64 TiB of 1 MiB blocks plus bitmaps: 512 MiB of BAT).
pub const MAX_BAT_ENTRIES: u64 = (64 << 20) + (64 << 20) / 4096 + 1;

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, what.to_string())
}

fn invalid(at: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::with_source(ErrorKind::InvalidFormat, at.to_string(), e)
}

fn read(storage: &dyn Storage, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut v = vec![0u8; usize::try_from(len).map_err(|_| corrupt("length overflows usize"))?];
    storage.read_at(&mut v, offset)?;
    Ok(v)
}

impl VhdxImage {
    /// Opens an image. A dirty log is replayed into the file when `writable`, or into an
    /// in-memory overlay when read-only (reported by [`crate::BlockDevice::warnings`]).
    /// A differencing image still needs [`VhdxImage::attach_parent`] before reads.
    ///
    /// # Errors
    /// `InvalidFormat` or `Corrupt` naming the structure and offset at fault; `Io`.
    pub fn open(storage: Arc<dyn Storage>, opts: OpenOptions) -> Result<VhdxImage> {
        let file_len = storage.len()?;
        if file_len < 5 * vhdx::KIB64 {
            // The fixed part (identifier, headers, region tables) ends at 320 KiB.
            return Err(Error::new(
                ErrorKind::InvalidFormat,
                format!("file of {file_len} bytes is too short to be vhdx (truncated?)"),
            ));
        }
        let ident = Ident::parse(&read(storage.as_ref(), 0, IDENT_LEN as u64)?)
            .map_err(|e| invalid("file identifier at offset 0", e))?;
        let h1 = read(storage.as_ref(), vhdx::HEADER1_OFFSET, HEADER_LEN as u64)?;
        let h2 = read(storage.as_ref(), vhdx::HEADER2_OFFSET, HEADER_LEN as u64)?;
        let current =
            header::choose(&h1, &h2).map_err(|e| invalid("headers at 0x10000/0x20000", e))?;
        let mut hdr = current.header;
        let mut warnings = Vec::new();
        if current.other_stale && header_valid(&h1) != header_valid(&h2) {
            warnings.push(format!(
                "one header copy is invalid; using the one at {:#x}",
                current.slot.offset()
            ));
        }
        let mut storage = storage;
        if !hdr.log_guid.is_zero() && hdr.log_length > 0 {
            let replay = find_replay(storage.as_ref(), &hdr, file_len)?;
            match (replay, opts.writable) {
                (Some(r), true) => {
                    apply_replay(storage.as_ref(), &r)?;
                    tracing::info!(entries = r.entries.len(), "replayed vhdx log");
                }
                (Some(r), false) => {
                    let n = r.entries.len();
                    let writes: Vec<Write> =
                        r.entries.iter().flat_map(|e| e.writes.clone()).collect();
                    storage = Arc::new(OverlayStorage::new(storage, writes, r.last_file_offset())?);
                    warnings.push(format!(
                        "log holds {n} unreplayed entr{}; replayed in memory (read-only open); \
                         run `ferry vdisk check --repair` to replay it into the file",
                        if n == 1 { "y" } else { "ies" }
                    ));
                }
                (None, _) => {}
            }
        }
        let regions = read_regions(storage.as_ref(), &mut warnings)?;
        let file_len = storage.len()?;
        for (name, r) in [("metadata", regions.metadata), ("bat", regions.bat)] {
            if r.offset >= file_len {
                return Err(corrupt(format!(
                    "{name} region at {:#x} lies past the end of the {file_len}-byte file (truncated?)",
                    r.offset
                )));
            }
        }
        let meta = read_metadata(storage.as_ref(), &regions)?;
        let layout = Layout::new(
            meta.block_size,
            meta.logical_sector_size,
            meta.virtual_size,
            meta.has_parent,
        )
        .map_err(|e| invalid("metadata geometry", e))?;
        let entries = layout.total_entries();
        if entries > MAX_BAT_ENTRIES {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!("bat of {entries} entries exceeds {MAX_BAT_ENTRIES}"),
            ));
        }
        let bat_bytes = (entries * 8).div_ceil(4096) * 4096;
        if bat_bytes > u64::from(regions.bat.length) {
            return Err(corrupt(format!(
                "bat region at {:#x} of {} bytes is smaller than the {} entries the disk needs",
                regions.bat.offset, regions.bat.length, entries
            )));
        }
        if regions
            .bat
            .offset
            .checked_add(bat_bytes)
            .is_none_or(|end| end > file_len)
        {
            return Err(corrupt(format!(
                "bat at {:#x} needs {bat_bytes} bytes but the file ends at {file_len} (truncated?)",
                regions.bat.offset
            )));
        }
        let raw = read(storage.as_ref(), regions.bat.offset, bat_bytes)?;
        let bat = bat::parse(&layout, &raw).map_err(|e| {
            let kind = match e {
                bat::Error::EntryOverHeaders { .. } => ErrorKind::Corrupt,
                _ => ErrorKind::InvalidFormat,
            };
            Error::with_source(kind, format!("bat at {:#x}", regions.bat.offset), e)
        })?;
        let file_len = storage.len()?;
        let file_end = validate_placement(&layout, &bat, &regions, &hdr, file_len)?;
        let locator = match &meta.parent_locator {
            Some(b) => Some(ParentLocator::parse(b).map_err(|e| invalid("parent locator", e))?),
            None => None,
        };
        let writable = opts.writable;
        let img = VhdxImage {
            storage,
            path: opts.path,
            writable,
            layout,
            regions,
            locator,
            parent: OnceLock::new(),
            state: RwLock::new(State {
                bat,
                bitmaps: HashMap::new(),
                header: hdr,
                slot: current.slot,
                dirty_bat: BTreeSet::new(),
                dirty_bitmap: BTreeSet::new(),
                file_end,
                log_seq: 0,
                session_started: false,
            }),
            alloc: Mutex::new(()),
            poisoned: AtomicBool::new(false),
            inline: crate::inline::InlineGate::default(),
            warnings,
            creator: ident.creator,
            meta,
        };
        if writable && !hdr.log_guid.is_zero() {
            // The log was replayed (or held nothing valid): mark it clean.
            hdr.log_guid = vhdx::Guid::ZERO;
            img.update_header(hdr)?;
        }
        Ok(img)
    }
}

fn header_valid(b: &[u8]) -> bool {
    header::Header::parse(b).is_ok()
}

fn find_replay(
    storage: &dyn Storage,
    hdr: &header::Header,
    file_len: u64,
) -> Result<Option<Replay>> {
    let len = u64::from(hdr.log_length);
    if len > MAX_LOG_LEN {
        return Err(Error::new(
            ErrorKind::LimitExceeded,
            format!("log of {len} bytes exceeds {MAX_LOG_LEN}"),
        ));
    }
    if hdr
        .log_offset
        .checked_add(len)
        .is_none_or(|end| end > file_len)
    {
        return Err(corrupt(format!(
            "log at {:#x} length {len:#x} lies past the end of the {file_len}-byte file",
            hdr.log_offset
        )));
    }
    let buf = read(storage, hdr.log_offset, len)?;
    let replay = log::find_active(&buf, hdr.log_guid).map_err(|e| invalid("log", e))?;
    if let Some(r) = &replay {
        if file_len < r.flushed_file_offset() {
            return Err(corrupt(format!(
                "file is {file_len} bytes but the log says {} were flushed (truncated file)",
                r.flushed_file_offset()
            )));
        }
        // Bounds the replayed file (and the read-only view of it) by the real length.
        r.check_extent(file_len).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("log at {:#x}: {e}", hdr.log_offset),
                e,
            )
        })?;
    }
    Ok(replay)
}

/// Applies a replay to the file: every write in order, extend to LastFileOffset, fsync.
pub(crate) fn apply_replay(storage: &dyn Storage, r: &Replay) -> Result<()> {
    for e in &r.entries {
        for w in &e.writes {
            match w {
                Write::Data {
                    file_offset,
                    sector,
                } => storage.write_at(sector, *file_offset)?,
                Write::Zero { file_offset, len } => storage.punch_hole(*file_offset, *len)?,
            }
        }
    }
    // `find_replay` bounded LastFileOffset by the file's real length and the log's writes.
    if storage.len()? < r.last_file_offset() {
        storage.set_len(r.last_file_offset())?;
    }
    storage.flush()
}

fn read_regions(storage: &dyn Storage, warnings: &mut Vec<String>) -> Result<RegionTable> {
    let r1 = RegionTable::parse(&read(storage, REGION1_OFFSET, REGION_TABLE_LEN as u64)?);
    match r1 {
        Ok(t) => Ok(t),
        Err(e1) => {
            let t = RegionTable::parse(&read(storage, REGION2_OFFSET, REGION_TABLE_LEN as u64)?)
                .map_err(|e2| {
                    Error::new(
                        ErrorKind::InvalidFormat,
                        format!("both region tables invalid: at {REGION1_OFFSET:#x}: {e1}; at {REGION2_OFFSET:#x}: {e2}"),
                    )
                })?;
            warnings.push(format!(
                "region table 1 invalid ({e1}); using region table 2"
            ));
            Ok(t)
        }
    }
}

fn read_metadata(storage: &dyn Storage, regions: &RegionTable) -> Result<Metadata> {
    let len = u64::from(regions.metadata.length).min(MAX_METADATA_REGION_LEN);
    let file_len = storage.len()?;
    let len = len.min(file_len.saturating_sub(regions.metadata.offset));
    let b = read(storage, regions.metadata.offset, len)?;
    Metadata::parse(&b).map_err(|e| {
        invalid(
            &format!("metadata region at {:#x}", regions.metadata.offset),
            e,
        )
    })
}

/// The file ranges the fixed structures occupy: the first 1 MiB (identifier, headers, region
/// tables), the BAT and metadata regions, and the log. Shared with `check`.
pub(crate) fn fixed_structures(
    regions: &RegionTable,
    hdr: &header::Header,
) -> Vec<(u64, u64, String)> {
    let mut used: Vec<(u64, u64, String)> = vec![
        (0, MIB, "file header area".into()),
        (regions.bat.offset, regions.bat.end(), "bat region".into()),
        (
            regions.metadata.offset,
            regions.metadata.end(),
            "metadata region".into(),
        ),
    ];
    if hdr.log_length > 0 {
        used.push((
            hdr.log_offset,
            // Saturating: a log whose end wraps overlaps everything after it.
            hdr.log_offset.saturating_add(u64::from(hdr.log_length)),
            "log".into(),
        ));
    }
    used
}

/// Checks that no block or bitmap lies over the headers, a region or the log, past the end
/// of the file, or over another; returns the first free 1 MiB-aligned offset for allocation.
fn validate_placement(
    layout: &Layout,
    bat: &[bat::Entry],
    regions: &RegionTable,
    hdr: &header::Header,
    file_len: u64,
) -> Result<u64> {
    let mut used = fixed_structures(regions, hdr);
    for (i, e) in bat.iter().enumerate() {
        let i = i as u64;
        let len = if bat::is_bitmap_index(layout, i) {
            if e.state() != bat::SB_BLOCK_PRESENT {
                continue;
            }
            bat::SECTOR_BITMAP_BLOCK_LEN
        } else {
            if !matches!(
                e.state(),
                bat::PAYLOAD_BLOCK_FULLY_PRESENT | bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT
            ) {
                continue;
            }
            u64::from(layout.block_size)
        };
        let start = e.file_offset();
        // Checked: an offset near 2^64 must not wrap round to pass.
        let Some(end) = start.checked_add(len).filter(|&end| end <= file_len) else {
            return Err(corrupt(format!(
                "bat entry {i} points at {start:#x}, a block ending past the end of the \
                 {file_len}-byte file (truncated?)"
            )));
        };
        used.push((start, end, format!("bat entry {i}")));
    }
    used.sort_by_key(|u| u.0);
    for w in used.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(corrupt(format!(
                "{} at {:#x} overlaps {} at {:#x}",
                w[1].2, w[1].0, w[0].2, w[0].0
            )));
        }
    }
    let top = used.iter().map(|u| u.1).max().unwrap_or(MIB);
    Ok(top.max(file_len).div_ceil(MIB) * MIB)
}
