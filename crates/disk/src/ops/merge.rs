//! Merging a differencing chain without touching its files.
//!
//! * [`merge_base`] ("merged base"): the whole chain under TOP into one standalone VHDX.
//! * [`merge_updates`] ("merged updates"): every version above the base into ONE differencing
//!   VHDX whose parent is the base.
//!
//! ```text
//!   base ◄─ v1 ◄─ v2 ◄─ v3 (TOP)          merge_base:    new.vhdx                  (standalone)
//!                                          merge_updates: base ◄─ new.avhdx  (= v1+v2+v3)
//! ```
//!
//! For merged updates each range is decided by walking the versions from TOP down with
//! `map_layer`: the first version holding data supplies the bytes (read from TOP, which returns
//! exactly those), a version that zeroes the range makes the output zero it too, and a range
//! that falls through every version to the base stays NOT_PRESENT in the output. Both copies
//! run through the pipeline of [`super::copy`].

use std::path::Path;
use std::sync::Arc;

use super::copy::{self, Fill, Job, Outputs, PlanRun, ZeroPolicy};
use super::{CopyStats, Progress};
use crate::device::{BlockDevice, Source};
use crate::open::{self, Format, OpenOptions};
use crate::version::relative_path;
use crate::vhdx::{CreateOptions, ParentSpec};
use crate::{Error, ErrorKind, Result};

/// Writes the content of the chain under `top` into the new standalone VHDX `out`, with the
/// geometry of `top`. Unallocated and zero ranges are not read and stay unallocated.
///
/// # Errors
/// `InvalidArgument` when `out` is named for another format; `Io` (also when `out` exists);
/// open and read errors of the chain. `out` is removed on error.
pub fn merge_base(top: &Path, out: &Path, progress: &dyn Progress) -> Result<CopyStats> {
    check_vhdx_name(out)?;
    let chain = open::open(top, OpenOptions::default())?;
    chain.advise_random_below_top()?;
    let dev = chain.top();
    progress.phase("merging");
    copy::copy_device(
        dev.as_ref(),
        out,
        Format::Vhdx,
        copy::create_options(dev.as_ref(), None),
        progress,
    )
}

/// Writes every version above the base of `top`'s chain into the new differencing VHDX `out`,
/// whose parent is the base (linked by the base's identity, with a path relative to `out`'s
/// directory). Base and `out` then read exactly like the chain.
///
/// # Errors
/// `InvalidArgument` when `top` has no parent or `out` is named for another format; `Io` (also when `out` exists); open and read
/// errors of the chain. `out` is removed on error.
pub fn merge_updates(top: &Path, out: &Path, progress: &dyn Progress) -> Result<CopyStats> {
    check_vhdx_name(out)?;
    let chain = open::open(top, OpenOptions::default())?;
    chain.advise_random_below_top()?;
    let Some((base, versions)) = chain.layers.split_last().filter(|(_, v)| !v.is_empty()) else {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: has no parent; there are no updates to merge",
                top.display()
            ),
        ));
    };
    let linkage = base.image.device().linkage_id().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: the base has no identity to link to",
                base.path.display()
            ),
        )
    })?;
    let spec = ParentSpec {
        linkage,
        relative_path: relative_path(out, &base.path),
        absolute_path: copy::absolute(&base.path).display().to_string(),
    };
    let dev = chain.top();
    let create = CreateOptions {
        parent: Some(spec),
        ..copy::create_options(dev.as_ref(), None)
    };
    let versions: Vec<Arc<dyn BlockDevice>> = versions.iter().map(|l| l.image.device()).collect();
    let plan = |offset: u64, len: u64| updates_plan(&versions, offset, len);
    let job = Job {
        src: dev.as_ref(),
        plan: &plan,
        policy: ZeroPolicy::Shadow,
        len: dev.size().min(create.size),
    };
    progress.phase("merging");
    progress.set_total(dev.size());
    let mut outputs = Outputs::default();
    let (stats, _) = copy::copy_to_new(&job, out, Format::Vhdx, &create, &mut outputs, progress)?;
    outputs.keep();
    Ok(stats)
}

/// Refuses an output whose extension names another format than the VHDX written.
fn check_vhdx_name(out: &Path) -> Result<()> {
    match Format::from_extension(out) {
        Some(Format::Vhdx) | None => Ok(()),
        Some(_) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: a merge writes vhdx; name it .vhdx or .avhdx",
                out.display()
            ),
        )),
    }
}

/// The plan of merged updates for `[offset, offset + len)`: the first of `versions` (top
/// first) that holds data or zeros decides; falling through all of them means Skip.
fn updates_plan(versions: &[Arc<dyn BlockDevice>], offset: u64, len: u64) -> Result<Vec<PlanRun>> {
    let mut out: Vec<PlanRun> = Vec::new();
    let mut push = |run: PlanRun| match out.last_mut() {
        Some(last) if last.fill == run.fill => last.len += run.len,
        _ if run.len > 0 => out.push(run),
        _ => {}
    };
    let Some((layer, below)) = versions.split_first() else {
        push(PlanRun {
            len,
            fill: Fill::Skip,
        });
        return Ok(out);
    };
    // A version smaller than the range reads as zeros past its end, whatever lies below.
    let inside = layer.size().saturating_sub(offset).min(len);
    let mut pos = offset;
    let runs = if inside > 0 {
        layer.map_layer(offset, inside)?
    } else {
        Vec::new()
    };
    for run in runs {
        match run.source {
            Source::Data => push(PlanRun {
                len: run.len,
                fill: Fill::Data,
            }),
            Source::Zero => push(PlanRun {
                len: run.len,
                fill: Fill::Zero,
            }),
            Source::Parent => updates_plan(below, pos, run.len)?
                .into_iter()
                .for_each(&mut push),
        }
        pos += run.len;
    }
    push(PlanRun {
        len: len - inside,
        fill: Fill::Zero,
    });
    Ok(out)
}
