//! Random 4 KiB read and write IOPS through the library on a 3-version chain (base + 2
//! versions, the top opened writable), against `fio` with `psync` on a plain file in the same
//! directory as the physical limit of the same run.
//!
//! Each worker thread is one synchronous queue: `read_at`/`write_at` of 4 KiB at a uniformly
//! random 4 KiB-aligned offset of the whole virtual disk, as `fio --ioengine=psync` does with
//! one job per thread. Neither side fsyncs inside the timed window (`--direct=0` without
//! `--end_fsync`); Ferry's closing commit is timed and reported on its own.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use disk::BlockDevice;
use disk::open::{OpenOptions, open};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::report::{IopsRow, IopsTable};
use crate::sys::IoCounters;
use crate::{Config, data, note};

/// The I/O size of every random operation.
pub const IO_BYTES: u64 = 4096;
/// The share of the disk the second version rewrites.
pub const SECOND_DELTA_FRACTION: f64 = 0.05;

/// Which direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rw {
    Read,
    Write,
}

impl Rw {
    fn fio_name(self) -> &'static str {
        match self {
            Rw::Read => "randread",
            Rw::Write => "randwrite",
        }
    }
}

/// The page-cache state a run starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// Dropped: the run reads from disk as the kernel decides.
    Cold,
    /// Every file of the run read once beforehand: the run measures the CPU path.
    Warm,
}

impl Cache {
    fn name(self) -> &'static str {
        match self {
            Cache::Cold => "cold cache",
            Cache::Warm => "warm cache",
        }
    }
}

/// Runs both directions, cold and warm, on the chain whose top is `top` (base ← v1 ← top).
///
/// # Errors
/// Library or fio failures.
pub fn iops_bench(cfg: &Config, top: &Path) -> Result<IopsTable> {
    let fio_file = cfg.dir.join("fio.dat");
    let mib = cfg.fio_size_bytes >> 20;
    note(&format!("iops: writing the {mib} MiB fio file (untimed)"));
    data::random_file(&fio_file, cfg.fio_size_bytes, cfg.seed ^ 0xf10)?;
    let mut rows = Vec::new();
    // Writes are measured cold only: a 4 KiB write needs no cached data, and pre-reading
    // the files makes the kernel cache them in large folios, so every 4 KiB write then
    // dirties a whole folio and the writers are throttled for the kernel's sake, not ours.
    let runs = [
        (Rw::Read, Cache::Cold),
        (Rw::Read, Cache::Warm),
        (Rw::Write, Cache::Cold),
    ];
    for (rw, cache) in runs {
        rows.push(iops_pair(cfg, top, &fio_file, rw, cache)?);
    }
    std::fs::remove_file(&fio_file)?;
    Ok(IopsTable {
        rows,
        threads: cfg.threads,
        seconds: cfg.iops_seconds,
    })
}

/// fio, then Ferry, for one direction and cache state.
fn iops_pair(cfg: &Config, top: &Path, fio_file: &Path, rw: Rw, cache: Cache) -> Result<IopsRow> {
    let label = format!("{} 4 KiB, {}", rw.fio_name(), cache.name());
    prepare_cache(cfg, &[fio_file.to_path_buf()], cache)?;
    cfg.loads.sample();
    note(&format!("iops: fio {label}, {} s", cfg.iops_seconds));
    let before = IoCounters::now();
    let fio = fio_iops(cfg, fio_file, rw, cache)?;
    let fio_io = IoCounters::now().since(before);
    note(&format!(
        "    {fio:.0} IOPS, {:.1} MB read from disk",
        mb(fio_io.read_bytes)
    ));
    let (ferry, ferry_io, close_secs) = ferry_iops(cfg, top, rw, cache)?;
    note(&format!(
        "    {ferry:.0} IOPS, {:.1} MB read from disk, closing commit {close_secs:.2} s",
        mb(ferry_io.read_bytes)
    ));
    let shown = fio_args(cfg, Path::new("FILE"), rw, cache);
    Ok(IopsRow {
        workload: label,
        ferry_iops: ferry,
        fio_iops: fio,
        close_secs,
        ferry_disk_read_bytes: ferry_io.read_bytes,
        fio_disk_read_bytes: fio_io.read_bytes,
        fio_command: format!("fio {}", shown[..shown.len() - 2].join(" ")),
    })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Drops the page cache, then for [`Cache::Warm`] reads `files` once so they are cached.
fn prepare_cache(cfg: &Config, files: &[PathBuf], cache: Cache) -> Result<()> {
    cfg.cache.drop_now();
    if cache == Cache::Warm {
        for f in files {
            let mut file = File::open(f).with_context(|| format!("open {}", f.display()))?;
            std::io::copy(&mut file, &mut std::io::sink())
                .with_context(|| format!("read {}", f.display()))?;
        }
    }
    Ok(())
}

/// Opens the chain writable, prepares the cache, runs the workers, then closes (commit timed
/// apart). Returns (IOPS, storage I/O of the timed window, closing seconds).
fn ferry_iops(cfg: &Config, top: &Path, rw: Rw, cache: Cache) -> Result<(f64, IoCounters, f64)> {
    let chain = open(
        top,
        OpenOptions {
            writable: true,
            format: None,
        },
    )?;
    let dev = chain.top();
    let files: Vec<PathBuf> = chain.layers.iter().map(|l| l.path.clone()).collect();
    prepare_cache(cfg, &files, cache)?;
    cfg.loads.sample();
    let threads = cfg.threads;
    note(&format!(
        "iops: ferry {}, {} s, {threads} threads",
        rw.fio_name(),
        cfg.iops_seconds
    ));
    let duration = Duration::from_secs(cfg.iops_seconds);
    let before = IoCounters::now();
    let start = Instant::now();
    let ops: Result<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let dev = Arc::clone(&dev);
                let seed = cfg.seed ^ (0x10_0000 + t as u64);
                s.spawn(move || worker(dev.as_ref(), rw, duration, seed))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow!("worker panicked"))?)
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let io = IoCounters::now().since(before);
    let total: u64 = ops?.iter().sum();
    let close_start = Instant::now();
    chain.close().context("close the chain's top")?;
    Ok((total as f64 / secs, io, close_start.elapsed().as_secs_f64()))
}

/// One synchronous queue: random 4 KiB operations until `duration` has passed.
fn worker(dev: &dyn BlockDevice, rw: Rw, duration: Duration, seed: u64) -> Result<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut buf = vec![0u8; IO_BYTES as usize];
    rng.fill_bytes(&mut buf);
    let slots = dev.size() / IO_BYTES;
    let deadline = Instant::now() + duration;
    let mut ops = 0u64;
    while Instant::now() < deadline {
        let offset = rng.gen_range(0..slots) * IO_BYTES;
        match rw {
            Rw::Read => dev.read_at(&mut buf, offset)?,
            Rw::Write => dev.write_at(&buf, offset)?,
        }
        ops += 1;
    }
    Ok(ops)
}

/// `fio --ioengine=psync --bs=4k --direct=0` on a plain file, one job per worker thread.
fn fio_iops(cfg: &Config, file: &Path, rw: Rw, cache: Cache) -> Result<f64> {
    let args = fio_args(cfg, file, rw, cache);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::sys::run("fio", &args)?;
    let json_at = out
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no json: {out}"))?;
    let v: serde_json::Value = serde_json::from_str(&out[json_at..]).context("parse fio json")?;
    let key = match rw {
        Rw::Read => "read",
        Rw::Write => "write",
    };
    v["jobs"][0][key]["iops"]
        .as_f64()
        .ok_or_else(|| anyhow!("no {key}.iops in fio's json"))
}

/// fio's arguments; the last two (name and output format) are not shown in the report. A warm
/// run keeps the cache fio would otherwise invalidate at start (`--invalidate=1` by default).
fn fio_args(cfg: &Config, file: &Path, rw: Rw, cache: Cache) -> Vec<String> {
    let mut args = vec![
        "--ioengine=psync".into(),
        format!("--rw={}", rw.fio_name()),
        "--bs=4k".into(),
        "--direct=0".into(),
        format!("--size={}M", cfg.fio_size_bytes >> 20),
        format!("--runtime={}", cfg.iops_seconds),
        "--time_based".into(),
        format!("--numjobs={}", cfg.threads),
        "--group_reporting".into(),
        format!("--filename={}", file.display()),
    ];
    if cache == Cache::Warm {
        args.push("--invalidate=0".into());
    }
    args.push(format!("--name=ferry-bench-{}", rw.fio_name()));
    args.push("--output-format=json".into());
    args
}
