//! The two copy benchmarks: capture (raw → VHDX) and merged base (a chain → one VHDX), each
//! timed against `qemu-img convert` of the same content and `cp` of a file of the same size.
//!
//! Every timed run starts with a cold page cache (when the machine allows dropping it) and ends
//! with an fsync of its output inside the timing, so page-cache speed never counts as disk
//! speed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use disk::open::{OpenOptions, open};
use disk::ops::NoProgress;
use disk::ops::capture::{CaptureOptions, capture};
use disk::ops::merge::merge_base;

use crate::data::{self, DeltaSummary, MergeSetup};
use crate::report::{CopyRun, CopyTable};
use crate::sys;
use crate::{Config, note};

/// The VHDX block size every tool is asked for (VHDX's default, Hyper-V's dynamic default).
pub const VHDX_BLOCK_BYTES: u32 = 32 << 20;
/// The share of the disk the version of the merge benchmark rewrites.
pub const MERGE_DELTA_FRACTION: f64 = 0.2;

/// The qemu-img arguments that write a dynamic VHDX with Ferry's block size.
fn qemu_convert_args<'a>(src: &'a str, dst: &'a str) -> Vec<&'a str> {
    let opts = "subformat=dynamic,block_size=32M";
    vec!["convert", "-f", "raw", "-O", "vhdx", "-o", opts, src, dst]
}

/// One tool of a copy benchmark.
struct Tool<'a> {
    name: &'static str,
    command: String,
    output: PathBuf,
    virtual_bytes: u64,
    run: Box<dyn Fn() -> Result<()> + 'a>,
    /// Keep the last run's output (for verification); others are removed at once to save
    /// space.
    keep: bool,
}

/// Runs every tool `cfg.runs` times, each from a cold cache with its output removed first.
fn measure(cfg: &Config, tools: &[Tool<'_>]) -> Result<Vec<CopyRun>> {
    let mut out: Vec<CopyRun> = tools
        .iter()
        .map(|t| CopyRun::new(t.name, &t.command, t.virtual_bytes))
        .collect();
    for round in 1..=cfg.runs {
        for (tool, row) in tools.iter().zip(&mut out) {
            remove_if_present(&tool.output)?;
            cfg.cache.drop_now();
            cfg.loads.sample();
            note(&format!(
                "  {} (run {round}/{}): {}",
                tool.name, cfg.runs, tool.command
            ));
            let io_before = sys::IoCounters::now();
            let secs = sys::timed_with_fsync(&tool.output, || (tool.run)())?;
            let io = sys::IoCounters::now().since(io_before);
            let written = sys::allocated_bytes(&tool.output)?;
            note(&format!(
                "    {secs:.2} s, {:.1} MB allocated, {:.1} MB read from disk",
                written as f64 / 1e6,
                io.read_bytes as f64 / 1e6
            ));
            row.add(secs, written, io.read_bytes);
            if round < cfg.runs || !tool.keep {
                remove_if_present(&tool.output)?;
            }
        }
    }
    Ok(out)
}

/// capture raw → VHDX: Ferry's library vs `qemu-img convert` vs `cp --sparse=always`.
/// Leaves Ferry's output at `base` for the merge benchmark.
///
/// # Errors
/// Any tool failing, or Ferry's output differing from the raw file.
pub fn capture_bench(cfg: &Config, raw: &Path, base: &Path) -> Result<CopyTable> {
    note("capture: raw → vhdx");
    let size = std::fs::metadata(raw)?.len();
    let dir = &cfg.dir;
    let (ferry_out, qemu_out, cp_out) = (
        dir.join("capture-ferry.vhdx"),
        dir.join("capture-qemu.vhdx"),
        dir.join("capture-cp.raw"),
    );
    let (raw_s, qemu_s, cp_s) = (path_str(raw)?, path_str(&qemu_out)?, path_str(&cp_out)?);
    let tools = [
        Tool {
            name: "ferry",
            command: "disk::ops::capture::capture (library, in process)".into(),
            output: ferry_out.clone(),
            virtual_bytes: size,
            run: Box::new(|| ferry_capture(raw, &ferry_out)),
            keep: true,
        },
        Tool {
            name: "qemu-img",
            command: format!(
                "qemu-img {}",
                qemu_convert_args("RAW", "OUT.vhdx").join(" ")
            ),
            output: qemu_out.clone(),
            virtual_bytes: size,
            run: Box::new(|| sys::run("qemu-img", &qemu_convert_args(raw_s, qemu_s)).map(drop)),
            keep: false,
        },
        Tool {
            name: "cp",
            command: "cp --sparse=always RAW OUT.raw".into(),
            output: cp_out.clone(),
            virtual_bytes: size,
            run: Box::new(|| sys::run("cp", &["--sparse=always", raw_s, cp_s]).map(drop)),
            keep: false,
        },
    ];
    let runs = measure(cfg, &tools)?;
    if cfg.verify {
        verify_same(raw, &ferry_out)?;
    }
    std::fs::rename(&ferry_out, base)?;
    remove_if_present(&qemu_out)?;
    remove_if_present(&cp_out)?;
    Ok(CopyTable { runs })
}

/// Captures `raw` into `base` without timing (when the capture benchmark is not selected).
///
/// # Errors
/// Capture failures.
pub fn make_base(raw: &Path, base: &Path) -> Result<()> {
    note("making the base vhdx (untimed capture)");
    remove_if_present(base)?;
    ferry_capture(raw, base)
}

fn ferry_capture(raw: &Path, out: &Path) -> Result<()> {
    let opts = CaptureOptions {
        block_size: VHDX_BLOCK_BYTES,
        verify: false,
    };
    capture(raw, out, &opts, &NoProgress).context("ferry capture")?;
    Ok(())
}

/// Creates `version` (a differencing child of `base`) holding a random delta over
/// `fraction` of the disk, written through the library. Returns what was written.
///
/// # Errors
/// Library failures.
pub fn make_version(base: &Path, version: &Path, fraction: f64, seed: u64) -> Result<DeltaSummary> {
    remove_if_present(version)?;
    disk::version::new_version(base, version).context("new version")?;
    let chain = open(
        version,
        OpenOptions {
            writable: true,
            format: None,
        },
    )?;
    let delta = data::write_delta(chain.top().as_ref(), fraction, seed)?;
    chain.close().context("close the version")?;
    Ok(delta)
}

/// Merged base of `base` + `version`: Ferry's `merge_base` vs `qemu-img convert` of the
/// flattened raw (made beforehand by the library, untimed) vs `cp` of a file as large as
/// Ferry's merge output.
///
/// # Errors
/// Any tool failing, or Ferry's output differing from the flattened chain.
pub fn merge_bench(
    cfg: &Config,
    version: &Path,
    delta: DeltaSummary,
) -> Result<(CopyTable, MergeSetup)> {
    let dir = &cfg.dir;
    let flat = dir.join("merge-flat.raw");
    note("merge: flattening the chain to raw for qemu-img (untimed)");
    let chain = open(version, OpenOptions::default())?;
    let size = chain.top().size();
    let flat_data_bytes = data::flatten(chain.top().as_ref(), &flat)?;
    drop(chain);
    let ferry_out = dir.join("merge-ferry.vhdx");
    let cp_src = dir.join("merge-cp-source.bin");
    let cp_source_bytes = size_of_merge(version, &ferry_out)?;
    note(&format!(
        "merge: writing the {:.1} MB file cp copies (untimed)",
        cp_source_bytes as f64 / 1e6
    ));
    data::random_file(&cp_src, cp_source_bytes, cfg.seed ^ 0xc0)?;
    let (qemu_out, cp_out) = (dir.join("merge-qemu.vhdx"), dir.join("merge-cp.bin"));
    let (flat_s, qemu_s) = (path_str(&flat)?, path_str(&qemu_out)?);
    let (cp_src_s, cp_s) = (path_str(&cp_src)?, path_str(&cp_out)?);
    let tools = [
        Tool {
            name: "ferry",
            command: "disk::ops::merge::merge_base (library, in process)".into(),
            output: ferry_out.clone(),
            virtual_bytes: size,
            run: Box::new(|| ferry_merge(version, &ferry_out)),
            keep: true,
        },
        Tool {
            name: "qemu-img",
            command: format!(
                "qemu-img {}",
                qemu_convert_args("FLAT.raw", "OUT.vhdx").join(" ")
            ),
            output: qemu_out.clone(),
            virtual_bytes: size,
            run: Box::new(|| sys::run("qemu-img", &qemu_convert_args(flat_s, qemu_s)).map(drop)),
            keep: false,
        },
        Tool {
            name: "cp",
            command: "cp SAME-SIZE-FILE OUT (non-sparse random bytes)".into(),
            output: cp_out.clone(),
            virtual_bytes: cp_source_bytes,
            run: Box::new(|| sys::run("cp", &[cp_src_s, cp_s]).map(drop)),
            keep: false,
        },
    ];
    note("merge: merged base of base + version → vhdx");
    let runs = measure(cfg, &tools)?;
    if cfg.verify {
        verify_same(&flat, &ferry_out)?;
    }
    for p in [&ferry_out, &qemu_out, &cp_out, &cp_src, &flat] {
        remove_if_present(p)?;
    }
    let setup = MergeSetup {
        delta,
        flat_data_bytes,
        cp_source_bytes,
    };
    Ok((CopyTable { runs }, setup))
}

/// Runs Ferry's merge once, untimed, to learn the size of its output (the `cp` baseline
/// copies a file that large).
fn size_of_merge(version: &Path, out: &Path) -> Result<u64> {
    note("merge: sizing the output with one untimed ferry merge");
    remove_if_present(out)?;
    ferry_merge(version, out)?;
    let bytes = sys::allocated_bytes(out)?;
    remove_if_present(out)?;
    Ok(bytes)
}

fn ferry_merge(version: &Path, out: &Path) -> Result<()> {
    merge_base(version, out, &NoProgress).context("ferry merge")?;
    Ok(())
}

/// `qemu-img compare` of a raw file with a VHDX (untimed correctness check).
fn verify_same(raw: &Path, vhdx: &Path) -> Result<()> {
    note(&format!(
        "  verifying {} with qemu-img compare",
        vhdx.display()
    ));
    let (a, b) = (path_str(raw)?, path_str(vhdx)?);
    sys::run("qemu-img", &["compare", "-f", "raw", "-F", "vhdx", a, b])
        .context("ferry's output differs from what it should equal")?;
    sys::run("qemu-img", &["check", "-f", "vhdx", b])
        .context("qemu-img check of ferry's output")?;
    Ok(())
}

fn remove_if_present(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("remove {}", p.display()))
        }
        _ => Ok(()),
    }
}

fn path_str(p: &Path) -> Result<&str> {
    match p.to_str() {
        Some(s) => Ok(s),
        None => bail!("{} is not UTF-8", p.display()),
    }
}
