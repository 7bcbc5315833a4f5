//! Helpers shared by the block cache's integration tests: the counting inner device,
//! seeded contents, and configurations and readers the tests have in common. Each test
//! file uses a different part of them.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use block_cache::{BlockCache, CacheConfig, ChainKey};
use disk::device::Geometry;
use disk::raw::RawDisk;
use disk::{BlockDevice, Error, ErrorKind, Result};
use rand::{Rng, SeedableRng};
use testkit::SimDisk;

/// The inner device of every test: bytes in memory behind a wrapper that counts store
/// reads per `granule`-sized block, can be slowed down, and can be made to fail.
#[derive(Debug)]
pub struct Counting {
    /// The bytes.
    pub inner: RawDisk,
    granule: u64,
    delay: Duration,
    /// Set: every read fails with `Io`.
    pub fail: AtomicBool,
    /// Store reads so far.
    pub reads: AtomicU64,
    bytes: AtomicU64,
    per_block: Mutex<HashMap<u64, u32>>,
}

impl Counting {
    pub fn new(bytes: Vec<u8>, granule: u64) -> Arc<Counting> {
        Counting::slow(bytes, granule, Duration::ZERO)
    }

    pub fn slow(bytes: Vec<u8>, granule: u64, delay: Duration) -> Arc<Counting> {
        let storage = Arc::new(SimDisk::from_bytes(bytes));
        Arc::new(Counting {
            inner: RawDisk::open(storage, false).expect("raw over memory"),
            granule,
            delay,
            fail: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            per_block: Mutex::new(HashMap::new()),
        })
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    pub fn block_reads(&self) -> HashMap<u64, u32> {
        self.per_block.lock().unwrap().clone()
    }
}

impl BlockDevice for Counting {
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }

    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn format(&self) -> &'static str {
        "counting"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Io, "injected store failure"));
        }
        std::thread::sleep(self.delay);
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(buf.len() as u64, Ordering::SeqCst);
        if !buf.is_empty() {
            let mut m = self.per_block.lock().unwrap();
            let end = offset + buf.len() as u64;
            for b in offset / self.granule..=(end - 1) / self.granule {
                *m.entry(b).or_default() += 1;
            }
        }
        self.inner.read_at(buf, offset)
    }
}

/// Bytes from a seed: random, with about a third of the 4 KiB pieces all zero.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(4096) {
        if rng.gen_range(0..3) != 0 {
            rng.fill(chunk);
        }
    }
    v
}

pub fn key(name: &str) -> ChainKey {
    ChainKey::new(name, None)
}

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

/// No read-ahead and one block per store read: every store read is one demand miss.
pub fn plain(budget_bytes: u64, block_bytes: u32) -> CacheConfig {
    CacheConfig {
        budget_bytes,
        block_bytes,
        fill_blocks_max: 1,
        read_ahead_blocks_max: 0,
        read_ahead_threads: 0,
        ..CacheConfig::default()
    }
}

/// Reads `[0, size)` through `wrapped` in `req`-byte reads, checking every byte.
pub fn stream(wrapped: &dyn BlockDevice, bytes: &[u8], range: std::ops::Range<u64>, req: u64) {
    let mut buf = vec![0u8; req as usize];
    for off in range.step_by(req as usize) {
        let n = req.min(bytes.len() as u64 - off) as usize;
        wrapped.read_at(&mut buf[..n], off).unwrap();
        assert!(
            buf[..n] == bytes[off as usize..off as usize + n],
            "at {off:#x}"
        );
    }
}

/// Two wrappers of one chain holding `bytes` (64 KiB blocks) through a cache of `budget`
/// with a scan window of `window`: two connections reading the same vDisk.
pub fn two_readers(
    bytes: &[u8],
    budget: u64,
    window: u64,
) -> (
    Arc<Counting>,
    BlockCache,
    Arc<dyn BlockDevice>,
    Arc<dyn BlockDevice>,
) {
    let dev = Counting::new(bytes.to_vec(), 64 * KIB);
    let cfg = CacheConfig {
        budget_bytes: budget,
        block_bytes: 64 << 10,
        scan_window_bytes: window,
        ..CacheConfig::default()
    };
    let cache = BlockCache::with_config(cfg).unwrap();
    let a: Arc<dyn BlockDevice> = cache.wrap(key("a"), dev.clone());
    let b: Arc<dyn BlockDevice> = cache.wrap(key("a"), dev.clone());
    (dev, cache, a, b)
}
