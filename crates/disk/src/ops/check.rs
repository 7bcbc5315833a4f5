//! `check`: a structural audit of an image that does not refuse what it finds, and `--repair`
//! for what can be fixed without losing data (log replay, a bad header or region table copy,
//! leaked space).
//!
//! Errors make an image unclean; warnings do not. A dirty log whose active sequence is valid is
//! a warning: every reader replays it (in memory when read-only), so the image is consistent;
//! `--repair` replays it into the file.

use std::path::Path;
use std::sync::Arc;

use vhdx::bat::{self, Layout};
use vhdx::header::{self, HEADER_LEN, Header};
use vhdx::ident::{IDENT_LEN, Ident};
use vhdx::log;
use vhdx::metadata::Metadata;
use vhdx::region::{REGION_TABLE_LEN, RegionTable};
use vhdx::{HEADER1_OFFSET, HEADER2_OFFSET, MIB, REGION1_OFFSET, REGION2_OFFSET};

use crate::open::{self, Format, OpenOptions};
use crate::overlay::OverlayStorage;
use crate::vhdx::{self as vx, VhdxImage};
use crate::{Result, Storage, device};

/// Options of [`check`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckOptions {
    /// Fix what can be fixed without losing data.
    pub repair: bool,
}

/// The result of a check.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    /// The image checked.
    pub path: String,
    /// Its format.
    pub format: String,
    /// Problems that make the image inconsistent.
    pub errors: Vec<String>,
    /// Problems that do not (a stale header copy, a dirty but valid log, leaked space).
    pub warnings: Vec<String>,
    /// What `--repair` fixed.
    pub repaired: Vec<String>,
    /// File bytes holding data that nothing references.
    pub leaked_bytes: u64,
    /// The chain, top first.
    pub chain: Vec<String>,
    /// No errors.
    pub clean: bool,
}

impl CheckReport {
    /// Human-readable text.
    pub fn render(&self) -> String {
        let mut s = format!("{} ({})\n", self.path, self.format);
        if self.chain.len() > 1 {
            s += &format!("chain: {}\n", self.chain.join(" -> "));
        }
        for r in &self.repaired {
            s += &format!("repaired: {r}\n");
        }
        for e in &self.errors {
            s += &format!("error: {e}\n");
        }
        for w in &self.warnings {
            s += &format!("warning: {w}\n");
        }
        if self.leaked_bytes > 0 {
            s += &format!("leaked: {} bytes\n", self.leaked_bytes);
        }
        s += if self.clean {
            "no errors found\n"
        } else {
            "image is NOT consistent\n"
        };
        s
    }
}

/// What the VHDX audit found that `--repair` can act on.
#[derive(Debug, Default)]
struct Fixable {
    dirty_log: bool,
    bad_header_copy: bool,
    bad_region_copy: Option<u64>,
    good_region: Option<Vec<u8>>,
    leaks: Vec<(u64, u64)>,
}

/// Checks `path` (and, through it, its parent chain).
///
/// # Errors
/// Only when the file cannot be read at all; everything wrong with its contents is reported.
pub fn check(path: &Path, opts: &CheckOptions) -> Result<CheckReport> {
    let storage = open::open_storage(path, false)?;
    let format = match open::detect(path, storage.as_ref()) {
        Ok(f) => f,
        Err(e) => {
            return Ok(CheckReport {
                path: path.display().to_string(),
                format: "unknown".into(),
                errors: vec![e.to_string()],
                ..CheckReport::default()
            });
        }
    };
    let mut report = CheckReport {
        path: path.display().to_string(),
        format: format!("{format:?}").to_lowercase(),
        ..CheckReport::default()
    };
    let mut fix = Fixable::default();
    if format == Format::Vhdx {
        audit_vhdx(&storage, &mut report, &mut fix)?;
    }
    drop(storage);
    if report.errors.is_empty() {
        audit_chain(path, &mut report);
    }
    if opts.repair && report.errors.is_empty() && format == Format::Vhdx {
        let done = repair_vhdx(path, &fix)?;
        if !done.is_empty() {
            let mut again = check(path, &CheckOptions { repair: false })?;
            again.repaired = done;
            return Ok(again);
        }
    }
    report.clean = report.errors.is_empty();
    Ok(report)
}

fn read(s: &dyn Storage, off: u64, len: u64) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len as usize];
    s.read_at(&mut v, off)?;
    Ok(v)
}

fn audit_chain(path: &Path, report: &mut CheckReport) {
    match open::open(path, OpenOptions::default()) {
        Ok(chain) => {
            report.chain = chain
                .layers
                .iter()
                .map(|l| l.path.display().to_string())
                .collect();
            let top = chain.top();
            for w in top.warnings() {
                if !report.warnings.contains(&w) {
                    report.warnings.push(w);
                }
            }
            if let Err(e) = device::extents(top.as_ref(), 0, top.size()) {
                report
                    .errors
                    .push(format!("allocation map unreadable: {e}"));
            }
        }
        Err(e) => report.errors.push(contract::ErrorChain(&e).to_string()),
    }
}

fn audit_vhdx(arc: &Arc<dyn Storage>, report: &mut CheckReport, fix: &mut Fixable) -> Result<()> {
    let s = arc.as_ref();
    let file_len = s.len()?;
    if let Err(e) = Ident::parse(&read(s, 0, IDENT_LEN as u64)?) {
        report.errors.push(format!("file identifier: {e}"));
        return Ok(());
    }
    let h1 = read(s, HEADER1_OFFSET, HEADER_LEN as u64)?;
    let h2 = read(s, HEADER2_OFFSET, HEADER_LEN as u64)?;
    let cur = match header::choose(&h1, &h2) {
        Ok(c) => c,
        Err(e) => {
            report.errors.push(format!("headers: {e}"));
            return Ok(());
        }
    };
    for (n, b, at) in [(1, &h1, HEADER1_OFFSET), (2, &h2, HEADER2_OFFSET)] {
        if let Err(e) = Header::parse(b) {
            report.warnings.push(format!(
                "header {n} at {at:#x} is invalid ({e}); the other copy is used"
            ));
            fix.bad_header_copy = true;
        }
    }
    let hdr = cur.header;
    let mut view: Arc<dyn Storage> = arc.clone();
    if !hdr.log_guid.is_zero() && hdr.log_length > 0 {
        let buf = read(
            s,
            hdr.log_offset,
            u64::from(hdr.log_length).min(vx::MAX_LOG_LEN),
        )?;
        match log::find_active(&buf, hdr.log_guid) {
            Ok(Some(r)) if file_len < r.flushed_file_offset() => {
                report.errors.push(format!(
                    "log says {} bytes were flushed but the file has {file_len} (truncated)",
                    r.flushed_file_offset()
                ));
                return Ok(());
            }
            Ok(Some(r)) => {
                if let Err(e) = r.check_extent(file_len) {
                    // A log stretching the file would let BAT entries far past its data
                    // pass, and --repair would extend the file to match.
                    report.errors.push(format!("log: {e}"));
                    return Ok(());
                }
                report.warnings.push(format!(
                    "log is dirty: {} entr{} to replay (readers replay it; --repair writes it)",
                    r.entries.len(),
                    if r.entries.len() == 1 { "y" } else { "ies" }
                ));
                fix.dirty_log = true;
                let writes = r.entries.iter().flat_map(|e| e.writes.clone()).collect();
                view = Arc::new(OverlayStorage::new(view, writes, r.last_file_offset())?);
            }
            Ok(None) => {
                report
                    .warnings
                    .push("log guid set but the log holds no valid entry".into());
                fix.dirty_log = true;
            }
            Err(e) => report.errors.push(format!("log: {e}")),
        }
    }
    audit_regions_and_bat(view.as_ref(), &hdr, report, fix)
}

fn audit_regions_and_bat(
    s: &dyn Storage,
    hdr: &Header,
    report: &mut CheckReport,
    fix: &mut Fixable,
) -> Result<()> {
    let file_len = s.len()?;
    let r1b = read(s, REGION1_OFFSET, REGION_TABLE_LEN as u64)?;
    let r2b = read(s, REGION2_OFFSET, REGION_TABLE_LEN as u64)?;
    let regions = match (RegionTable::parse(&r1b), RegionTable::parse(&r2b)) {
        (Ok(a), Ok(b)) => {
            if a != b {
                report.errors.push("region tables 1 and 2 differ".into());
            }
            a
        }
        (Ok(a), Err(e)) => {
            report.warnings.push(format!(
                "region table 2 at {REGION2_OFFSET:#x} is invalid ({e})"
            ));
            fix.bad_region_copy = Some(REGION2_OFFSET);
            fix.good_region = Some(r1b);
            a
        }
        (Err(e), Ok(b)) => {
            report.warnings.push(format!(
                "region table 1 at {REGION1_OFFSET:#x} is invalid ({e})"
            ));
            fix.bad_region_copy = Some(REGION1_OFFSET);
            fix.good_region = Some(r2b);
            b
        }
        (Err(e1), Err(e2)) => {
            report
                .errors
                .push(format!("both region tables invalid: {e1}; {e2}"));
            return Ok(());
        }
    };
    let mlen = u64::from(regions.metadata.length).min(64 * MIB);
    let meta = match Metadata::parse(&read(s, regions.metadata.offset, mlen)?) {
        Ok(m) => m,
        Err(e) => {
            report.errors.push(format!(
                "metadata region at {:#x}: {e}",
                regions.metadata.offset
            ));
            return Ok(());
        }
    };
    let layout = match Layout::new(
        meta.block_size,
        meta.logical_sector_size,
        meta.virtual_size,
        meta.has_parent,
    ) {
        Ok(l) => l,
        Err(e) => {
            report.errors.push(format!("geometry: {e}"));
            return Ok(());
        }
    };
    let n = layout.total_entries();
    if n * 8 > u64::from(regions.bat.length) {
        report.errors.push(format!(
            "bat region holds fewer than the {n} entries needed"
        ));
        return Ok(());
    }
    let raw = read(s, regions.bat.offset, n * 8)?;
    let mut used = crate::vhdx::fixed_structures(&regions, hdr);
    audit_entries(&layout, &raw, file_len, &mut used, report);
    used.sort_by_key(|u| u.0);
    for w in used.windows(2) {
        if w[1].0 < w[0].1 {
            report.errors.push(format!(
                "{} at {:#x} overlaps {} at {:#x}",
                w[1].2, w[1].0, w[0].2, w[0].0
            ));
        }
    }
    find_leaks(s, &used, file_len, report, fix)
}

fn audit_entries(
    layout: &Layout,
    raw: &[u8],
    file_len: u64,
    used: &mut Vec<(u64, u64, String)>,
    report: &mut CheckReport,
) {
    let cr = layout.chunk_ratio();
    let entries: Vec<bat::Entry> = raw
        .chunks_exact(8)
        .map(|c| bat::Entry(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
        .collect();
    for (i, e) in entries.iter().enumerate() {
        let i = i as u64;
        let is_sb = bat::is_bitmap_index(layout, i);
        let (present, len) = if is_sb {
            match e.state() {
                bat::SB_BLOCK_NOT_PRESENT => (false, 0),
                bat::SB_BLOCK_PRESENT if layout.has_parent => (true, bat::SECTOR_BITMAP_BLOCK_LEN),
                st => {
                    report.errors.push(format!(
                        "bat entry {i} (sector bitmap) has invalid state {st}"
                    ));
                    continue;
                }
            }
        } else {
            match e.state() {
                bat::PAYLOAD_BLOCK_FULLY_PRESENT => (true, u64::from(layout.block_size)),
                bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT if layout.has_parent => {
                    let chunk = i / (cr + 1);
                    let sb = entries.get(layout.bitmap_index(chunk) as usize);
                    if sb.is_none_or(|sb| sb.state() != bat::SB_BLOCK_PRESENT) {
                        report.errors.push(format!("bat entry {i} is partially present but chunk {chunk} has no sector bitmap"));
                    }
                    (true, u64::from(layout.block_size))
                }
                0..=3 | 5 => (false, 0),
                st => {
                    report
                        .errors
                        .push(format!("bat entry {i} has invalid state {st}"));
                    continue;
                }
            }
        };
        if !present {
            continue;
        }
        let start = e.file_offset();
        if start < MIB {
            report.errors.push(format!(
                "bat entry {i} points at {start:#x}, over the file headers"
            ));
        } else if start >= file_len {
            report.errors.push(format!(
                "bat entry {i} points at {start:#x}, past the end of the {file_len}-byte file"
            ));
        } else if start.checked_add(len).is_none_or(|end| end > file_len) {
            report.warnings.push(format!(
                "bat entry {i}: block at {start:#x} extends past the end of the file"
            ));
        }
        used.push((start, start.saturating_add(len), format!("bat entry {i}")));
    }
}

/// Space below the end of the file that nothing references yet holds data (holes are free).
fn find_leaks(
    s: &dyn Storage,
    used: &[(u64, u64, String)],
    file_len: u64,
    report: &mut CheckReport,
    fix: &mut Fixable,
) -> Result<()> {
    let mut pos = 0u64;
    let mut gaps = Vec::new();
    for (start, end, _) in used {
        if *start > pos {
            gaps.push((pos, (*start).min(file_len)));
        }
        pos = pos.max(*end);
    }
    if pos < file_len {
        gaps.push((pos, file_len));
    }
    for (g0, g1) in gaps {
        let mut at = g0;
        while at < g1 {
            let Some(d) = s.next_data(at)? else { break };
            if d >= g1 {
                break;
            }
            let h = s.next_hole(d)?.min(g1).max(d + 1);
            fix.leaks.push((d, h - d));
            report.leaked_bytes += h - d;
            at = h;
        }
    }
    if report.leaked_bytes > 0 {
        report.warnings.push(format!(
            "{} bytes of unreferenced data in the file (leaked)",
            report.leaked_bytes
        ));
    }
    Ok(())
}

fn repair_vhdx(path: &Path, fix: &Fixable) -> Result<Vec<String>> {
    let mut done = Vec::new();
    if let (Some(at), Some(good)) = (fix.bad_region_copy, &fix.good_region) {
        let s = open::open_storage(path, true)?;
        s.write_at(good, at)?;
        s.flush()?;
        done.push(format!(
            "rewrote region table at {at:#x} from the good copy"
        ));
    }
    if fix.dirty_log || fix.bad_header_copy {
        let s = open::open_storage(path, true)?;
        let img = VhdxImage::open(
            s,
            vx::OpenOptions {
                writable: true,
                path: Some(path.to_path_buf()),
            },
        )?;
        if fix.dirty_log {
            done.push("replayed the log into the file".into());
        }
        img.rewrite_headers()?;
        img.close()?;
        if fix.bad_header_copy {
            done.push("rewrote both header copies".into());
        }
    }
    if !fix.leaks.is_empty() {
        let s = open::open_storage(path, true)?;
        let total: u64 = fix.leaks.iter().map(|l| l.1).sum();
        let last_end = fix.leaks.iter().map(|l| l.0 + l.1).max().unwrap_or(0);
        let tail_start = fix
            .leaks
            .iter()
            .filter(|l| l.0 + l.1 == last_end)
            .map(|l| l.0)
            .next();
        for &(off, len) in &fix.leaks {
            s.punch_hole(off, len)?;
        }
        if let Some(t) = tail_start.filter(|_| last_end == s.len().unwrap_or(0)) {
            s.set_len(t.div_ceil(MIB) * MIB)?;
        }
        s.flush()?;
        done.push(format!("freed {total} bytes of leaked space"));
    }
    Ok(done)
}
