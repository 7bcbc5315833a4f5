//! `compact`: gives back the space of unused and trimmed blocks of a VHDX (base or
//! differencing) by rewriting it.
//!
//! The image is copied block by block into `<path>.compact.tmp`, which then replaces it by an
//! atomic rename. The copy keeps only blocks that hold data:
//!
//! | old block state                | new file                                         |
//! |--------------------------------|--------------------------------------------------|
//! | NOT_PRESENT, UNDEFINED         | NOT_PRESENT (dropped)                            |
//! | ZERO, UNMAPPED                 | ZERO, no space (dropped)                         |
//! | FULLY_PRESENT, data            | FULLY_PRESENT                                    |
//! | FULLY_PRESENT, all zero        | ZERO (dropped); in a differencing disk ZERO still shadows the parent, never NOT_PRESENT |
//! | PARTIALLY_PRESENT              | its present sectors only (zeros stay explicit)   |
//!
//! The new file has the same geometry, Page83 identifier, parent locator and DataWriteGuid, so
//! the image's children still open. A crash before the rename leaves the original untouched
//! (the next compaction removes the stale temporary file).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use vhdx::Guid;
use vhdx::bat::{self, Entry, Layout};
use vhdx::parent::ParentLocator;

use super::Progress;
use super::copy::{self, Fill, Job, Outputs, PlanRun, Sink, SinkImage, ZeroPolicy};
use crate::device::BlockDevice;
use crate::open::{self, Format, Image, OpenOptions};
use crate::vhdx::{CreateOptions, ParentSpec, VhdxImage};
use crate::{Error, ErrorKind, Result};

/// What [`compact`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactStats {
    /// File length before.
    pub file_size_before: u64,
    /// File length after.
    pub file_size_after: u64,
    /// Payload blocks that held space before and no longer do.
    pub blocks_dropped: u64,
}

/// Compacts the VHDX at `path` in place (through a temporary file and a rename).
/// Progress phase: "compacting".
///
/// # Errors
/// `InvalidArgument` for a non-VHDX or fixed image; `Unsupported` for a parent locator without
/// a path; open, read and write errors (the original is then left untouched).
pub fn compact(path: &Path, progress: &dyn Progress) -> Result<CompactStats> {
    let layer = open::open_one(path, OpenOptions::default())?;
    let Image::Vhdx(img) = &layer.image else {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{}: only vhdx images can be compacted", path.display()),
        ));
    };
    let meta = img.metadata();
    if meta.leave_blocks_allocated {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: a fixed image keeps every block allocated; convert it to a dynamic one",
                path.display()
            ),
        ));
    }
    let old_guid = img.header().data_write_guid;
    let parent = match img.locator() {
        Some(loc) => Some(parent_spec(img, loc)?),
        None => None,
    };
    let create = CreateOptions {
        size: meta.virtual_size,
        block_size: meta.block_size,
        logical_sector_size: meta.logical_sector_size,
        physical_sector_size: meta.physical_sector_size,
        parent,
        page83: Some(meta.page83),
        data_write_guid: Some(old_guid),
        ..CreateOptions::default()
    };
    let before = copy::file_len(path)?;
    let tmp = tmp_path(path);
    if tmp.exists() {
        std::fs::remove_file(&tmp)
            .map_err(|e| Error::io(format!("remove stale {}", tmp.display()), e))?;
    }
    progress.phase("compacting");
    progress.set_total(meta.virtual_size);
    let mut outputs = Outputs::default();
    let allocated_after = copy_blocks(img, &tmp, &create, &mut outputs, progress)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        Error::io(
            format!("rename {} over {}", tmp.display(), path.display()),
            e,
        )
    })?;
    outputs.keep();
    copy::sync_parent_dir(path)?;
    Ok(CompactStats {
        file_size_before: before,
        file_size_after: copy::file_len(path)?,
        blocks_dropped: allocated_blocks(img.layout(), &img.bat()).saturating_sub(allocated_after),
    })
}

/// Copies the blocks with data into the new file `tmp`, restores the DataWriteGuid and closes
/// it. Returns the number of payload blocks the new file allocates.
fn copy_blocks(
    img: &VhdxImage,
    tmp: &Path,
    create: &CreateOptions,
    outputs: &mut Outputs,
    progress: &dyn Progress,
) -> Result<u64> {
    let layout = img.layout();
    let entries = img.bat();
    let plan = |offset: u64, len: u64| compact_plan(img, &layout, &entries, offset, len);
    let job = Job {
        src: img,
        plan: &plan,
        policy: ZeroPolicy::Shadow,
        len: create.size,
    };
    let sink = Sink::create(tmp, Format::Vhdx, create, outputs)?;
    let SinkImage::Vhdx(new) = &sink.image else {
        unreachable!("Sink::create made a vhdx sink for Format::Vhdx");
    };
    let unit = u64::from(create.block_size).min(copy::UNIT_BYTES_MAX);
    copy::run(&job, new.as_ref(), Some(&sink.file), unit, progress)?;
    let guid = create
        .data_write_guid
        .expect("compaction keeps the DataWriteGuid");
    new.set_data_write_guid(guid)?;
    sink.finish().map_err(|e| e.context(tmp.display()))?;
    Ok(allocated_blocks(new.layout(), &new.bat()))
}

/// `<path>.compact.tmp`.
fn tmp_path(path: &Path) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(".compact.tmp");
    PathBuf::from(s)
}

/// The plan of `[offset, offset + len)` from the block states (see the module table).
fn compact_plan(
    img: &VhdxImage,
    layout: &Layout,
    entries: &[Entry],
    offset: u64,
    len: u64,
) -> Result<Vec<PlanRun>> {
    let bs = u64::from(layout.block_size);
    let mut out: Vec<PlanRun> = Vec::new();
    let mut push = |run: PlanRun| match out.last_mut() {
        Some(last) if last.fill == run.fill => last.len += run.len,
        _ => out.push(run),
    };
    let (mut pos, end) = (offset, offset + len);
    while pos < end {
        let block = pos / bs;
        let n = (bs - pos % bs).min(end - pos);
        let state = entries[layout.payload_index(block) as usize].state();
        let fill = match state {
            bat::PAYLOAD_BLOCK_FULLY_PRESENT => Fill::Data,
            bat::PAYLOAD_BLOCK_ZERO
            | bat::PAYLOAD_BLOCK_UNMAPPED
            | bat::PAYLOAD_BLOCK_UNMAPPED_V095 => Fill::Zero,
            bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT => {
                copy::layer_plan(img, pos, n, true)?
                    .into_iter()
                    .for_each(&mut push);
                pos += n;
                continue;
            }
            _ => Fill::Skip,
        };
        push(PlanRun { len: n, fill });
        pos += n;
    }
    Ok(out)
}

/// Payload blocks that occupy space in the file.
fn allocated_blocks(layout: Layout, entries: &[Entry]) -> u64 {
    (0..layout.data_blocks())
        .map(|b| entries[layout.payload_index(b) as usize].state())
        .filter(|&s| {
            matches!(
                s,
                bat::PAYLOAD_BLOCK_FULLY_PRESENT | bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT
            )
        })
        .count() as u64
}

/// The parent of the new file, from the old locator: the same linkage and paths. When the
/// locator also has `parent_linkage2`, the one the parent on disk has now is kept.
fn parent_spec(img: &VhdxImage, loc: &ParentLocator) -> Result<ParentSpec> {
    let primary = loc
        .linkage()
        .expect("ParentLocator::parse requires parent_linkage");
    let linkage = match loc.linkage2() {
        Some(second) if current_parent_id(img) == Some(second) => second,
        _ => primary,
    };
    let absolute = loc
        .get("absolute_win32_path")
        .or_else(|| loc.get("volume_path"));
    let relative = loc
        .get("relative_path")
        .map(str::to_string)
        .or_else(|| {
            absolute
                .and_then(|a| a.rsplit('\\').next())
                .map(|name| format!(".\\{name}"))
        })
        .ok_or_else(|| Error::new(ErrorKind::Unsupported, "parent locator names no path"))?;
    let absolute_path = absolute.map_or_else(|| relative.clone(), str::to_string);
    Ok(ParentSpec {
        linkage,
        relative_path: relative,
        absolute_path,
    })
}

/// The identity of the first parent candidate that opens, if any.
fn current_parent_id(img: &VhdxImage) -> Option<Guid> {
    img.parent_ref()?
        .paths
        .iter()
        .filter(|p| p.exists())
        .find_map(|p| open::open_one(p, OpenOptions::default()).ok())
        .and_then(|l| l.image.device().linkage_id())
}
