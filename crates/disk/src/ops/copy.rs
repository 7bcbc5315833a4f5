//! The copy pipeline that `convert`, `capture`, `merge` and `compact` share: plans from
//! allocation maps, a reader thread feeding the writer through bounded buffers, and the new
//! output files (`Sink`, `Outputs`).
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
//!   (`Fill::Data`), must read as zeros in its own right (`Fill::Zero`: a differencing output
//!   shadows its parent with it), or is left alone (`Fill::Skip`: unallocated, or falling
//!   through to the output's parent). Plans come from allocation maps
//!   ([`crate::device::extents`], `map_layer`), so holes and zero blocks are never read.
//! * Data that reads as zeros is dropped under `ZeroPolicy::Skip` (standalone outputs, where
//!   unwritten ranges read as zeros) and written as zeros under `ZeroPolicy::Shadow`
//!   (differencing outputs, where an unwritten range would read from the parent).
//! * A unit of non-zero data is written with one `write_at`, so a VHDX block is allocated
//!   FULLY_PRESENT with one `set_len`, and the BAT goes through the log once, at `close`. Zero
//!   gaps of [`ZERO_GRANULE`] inside a standalone output's unit stay unwritten, so outputs stay
//!   sparse on the host filesystem too.
//! * Memory is bounded by `BUFFERS` units; buffers are reused.
//! * Every `WRITEBACK_BYTES` the writer asks the kernel to start writing the output back
//!   (`start_writeback`), so the disk works while the copy goes on instead of all at the
//!   final fsync; on this machine that made a 1 GiB convert about twice as fast.
//! * Why two threads: with one, reads and writes alternate and each device idles half of the
//!   time. Why not more: on two cores the copy is bound by memory bandwidth and the disk, and a
//!   deeper queue only holds more RAM.
//! * Outputs are written in place and removed if the operation fails (`Outputs`); an existing
//!   file is never overwritten, so an input cannot be clobbered by a colliding output name.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};

use ::vhdx::Guid;

use super::{CopyStats, Progress};
use crate::bytes::is_zero;
use crate::device::{self, BlockDevice, ExtentKind, Source};
use crate::open::Format;
use crate::raw::RawDisk;
use crate::vhd::{VHD_BLOCK_SIZE, VhdWriter};
use crate::vhdx::{self, CreateOptions, VhdxImage};
use crate::{Error, FileStorage, Result, Storage};

/// The largest unit copied with one read and one write (bounds RAM with `BUFFERS`).
pub const UNIT_BYTES_MAX: u64 = 64 << 20;
/// The unit of raw output (raw files have no blocks).
pub const RAW_UNIT_BYTES: u64 = 8 << 20;
/// Units in flight between the reader and the writer.
const QUEUE_DEPTH: usize = 2;
/// Buffers in the pool: the queue, plus one being read and one being written.
const BUFFERS: usize = QUEUE_DEPTH + 2;
/// Bytes of virtual disk whose allocation map is fetched at once.
const WINDOW_BYTES: u64 = 1 << 30;
/// Data bytes written between two `start_writeback` hints.
const WRITEBACK_BYTES: u64 = 32 << 20;
/// Zero runs at least this long inside a standalone output's unit are not written.
pub const ZERO_GRANULE: u64 = 64 << 10;

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
pub(crate) struct Sink {
    /// The image.
    pub image: SinkImage,
    /// The output file, to start its writeback early (see `start_writeback`).
    pub file: File,
}

/// The image of a [`Sink`].
#[derive(Debug)]
pub(crate) enum SinkImage {
    /// A VHDX image opened for writing.
    Vhdx(Box<VhdxImage>),
    /// A dynamic VHD being written.
    Vhd(VhdWriter),
    /// A sparse raw file.
    Raw(RawDisk),
}

impl Sink {
    /// Creates `path` (which must not exist), registers it in `outputs`, and opens it.
    ///
    /// # Errors
    /// `Io` (also when the file exists); `InvalidArgument` for a geometry the format cannot
    /// hold.
    pub fn create(
        path: &Path,
        format: Format,
        opts: &CreateOptions,
        outputs: &mut Outputs,
    ) -> Result<Sink> {
        if format == Format::Vhd {
            VhdWriter::check_size(opts.size)?;
        }
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        outputs.add(path);
        let side = file
            .try_clone()
            .map_err(|e| Error::io(format!("dup {}", path.display()), e))?;
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(file));
        let ctx = |e: Error| e.context(path.display());
        if format == Format::Raw {
            storage.set_len(opts.size).map_err(ctx)?;
            if opts.fixed {
                storage.allocate(0, opts.size).map_err(ctx)?;
            }
            return Ok(Sink {
                image: SinkImage::Raw(RawDisk::open(storage, true)?),
                file: side,
            });
        }
        if format == Format::Vhd {
            return Ok(Sink {
                image: SinkImage::Vhd(VhdWriter::new(storage, opts.size)),
                file: side,
            });
        }
        vhdx::create(&storage, opts).map_err(ctx)?;
        let o = vhdx::OpenOptions {
            writable: true,
            path: Some(path.to_path_buf()),
        };
        let image = SinkImage::Vhdx(Box::new(VhdxImage::open(storage, o).map_err(ctx)?));
        Ok(Sink { image, file: side })
    }

    /// The output as a block device.
    pub fn device(&self) -> &dyn BlockDevice {
        match &self.image {
            SinkImage::Vhdx(i) => i.as_ref(),
            SinkImage::Vhd(v) => v,
            SinkImage::Raw(r) => r,
        }
    }

    /// Commits and makes everything durable (VHDX `close`, raw `fsync`).
    ///
    /// # Errors
    /// I/O failures.
    pub fn finish(&self) -> Result<()> {
        match &self.image {
            SinkImage::Vhdx(i) => i.close(),
            SinkImage::Vhd(v) => v.finish(),
            SinkImage::Raw(r) => r.flush(),
        }
    }

    /// The identity children link to (VHDX DataWriteGuid).
    pub fn linkage(&self) -> Option<Guid> {
        self.device().linkage_id()
    }
}

/// The geometry of a VHDX copy of `dev`: its size (rounded up to a whole logical sector), its
/// sector sizes, and `block_size` or its own block size clamped to what VHDX allows.
pub(crate) fn create_options(dev: &dyn BlockDevice, block_size: Option<u32>) -> CreateOptions {
    let g = dev.geometry();
    let block_size = block_size.unwrap_or(
        if dev.format() == "raw" || !g.block_size.is_power_of_two() {
            // A raw file has no block size of its own (RawDisk reports a nominal 1 MiB).
            CreateOptions::default().block_size
        } else {
            g.block_size
                .clamp(::vhdx::MIN_BLOCK_SIZE, ::vhdx::MAX_BLOCK_SIZE)
        },
    );
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
/// logical sector); for raw output only `size` and `fixed` count, for VHD output only `size`
/// (a dynamic VHD with 2 MiB blocks). With `create.parent` set, the output is differencing
/// and every range that `src` does not hold as data is written as zeros, so the output chain
/// reads exactly like `src`. `dst` is removed on error.
///
/// # Errors
/// `InvalidArgument` for a geometry the format cannot hold; `Io` (also when `dst` exists);
/// read errors of `src`.
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
    let policy = if shadow {
        ZeroPolicy::Shadow
    } else {
        ZeroPolicy::Skip
    };
    let job = Job {
        src,
        plan: &plan,
        policy,
        len: src.size().min(create.size),
    };
    let mut outputs = Outputs::default();
    let (stats, _) = copy_to_new(&job, dst, format, &create, &mut outputs, progress)?;
    outputs.keep();
    Ok(stats)
}

/// The plan of a whole-content copy: data where the chain has data; elsewhere zeros when the
/// output shadows a parent, nothing otherwise.
pub(crate) fn resolved_plan(
    src: &dyn BlockDevice,
    offset: u64,
    len: u64,
    shadow: bool,
) -> Result<Vec<PlanRun>> {
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
pub(crate) fn layer_plan(
    layer: &dyn BlockDevice,
    offset: u64,
    len: u64,
    shadow: bool,
) -> Result<Vec<PlanRun>> {
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
        Format::Vhd => RAW_UNIT_BYTES.max(u64::from(VHD_BLOCK_SIZE)),
        Format::Vhdx => u64::from(create.block_size).min(UNIT_BYTES_MAX),
    };
    let mut stats = run(job, sink.device(), Some(&sink.file), unit, progress)?;
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
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// An absolute path (canonical when it exists).
pub(crate) fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
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
            (Fill::Zero, ZeroPolicy::Shadow) => push_action(
                &mut out,
                Action {
                    rel,
                    len,
                    zero: true,
                },
            ),
            (Fill::Data, ZeroPolicy::Shadow) => {
                let zero = is_zero(&buf[rel as usize..(rel + len) as usize]);
                push_action(&mut out, Action { rel, len, zero });
            }
            (Fill::Data, ZeroPolicy::Skip) => {
                let mut pos = rel;
                while pos < rel + len {
                    let n = (ZERO_GRANULE - pos % ZERO_GRANULE).min(rel + len - pos);
                    if !is_zero(&buf[pos as usize..(pos + n) as usize]) {
                        push_action(
                            &mut out,
                            Action {
                                rel: pos,
                                len: n,
                                zero: false,
                            },
                        );
                    }
                    pos += n;
                }
            }
        }
    }
    out
}

/// Runs `job` into `dst` in units of `unit` bytes: a reader thread feeds this thread.
pub(crate) fn run(
    job: &Job<'_>,
    dst: &dyn BlockDevice,
    writeback: Option<&File>,
    unit: u64,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Unit>(QUEUE_DEPTH);
        let (free_tx, free_rx) = channel::<Vec<u8>>();
        let reader = std::thread::Builder::new()
            .name("ferry-copy-read".into())
            .spawn_scoped(s, move || read_units(job, unit, &tx, &free_rx))
            .map_err(|e| Error::io("spawn the reader thread", e))?;
        let written = write_units(rx, free_tx, dst, writeback, progress);
        let read = reader
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        let stats = written?;
        read?;
        Ok(stats)
    })
}

/// The reader: plans each window, reads the Data pieces of each unit, sends units in order.
/// Returns early (Ok) when the writer has gone away; the writer reports its own error.
fn read_units(
    job: &Job<'_>,
    unit: u64,
    tx: &SyncSender<Unit>,
    free: &Receiver<Vec<u8>>,
) -> Result<()> {
    let window = (WINDOW_BYTES / unit).max(1) * unit;
    let mut allocated = 0usize;
    let mut pos = 0u64;
    while pos < job.len {
        let wlen = window.min(job.len - pos);
        let runs = (job.plan)(pos, wlen)?;
        let mut cursor = RunCursor {
            runs: &runs,
            index: 0,
            used: 0,
        };
        let mut offset = pos;
        while offset < pos + wlen {
            let len = unit.min(pos + wlen - offset);
            let pieces = cursor.take(len);
            let mut u = Unit {
                offset,
                len,
                bytes_read: 0,
                buf: None,
                actions: Vec::new(),
            };
            if pieces.iter().any(|p| p.2 != Fill::Skip) {
                let Some(mut buf) = next_buffer(free, &mut allocated, unit) else {
                    return Ok(());
                };
                for &(rel, n, fill) in &pieces {
                    if fill == Fill::Data {
                        job.src
                            .read_at(&mut buf[rel as usize..(rel + n) as usize], offset + rel)?;
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

/// A free buffer: a returned one, a new one while fewer than `BUFFERS` exist, else the next
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
fn write_units(
    rx: Receiver<Unit>,
    free: Sender<Vec<u8>>,
    dst: &dyn BlockDevice,
    writeback: Option<&File>,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    let mut stats = CopyStats::default();
    let mut unsynced = 0u64;
    for u in rx {
        let mut wrote = false;
        for a in &u.actions {
            let at = u.offset + a.rel;
            if a.zero {
                dst.write_zeroes(at, a.len)?;
            } else {
                let buf = u
                    .buf
                    .as_deref()
                    .expect("a unit with data writes carries its buffer");
                dst.write_at(&buf[a.rel as usize..(a.rel + a.len) as usize], at)?;
                stats.bytes_written += a.len;
                wrote = true;
            }
        }
        stats.bytes_read += u.bytes_read;
        unsynced += u
            .actions
            .iter()
            .filter(|a| !a.zero)
            .map(|a| a.len)
            .sum::<u64>();
        if let Some(f) = writeback.filter(|_| unsynced >= WRITEBACK_BYTES) {
            start_writeback(f);
            unsynced = 0;
        }
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

/// Starts writing the file's dirty pages back and drops its clean ones (`POSIX_FADV_DONTNEED`
/// does both on Linux), so the disk works while the copy goes on and the final fsync has
/// little left to do; it also keeps a large copy from filling the page cache.
fn start_writeback(file: &File) {
    // Only a hint: a filesystem that refuses it costs nothing but speed.
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_policy_writes_only_non_zero_granules() {
        // Three granules of data; the middle one is zero and is not written.
        let g = ZERO_GRANULE as usize;
        let mut buf = vec![0u8; 3 * g];
        buf[0] = 1;
        buf[2 * g] = 1;
        let a = actions(&buf, &[(0, 3 * ZERO_GRANULE, Fill::Data)], ZeroPolicy::Skip);
        let want = vec![
            Action {
                rel: 0,
                len: ZERO_GRANULE,
                zero: false,
            },
            Action {
                rel: 2 * ZERO_GRANULE,
                len: ZERO_GRANULE,
                zero: false,
            },
        ];
        assert_eq!(a, want);
    }

    #[test]
    fn shadow_policy_turns_zero_data_into_zeroing_and_merges_it() {
        // A zero Data run followed by a Zero run becomes one zeroing of both.
        let buf = vec![0u8; 8192];
        let pieces = [(0, 4096, Fill::Data), (4096, 4096, Fill::Zero)];
        let a = actions(&buf, &pieces, ZeroPolicy::Shadow);
        assert_eq!(
            a,
            vec![Action {
                rel: 0,
                len: 8192,
                zero: true
            }]
        );
    }

    #[test]
    fn run_cursor_splits_runs_at_unit_edges() {
        // Runs 3 + 5 bytes taken as 4 + 4.
        let runs = [
            PlanRun {
                len: 3,
                fill: Fill::Data,
            },
            PlanRun {
                len: 5,
                fill: Fill::Skip,
            },
        ];
        let mut c = RunCursor {
            runs: &runs,
            index: 0,
            used: 0,
        };
        assert_eq!(c.take(4), vec![(0, 3, Fill::Data), (3, 1, Fill::Skip)]);
        assert_eq!(c.take(4), vec![(0, 4, Fill::Skip)]);
    }
}
