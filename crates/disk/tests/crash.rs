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
//! **A commit bigger than one log entry** (about 600 dirty pages in a sparse 160 GiB child whose
//! chunks start without sector bitmap blocks, as Hyper-V makes them), cut at about sixty points:
//! every entry boundary must leave a valid BAT, and the image must take writes afterwards.
//!
//! **Fail-stop.** The Nth storage op of a flush or close fails with EIO: the call returns the
//! error, every later call on that image returns `Poisoned`, and the flushed data survives.
//!
//! `SIM_SEED=n` replays a run (the seed is printed to stderr, which the harness shows on
//! failure); by default every run draws a new seed.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use disk::device::{ExtentKind, extents};
use disk::ops::check::{CheckOptions, check};
use disk::vhdx::{CreateOptions, OpenOptions, ParentSpec, VhdxImage, create};
use disk::{BlockDevice, ErrorKind, Storage};
use rand::Rng;
use testkit::{CrashModel, SimDisk, SimRng, seed_from_env, sim_rng};

const BLOCK: u64 = 1 << 20;
/// The piece size of the crash model: SimDisk tears writes at 512-byte boundaries, also inside
/// a 4096-byte logical sector.
const PIECE: u64 = 512;
/// Ops of one workload (plus a final close).
const WORKLOAD_OPS: usize = 44;
/// About this many crash images per variant are written to a file after recovery for
/// `disk::ops::check` and `qemu-img check`.
const FILE_CHECKS: usize = 24;

// ---------------------------------------------------------------------------------------------
// Workload and model.

/// One op of the workload, at the `BlockDevice` level.
#[derive(Debug, Clone, Copy)]
enum Step {
    Write {
        off: u64,
        len: u64,
        seed: u8,
    },
    Trim {
        off: u64,
        len: u64,
    },
    Zero {
        off: u64,
        len: u64,
    },
    Flush,
    /// `close()`: commit and mark the log clean; the image stays open, and the next write
    /// starts a new session (new header GUIDs).
    Close,
}

impl Step {
    fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Step::Write { off, len, .. } | Step::Trim { off, len } | Step::Zero { off, len } => {
                Some((off, len))
            }
            Step::Flush | Step::Close => None,
        }
    }

    fn is_flush(&self) -> bool {
        matches!(self, Step::Flush | Step::Close)
    }

    fn exec(&self, img: &VhdxImage) -> disk::Result<()> {
        match *self {
            Step::Write { off, len, seed } => img.write_at(&pattern(off, len as usize, seed), off),
            Step::Trim { off, len } => img.trim(off, len),
            Step::Zero { off, len } => img.write_zeroes(off, len),
            Step::Flush => img.flush(),
            Step::Close => img.close(),
        }
    }
}

/// Deterministic test data: a function of the seed and the absolute disk offset.
fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
    let mix = |w: u64| {
        let mut x = w ^ (u64::from(seed) << 56) ^ 0x9E37_79B9_7F4A_7C15;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    (off..off + len as u64)
        .map(|p| mix(p / 8).to_le_bytes()[(p % 8) as usize])
        .collect()
}

/// Virtual disk content with a per-byte "unspecified" flag (trimmed bytes).
#[derive(Debug, Clone)]
struct Content {
    data: Vec<u8>,
    unspecified: Vec<bool>,
}

impl Content {
    fn new(data: Vec<u8>) -> Content {
        let unspecified = vec![false; data.len()];
        Content { data, unspecified }
    }

    fn apply(&mut self, step: &Step) {
        let r = |off: u64, len: u64| off as usize..(off + len) as usize;
        match *step {
            Step::Write { off, len, seed } => {
                self.data[r(off, len)].copy_from_slice(&pattern(off, len as usize, seed));
                self.unspecified[r(off, len)].fill(false);
            }
            Step::Zero { off, len } => {
                self.data[r(off, len)].fill(0);
                self.unspecified[r(off, len)].fill(false);
            }
            Step::Trim { off, len } => self.unspecified[r(off, len)].fill(true),
            Step::Flush | Step::Close => {}
        }
    }

    /// True when piece `p` of `actual` matches this content (unspecified bytes match anything).
    fn piece_matches(&self, actual: &[u8], p: usize) -> bool {
        let r = p * PIECE as usize..((p + 1) * PIECE as usize).min(actual.len());
        self.data[r.clone()] == actual[r.clone()]
            || r.clone()
                .all(|i| self.unspecified[i] || self.data[i] == actual[i])
    }
}

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

// ---------------------------------------------------------------------------------------------
// Fixtures.

/// One variant's starting point: the empty top image (durable) and its read-only parent.
struct Fixture {
    name: &'static str,
    /// The run's seed (what `SIM_SEED` replays).
    seed: u64,
    size: u64,
    sector: u64,
    /// The freshly created top image; each run starts from a copy.
    top: SimDisk,
    parent: Option<Arc<VhdxImage>>,
    /// What the top reads as before the workload.
    initial: Vec<u8>,
    /// Also run `qemu-img check` on sampled crash images (dynamic, 512-byte sectors only).
    qemu: bool,
    /// Where sampled crash images are written for the file-based checks (the parent, if any,
    /// is there as `base.vhdx`, which the child's locator names).
    files: tempfile::TempDir,
}

fn storage(d: &Arc<SimDisk>) -> Arc<dyn Storage> {
    d.clone()
}

fn create_on(size: u64, sector: u64, parent: Option<&VhdxImage>) -> Arc<SimDisk> {
    let d = Arc::new(SimDisk::new());
    let opts = CreateOptions {
        size,
        block_size: BLOCK as u32,
        logical_sector_size: sector as u32,
        parent: parent.map(|p| ParentSpec {
            linkage: p.header().data_write_guid,
            relative_path: ".\\base.vhdx".into(),
            absolute_path: "/images/base.vhdx".into(),
        }),
        ..CreateOptions::default()
    };
    create(&storage(&d), &opts).expect("create");
    d
}

fn read_all(dev: &dyn BlockDevice) -> disk::Result<Vec<u8>> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read_at(&mut buf, 0)?;
    Ok(buf)
}

impl Fixture {
    fn new(name: &'static str, seed: u64, differencing: bool, sector: u64, qemu: bool) -> Fixture {
        // A size that ends three sectors into a block, so the last block is partial.
        let size = 8 * BLOCK + 3 * sector;
        let files = tempfile::tempdir().expect("tempdir");
        let parent = differencing.then(|| {
            let d = create_on(size, sector, None);
            let img = VhdxImage::open(
                storage(&d),
                OpenOptions {
                    writable: true,
                    path: None,
                },
            )
            .expect("open new parent");
            // Whole blocks, a partial block and a sub-sector write, so that partial child
            // writes read-modify-write parent data.
            img.write_at(&pattern(0, (3 * BLOCK) as usize, 0xA1), 0)
                .expect("parent write");
            img.write_at(&pattern(4 * BLOCK + 4096, 300_000, 0xA2), 4 * BLOCK + 4096)
                .expect("parent write");
            img.write_at(&pattern(7 * BLOCK + 77, 1000, 0xA3), 7 * BLOCK + 77)
                .expect("parent write");
            img.close().expect("parent close");
            drop(img);
            std::fs::write(files.path().join("base.vhdx"), d.live_bytes()).expect("write parent");
            let ro = VhdxImage::open(
                storage(&d),
                OpenOptions {
                    writable: false,
                    path: None,
                },
            )
            .expect("reopen parent read-only");
            Arc::new(ro)
        });
        let top_arc = create_on(size, sector, parent.as_deref());
        let initial = match &parent {
            Some(p) => read_all(p.as_ref()).expect("read parent"),
            None => vec![0; size as usize],
        };
        let top = top_arc.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed);
        Fixture {
            name,
            seed,
            size,
            sector,
            top,
            parent,
            initial,
            qemu,
            files,
        }
    }

    fn fresh_disk(&self) -> Arc<SimDisk> {
        Arc::new(
            self.top
                .crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed),
        )
    }

    fn open(&self, d: &Arc<SimDisk>, writable: bool) -> disk::Result<VhdxImage> {
        let img = VhdxImage::open(
            storage(d),
            OpenOptions {
                writable,
                path: None,
            },
        )?;
        if let Some(p) = &self.parent {
            img.attach_parent(p.clone())?;
        }
        Ok(img)
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "[{}, sector {}; replay with SIM_SEED={}] {what}",
            self.name, self.sector, self.seed
        )
    }
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

/// Which steps the content of a crash image may reflect.
struct Expect {
    /// Content as of the last flush (or close) that completed before the power cut.
    flushed: Content,
    /// Steps issued after that flush and before the cut, in order.
    unflushed: Vec<Step>,
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

/// Every piece of `actual` must equal the flushed content or the content after some prefix of
/// the unflushed steps.
fn check_content(expect: &Expect, actual: &[u8]) -> Result<(), String> {
    let pieces = actual.len().div_ceil(PIECE as usize);
    let mut ok: Vec<bool> = (0..pieces)
        .map(|p| expect.flushed.piece_matches(actual, p))
        .collect();
    let mut state = expect.flushed.clone();
    for s in &expect.unflushed {
        state.apply(s);
        if let Some((off, len)) = s.range() {
            let (p0, p1) = ((off / PIECE) as usize, (off + len).div_ceil(PIECE) as usize);
            for (p, ok) in ok.iter_mut().enumerate().take(p1).skip(p0) {
                *ok = *ok || state.piece_matches(actual, p);
            }
        }
    }
    match ok.iter().position(|&o| !o) {
        None => Ok(()),
        Some(p) => {
            let at = p * PIECE as usize;
            let show = |b: &[u8]| format!("{:02x?}", &b[at..at + 16]);
            Err(format!(
                "piece at {at:#x} reads {} but was {} at the last flush, and no step since \
                 explains it (unflushed steps: {:?})",
                show(actual),
                show(&expect.flushed.data),
                expect.unflushed
            ))
        }
    }
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

/// The BAT invariant of MS-VHDX 2.5.1: a chunk with a PARTIALLY_PRESENT block has its sector
/// bitmap block present.
fn check_bat(img: &VhdxImage) -> Result<(), String> {
    let layout = img.layout();
    let bat = img.bat();
    for block in 0..layout.data_blocks() {
        let e = bat[layout.payload_index(block) as usize];
        if e.state() != vhdx::bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT {
            continue;
        }
        let chunk = block / layout.chunk_ratio();
        let sb = bat[layout.bitmap_index(chunk) as usize];
        if sb.state() != vhdx::bat::SB_BLOCK_PRESENT {
            return Err(format!(
                "block {block} is PARTIALLY_PRESENT but the sector bitmap block of chunk {chunk} \
                 is not present (state {})",
                sb.state()
            ));
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

/// The RNG of one variant: its own stream of the run's seed.
fn variant_rng(seed: u64, salt: u64) -> SimRng {
    sim_rng(seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn default_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    t.map_or(1, |d| d.as_nanos() as u64)
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

// ---------------------------------------------------------------------------------------------
// A commit too big for one log entry.

/// Virtual size of the sparse differencing disk: 160 GiB of 1 MiB blocks (40 chunks).
const BIG: u64 = 160 << 30;
/// Blocks written, 512 blocks apart: each BAT entry sits in its own 4 KiB BAT page and each
/// block's sector bits in their own bitmap page, so the close has about 600 dirty pages,
/// more than one 1 MiB log entry carries (254), and commits them in three entries.
const BIG_WRITES: u64 = 300;

fn big_offsets() -> impl Iterator<Item = u64> {
    (0..BIG_WRITES).map(|i| i * 512 * BLOCK + (i % 7) * 4096)
}

fn open_on(d: &Arc<SimDisk>, writable: bool) -> disk::Result<VhdxImage> {
    VhdxImage::open(
        storage(d),
        OpenOptions {
            writable,
            path: None,
        },
    )
}

/// A differencing child as Hyper-V creates it: every sector bitmap entry NOT_PRESENT, so the
/// first partial write into a chunk allocates its bitmap block (Ferry's `create` pre-allocates
/// them all).
fn child_without_bitmap_blocks(size: u64, sector: u64, parent: &VhdxImage) -> SimDisk {
    let d = create_on(size, sector, Some(parent));
    let img = open_on(&d, false).expect("open child");
    let (layout, bat_at) = (img.layout(), img.regions().bat.offset);
    for chunk in 0..layout.bitmap_blocks() {
        d.write_at(&[0; 8], bat_at + layout.bitmap_index(chunk) * 8)
            .expect("clear entry");
    }
    d.flush().expect("flush");
    d.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed)
}

/// Writes one sector into each of [`BIG_WRITES`] blocks of a copy of `base`, then closes it
/// with the power cut `cut` storage ops after the close starts. Returns the disk and the
/// number of storage ops the close took.
fn big_run(parent: &Arc<VhdxImage>, base: &SimDisk, cut: Option<u64>) -> (Arc<SimDisk>, u64) {
    let disk = Arc::new(base.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let img = open_on(&disk, true).expect("open");
    img.attach_parent(parent.clone()).expect("attach");
    for off in big_offsets() {
        img.write_at(&pattern(off, 512, 9), off).expect("write");
    }
    let start = disk.op_count();
    if let Some(c) = cut {
        disk.set_crash_at(start + c);
    }
    img.close().expect("close");
    let ops = disk.op_count() - start;
    drop(img);
    (disk, ops)
}

/// Each written sector reads as zeros (the empty parent) or as the write, the same through a
/// read-only and a writable open, and all as the write when `complete`. Then the sector after
/// each is written, the image closed and reopened: both must read back.
fn big_check(parent: &Arc<VhdxImage>, crashed: SimDisk, complete: bool) -> Result<(), String> {
    let crashed = Arc::new(crashed);
    let copy = Arc::new(crashed.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let read = |img: &VhdxImage, off: u64| {
        let mut buf = vec![0u8; 512];
        img.read_at(&mut buf, off)
            .map(|()| buf)
            .map_err(|e| format!("read {off:#x}: {e:?}"))
    };
    let mut seen = Vec::new();
    for (d, writable) in [(&copy, false), (&crashed, true)] {
        let img = open_on(d, writable).map_err(|e| format!("open (writable={writable}): {e:?}"))?;
        img.attach_parent(parent.clone())
            .map_err(|e| format!("attach: {e:?}"))?;
        check_bat(&img)?;
        let mut got = Vec::new();
        for off in big_offsets() {
            let buf = read(&img, off)?;
            let new = buf == pattern(off, 512, 9);
            if !new && (complete || buf != [0; 512]) {
                return Err(format!("sector {off:#x} reads {:02x?}", &buf[..16]));
            }
            got.push(buf);
        }
        seen.push(got);
        if writable {
            for off in big_offsets() {
                let next = off + 512;
                img.write_at(&pattern(next, 512, 10), next)
                    .map_err(|e| format!("write after recovery: {e:?}"))?;
            }
            img.close()
                .map_err(|e| format!("close after recovery: {e:?}"))?;
        }
    }
    if seen[0] != seen[1] {
        return Err("read-only and writable opens differ".into());
    }
    let img = open_on(&crashed, false).map_err(|e| format!("reopen after recovery: {e:?}"))?;
    img.attach_parent(parent.clone())
        .map_err(|e| format!("attach: {e:?}"))?;
    check_bat(&img)?;
    for (off, before) in big_offsets().zip(&seen[1]) {
        if read(&img, off)? != *before || read(&img, off + 512)? != pattern(off + 512, 512, 10) {
            return Err(format!(
                "after recovery, writes and close, block of {off:#x} changed"
            ));
        }
    }
    Ok(())
}

#[test]
fn crash_during_a_commit_bigger_than_one_log_entry() {
    let seed = seed_from_env(default_seed());
    let mut rng = variant_rng(seed, 3);
    let parent = {
        let d = create_on(BIG, 512, None);
        Arc::new(open_on(&d, false).expect("open parent"))
    };
    let base = child_without_bitmap_blocks(BIG, 512, &parent);
    let (_, total) = big_run(&parent, &base, None);
    assert!(
        total > 600,
        "the close took {total} storage ops: fewer pages than three log entries"
    );
    // About sixty cuts spread over the whole close, each crashed two ways.
    let step = (total / 60).max(1);
    let mut cut = rng.gen_range(0..step);
    let mut cuts = 0;
    while cut <= total {
        let (disk, _) = big_run(&parent, &base, Some(cut));
        let complete = cut >= total;
        for (how, image) in [
            ("random survivors", disk.crash(&mut rng)),
            (
                "last write torn at a chosen sector",
                disk.crash_torn(rng.gen_range(0..=8)),
            ),
        ] {
            big_check(&parent, image, complete).unwrap_or_else(|e| {
                panic!(
                    "SIM_SEED={seed}: power cut {cut} of {total} ops into the close ({how}): {e}"
                )
            });
        }
        cuts += 1;
        // The last cut is always the one after the whole close.
        cut = if cut < total {
            (cut + step).min(total)
        } else {
            total + 1
        };
    }
    eprintln!("commit bigger than one log entry: {total} storage ops, {cuts} cuts");
}

/// Regression: a PARTIALLY_PRESENT block in a chunk whose sector bitmap entry is NOT_PRESENT
/// (what a crash between the entries of a multi-entry commit used to leave, and what a foreign
/// writer may leave). A write into the block set its bits in a bitmap "at" file offset 0, and
/// the commit wrote that page over the file identifier.
#[test]
fn partial_block_without_bitmap_block_takes_writes() {
    let parent = Arc::new(open_on(&create_on(8 * BLOCK, 512, None), false).expect("parent"));
    let d = Arc::new(child_without_bitmap_blocks(8 * BLOCK, 512, &parent));
    let img = open_on(&d, true).expect("open");
    img.attach_parent(parent.clone()).expect("attach");
    img.write_at(&[1; 512], 0).expect("first write");
    img.close().expect("close");
    let (layout, bat_at) = (img.layout(), img.regions().bat.offset);
    drop(img);
    // Block 0 is PARTIALLY_PRESENT; now take its chunk's bitmap block away.
    d.write_at(&[0; 8], bat_at + layout.bitmap_index(0) * 8)
        .expect("clear entry");
    d.flush().expect("flush");
    let img = open_on(&d, true).expect("reopen");
    img.attach_parent(parent.clone()).expect("attach");
    img.write_at(&[2; 512], 512).expect("second write");
    img.close().expect("close");
    drop(img);
    let img = open_on(&d, false).expect("open after writing the partial block");
    img.attach_parent(parent).expect("attach");
    check_bat(&img).expect("bat invariant");
    let mut buf = vec![0u8; 1024];
    img.read_at(&mut buf, 0).expect("read");
    // The first sector's bit was lost with the bitmap block: it reads from the parent.
    assert_eq!((buf[0], buf[512]), (0, 2));
}

// ---------------------------------------------------------------------------------------------
// Fail-stop.

/// Writes (new blocks, partial sectors and partial blocks), then `last` (a flush or close),
/// failing the storage op `fail_at` counted from the start of `last`. Returns the number of
/// storage ops `last` takes when nothing fails.
fn fail_during(fx: &Fixture, last: Step, fail_at: Option<u64>) -> u64 {
    let disk = fx.fresh_disk();
    let img = fx.open(&disk, true).expect("open");
    let before = [
        Step::Write {
            off: 0,
            len: 8192,
            seed: 1,
        },
        Step::Flush,
        Step::Write {
            off: BLOCK + 100,
            len: 5000,
            seed: 2,
        },
        Step::Write {
            off: 3 * BLOCK - 512,
            len: BLOCK,
            seed: 3,
        },
        Step::Trim {
            off: 5 * BLOCK,
            len: BLOCK,
        },
        Step::Write {
            off: 0,
            len: 512,
            seed: 4,
        },
    ];
    for s in &before {
        s.exec(&img).expect("workload before the fault");
    }
    let start = disk.op_count();
    let Some(k) = fail_at else {
        last.exec(&img).expect("flush without faults");
        return disk.op_count() - start;
    };
    disk.fail_after(start + k);
    let what = format!("{} with storage op {k} of {last:?} failing", fx.name);
    let e = last.exec(&img).expect_err(&what);
    assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e:?}");
    // The storage works again; the image must not.
    disk.clear_failures();
    let mut buf = [0u8; 512];
    let results = [
        ("write", img.write_at(&[7; 512], 0)),
        ("write to a new block", img.write_at(&[7; 512], 6 * BLOCK)),
        ("read", img.read_at(&mut buf, 0)),
        ("flush", img.flush()),
        ("trim", img.trim(0, BLOCK)),
        ("write_zeroes", img.write_zeroes(0, 4096)),
        ("close", img.close()),
    ];
    for (op, r) in results {
        let kind = r.as_ref().err().map(disk::Error::kind);
        assert_eq!(
            kind,
            Some(ErrorKind::Poisoned),
            "{what}: later {op} returned {r:?}"
        );
    }
    // Dropping a poisoned image must not write.
    let ops = disk.op_count();
    drop(img);
    assert_eq!(
        disk.op_count(),
        ops,
        "{what}: drop of a poisoned image wrote"
    );
    // What was flushed before survives: the first write (flushed) reads back unless the
    // last write covered it.
    let after = Arc::new(disk.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let img = fx
        .open(&after, false)
        .unwrap_or_else(|e| panic!("{what}: reopen: {e:?}"));
    let mut expect = Content::new(fx.initial.clone());
    before[..2].iter().for_each(|s| expect.apply(s));
    let expect = Expect {
        flushed: expect,
        unflushed: before[2..].to_vec(),
    };
    let seen = read_all(&img).expect("read after reopen");
    check_content(&expect, &seen).unwrap_or_else(|e| panic!("{what}: {e}"));
    0
}

#[test]
fn failed_flush_or_close_poisons_the_image() {
    for differencing in [false, true] {
        let fx = Fixture::new("fail-stop", 0, differencing, 512, false);
        for last in [Step::Flush, Step::Close] {
            let n = fail_during(&fx, last, None);
            assert!(
                n >= 4,
                "{last:?} took only {n} storage ops: the test is too weak"
            );
            for k in 0..n {
                fail_during(&fx, last, Some(k));
            }
            eprintln!(
                "differencing {differencing}: failed each of the {n} storage ops of {last:?}"
            );
        }
    }
}
