//! `convert`: any readable image (VHDX, VHD, raw; whole differencing chains) to VHDX, raw or
//! dynamic VHD. The copying itself is the shared pipeline of [`super::copy`]; this module
//! decides what to copy: the chain's top read through into one output, or each layer into its
//! own output linked to the converted parent.

use std::path::{Path, PathBuf};

use ::vhdx::Guid;

use super::copy::{self, Job, Outputs, ZeroPolicy};
use super::{CopyStats, Progress};
use crate::open::{self, Chain, Format, OpenOptions};
use crate::version::relative_path;
use crate::vhdx::{CreateOptions, ParentSpec};
use crate::{Error, ErrorKind, Result};

/// Options of [`convert`].
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Output format; by default taken from the output's extension.
    pub format: Option<Format>,
    /// Read a differencing chain through its top into one standalone output.
    pub flatten: bool,
    /// VHDX block size; by default the source's, clamped to 1..=256 MiB, else 32 MiB.
    pub block_size: Option<u32>,
    /// Make a fixed VHDX (every block allocated), or a fully allocated raw file (VHD output is
    /// always dynamic).
    pub fixed: bool,
}

/// Converts `src` (with its whole chain) into `dst`.
///
/// The output format is `opts.format`, else the one `dst`'s extension names. A chain is read
/// through its top into one file when `opts.flatten` is set or the output is raw or VHD (a
/// dynamic VHD, see `crate::vhd::VhdWriter`); otherwise every parent layer is converted next
/// to `dst` (`<stem>.vhdx` for the base, `<stem>.avhdx` for versions) and each converted child
/// links to its converted parent. Blocks that are unallocated or all zero stay unallocated.
/// Existing files are never overwritten, and the outputs are removed on error.
///
/// # Errors
/// `InvalidArgument` for an unknown output format, `fixed` with an unflattened chain, or a VHD
/// output above 2040 GiB; `Io` (also when an output exists); open, read and write errors.
pub fn convert(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    let format = match opts.format.or_else(|| Format::from_extension(dst)) {
        Some(f) => f,
        None => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{}: cannot tell the output format from the name; give one (vhdx, vhd, raw)",
                    dst.display()
                ),
            ));
        }
    };
    let chain = open::open(src, OpenOptions::default())?;
    progress.phase("converting");
    if format != Format::Vhdx || opts.flatten || chain.layers.len() == 1 {
        let top = chain.top();
        let create = CreateOptions {
            fixed: opts.fixed,
            ..copy::create_options(top.as_ref(), opts.block_size)
        };
        return copy::copy_device(top.as_ref(), dst, format, create, progress);
    }
    if opts.fixed {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "a differencing image cannot be fixed; flatten the chain to make a fixed image",
        ));
    }
    convert_chain(&chain, dst, opts.block_size, progress)
}

/// Converts each layer of `chain` into its own VHDX, linked to the converted parent.
fn convert_chain(
    chain: &Chain,
    dst: &Path,
    block_size: Option<u32>,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    progress.set_total(chain.layers.iter().map(|l| l.image.device().size()).sum());
    let dir = copy::parent_dir(dst);
    let base = chain.layers.len() - 1;
    let mut outputs = Outputs::default();
    let mut total = CopyStats::default();
    let mut parent: Option<(PathBuf, Guid)> = None;
    for (i, layer) in chain.layers.iter().enumerate().rev() {
        let out = if i == 0 {
            dst.to_path_buf()
        } else {
            let stem = layer.path.file_stem().unwrap_or(layer.path.as_os_str());
            dir.join(stem)
                .with_extension(if i == base { "vhdx" } else { "avhdx" })
        };
        let dev = layer.image.device();
        let spec = parent.as_ref().map(|(p, linkage)| ParentSpec {
            linkage: *linkage,
            relative_path: relative_path(&out, p),
            absolute_path: copy::absolute(p).display().to_string(),
        });
        let shadow = spec.is_some();
        let create = CreateOptions {
            parent: spec,
            ..copy::create_options(dev.as_ref(), block_size)
        };
        let plan = |offset: u64, len: u64| copy::layer_plan(dev.as_ref(), offset, len, shadow);
        let policy = if shadow {
            ZeroPolicy::Shadow
        } else {
            ZeroPolicy::Skip
        };
        let job = Job {
            src: dev.as_ref(),
            plan: &plan,
            policy,
            len: dev.size().min(create.size),
        };
        let (stats, linkage) =
            copy::copy_to_new(&job, &out, Format::Vhdx, &create, &mut outputs, progress)?;
        let linkage = linkage.expect("a vhdx output has a DataWriteGuid");
        add_stats(&mut total, &stats);
        parent = Some((out, linkage));
    }
    total.virtual_size = chain.top().size();
    outputs.keep();
    Ok(total)
}

/// Adds `s` to `total` (sizes add up: the output file size becomes that of all outputs).
fn add_stats(total: &mut CopyStats, s: &CopyStats) {
    total.bytes_read += s.bytes_read;
    total.bytes_written += s.bytes_written;
    total.blocks_skipped += s.blocks_skipped;
    total.blocks_written += s.blocks_written;
    total.output_file_size += s.output_file_size;
}
