//! The long `ferry vdisk` commands: merge, convert, capture and compact.
//!
//! Each draws a progress bar on stderr (see [`crate::progress`]) while the library works, then
//! prints a one-paragraph summary, or with `--json` the library's statistics
//! ([`CopyStats`], [`disk::ops::compact::CompactStats`]) as JSON on stdout.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use disk::open::Format;
use disk::ops::CopyStats;
use disk::ops::capture::{CaptureOptions, capture as capture_op};
use disk::ops::compact::compact as compact_op;
use disk::ops::convert::{ConvertOptions, convert as convert_op};
use disk::ops::info::human_size;
use disk::ops::merge::{merge_base, merge_updates};
use disk::vhdx::CreateOptions;

use crate::progress::Bar;
use crate::size::parse_block_size;
use crate::{Global, print_json};

/// Arguments of `merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The newest version of the chain to merge.
    pub top: PathBuf,
    /// The new file: a standalone .vhdx, or with --updates a .avhdx on the chain's base.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Merge only the versions above the base, into one differencing image.
    #[arg(long)]
    pub updates: bool,
    /// Print the statistics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The source image (vhdx, vhd or raw; a chain is followed).
    pub src: PathBuf,
    /// The new file; its extension (.vhdx/.avhdx, .img/.raw) picks the format unless --format
    /// is given. An unflattened chain is written as a chain next to it.
    pub dst: PathBuf,
    /// Output format: vhdx or raw (VHD is read, never written).
    #[arg(long, value_parser = parse_format)]
    pub format: Option<Format>,
    /// Write the whole chain into one file instead of a chain of the same shape (raw output
    /// is always flat).
    #[arg(long)]
    pub flatten: bool,
    /// Block size of a VHDX output (default: the source's, or 32M).
    #[arg(long, value_parser = parse_block_size)]
    pub block_size: Option<u32>,
    /// Make a VHDX output fixed (every block allocated); needs a flat output.
    #[arg(long)]
    pub fixed: bool,
    /// Print the statistics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `capture`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// A block device or raw file.
    pub source: PathBuf,
    /// The new VHDX image.
    pub dst: PathBuf,
    /// Read both back afterwards and compare.
    #[arg(long)]
    pub verify: bool,
    /// Block size of the new image.
    #[arg(long, value_parser = parse_block_size)]
    pub block_size: Option<u32>,
    /// Print the statistics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `compact`.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// The image to compact in place.
    pub path: PathBuf,
    /// Print the statistics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).map_err(|e| e.to_string())
}

/// `ferry vdisk merge`.
///
/// # Errors
/// Open, merge and output errors.
pub fn merge(a: &MergeArgs, global: Global) -> anyhow::Result<()> {
    let bar = Bar::new(global.quiet, "merging");
    let start = Instant::now();
    let stats = if a.updates {
        merge_updates(&a.top, &a.output, &bar)?
    } else {
        merge_base(&a.top, &a.output, &bar)?
    };
    bar.finish();
    let what = if a.updates {
        "merged updates of"
    } else {
        "merged base of"
    };
    report(
        &stats,
        a.json,
        &format!("{what} {}", a.top.display()),
        &a.output,
        start.elapsed(),
    )
}

/// `ferry vdisk convert`.
///
/// # Errors
/// Open, format and output errors.
pub fn convert(a: &ConvertArgs, global: Global) -> anyhow::Result<()> {
    let opts = ConvertOptions {
        format: a.format,
        flatten: a.flatten,
        block_size: a.block_size,
        fixed: a.fixed,
    };
    let bar = Bar::new(global.quiet, "converting");
    let start = Instant::now();
    let stats = convert_op(&a.src, &a.dst, &opts, &bar)?;
    bar.finish();
    let what = format!("converted {}", a.src.display());
    report(&stats, a.json, &what, &a.dst, start.elapsed())
}

/// `ferry vdisk capture`.
///
/// # Errors
/// Source, output and verification errors.
pub fn capture(a: &CaptureArgs, global: Global) -> anyhow::Result<()> {
    let opts = CaptureOptions {
        block_size: a.block_size.unwrap_or(CreateOptions::default().block_size),
        verify: a.verify,
    };
    let bar = Bar::new(global.quiet, "capturing");
    let start = Instant::now();
    let stats = capture_op(&a.source, &a.dst, &opts, &bar)?;
    bar.finish();
    let verified = if a.verify { " (verified)" } else { "" };
    let what = format!("captured {}{verified}", a.source.display());
    report(&stats, a.json, &what, &a.dst, start.elapsed())
}

/// `ferry vdisk compact`.
///
/// # Errors
/// Open and I/O errors.
pub fn compact(a: &CompactArgs, global: Global) -> anyhow::Result<()> {
    let bar = Bar::new(global.quiet, "compacting");
    let start = Instant::now();
    let stats = compact_op(&a.path, &bar)?;
    bar.finish();
    if a.json {
        return print_json(&stats);
    }
    let freed = stats.file_size_before.saturating_sub(stats.file_size_after);
    outln!(
        "compacted {} in {}",
        a.path.display(),
        seconds(start.elapsed())
    );
    outln!(
        "  file {} -> {} ({} given back); {} unused blocks dropped",
        human_size(stats.file_size_before),
        human_size(stats.file_size_after),
        human_size(freed),
        stats.blocks_dropped
    );
    Ok(())
}

/// Prints a copy's summary, or its statistics as JSON.
fn report(
    stats: &CopyStats,
    json: bool,
    what: &str,
    out: &Path,
    elapsed: Duration,
) -> anyhow::Result<()> {
    if json {
        return print_json(stats);
    }
    let per_second = (stats.bytes_written as f64 / elapsed.as_secs_f64().max(1e-3)) as u64;
    outln!("{what} into {} in {}", out.display(), seconds(elapsed));
    outln!(
        "  virtual size {}; read {}, wrote {} ({}/s)",
        human_size(stats.virtual_size),
        human_size(stats.bytes_read),
        human_size(stats.bytes_written),
        human_size(per_second)
    );
    outln!(
        "  {} blocks written, {} unallocated or zero blocks skipped; output file {}",
        stats.blocks_written,
        stats.blocks_skipped,
        human_size(stats.output_file_size)
    );
    Ok(())
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
