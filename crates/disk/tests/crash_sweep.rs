//! Crash consistency of `VhdxImage` on `testkit::SimDisk`.
//!
//! **Sweeps.** A seeded random workload (writes of partial sectors, partial blocks, whole and
//! new blocks and across block boundaries; trims; write-zeroes; flushes; closes, after which the
//! next write starts a new session with a header update) runs once to count its storage ops,
//! then again with the power cut before every storage op N in turn. Each cut becomes several
//! crash images: random survivors with the last write torn; a chosen number of sectors of the
//! last write kept; every unflushed sector independently (every third cut); the in-flight
//! header write garbled inside its first sector (a tear SimDisk cannot make); and, for about a
//! third of the cuts, a second crash while the writable open replays the log. Each crash image
//! must:
//!
//! * open read-only (the log replayed in memory) and writable (replayed into the file), and
//!   read the same through both;
//! * read, in every 512-byte piece, the content as of the last flush that completed before the
//!   cut, or the content after one of the ops issued since (a write that was in flight may
//!   have reached any subset of its sectors); trimmed bytes are unspecified;
//! * have an allocation map (`disk::device::extents`) that never calls non-zero bytes Hole or
//!   Zero;
//! * take a new write after recovery, close, and read back exactly what it read before plus
//!   that write; the closed bytes (sampled) must get a clean `disk::ops::check` report and pass
//!   `qemu-img check` (dynamic variant only: qemu cannot open differencing VHDX).
//!
//! Variants: a dynamic disk, and a differencing child over a read-only parent that holds data;
//! the logical sector is 512 or 4096 bytes (chosen by the seed, except for the qemu-checked
//! dynamic variant, which qemu only supports with 512).
//!
//! `SIM_SEED=n` replays a run (the seed is printed to stderr, which the harness shows on
//! failure); by default every run draws a new seed.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use disk::device::{ExtentKind, extents};
use disk::ops::check::{CheckOptions, check};
use disk::vhdx::VhdxImage;
use disk::{BlockDevice, Storage};
use rand::Rng;
use testkit::{CrashModel, SimDisk, SimRng, seed_from_env};

/// Ops of one workload (plus a final close).
const WORKLOAD_OPS: usize = 44;
/// About this many crash images per variant are written to a file after recovery for
/// `disk::ops::check` and `qemu-img check`.
const FILE_CHECKS: usize = 24;

// ---------------------------------------------------------------------------------------------
// Workload and model.

fn random_range(rng: &mut SimRng, size: u64, sector: u64) -> (u64, u64) {
    let blocks = size.div_ceil(BLOCK);
    let (off, len) = match rng.gen_range(0..6) {
        // Sub-sector and cross-sector, at any byte.
        0 => (rng.gen_range(0..size), rng.gen_range(1..=700)),
        // Sector-aligned, part of a block.
        1 => (
            rng.gen_range(0..size / sector) * sector,
            sector * rng.gen_range(1..=64),
        ),
        // A whole block.
        2 => (rng.gen_range(0..blocks) * BLOCK, BLOCK),
        // Across a block boundary, at any byte.
        3 => {
            let b = rng.gen_range(1..blocks) * BLOCK;
            (
                b - rng.gen_range(1..=3 * sector),
                rng.gen_range(1..=6 * sector),
            )
        }
        // Up to one and a half blocks anywhere.
        4 => (rng.gen_range(0..size), rng.gen_range(1..=BLOCK + BLOCK / 2)),
        // A few sectors at a random sector of a random block.
        _ => (
            rng.gen_range(0..size / sector) * sector,
            rng.gen_range(1..=4 * sector),
        ),
    };
    let off = off.min(size - 1);
    (off, len.min(size - off))
}

fn workload(rng: &mut SimRng, size: u64, sector: u64) -> Vec<Step> {
    let mut steps: Vec<Step> = (0..WORKLOAD_OPS)
        .map(|_| {
            let (off, len) = random_range(rng, size, sector);
            match rng.gen_range(0..100) {
                0..50 => Step::Write {
                    off,
                    len,
                    seed: rng.gen_range(1..=255),
                },
                50..58 => Step::Trim { off, len },
                58..68 => Step::Zero { off, len },
                68..92 => Step::Flush,
                _ => Step::Close,
            }
        })
        .collect();
    steps.push(Step::Close);
    steps
}

/// A run of the workload: the disk, and for each executed step the storage op numbers it
/// spanned, `[first, end)`.
struct Run {
    disk: Arc<SimDisk>,
    spans: Vec<(u64, u64)>,
}

fn run(fx: &Fixture, steps: &[Step], crash_at: Option<u64>) -> Run {
    let disk = fx.fresh_disk();
    if let Some(n) = crash_at {
        disk.set_crash_at(n);
    }
    let img = fx
        .open(&disk, true)
        .unwrap_or_else(|e| fx.fail(&format!("open: {e:?}")));
    let mut spans = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let a = disk.op_count();
        s.exec(&img)
            .unwrap_or_else(|e| fx.fail(&format!("step {i} {s:?}: {e:?}")));
        let b = disk.op_count();
        spans.push((a, b));
        if crash_at.is_some_and(|n| b >= n) {
            break;
        }
    }
    // Dropping closes the image; past the power cut those writes change nothing durable.
    drop(img);
    Run { disk, spans }
}

// ---------------------------------------------------------------------------------------------
// Checking one crash image.

/// Counters for the report.
#[derive(Debug, Default)]
struct Stats {
    cuts: usize,
    images: usize,
    replayed_in_memory: usize,
    unflushed_steps_seen: usize,
    file_checks: usize,
    /// Images whose in-flight header write was garbled inside its first sector.
    garbled_headers: usize,
    /// Images crashed a second time while the writable open replayed their log.
    recoveries_crashed: usize,
}

fn expectation(fx: &Fixture, steps: &[Step], spans: &[(u64, u64)], cut: u64) -> Expect {
    let last_flush = (0..spans.len())
        .rev()
        .find(|&i| steps[i].is_flush() && spans[i].1 <= cut);
    let first_unflushed = last_flush.map_or(0, |i| i + 1);
    let mut flushed = Content::new(fx.initial.clone());
    for s in &steps[..first_unflushed] {
        flushed.apply(s);
    }
    // Steps issued after the cut never run (the run stops at the step that reached it).
    let unflushed = steps[first_unflushed..spans.len()].to_vec();
    Expect { flushed, unflushed }
}

/// Hole and Zero extents must read as zeros.
fn check_extents(img: &VhdxImage, actual: &[u8]) -> Result<(), String> {
    let map = extents(img, 0, actual.len() as u64).map_err(|e| format!("extents: {e:?}"))?;
    for x in map
        .iter()
        .filter(|x| matches!(x.kind, ExtentKind::Hole | ExtentKind::Zero))
    {
        let r = x.offset as usize..(x.offset + x.len) as usize;
        if let Some(i) = actual[r.clone()].iter().position(|&b| b != 0) {
            return Err(format!("extent {x:?} reads non-zero at {:#x}", r.start + i));
        }
    }
    Ok(())
}

/// Opens a crash image read-only and writable, checks it, writes to it after recovery, closes
/// it and checks the closed bytes.
fn check_crash_image(
    fx: &Fixture,
    crashed: SimDisk,
    expect: &Expect,
    rng: &mut SimRng,
    stats: &mut Stats,
    file_checks: bool,
) -> Result<(), String> {
    let crashed = Arc::new(crashed);
    let copy = Arc::new(crashed.crash_with(rng, CrashModel::LoseUnflushed));
    let ro = fx
        .open(&copy, false)
        .map_err(|e| format!("read-only open failed: {e:?}"))?;
    stats.replayed_in_memory += usize::from(!ro.warnings().is_empty());
    let seen_ro = read_all(&ro).map_err(|e| format!("read-only read: {e:?}"))?;
    drop(ro);
    let rw = fx
        .open(&crashed, true)
        .map_err(|e| format!("writable open failed: {e:?}"))?;
    let seen = read_all(&rw).map_err(|e| format!("read: {e:?}"))?;
    if seen != seen_ro {
        let i = seen
            .iter()
            .zip(&seen_ro)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!("writable and read-only opens differ at {i:#x}"));
    }
    check_content(expect, &seen)?;
    check_extents(&rw, &seen)?;
    check_bat(&rw)?;
    // The recovered image must take new writes (allocation must not reuse live space).
    let (off, len) = random_range(rng, fx.size, fx.sector);
    let data = pattern(off, len as usize, 0xEE);
    rw.write_at(&data, off)
        .map_err(|e| format!("write after recovery: {e:?}"))?;
    rw.close()
        .map_err(|e| format!("close after recovery: {e:?}"))?;
    drop(rw);
    let mut want = seen;
    want[off as usize..(off + len) as usize].copy_from_slice(&data);
    let again = fx
        .open(&crashed, false)
        .map_err(|e| format!("reopen after close: {e:?}"))?;
    if !again.warnings().is_empty() {
        return Err(format!(
            "closed image still needs a replay: {:?}",
            again.warnings()
        ));
    }
    let reread = read_all(&again).map_err(|e| format!("reread: {e:?}"))?;
    if reread != want {
        let i = reread
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "after recovery, write {off:#x}+{len:#x} and close, byte {i:#x} reads {:#04x}, \
             want {:#04x}",
            reread[i], want[i]
        ));
    }
    if file_checks {
        stats.file_checks += 1;
        check_file(fx, &crashed.live_bytes())?;
    }
    Ok(())
}

/// Writes the image out and requires a clean `disk::ops::check` report and, for the
/// qemu-checked variant, a passing `qemu-img check`.
fn check_file(fx: &Fixture, bytes: &[u8]) -> Result<(), String> {
    let name = if fx.parent.is_some() {
        "child.avhdx"
    } else {
        "image.vhdx"
    };
    let path = fx.files.path().join(name);
    std::fs::write(&path, bytes).map_err(|e| format!("write {}: {e}", path.display()))?;
    let report = check(&path, &CheckOptions::default()).map_err(|e| format!("check: {e:?}"))?;
    if !report.clean {
        return Err(format!("check reports errors:\n{}", report.render()));
    }
    if fx.qemu {
        qemu_check(&path)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// qemu-img.

/// True when `qemu-img` runs. Missing it skips those checks with a printed reason, except
/// under CI (`CI=true`), where it fails (STYLE.md §6 "Interop").
fn have_qemu_img() -> bool {
    let ok = Command::new("qemu-img")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "qemu-img is required under CI"
        );
        eprintln!("qemu-img not found: skipping qemu-img check of crash images");
    }
    ok
}

fn qemu_check(path: &Path) -> Result<(), String> {
    let out = Command::new("qemu-img")
        .args(["check", "-f", "vhdx"])
        .arg(path)
        .output()
        .map_err(|e| format!("run qemu-img: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "qemu-img check failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The sweep.

fn sweep(fx: &Fixture, rng: &mut SimRng) -> Stats {
    let steps = workload(rng, fx.size, fx.sector);
    let total = run(fx, &steps, None).spans.last().map_or(0, |s| s.1);
    let mut stats = Stats::default();
    let file_every = (total as usize * 2 / FILE_CHECKS).max(1);
    // Every cut point from before the first storage op to after the last one.
    for cut in 0..=total {
        let r = run(fx, &steps, Some(cut));
        let expect = expectation(fx, &steps, &r.spans, cut);
        stats.cuts += 1;
        stats.unflushed_steps_seen += expect.unflushed.len();
        let pending = r.disk.pending_count();
        let mut images = vec![
            ("random survivors, last write torn", r.disk.crash(rng)),
            (
                "last write torn at a chosen sector",
                r.disk.crash_torn(rng.gen_range(0..=8)),
            ),
        ];
        if cut % 3 == 0 {
            images.push((
                "every sector independent",
                r.disk.crash_with(rng, CrashModel::Sectors),
            ));
        }
        if let Some(image) = garbled_header(&r.disk) {
            stats.garbled_headers += 1;
            images.push(("in-flight header garbled inside its first sector", image));
        }
        if rng.gen_bool(0.3) {
            let first = r.disk.crash(rng);
            if let Some(image) = crash_during_recovery(fx, &first, rng) {
                stats.recoveries_crashed += 1;
                images.push((
                    "crashed again while the writable open replayed the log",
                    image,
                ));
            }
        }
        for (how, image) in images {
            stats.images += 1;
            let files = stats.images % file_every == 0;
            if let Err(e) = check_crash_image(fx, image, &expect, rng, &mut stats, files) {
                fx.fail(&format!(
                    "power cut before storage op {cut} of {total} ({pending} ops pending, \
                     {how}), during step {:?}: {e}\nsteps: {steps:?}",
                    r.spans.len().checked_sub(1).map(|i| (i, steps[i]))
                ));
            }
        }
    }
    eprintln!("{}, sector {}: {stats:?}", fx.name, fx.sector);
    assert!(
        stats.replayed_in_memory > 0,
        "no crash image needed a log replay: the sweep is too weak"
    );
    stats
}

/// When the last unflushed write is a header update, a crash image in which that header slot
/// holds the first 40 bytes of the new header over the old one: a tear inside a sector (which
/// SimDisk's 512-byte tearing cannot produce, because a header's fields all sit in its first
/// sector). Its checksum fails, so the open must use the other slot.
fn garbled_header(d: &SimDisk) -> Option<SimDisk> {
    let without = d.crash_torn(0);
    let with = d.crash_torn(usize::MAX);
    for slot in [0x1_0000u64, 0x2_0000] {
        let (mut old, mut new) = ([0u8; 4096], [0u8; 4096]);
        without.read_at(&mut old, slot).expect("read header");
        with.read_at(&mut new, slot).expect("read header");
        if old != new {
            old[..40].copy_from_slice(&new[..40]);
            if vhdx::header::Header::parse(&old).is_ok() {
                return None;
            }
            without.write_at(&old, slot).expect("write header");
            without.flush().expect("flush");
            return Some(without);
        }
    }
    None
}

/// Opens `crashed` writable with the power cut at a random storage op of that open (log
/// replay and header update), and returns what survives; `None` when the open writes nothing.
/// When the open fails, returns `crashed` itself, so the caller's checks report the failure.
fn crash_during_recovery(fx: &Fixture, crashed: &SimDisk, rng: &mut SimRng) -> Option<SimDisk> {
    let copy = |rng: &mut SimRng| Arc::new(crashed.crash_with(rng, CrashModel::LoseUnflushed));
    let probe = copy(rng);
    let Ok(img) = fx.open(&probe, true) else {
        return Some(crashed.crash_with(rng, CrashModel::LoseUnflushed));
    };
    // Dropping adds one flush; cut anywhere up to and including it.
    drop(img);
    let ops = probe.op_count();
    if ops <= 1 {
        return None;
    }
    let d = copy(rng);
    d.set_crash_at(rng.gen_range(0..ops));
    // Past the cut every storage op still succeeds, so this open does too.
    drop(fx.open(&d, true).ok()?);
    Some(d.crash(rng))
}

#[test]
fn crash_sweep_dynamic() {
    let seed = seed_from_env(default_seed());
    let mut rng = variant_rng(seed, 1);
    let fx = Fixture::new("dynamic", seed, false, 512, have_qemu_img());
    sweep(&fx, &mut rng);
}

#[test]
fn crash_sweep_differencing() {
    let seed = seed_from_env(default_seed());
    let mut rng = variant_rng(seed, 2);
    let sector = if rng.gen_bool(0.5) { 512 } else { 4096 };
    let fx = Fixture::new("differencing", seed, true, sector, false);
    sweep(&fx, &mut rng);
}
