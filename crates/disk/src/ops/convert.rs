//! `convert`: any readable image (VHDX, VHD, raw; whole differencing chains) to VHDX or raw,
//! and the copy pipeline that `capture`, `merge` and `compact` share.
//!
//! # Design notes
//!
//! A copy walks the virtual disk in *units*: one output block (at most [`UNIT_BYTES_MAX`]),
//! or [`RAW_UNIT_BYTES`] for raw output.
//!
//! ```text
//!  reader thread                                sync_channel(QUEUE_DEPTH)   writer (caller's thread)
//!  plan(window) ─► per unit: read the Data runs ─► Unit { buf, actions } ─► write_at / write_zeroes
//!                   into a pooled buffer                                        │
//!        ▲                                                                      │
//!        └────────────────── free buffers (at most BUFFERS) ◄──────────────────┘
//! ```
//!
//! * A *plan* says, per run of the virtual disk, whether the output gets the source's bytes
//!   ([`Fill::Data`]), must read as zeros in its own right ([`Fill::Zero`]: a differencing output
//!   shadows its parent with it), or is left alone ([`Fill::Skip`]: unallocated, or falling
//!   through to the output's parent). Plans come from allocation maps
//!   ([`crate::device::extents`], `map_layer`), so holes and zero blocks are never read.
//! * Data that reads as zeros is dropped under [`ZeroPolicy::Skip`] (standalone outputs, where
//!   unwritten ranges read as zeros) and written as zeros under [`ZeroPolicy::Shadow`]
//!   (differencing outputs, where an unwritten range would read from the parent).
//! * A unit of non-zero data is written with one `write_at`, so a VHDX block is allocated
//!   FULLY_PRESENT with one `set_len`, and the BAT goes through the log once, at `close`. Zero
//!   gaps of [`ZERO_GRANULE`] inside a standalone output's unit stay unwritten, so outputs stay
//!   sparse on the host filesystem too.
//! * Memory is bounded by `BUFFERS` units; buffers are reused.
//! * Why two threads: with one, reads and writes alternate and each device idles half of the
//!   time. Why not more: on two cores the copy is bound by memory bandwidth and the disk, and a
//!   deeper queue only holds more RAM.
//! * Outputs are written in place and removed if the operation fails ([`Outputs`]); an existing
//!   file is never overwritten, so an input cannot be clobbered by a colliding output name.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};

use ::vhdx::Guid;

use super::{CopyStats, Progress};
use crate::device::{self, BlockDevice, ExtentKind, Source};
use crate::open::{self, Chain, Format, OpenOptions};
use crate::raw::RawDisk;
use crate::version::relative_path;
use crate::vhdx::{self, CreateOptions, ParentSpec, VhdxImage};
use crate::{Error, ErrorKind, FileStorage, Result, Storage};

/// The largest unit copied with one read and one write (bounds RAM with [`BUFFERS`]).
pub const UNIT_BYTES_MAX: u64 = 64 << 20;
/// The unit of raw output (raw files have no blocks).
pub const RAW_UNIT_BYTES: u64 = 8 << 20;
/// Units in flight between the reader and the writer.
const QUEUE_DEPTH: usize = 2;
/// Buffers in the pool: the queue, plus one being read and one being written.
const BUFFERS: usize = QUEUE_DEPTH + 2;
/// Bytes of virtual disk whose allocation map is fetched at once.
const WINDOW_BYTES: u64 = 1 << 30;
/// Zero runs at least this long inside a standalone output's unit are not written.
pub const ZERO_GRANULE: u64 = 64 << 10;

/// Options of [`convert`].
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Output format; by default taken from the output's extension.
    pub format: Option<Format>,
    /// Read a differencing chain through its top into one standalone output.
    pub flatten: bool,
    /// VHDX block size; by default the source's, clamped to 1..=256 MiB, else 32 MiB.
    pub block_size: Option<u32>,
    /// Make a fixed VHDX (every block allocated), or a fully allocated raw file.
    pub fixed: bool,
}

/// What the output gets for a run of the virtual disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// The source's bytes.
    Data,
    /// Zeros decided by the output itself.
    Zero,
    /// Nothing: the output leaves the range unallocated.
    Skip,
}

/// A run of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanRun {
    /// Length in bytes.
    pub len: u64,
    /// What the output gets.
    pub fill: Fill,
}

/// What happens to data that reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZeroPolicy {
    /// Not written (standalone outputs).
    Skip,
    /// Written as zeros with `write_zeroes` (differencing outputs).
    Shadow,
}

/// A plan: the runs of `[offset, offset + len)`, covering it exactly.
pub(crate) type Plan<'a> = dyn Fn(u64, u64) -> Result<Vec<PlanRun>> + Sync + 'a;

/// One copy: where from, what to copy, and how.
pub(crate) struct Job<'a> {
    /// The device the Data runs are read from.
    pub src: &'a dyn BlockDevice,
    /// The plan.
    pub plan: &'a Plan<'a>,
    /// Zero handling.
    pub policy: ZeroPolicy,
    /// Bytes of the virtual disk to walk.
    pub len: u64,
}

/// Files created by an operation; removed on drop unless [`Outputs::keep`] was called.
#[derive(Debug, Default)]
pub(crate) struct Outputs {
    paths: Vec<PathBuf>,
    keep: bool,
}

impl Outputs {
    /// Registers a file this operation created.
    pub fn add(&mut self, path: &Path) {
        self.paths.push(path.to_path_buf());
    }

    /// The operation succeeded: keep every file.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for p in &self.paths {
            if let Err(e) = std::fs::remove_file(p) {
                tracing::warn!(path = %p.display(), error = %e, "removing a partial output failed");
            }
        }
    }
}

/// A new output image being written.
#[derive(Debug)]
pub(crate) enum Sink {
    /// A VHDX image opened for writing.
    Vhdx(Box<VhdxImage>),
    /// A sparse raw file.
    Raw(RawDisk),
}

impl Sink {
    /// Creates `path` (which must not exist), registers it in `outputs`, and opens it.
    ///
    /// # Errors
    /// `Unsupported` for VHD; `Io` (also when the file exists); `InvalidArgument` for a bad
    /// geometry.
    pub fn create(path: &Path, format: Format, opts: &CreateOptions, outputs: &mut Outputs) -> Result<Sink> {
        if format == Format::Vhd {
            return Err(vhd_unsupported());
        }
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        outputs.add(path);
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(file));
        let ctx = |e: Error| e.context(path.display());
        if format == Format::Raw {
            storage.set_len(opts.size).map_err(ctx)?;
            if opts.fixed {
                storage.allocate(0, opts.size).map_err(ctx)?;
            }
            return Ok(Sink::Raw(RawDisk::open(storage, true)?));
        }
        vhdx::create(&storage, opts).map_err(ctx)?;
        let o = vhdx::OpenOptions { writable: true, path: Some(path.to_path_buf()) };
        Ok(Sink::Vhdx(Box::new(VhdxImage::open(storage, o).map_err(ctx)?)))
    }

    /// The output as a block device.
    pub fn device(&self) -> &dyn BlockDevice {
        match self {
            Sink::Vhdx(i) => i.as_ref(),
            Sink::Raw(r) => r,
        }
    }

    /// Commits and makes everything durable (VHDX `close`, raw `fsync`).
    ///
    /// # Errors
    /// I/O failures.
    pub fn finish(&self) -> Result<()> {
        match self {
            Sink::Vhdx(i) => i.close(),
            Sink::Raw(r) => r.flush(),
        }
    }

    /// The identity children link to (VHDX DataWriteGuid).
    pub fn linkage(&self) -> Option<Guid> {
        self.device().linkage_id()
    }
}

fn vhd_unsupported() -> Error {
    Error::new(ErrorKind::Unsupported, "writing vhd is not supported; convert to vhdx or raw")
}

/// Converts `src` (with its whole chain) into `dst`.
///
/// The output format is `opts.format`, else the one `dst`'s extension names. A chain is read
/// through its top into one file when `opts.flatten` is set or the output is raw; otherwise
/// every parent layer is converted next to `dst` (`<stem>.vhdx` for the base, `<stem>.avhdx`
/// for versions) and each converted child links to its converted parent. Blocks that are
/// unallocated or all zero stay unallocated. Existing files are never overwritten, and the
/// outputs are removed on error.
///
/// # Errors
/// `InvalidArgument` for an unknown output format, an existing output, or `fixed` with an
/// unflattened chain; `Unsupported` for VHD output; open, read and write errors.
pub fn convert(src: &Path, dst: &Path, opts: &ConvertOptions, progress: &dyn Progress) -> Result<CopyStats> {
    let format = match opts.format.or_else(|| Format::from_extension(dst)) {
        Some(Format::Vhd) => return Err(vhd_unsupported()),
        Some(f) => f,
        None => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{}: cannot tell the output format from the name; give one (vhdx, raw)", dst.display()),
            ));
        }
    };
    let chain = open::open(src, OpenOptions::default())?;
    if format == Format::Raw || opts.flatten || chain.layers.len() == 1 {
        let top = chain.top();
        let create = CreateOptions { fixed: opts.fixed, ..create_options(top.as_ref(), opts.block_size) };
        return copy_device(top.as_ref(), dst, format, create, progress);
    }
    if opts.fixed {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "a differencing image cannot be fixed; flatten the chain to make a fixed image",
        ));
    }
    convert_chain(&chain, dst, opts.block_size, progress)
}

/// The geometry of a VHDX copy of `dev`: its size (rounded up to a whole logical sector), its
/// sector sizes, and `block_size` or its own block size clamped to what VHDX allows.
pub(crate) fn create_options(dev: &dyn BlockDevice, block_size: Option<u32>) -> CreateOptions {
    let g = dev.geometry();
    let block_size = block_size.unwrap_or(if dev.format() == "raw" || !g.block_size.is_power_of_two() {
        // A raw file has no block size of its own (RawDisk reports a nominal 1 MiB).
        CreateOptions::default().block_size
    } else {
        g.block_size.clamp(::vhdx::MIN_BLOCK_SIZE, ::vhdx::MAX_BLOCK_SIZE)
    });
    let sector = u64::from(g.logical_sector_size.max(1));
    CreateOptions {
        size: g.size.div_ceil(sector) * sector,
        block_size,
        logical_sector_size: g.logical_sector_size,
        physical_sector_size: g.physical_sector_size,
        ..CreateOptions::default()
    }
}

/// Copies the whole content of `src` (parents resolved) into a new file `dst`.
///
/// `create` gives the VHDX geometry (a zero `size` means `src`'s size rounded up to a whole
/// logical sector); for raw output only `size` and `fixed` count. With `create.parent` set,
/// the output is differencing and every range that `src` does not hold as data is written as
/// zeros, so the output chain reads exactly like `src`. `dst` is removed on error.
///
/// # Errors
/// `Unsupported` for VHD; `Io` (also when `dst` exists); read errors of `src`.
pub fn copy_device(
    src: &dyn BlockDevice,
    dst: &Path,
    format: Format,
    create: CreateOptions,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    let mut create = create;
    if create.size == 0 {
        let sector = u64::from(create.logical_sector_size.max(1));
        create.size = src.size().div_ceil(sector) * sector;
    }
    progress.set_total(src.size());
    let shadow = create.parent.is_some();
    let plan = move |offset: u64, len: u64| resolved_plan(src, offset, len, shadow);
    let policy = if shadow { ZeroPolicy::Shadow } else { ZeroPolicy::Skip };
    let job = Job { src, plan: &plan, policy, len: src.size().min(create.size) };
    let mut outputs = Outputs::default();
    let (stats, _) = copy_to_new(&job, dst, format, &create, &mut outputs, progress)?;
    outputs.keep();
    Ok(stats)
}

/// The plan of a whole-content copy: data where the chain has data; elsewhere zeros when the
/// output shadows a parent, nothing otherwise.
pub(crate) fn resolved_plan(src: &dyn BlockDevice, offset: u64, len: u64, shadow: bool) -> Result<Vec<PlanRun>> {
    let runs = device::extents(src, offset, len)?;
    Ok(runs
        .iter()
        .map(|e| PlanRun {
            len: e.len,
            fill: match e.kind {
                ExtentKind::Data => Fill::Data,
                _ if shadow => Fill::Zero,
                _ => Fill::Skip,
            },
        })
        .collect())
}

/// The plan of copying one layer of a chain by itself: its own data, its own zeros when the
/// output has a parent to shadow, and nothing where it falls through to its parent.
pub(crate) fn layer_plan(layer: &dyn BlockDevice, offset: u64, len: u64, shadow: bool) -> Result<Vec<PlanRun>> {
    let runs = layer.map_layer(offset, len)?;
    Ok(runs
        .iter()
        .map(|r| PlanRun {
            len: r.len,
            fill: match r.source {
                Source::Data => Fill::Data,
                Source::Zero if shadow => Fill::Zero,
                Source::Zero | Source::Parent => Fill::Skip,
            },
        })
        .collect())
}

/// Creates `dst`, runs `job` into it and finishes it. Returns the stats and the output's
/// linkage identity. `dst` is registered in `outputs` (the caller decides to keep it).
pub(crate) fn copy_to_new(
    job: &Job<'_>,
    dst: &Path,
    format: Format,
    create: &CreateOptions,
    outputs: &mut Outputs,
    progress: &dyn Progress,
) -> Result<(CopyStats, Option<Guid>)> {
    let sink = Sink::create(dst, format, create, outputs)?;
    let unit = match format {
        Format::Raw => RAW_UNIT_BYTES,
        _ => u64::from(create.block_size).min(UNIT_BYTES_MAX),
    };
    let mut stats = run(job, sink.device(), unit, progress)?;
    sink.finish().map_err(|e| e.context(dst.display()))?;
    sync_parent_dir(dst)?;
    stats.virtual_size = create.size;
    stats.output_file_size = file_len(dst)?;
    Ok((stats, sink.linkage()))
}

/// The length of a file.
pub(crate) fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))
}

/// Makes a new directory entry durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = parent_dir(path);
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("fsync directory {}", dir.display()), e))
}

/// The directory of `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

fn convert_chain(chain: &Chain, dst: &Path, block_size: Option<u32>, progress: &dyn Progress) -> Result<CopyStats> {
    progress.set_total(chain.layers.iter().map(|l| l.image.device().size()).sum());
    let dir = parent_dir(dst);
    let base = chain.layers.len() - 1;
    let mut outputs = Outputs::default();
    let mut total = CopyStats::default();
    let mut parent: Option<(PathBuf, Guid)> = None;
    for (i, layer) in chain.layers.iter().enumerate().rev() {
        let out = if i == 0 {
            dst.to_path_buf()
        } else {
            let stem = layer.path.file_stem().unwrap_or(layer.path.as_os_str());
            dir.join(stem).with_extension(if i == base { "vhdx" } else { "avhdx" })
        };
        let dev = layer.image.device();
        let spec = parent.as_ref().map(|(p, linkage)| ParentSpec {
            linkage: *linkage,
            relative_path: relative_path(&out, p),
            absolute_path: absolute(p).display().to_string(),
        });
        let shadow = spec.is_some();
        let create = CreateOptions { parent: spec, ..create_options(dev.as_ref(), block_size) };
        let plan = |offset: u64, len: u64| layer_plan(dev.as_ref(), offset, len, shadow);
        let policy = if shadow { ZeroPolicy::Shadow } else { ZeroPolicy::Skip };
        let job = Job { src: dev.as_ref(), plan: &plan, policy, len: dev.size().min(create.size) };
        let (stats, linkage) = copy_to_new(&job, &out, Format::Vhdx, &create, &mut outputs, progress)?;
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

/// An absolute path (canonical when it exists).
pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// True when every byte is zero; compares 16-byte words, 256 bytes per early-exit check.
pub fn is_zero(buf: &[u8]) -> bool {
    const STRIDE: usize = 256;
    let mut chunks = buf.chunks_exact(STRIDE);
    for c in &mut chunks {
        let mut acc = 0u128;
        for w in c.chunks_exact(16) {
            acc |= u128::from_ne_bytes(w.try_into().expect("chunks_exact yields 16 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

/// A write (or zeroing) of `[rel, rel + len)` of a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Action {
    rel: u64,
    len: u64,
    zero: bool,
}

/// A unit on its way from the reader to the writer.
#[derive(Debug)]
struct Unit {
    offset: u64,
    len: u64,
    bytes_read: u64,
    buf: Option<Vec<u8>>,
    actions: Vec<Action>,
}

/// A piece of a unit: offset in the unit, length, fill.
type Piece = (u64, u64, Fill);

/// Walks a window's plan in unit-sized steps.
struct RunCursor<'r> {
    runs: &'r [PlanRun],
    index: usize,
    used: u64,
}

impl RunCursor<'_> {
    /// The next `len` bytes of the plan as pieces (a plan that ends early is padded with Skip).
    fn take(&mut self, len: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut rel = 0;
        while rel < len {
            let Some(run) = self.runs.get(self.index) else {
                out.push((rel, len - rel, Fill::Skip));
                break;
            };
            let n = (run.len - self.used).min(len - rel);
            if n > 0 {
                out.push((rel, n, run.fill));
            }
            rel += n;
            self.used += n;
            if self.used >= run.len {
                self.index += 1;
                self.used = 0;
            }
        }
        out
    }
}

/// Appends an action, merging it into the previous one when they touch and agree.
fn push_action(out: &mut Vec<Action>, a: Action) {
    match out.last_mut() {
        Some(last) if last.zero == a.zero && last.rel + last.len == a.rel => last.len += a.len,
        _ => out.push(a),
    }
}

/// Decides the writes of a unit whose Data pieces are in `buf`.
fn actions(buf: &[u8], pieces: &[Piece], policy: ZeroPolicy) -> Vec<Action> {
    let mut out = Vec::new();
    for &(rel, len, fill) in pieces {
        match (fill, policy) {
            (Fill::Skip, _) | (Fill::Zero, ZeroPolicy::Skip) => {}
            (Fill::Zero, ZeroPolicy::Shadow) => push_action(&mut out, Action { rel, len, zero: true }),
            (Fill::Data, ZeroPolicy::Shadow) => {
                let zero = is_zero(&buf[rel as usize..(rel + len) as usize]);
                push_action(&mut out, Action { rel, len, zero });
            }
            (Fill::Data, ZeroPolicy::Skip) => {
                let mut pos = rel;
                while pos < rel + len {
                    let n = (ZERO_GRANULE - pos % ZERO_GRANULE).min(rel + len - pos);
                    if !is_zero(&buf[pos as usize..(pos + n) as usize]) {
                        push_action(&mut out, Action { rel: pos, len: n, zero: false });
                    }
                    pos += n;
                }
            }
        }
    }
    out
}

/// Runs `job` into `dst` in units of `unit` bytes: a reader thread feeds this thread.
pub(crate) fn run(job: &Job<'_>, dst: &dyn BlockDevice, unit: u64, progress: &dyn Progress) -> Result<CopyStats> {
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Unit>(QUEUE_DEPTH);
        let (free_tx, free_rx) = channel::<Vec<u8>>();
        let reader = std::thread::Builder::new()
            .name("ferry-copy-read".into())
            .spawn_scoped(s, move || read_units(job, unit, &tx, &free_rx))
            .map_err(|e| Error::io("spawn the reader thread", e))?;
        let written = write_units(rx, free_tx, dst, progress);
        let read = reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let stats = written?;
        read?;
        Ok(stats)
    })
}

/// The reader: plans each window, reads the Data pieces of each unit, sends units in order.
/// Returns early (Ok) when the writer has gone away; the writer reports its own error.
fn read_units(job: &Job<'_>, unit: u64, tx: &SyncSender<Unit>, free: &Receiver<Vec<u8>>) -> Result<()> {
    let window = (WINDOW_BYTES / unit).max(1) * unit;
    let mut allocated = 0usize;
    let mut pos = 0u64;
    while pos < job.len {
        let wlen = window.min(job.len - pos);
        let runs = (job.plan)(pos, wlen)?;
        let mut cursor = RunCursor { runs: &runs, index: 0, used: 0 };
        let mut offset = pos;
        while offset < pos + wlen {
            let len = unit.min(pos + wlen - offset);
            let pieces = cursor.take(len);
            let mut u = Unit { offset, len, bytes_read: 0, buf: None, actions: Vec::new() };
            if pieces.iter().any(|p| p.2 != Fill::Skip) {
                let Some(mut buf) = next_buffer(free, &mut allocated, unit) else { return Ok(()) };
                for &(rel, n, fill) in &pieces {
                    if fill == Fill::Data {
                        job.src.read_at(&mut buf[rel as usize..(rel + n) as usize], offset + rel)?;
                        u.bytes_read += n;
                    }
                }
                u.actions = actions(&buf, &pieces, job.policy);
                u.buf = Some(buf);
            }
            if tx.send(u).is_err() {
                return Ok(());
            }
            offset += len;
        }
        pos += wlen;
    }
    Ok(())
}

/// A free buffer: a returned one, a new one while fewer than [`BUFFERS`] exist, else the next
/// one returned. `None` when the writer has gone away.
fn next_buffer(free: &Receiver<Vec<u8>>, allocated: &mut usize, unit: u64) -> Option<Vec<u8>> {
    match free.try_recv() {
        Ok(b) => return Some(b),
        Err(TryRecvError::Disconnected) => return None,
        Err(TryRecvError::Empty) => {}
    }
    if *allocated < BUFFERS {
        *allocated += 1;
        let len = usize::try_from(unit).expect("unit is at most UNIT_BYTES_MAX");
        return Some(vec![0u8; len]);
    }
    free.recv().ok()
}

/// The writer: applies each unit's actions in order and returns its buffer to the pool.
fn write_units(rx: Receiver<Unit>, free: Sender<Vec<u8>>, dst: &dyn BlockDevice, progress: &dyn Progress) -> Result<CopyStats> {
    let mut stats = CopyStats::default();
    for u in rx {
        let mut wrote = false;
        for a in &u.actions {
            let at = u.offset + a.rel;
            if a.zero {
                dst.write_zeroes(at, a.len)?;
            } else {
                let buf = u.buf.as_deref().expect("a unit with data writes carries its buffer");
                dst.write_at(&buf[a.rel as usize..(a.rel + a.len) as usize], at)?;
                stats.bytes_written += a.len;
                wrote = true;
            }
        }
        stats.bytes_read += u.bytes_read;
        if wrote {
            stats.blocks_written += 1;
        } else {
            stats.blocks_skipped += 1;
        }
        progress.advance(u.len);
        if let Some(b) = u.buf {
            // The reader may have finished already; a dropped buffer is then simply freed.
            let _ = free.send(b);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_zero_finds_one_byte_past_the_last_whole_word() {
        // 1000 bytes = 3 strides of 256 plus a 232-byte remainder; the set byte is in it.
        let mut b = vec![0u8; 1000];
        assert!(is_zero(&b));
        b[999] = 1;
        assert!(!is_zero(&b));
    }

    #[test]
    fn skip_policy_writes_only_non_zero_granules() {
        // Three granules of data; the middle one is zero and is not written.
        let g = ZERO_GRANULE as usize;
        let mut buf = vec![0u8; 3 * g];
        buf[0] = 1;
        buf[2 * g] = 1;
        let a = actions(&buf, &[(0, 3 * ZERO_GRANULE, Fill::Data)], ZeroPolicy::Skip);
        let want = vec![
            Action { rel: 0, len: ZERO_GRANULE, zero: false },
            Action { rel: 2 * ZERO_GRANULE, len: ZERO_GRANULE, zero: false },
        ];
        assert_eq!(a, want);
    }

    #[test]
    fn shadow_policy_turns_zero_data_into_zeroing_and_merges_it() {
        // A zero Data run followed by a Zero run becomes one zeroing of both.
        let buf = vec![0u8; 8192];
        let pieces = [(0, 4096, Fill::Data), (4096, 4096, Fill::Zero)];
        let a = actions(&buf, &pieces, ZeroPolicy::Shadow);
        assert_eq!(a, vec![Action { rel: 0, len: 8192, zero: true }]);
    }

    #[test]
    fn run_cursor_splits_runs_at_unit_edges() {
        // Runs 3 + 5 bytes taken as 4 + 4.
        let runs = [PlanRun { len: 3, fill: Fill::Data }, PlanRun { len: 5, fill: Fill::Skip }];
        let mut c = RunCursor { runs: &runs, index: 0, used: 0 };
        assert_eq!(c.take(4), vec![(0, 3, Fill::Data), (3, 1, Fill::Skip)]);
        assert_eq!(c.take(4), vec![(0, 4, Fill::Skip)]);
    }
}
