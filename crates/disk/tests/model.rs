//! Property tests of `VhdxImage` against an in-memory model of the virtual disk.
//!
//! Each case builds a small VHDX (8–40 MiB, 1 or 2 MiB blocks, 512 or 4096-byte logical
//! sectors, sometimes a size that ends inside a block) on a `testkit::SimDisk` and runs a random
//! sequence of writes (any size and alignment: sub-sector, cross-sector, cross-block, whole
//! blocks), trims, write-zeroes, flushes, reopens (close, drop, or dirty: flush then lose every
//! unflushed storage write so the log must be replayed) and new versions (the top is closed,
//! reopened read-only and gets a differencing child, with or without pre-allocated sector
//! bitmap blocks; chains of 1 to 5 images).
//!
//! The model is a `Vec<u8>` of the virtual disk plus a set of "unspecified" byte ranges: after a
//! trim a range may read as zeros, as the old data or as the parent's data, so it is skipped
//! until rewritten. After every op the op's range (widened by a sector) and a random range must
//! read as the model says, and `disk::device::extents` must not call a range Hole or Zero where
//! the model holds non-zero data; after every reopen, new version and at the end the whole disk
//! is compared.
//!
//! `PROPTEST_CASES` overrides the default of 64 cases.

use std::collections::BTreeMap;
use std::sync::Arc;

use disk::device::{ExtentKind, extents};
use disk::vhdx::{CreateOptions, OpenOptions, ParentSpec, VhdxImage, create};
use disk::{BlockDevice, Storage};
use proptest::prelude::*;
use proptest::test_runner::Config;
use testkit::{CrashModel, SimDisk, sim_rng};

/// Cases run when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 64;
/// The most images in a chain (base + 4 versions).
const MAX_CHAIN: usize = 5;

// ---------------------------------------------------------------------------------------------
// The model.

/// Byte ranges `[start, end)` whose content is unspecified (trimmed), disjoint and
/// non-adjacent, keyed by start.
#[derive(Debug, Clone, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Removes `[s, e)` from the set.
    fn remove(&mut self, s: u64, e: u64) {
        let hit: Vec<(u64, u64)> = self
            .0
            .range(..e)
            .rev()
            .take_while(|&(_, &end)| end > s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in hit {
            self.0.remove(&a);
            if a < s {
                self.0.insert(a, s);
            }
            if b > e {
                self.0.insert(e, b);
            }
        }
    }

    /// Adds `[s, e)`, merging with overlapping or adjacent ranges.
    fn insert(&mut self, s: u64, e: u64) {
        let (mut lo, mut hi) = (s, e);
        let hit: Vec<(u64, u64)> = self
            .0
            .range(..=e)
            .rev()
            .take_while(|&(_, &end)| end >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in hit {
            self.0.remove(&a);
            lo = lo.min(a);
            hi = hi.max(b);
        }
        self.0.insert(lo, hi);
    }

    /// The parts of `[s, e)` outside the set.
    fn gaps(&self, s: u64, e: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = s;
        // The range that starts before `s` may still cover it.
        let first = self.0.range(..=s).next_back().map(|(&a, &b)| (a, b));
        let rest = self.0.range(s + 1..e).map(|(&a, &b)| (a, b));
        for (a, b) in first.into_iter().chain(rest) {
            if b <= pos {
                continue;
            }
            if a > pos {
                out.push((pos, a.min(e)));
            }
            pos = pos.max(b);
            if pos >= e {
                break;
            }
        }
        if pos < e {
            out.push((pos, e));
        }
        out
    }
}

/// What the virtual disk must read as.
#[derive(Debug, Clone)]
struct Model {
    data: Vec<u8>,
    unspecified: Ranges,
}

impl Model {
    fn new(size: u64) -> Model {
        Model {
            data: vec![0; size as usize],
            unspecified: Ranges::default(),
        }
    }

    fn write(&mut self, off: u64, bytes: &[u8]) {
        self.data[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
        self.unspecified.remove(off, off + bytes.len() as u64);
    }

    fn zero(&mut self, off: u64, len: u64) {
        self.data[off as usize..(off + len) as usize].fill(0);
        self.unspecified.remove(off, off + len);
    }

    fn trim(&mut self, off: u64, len: u64) {
        self.unspecified.insert(off, off + len);
    }
}

/// Deterministic test data: a function of the seed and the absolute disk offset, so a write
/// that lands at the wrong place or with the wrong seed is visible.
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

fn is_zero(b: &[u8]) -> bool {
    const Z: [u8; 4096] = [0; 4096];
    b.chunks(Z.len()).all(|c| c == &Z[..c.len()])
}

// ---------------------------------------------------------------------------------------------
// Ops and strategies.

/// Disk geometry of one case.
#[derive(Debug, Clone, Copy)]
struct Geo {
    size: u64,
    block: u64,
    sector: u64,
}

/// An offset to be resolved against the geometry: `kind` picks the alignment.
#[derive(Debug, Clone, Copy)]
struct Pos {
    kind: u8,
    raw: u64,
}

/// A length to be resolved against the geometry: `kind` picks the size class.
#[derive(Debug, Clone, Copy)]
struct Len {
    kind: u8,
    raw: u64,
}

#[derive(Debug, Clone, Copy)]
enum Reopen {
    /// `close()`, drop, open.
    Close,
    /// Drop (which commits and closes), open.
    Drop,
    /// Flush, then keep only the durable bytes (the in-place metadata writes after the log
    /// entry are lost): open read-only (replay in memory), then writable (replay into the file).
    Dirty,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Write {
        at: Pos,
        len: Len,
        seed: u8,
    },
    Trim {
        at: Pos,
        len: Len,
    },
    WriteZeroes {
        at: Pos,
        len: Len,
    },
    Flush,
    Reopen(Reopen),
    /// `bare`: the child's chunks start without sector bitmap blocks, as Hyper-V creates
    /// them (Ferry pre-allocates them), so partial writes allocate them.
    NewVersion {
        bare: bool,
    },
}

impl Geo {
    fn resolve_pos(&self, p: Pos) -> u64 {
        let blocks = self.size.div_ceil(self.block);
        let off = match p.kind {
            0 => p.raw % self.size,
            1 => (p.raw % (self.size / self.sector)) * self.sector,
            2 => (p.raw % blocks) * self.block,
            // Up to two sectors either side of a block boundary, at any byte.
            _ => {
                let b = (p.raw % blocks) * self.block;
                (b + (p.raw >> 32) % (4 * self.sector)).saturating_sub(2 * self.sector)
            }
        };
        off.min(self.size - 1)
    }

    fn resolve_len(&self, l: Len, off: u64) -> u64 {
        let len = match l.kind {
            0 => 1 + l.raw % 700,
            1 => self.sector * (1 + l.raw % 16),
            2 => 1 + l.raw % (3 * self.block),
            3 => self.block,
            _ => 1 + l.raw % (self.sector - 1),
        };
        len.min(self.size - off)
    }
}

fn geo() -> impl Strategy<Value = Geo> {
    (
        prop_oneof![Just(1u64 << 20), Just(2 << 20)],
        prop_oneof![Just(512u64), Just(4096)],
        8u64..=40,
        0u64..4,
    )
        .prop_map(|(block, sector, mib, extra)| Geo {
            size: (mib << 20) + extra * sector,
            block,
            sector,
        })
}

fn pos() -> impl Strategy<Value = Pos> {
    (0u8..4, any::<u64>()).prop_map(|(kind, raw)| Pos { kind, raw })
}

fn len() -> impl Strategy<Value = Len> {
    (0u8..5, any::<u64>()).prop_map(|(kind, raw)| Len { kind, raw })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (pos(), len(), 1u8..=255).prop_map(|(at, len, seed)| Op::Write { at, len, seed }),
        2 => (pos(), len()).prop_map(|(at, len)| Op::Trim { at, len }),
        2 => (pos(), len()).prop_map(|(at, len)| Op::WriteZeroes { at, len }),
        2 => Just(Op::Flush),
        1 => prop_oneof![Just(Reopen::Close), Just(Reopen::Drop), Just(Reopen::Dirty)].prop_map(Op::Reopen),
        1 => any::<bool>().prop_map(|bare| Op::NewVersion { bare }),
    ]
}

/// An op and a random range to read after it (resolved like a write's range).
fn step() -> impl Strategy<Value = (Op, Pos, Len)> {
    (op(), pos(), len())
}

// ---------------------------------------------------------------------------------------------
// The system under test.

/// A chain of in-memory images: read-only frozen versions and a writable top.
struct Chain {
    geo: Geo,
    /// Frozen versions, base first, each with its parent attached.
    frozen: Vec<Arc<VhdxImage>>,
    top_storage: Arc<SimDisk>,
    top: Option<Arc<VhdxImage>>,
    model: Model,
    /// Human-readable history, printed on failure.
    log: Vec<String>,
}

fn as_storage(s: &Arc<SimDisk>) -> Arc<dyn Storage> {
    s.clone()
}

fn create_image(geo: Geo, parent: Option<&VhdxImage>) -> Arc<SimDisk> {
    let storage = Arc::new(SimDisk::new());
    let opts = CreateOptions {
        size: geo.size,
        block_size: geo.block as u32,
        logical_sector_size: geo.sector as u32,
        parent: parent.map(|p| ParentSpec {
            linkage: p.header().data_write_guid,
            relative_path: ".\\parent.vhdx".into(),
            absolute_path: "/images/parent.vhdx".into(),
        }),
        ..CreateOptions::default()
    };
    create(&as_storage(&storage), &opts).expect("create");
    storage
}

/// Sets every sector bitmap entry of a new differencing image to NOT_PRESENT.
fn clear_bitmap_entries(d: &Arc<SimDisk>) {
    let img = VhdxImage::open(as_storage(d), OpenOptions::default()).expect("open child");
    let (layout, bat_at) = (img.layout(), img.regions().bat.offset);
    for chunk in 0..layout.bitmap_blocks() {
        d.write_at(&[0; 8], bat_at + layout.bitmap_index(chunk) * 8)
            .expect("clear entry");
    }
    d.flush().expect("flush");
}

impl Chain {
    fn new(geo: Geo) -> Chain {
        let top_storage = create_image(geo, None);
        let mut c = Chain {
            geo,
            frozen: Vec::new(),
            top_storage,
            top: None,
            model: Model::new(geo.size),
            log: Vec::new(),
        };
        c.top = Some(c.open(true));
        c
    }

    fn top(&self) -> &VhdxImage {
        self.top.as_deref().expect("top is open")
    }

    /// Opens the top storage, attaching the newest frozen version as its parent.
    fn open(&self, writable: bool) -> Arc<VhdxImage> {
        let img = VhdxImage::open(
            as_storage(&self.top_storage),
            OpenOptions {
                writable,
                path: None,
            },
        )
        .unwrap_or_else(|e| self.fail(&format!("open (writable={writable}): {e:?}")));
        if let Some(p) = self.frozen.last() {
            img.attach_parent(p.clone())
                .unwrap_or_else(|e| self.fail(&format!("attach_parent: {e:?}")));
        }
        Arc::new(img)
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\ngeometry {:?}, chain of {}\nhistory:\n  {}",
            self.geo,
            self.frozen.len() + 1,
            self.log.join("\n  ")
        )
    }

    fn apply(&mut self, op: Op, check_at: Pos, check_len: Len) {
        let g = self.geo;
        let mut window = None;
        match op {
            Op::Write { at, len, seed } => {
                let off = g.resolve_pos(at);
                let n = g.resolve_len(len, off);
                self.log.push(format!("write {off:#x}+{n:#x} seed {seed}"));
                let data = pattern(off, n as usize, seed);
                self.top()
                    .write_at(&data, off)
                    .unwrap_or_else(|e| self.fail(&format!("write: {e:?}")));
                self.model.write(off, &data);
                window = Some((off, n));
            }
            Op::Trim { at, len } => {
                let off = g.resolve_pos(at);
                let n = g.resolve_len(len, off);
                self.log.push(format!("trim {off:#x}+{n:#x}"));
                self.top()
                    .trim(off, n)
                    .unwrap_or_else(|e| self.fail(&format!("trim: {e:?}")));
                self.model.trim(off, n);
                window = Some((off, n));
            }
            Op::WriteZeroes { at, len } => {
                let off = g.resolve_pos(at);
                let n = g.resolve_len(len, off);
                self.log.push(format!("write_zeroes {off:#x}+{n:#x}"));
                self.top()
                    .write_zeroes(off, n)
                    .unwrap_or_else(|e| self.fail(&format!("write_zeroes: {e:?}")));
                self.model.zero(off, n);
                window = Some((off, n));
            }
            Op::Flush => {
                self.log.push("flush".into());
                self.top()
                    .flush()
                    .unwrap_or_else(|e| self.fail(&format!("flush: {e:?}")));
            }
            Op::Reopen(how) => {
                self.log.push(format!("reopen ({how:?})"));
                self.reopen(how);
                self.check_all("after reopen");
            }
            Op::NewVersion { bare } if self.frozen.len() + 1 < MAX_CHAIN => {
                let n = self.frozen.len() + 2;
                self.log
                    .push(format!("new version (chain of {n}, bare {bare})"));
                self.new_version(bare);
                self.check_all("after new version");
            }
            Op::NewVersion { .. } => self.log.push("new version skipped (chain full)".into()),
        }
        if let Some((off, n)) = window {
            // The op's range and a sector either side.
            let lo = off.saturating_sub(g.sector);
            let hi = (off + n + g.sector).min(g.size);
            self.check_range(lo, hi - lo, "op range");
            self.check_extents(lo, hi - lo);
        }
        let off = g.resolve_pos(check_at);
        let n = g.resolve_len(check_len, off);
        self.check_range(off, n, "random range");
    }

    fn reopen(&mut self, how: Reopen) {
        let top = self.top.take().expect("top is open");
        match how {
            Reopen::Close => {
                top.close()
                    .unwrap_or_else(|e| self.fail(&format!("close: {e:?}")));
                drop(top);
            }
            Reopen::Drop => drop(top),
            Reopen::Dirty => {
                top.flush()
                    .unwrap_or_else(|e| self.fail(&format!("flush: {e:?}")));
                // After a flush the only unflushed storage writes are the in-place copies of
                // the pages the last log entry holds, so losing them requires a replay.
                let must_replay = self.top_storage.pending_count() > 0;
                let durable = self
                    .top_storage
                    .crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed);
                // Dropping the old image closes it into the old storage, which is discarded.
                drop(top);
                self.top_storage = Arc::new(durable);
                self.top = Some(self.open(false));
                if must_replay && self.top().warnings().is_empty() {
                    self.fail("a dirty image opened read-only without replaying its log");
                }
                self.check_all("dirty image opened read-only");
                self.top = None;
            }
        }
        self.top = Some(self.open(true));
    }

    fn new_version(&mut self, bare: bool) {
        let top = self.top.take().expect("top is open");
        top.close()
            .unwrap_or_else(|e| self.fail(&format!("close before new version: {e:?}")));
        drop(top);
        let frozen = self.open(false);
        let child = create_image(self.geo, Some(&frozen));
        if bare {
            clear_bitmap_entries(&child);
        }
        self.frozen.push(frozen);
        self.top_storage = child;
        self.top = Some(self.open(true));
    }

    fn check_range(&self, off: u64, len: u64, what: &str) {
        let mut buf = vec![0u8; len as usize];
        self.top()
            .read_at(&mut buf, off)
            .unwrap_or_else(|e| self.fail(&format!("read {off:#x}+{len:#x}: {e:?}")));
        for (s, e) in self.model.unspecified.gaps(off, off + len) {
            let got = &buf[(s - off) as usize..(e - off) as usize];
            let want = &self.model.data[s as usize..e as usize];
            if got != want {
                let i = got
                    .iter()
                    .zip(want)
                    .position(|(a, b)| a != b)
                    .expect("slices differ");
                let at = s + i as u64;
                self.fail(&format!(
                    "{what} {off:#x}+{len:#x}: byte at {at:#x} reads {:#04x}, model says {:#04x}",
                    got[i], want[i]
                ));
            }
        }
    }

    /// No extent called Hole or Zero may cover model bytes that are specified and non-zero.
    fn check_extents(&self, off: u64, len: u64) {
        let map =
            extents(self.top(), off, len).unwrap_or_else(|e| self.fail(&format!("extents: {e:?}")));
        let total: u64 = map.iter().map(|e| e.len).sum();
        if total != len || map.first().is_some_and(|e| e.offset != off) {
            self.fail(&format!(
                "extents of {off:#x}+{len:#x} do not tile the range: {map:?}"
            ));
        }
        for x in map
            .iter()
            .filter(|x| matches!(x.kind, ExtentKind::Hole | ExtentKind::Zero))
        {
            for (s, e) in self.model.unspecified.gaps(x.offset, x.offset + x.len) {
                if !is_zero(&self.model.data[s as usize..e as usize]) {
                    self.fail(&format!(
                        "extent {x:?} is not data, but the model holds data in {s:#x}..{e:#x}"
                    ));
                }
            }
        }
    }

    fn check_all(&self, what: &str) {
        self.check_range(0, self.geo.size, what);
        self.check_extents(0, self.geo.size);
    }
}

fn run(geo: Geo, steps: &[(Op, Pos, Len)]) {
    let mut chain = Chain::new(geo);
    for &(op, at, len) in steps {
        chain.apply(op, at, len);
    }
    chain.check_all("final");
    chain.log.push("final close + reopen".into());
    chain.reopen(Reopen::Close);
    chain.check_all("final, reopened");
}

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    // No regression files are written next to the tests; regressions found by this test are
    // kept as the named tests at the bottom.
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn vhdx_matches_model(geo in geo(), steps in prop::collection::vec(step(), 1..=40)) {
        run(geo, &steps);
    }
}

// ---------------------------------------------------------------------------------------------
// Unit tests of the model itself, and fixed regressions.

#[test]
fn ranges_insert_merges_and_remove_splits() {
    let mut r = Ranges::default();
    r.insert(10, 20);
    r.insert(20, 30);
    r.insert(5, 12);
    assert_eq!(
        r.0.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
        vec![(5, 30)]
    );
    r.remove(8, 9);
    assert_eq!(r.gaps(0, 40), vec![(0, 5), (8, 9), (30, 40)]);
    assert_eq!(r.gaps(6, 7), vec![]);
    assert_eq!(r.gaps(29, 31), vec![(30, 31)]);
}

#[test]
fn pattern_depends_on_seed_and_offset() {
    assert_ne!(pattern(0, 64, 1), pattern(0, 64, 2));
    assert_eq!(pattern(8, 8, 1), pattern(0, 16, 1)[8..].to_vec());
}
