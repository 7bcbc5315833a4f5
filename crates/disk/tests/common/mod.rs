//! Helpers shared by the crash tests (`crash_sweep.rs`, `crash_log.rs`, `crash_fail.rs`): the
//! workload steps and the content model they are checked against, the `VhdxImage` fixtures on
//! `testkit::SimDisk`, and the checks every crash image must pass.

// Each crash test binary compiles this module and uses a different part of it.
#![allow(
    dead_code,
    reason = "each crash_* test binary uses only part of these helpers"
)]

use std::sync::Arc;

use disk::vhdx::{CreateOptions, OpenOptions, ParentSpec, VhdxImage, create};
use disk::{BlockDevice, Storage};
use testkit::{CrashModel, SimDisk, SimRng, sim_rng};

pub const BLOCK: u64 = 1 << 20;
/// The piece size of the crash model: SimDisk tears writes at 512-byte boundaries, also inside
/// a 4096-byte logical sector.
pub const PIECE: u64 = 512;

// ---------------------------------------------------------------------------------------------
// Workload and model.

/// One op of the workload, at the `BlockDevice` level.
#[derive(Debug, Clone, Copy)]
pub enum Step {
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
    pub fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Step::Write { off, len, .. } | Step::Trim { off, len } | Step::Zero { off, len } => {
                Some((off, len))
            }
            Step::Flush | Step::Close => None,
        }
    }

    pub fn is_flush(&self) -> bool {
        matches!(self, Step::Flush | Step::Close)
    }

    pub fn exec(&self, img: &VhdxImage) -> disk::Result<()> {
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
pub fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
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
pub struct Content {
    pub data: Vec<u8>,
    pub unspecified: Vec<bool>,
}

impl Content {
    pub fn new(data: Vec<u8>) -> Content {
        let unspecified = vec![false; data.len()];
        Content { data, unspecified }
    }

    pub fn apply(&mut self, step: &Step) {
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
    pub fn piece_matches(&self, actual: &[u8], p: usize) -> bool {
        let r = p * PIECE as usize..((p + 1) * PIECE as usize).min(actual.len());
        self.data[r.clone()] == actual[r.clone()]
            || r.clone()
                .all(|i| self.unspecified[i] || self.data[i] == actual[i])
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures.

/// One variant's starting point: the empty top image (durable) and its read-only parent.
pub struct Fixture {
    pub name: &'static str,
    /// The run's seed (what `SIM_SEED` replays).
    pub seed: u64,
    pub size: u64,
    pub sector: u64,
    /// The freshly created top image; each run starts from a copy.
    pub top: SimDisk,
    pub parent: Option<Arc<VhdxImage>>,
    /// What the top reads as before the workload.
    pub initial: Vec<u8>,
    /// Also run `qemu-img check` on sampled crash images (dynamic, 512-byte sectors only).
    pub qemu: bool,
    /// Where sampled crash images are written for the file-based checks (the parent, if any,
    /// is there as `base.vhdx`, which the child's locator names).
    pub files: tempfile::TempDir,
}

pub fn storage(d: &Arc<SimDisk>) -> Arc<dyn Storage> {
    d.clone()
}

pub fn create_on(size: u64, sector: u64, parent: Option<&VhdxImage>) -> Arc<SimDisk> {
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

pub fn read_all(dev: &dyn BlockDevice) -> disk::Result<Vec<u8>> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read_at(&mut buf, 0)?;
    Ok(buf)
}

impl Fixture {
    pub fn new(
        name: &'static str,
        seed: u64,
        differencing: bool,
        sector: u64,
        qemu: bool,
    ) -> Fixture {
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

    pub fn fresh_disk(&self) -> Arc<SimDisk> {
        Arc::new(
            self.top
                .crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed),
        )
    }

    pub fn open(&self, d: &Arc<SimDisk>, writable: bool) -> disk::Result<VhdxImage> {
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

    pub fn fail(&self, what: &str) -> ! {
        panic!(
            "[{}, sector {}; replay with SIM_SEED={}] {what}",
            self.name, self.sector, self.seed
        )
    }
}

pub fn open_on(d: &Arc<SimDisk>, writable: bool) -> disk::Result<VhdxImage> {
    VhdxImage::open(
        storage(d),
        OpenOptions {
            writable,
            path: None,
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Checks.

/// Which steps the content of a crash image may reflect.
pub struct Expect {
    /// Content as of the last flush (or close) that completed before the power cut.
    pub flushed: Content,
    /// Steps issued after that flush and before the cut, in order.
    pub unflushed: Vec<Step>,
}

/// Every piece of `actual` must equal the flushed content or the content after some prefix of
/// the unflushed steps.
pub fn check_content(expect: &Expect, actual: &[u8]) -> Result<(), String> {
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

/// The BAT invariant of MS-VHDX 2.5.1: a chunk with a PARTIALLY_PRESENT block has its sector
/// bitmap block present.
pub fn check_bat(img: &VhdxImage) -> Result<(), String> {
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

// ---------------------------------------------------------------------------------------------
// Seeds.

/// The RNG of one variant: its own stream of the run's seed.
pub fn variant_rng(seed: u64, salt: u64) -> SimRng {
    sim_rng(seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

pub fn default_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    t.map_or(1, |d| d.as_nanos() as u64)
}
