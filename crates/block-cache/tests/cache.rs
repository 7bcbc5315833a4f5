//! The block cache against its inner device: equality (property), single-flight under
//! concurrency, the memory budget, read-ahead, sharing, invalidation and errors.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use block_cache::{BlockCache, CacheConfig, ChainKey, ENTRY_OVERHEAD_BYTES};
use disk::device::Geometry;
use disk::raw::RawDisk;
use disk::{BlockDevice, Error, ErrorKind, Result};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use testkit::SimDisk;

/// The inner device of every test: bytes in memory behind a wrapper that counts store
/// reads per `granule`-sized block, can be slowed down, and can be made to fail.
#[derive(Debug)]
struct Counting {
    inner: RawDisk,
    granule: u64,
    delay: Duration,
    fail: AtomicBool,
    reads: AtomicU64,
    bytes: AtomicU64,
    per_block: Mutex<HashMap<u64, u32>>,
}

impl Counting {
    fn new(bytes: Vec<u8>, granule: u64) -> Arc<Counting> {
        Counting::slow(bytes, granule, Duration::ZERO)
    }

    fn slow(bytes: Vec<u8>, granule: u64, delay: Duration) -> Arc<Counting> {
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

    fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    fn block_reads(&self) -> HashMap<u64, u32> {
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
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(4096) {
        if rng.gen_range(0..3) != 0 {
            rng.fill(chunk);
        }
    }
    v
}

fn key(name: &str) -> ChainKey {
    ChainKey::new(name, None)
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// No read-ahead and one block per store read: every store read is one demand miss.
fn plain(budget_bytes: u64, block_bytes: u32) -> CacheConfig {
    CacheConfig {
        budget_bytes,
        block_bytes,
        fill_blocks_max: 1,
        read_ahead_blocks_max: 0,
        read_ahead_threads: 0,
        ..CacheConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any reads through the cache (any budget, coalescing and read-ahead on) return the
    /// inner device's bytes, and the charged bytes never exceed the budget.
    #[test]
    fn cached_reads_equal_uncached(
        seed in any::<u64>(),
        size in 1u64..200_000,
        budget_blocks in 0u64..48,
        fill_max in 1u32..8,
        complete_blocks in any::<bool>(),
        reads in prop::collection::vec((any::<u64>(), 0u64..40_000, any::<bool>()), 1..40),
    ) {
        let size = size.next_multiple_of(512);
        let dev = Counting::new(content(seed, size as usize), 4096);
        let cfg = CacheConfig {
            budget_bytes: budget_blocks * (4096 + ENTRY_OVERHEAD_BYTES),
            block_bytes: 4096,
            fill_blocks_max: fill_max,
            read_ahead_blocks_max: 8,
            read_ahead_threads: 1,
            read_ahead_queue: 4,
            complete_blocks,
            ..CacheConfig::default()
        };
        let cache = BlockCache::with_config(cfg).unwrap();
        let cached = cache.wrap(key("a"), dev.clone());
        let mut next = 0u64;
        for (pos, len, sequential) in reads {
            let offset = if sequential { next % size } else { pos % size };
            let len = len.min(size - offset);
            let mut want = vec![0u8; len as usize];
            let mut got = vec![0xAAu8; len as usize];
            dev.inner.read_at(&mut want, offset).unwrap();
            cached.read_at(&mut got, offset).unwrap();
            prop_assert!(want == got, "read {len} bytes at {offset}");
            prop_assert!(cache.stats().cached_bytes <= cache.stats().budget_bytes);
            next = offset + len;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// With 64 KiB blocks of 4 KiB pages, reads of any size and alignment fill only the
    /// pages they touch, later reads extend partial blocks, and every read (through
    /// `read_at` or, when everything it needs is cached, `try_read_at`) returns the inner
    /// device's bytes. The store never reads more than the device's size plus one page per
    /// read, whatever the budget.
    #[test]
    fn partial_blocks_return_the_inner_bytes(
        seed in any::<u64>(),
        size in 1u64..600_000,
        budget_blocks in 0u64..6,
        fill_max in 1u32..4,
        complete_blocks in any::<bool>(),
        reads in prop::collection::vec((any::<u64>(), 1u64..150_000, any::<bool>()), 1..60),
    ) {
        let size = size.next_multiple_of(512);
        let dev = Counting::new(content(seed, size as usize), 4096);
        let cfg = CacheConfig {
            // 5 stands for a budget larger than the device (nothing is evicted).
            budget_bytes: if budget_blocks == 5 { 16 } else { budget_blocks }
                * (64 * KIB + ENTRY_OVERHEAD_BYTES),
            block_bytes: 64 << 10,
            fill_blocks_max: fill_max,
            read_ahead_blocks_max: 4,
            read_ahead_threads: 1,
            read_ahead_queue: 4,
            complete_blocks,
            ..CacheConfig::default()
        };
        let cache = BlockCache::with_config(cfg).unwrap();
        let cached = cache.wrap(key("a"), dev.clone());
        let (mut tried, mut served) = (0, 0);
        for (pos, len, try_first) in reads {
            let offset = pos % size;
            let len = len.min(size - offset);
            let mut want = vec![0u8; len as usize];
            let mut got = vec![0xAAu8; len as usize];
            dev.inner.read_at(&mut want, offset).unwrap();
            let fast = if try_first { cached.try_read_at(&mut got, offset) } else { None };
            tried += u32::from(try_first);
            match fast {
                Some(r) => {
                    r.unwrap();
                    served += 1;
                }
                None => cached.read_at(&mut got, offset).unwrap(),
            }
            prop_assert!(want == got, "read {len} bytes at {offset}");
            // Read again at once: a budget larger than the device must serve it from memory.
            if budget_blocks == 5 {
                let mut again = vec![0x55u8; len as usize];
                prop_assert!(cached.try_read_at(&mut again, offset).is_some());
                prop_assert!(want == again);
                // And as shared pieces of the cache's buffers, without a copy.
                let pieces = cached.try_read_shared(offset, len).unwrap().unwrap();
                let mut joined = Vec::with_capacity(len as usize);
                for p in &pieces {
                    match p.bytes() {
                        Some(b) => joined.extend_from_slice(b),
                        None => joined.resize(joined.len() + p.len(), 0),
                    }
                }
                prop_assert!(want == joined);
            }
            prop_assert!(cache.stats().cached_bytes <= cache.stats().budget_bytes);
        }
        prop_assert!(served <= tried);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `read_shared` (the server's path for misses) fills what is missing and returns the
    /// inner device's bytes as pieces of the cache's buffers, under any budget.
    #[test]
    fn read_shared_returns_the_inner_bytes(
        seed in any::<u64>(),
        size in 1u64..600_000,
        budget_blocks in 0u64..6,
        reads in prop::collection::vec((any::<u64>(), 1u64..150_000), 1..40),
    ) {
        let size = size.next_multiple_of(512);
        let dev = Counting::new(content(seed, size as usize), 4096);
        let cfg = CacheConfig {
            budget_bytes: budget_blocks * (64 * KIB + ENTRY_OVERHEAD_BYTES),
            ..plain(0, 64 << 10)
        };
        let cache = BlockCache::with_config(cfg).unwrap();
        let cached = cache.wrap(key("a"), dev.clone());
        for (pos, len) in reads {
            let offset = pos % size;
            let len = len.min(size - offset);
            let mut want = vec![0u8; len as usize];
            dev.inner.read_at(&mut want, offset).unwrap();
            let pieces = cached.read_shared(offset, len).unwrap().unwrap();
            let mut joined = Vec::with_capacity(len as usize);
            for p in &pieces {
                match p.bytes() {
                    Some(b) => joined.extend_from_slice(b),
                    None => joined.resize(joined.len() + p.len(), 0),
                }
            }
            prop_assert!(want == joined, "read {len} bytes at {offset}");
        }
        let mut past = vec![0u8; 1];
        prop_assert!(cached.read_shared(size, 1).unwrap().is_err());
        prop_assert!(cached.read_at(&mut past, size).is_err());
    }
}

/// A cold cache answers `try_read_at` with `None` and reads nothing; after a demand read of
/// 4 KiB, exactly that page is cached: `try_read_at` serves it and refuses its neighbour.
#[test]
fn try_read_serves_only_cached_pages() {
    let dev = Counting::new(content(3, (256 * KIB) as usize), 4096);
    let cache = BlockCache::with_config(plain(1 << 20, 64 << 10)).unwrap();
    let cached = cache.wrap(key("a"), dev.clone());
    let mut buf = vec![0u8; 4096];
    assert!(cached.try_read_at(&mut buf, 8192).is_none());
    assert_eq!(dev.bytes_read(), 0);
    cached.read_at(&mut buf, 8192).unwrap();
    assert_eq!(dev.bytes_read(), 4096);
    assert!(matches!(cached.try_read_at(&mut buf, 8192), Some(Ok(()))));
    assert!(cached.try_read_at(&mut buf, 12288).is_none());
    // A read spanning the cached page and its neighbours fetches only the neighbours.
    let mut wide = vec![0u8; 3 * 4096];
    cached.read_at(&mut wide, 4096).unwrap();
    assert_eq!(
        dev.bytes_read(),
        4096 * 4,
        "the cached page is read again only as part of one contiguous store read"
    );
}

/// Random reads within blocks: once a tenth of a chain's recent misses are second misses in
/// a block apart from the pages it holds (after a warm-up of 1024 misses), such a miss reads
/// the rest of the block in one store read. With `complete_blocks` off, or for a stream
/// through a block, only the pages asked for are read.
#[test]
fn scattered_second_misses_complete_the_block() {
    const BLOCKS: u64 = 700;
    for complete in [true, false] {
        let dev = Counting::new(content(5, (BLOCKS * 64 * KIB) as usize), 4096);
        let cfg = CacheConfig {
            complete_blocks: complete,
            ..plain(1 << 30, 64 << 10)
        };
        let cache = BlockCache::with_config(cfg).unwrap();
        let cached = cache.wrap(key("a"), dev.clone());
        let mut buf = vec![0u8; 4096];
        let mut want = vec![0u8; 4096];
        // Warm-up: pages 2 and 10 of 600 blocks (half the misses scattered).
        for b in 0..600 {
            cached.read_at(&mut buf, b * 64 * KIB + 8192).unwrap();
            cached.read_at(&mut buf, b * 64 * KIB + 40960).unwrap();
        }
        let warm = cache.stats().completions;
        assert_eq!(warm > 0, complete, "completions after warm-up: {warm}");
        let base = 650 * 64 * KIB;
        let before = dev.bytes_read();
        cached.read_at(&mut buf, base + 8192).unwrap();
        cached.read_at(&mut buf, base + 40960).unwrap();
        dev.inner.read_at(&mut want, base + 40960).unwrap();
        assert_eq!(buf, want);
        if complete {
            // The span of the missing pages is the whole block (the held page is inside).
            assert_eq!(dev.bytes_read() - before, 4096 + 64 * KIB);
            assert_eq!(cache.stats().completions, warm + 1);
            for page in 0..16 {
                let at = base + page * 4096;
                assert!(cached.try_read_at(&mut buf, at).is_some(), "page {page}");
                dev.inner.read_at(&mut want, at).unwrap();
                assert_eq!(buf, want, "page {page}");
            }
            assert_eq!(
                dev.bytes_read() - before,
                4096 + 64 * KIB,
                "no more store reads"
            );
        } else {
            assert_eq!(dev.bytes_read() - before, 2 * 4096);
            assert!(cached.try_read_at(&mut buf, base + 16384).is_none());
        }
        // The next page of a stream through a block is not scattered.
        let c = cache.stats().completions;
        cached.read_at(&mut buf, base + 64 * KIB).unwrap();
        cached.read_at(&mut buf, base + 64 * KIB + 4096).unwrap();
        assert_eq!(cache.stats().completions, c);
        assert_eq!(
            dev.bytes_read() - before,
            if complete {
                64 * KIB + 3 * 4096
            } else {
                4 * 4096
            }
        );
    }
}

/// 16 threads read the same 64 blocks at once, each in its own order, through a slow
/// store: with read-ahead and coalescing off, the store sees exactly one read per block.
#[test]
fn sixteen_threads_read_each_block_from_the_store_once() {
    const BLOCK: u64 = 64 * KIB;
    const BLOCKS: u64 = 64;
    const THREADS: usize = 16;
    let dev = Counting::slow(
        content(1, (BLOCK * BLOCKS) as usize),
        BLOCK,
        Duration::from_millis(2),
    );
    let cache = BlockCache::with_config(plain(1 << 30, BLOCK as u32)).unwrap();
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let wrapped = cache.wrap(key("golden"), dev.clone());
            let start = start.clone();
            std::thread::spawn(move || {
                let mut order: Vec<u64> = (0..BLOCKS).collect();
                order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(t as u64 % 4));
                start.wait();
                let mut buf = vec![0u8; 4096];
                for b in order {
                    wrapped.read_at(&mut buf, b * BLOCK + 8192).unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let s = cache.stats();
    assert_eq!(
        dev.reads.load(Ordering::SeqCst),
        BLOCKS,
        "store reads == unique blocks"
    );
    assert_eq!(s.misses, BLOCKS);
    assert_eq!(s.hits + s.inflight_waits, BLOCKS * (THREADS as u64 - 1));
    assert!(
        s.inflight_waits > 0,
        "the slow store made readers wait on each other"
    );
}

/// The same storm with the default coalescing and read-ahead: still every byte is read
/// from the store exactly once (a block may be fetched in several page ranges, since
/// 16 KiB readers fetch 16 KiB), and the store reads only the device's bytes.
#[test]
fn storm_with_read_ahead_reads_each_block_once() {
    const BLOCK: u64 = 64 * KIB;
    const BLOCKS: u64 = 128;
    const THREADS: usize = 16;
    let dev = Counting::slow(
        content(2, (BLOCK * BLOCKS) as usize),
        BLOCK,
        Duration::from_millis(1),
    );
    let cache = BlockCache::new(1 << 30, BLOCK as u32).unwrap();
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let wrapped = cache.wrap(key("golden"), dev.clone());
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut buf = vec![0u8; 16 * KIB as usize];
                for off in (0..BLOCK * BLOCKS).step_by(buf.len()) {
                    wrapped.read_at(&mut buf, off).unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let per_block = dev.block_reads();
    assert_eq!(per_block.len() as u64, BLOCKS);
    assert!(per_block.values().all(|&n| n <= 4), "{per_block:?}");
    assert_eq!(dev.bytes_read(), BLOCK * BLOCKS);
}

/// Resident block memory under 8 random readers stays within the budget plus one block per
/// thread (no coalescing, no read-ahead); the charged bytes stay within the budget.
#[test]
fn memory_stays_within_budget_plus_one_block_per_thread() {
    const BLOCK: u64 = 64 * KIB;
    const THREADS: u64 = 8;
    let budget = 16 * (BLOCK + ENTRY_OVERHEAD_BYTES);
    let dev = Counting::new(content(3, (256 * BLOCK) as usize), BLOCK);
    let cache = BlockCache::with_config(plain(budget, BLOCK as u32)).unwrap();
    random_readers(&cache, &dev, THREADS, 300);
    let s = cache.stats();
    assert!(s.evictions > 0);
    assert!(s.cached_bytes <= budget);
    assert!(
        s.resident_bytes_max <= budget + THREADS * BLOCK,
        "resident max {} > budget {budget} + {THREADS} blocks",
        s.resident_bytes_max
    );
}

/// With coalescing and read-ahead on, each reader and each worker adds at most one store
/// read buffer (`fill_blocks_max` blocks) and one block.
#[test]
fn memory_with_read_ahead_stays_within_budget_plus_run_buffers() {
    const BLOCK: u64 = 64 * KIB;
    const THREADS: u64 = 8;
    let cfg = CacheConfig {
        budget_bytes: 32 * (BLOCK + ENTRY_OVERHEAD_BYTES),
        block_bytes: BLOCK as u32,
        ..CacheConfig::default()
    };
    let run = u64::from(cfg.fill_blocks_max) * BLOCK;
    let workers = cfg.read_ahead_threads as u64;
    let budget = cfg.budget_bytes;
    let dev = Counting::new(content(4, (256 * BLOCK) as usize), BLOCK);
    let cache = BlockCache::with_config(cfg).unwrap();
    random_readers(&cache, &dev, THREADS, 300);
    let s = cache.stats();
    assert!(s.cached_bytes <= budget);
    assert!(s.resident_bytes_max <= budget + (THREADS + workers) * (run + BLOCK));
}

/// `threads` readers, each with its own wrapper, doing `reads` random reads of up to
/// 256 KiB, half of them continuing sequentially, checked against the inner device.
fn random_readers(cache: &BlockCache, dev: &Arc<Counting>, threads: u64, reads: usize) {
    let size = dev.size();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let wrapped = cache.wrap(key("golden"), dev.clone());
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                let mut next = 0;
                for _ in 0..reads {
                    let offset = if rng.gen_bool(0.5) {
                        next
                    } else {
                        rng.gen_range(0..size)
                    };
                    let len = rng.gen_range(1..=256 * KIB).min(size - offset);
                    let (mut got, mut want) = (vec![0u8; len as usize], vec![0u8; len as usize]);
                    wrapped.read_at(&mut got, offset).unwrap();
                    dev.inner.read_at(&mut want, offset).unwrap();
                    assert!(got == want, "read {len} at {offset}");
                    next = (offset + len) % size;
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
}

#[test]
fn second_wrapper_of_same_key_reads_nothing_from_the_store() {
    let dev = Counting::new(content(5, 1 << 20), 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let mut buf = vec![0u8; 300_000];
    cache
        .wrap(key("a"), dev.clone())
        .read_at(&mut buf, 1000)
        .unwrap();
    let before = dev.bytes_read();
    cache
        .wrap(key("a"), dev.clone())
        .read_at(&mut buf, 1000)
        .unwrap();
    assert_eq!(dev.bytes_read(), before);
}

#[test]
fn different_keys_do_not_share_entries() {
    let dev = Counting::new(content(6, 1 << 20), 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let mut buf = vec![0u8; 4096];
    cache
        .wrap(key("a"), dev.clone())
        .read_at(&mut buf, 0)
        .unwrap();
    cache
        .wrap(key("b"), dev.clone())
        .read_at(&mut buf, 0)
        .unwrap();
    assert_eq!(dev.reads.load(Ordering::SeqCst), 2);
}

#[test]
fn invalidate_makes_the_next_read_go_to_the_store() {
    let dev = Counting::new(content(7, 1 << 20), 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let mut buf = vec![0u8; 4096];
    cache
        .wrap(key("a"), dev.clone())
        .read_at(&mut buf, 0)
        .unwrap();
    assert_eq!(cache.invalidate(&key("a")), 1);
    cache
        .wrap(key("a"), dev.clone())
        .read_at(&mut buf, 0)
        .unwrap();
    assert_eq!(dev.reads.load(Ordering::SeqCst), 2);
}

#[test]
fn store_error_is_returned_and_not_cached() {
    let dev = Counting::new(content(8, 1 << 20), 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    let mut buf = vec![0u8; 4096];
    dev.fail.store(true, Ordering::SeqCst);
    let err = wrapped.read_at(&mut buf, 0).unwrap_err();
    dev.fail.store(false, Ordering::SeqCst);
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(wrapped.read_at(&mut buf, 0).is_ok());
}

/// A failed group read (whole new blocks, groups on) fails the read with the store's
/// error, caches nothing, and the next read reads the store again.
#[test]
fn failed_group_read_is_returned_and_not_cached() {
    const BLOCK: u64 = 64 * KIB;
    let bytes = content(13, (64 * BLOCK) as usize);
    let dev = Counting::new(bytes.clone(), BLOCK);
    let cfg = CacheConfig {
        budget_bytes: 8 << 20,
        block_bytes: BLOCK as u32,
        read_ahead_threads: 0,
        ..CacheConfig::default()
    };
    let cache = BlockCache::with_config(cfg).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    let mut buf = vec![0u8; MIB as usize];
    dev.fail.store(true, Ordering::SeqCst);
    let err = wrapped.read_at(&mut buf, 0).unwrap_err();
    dev.fail.store(false, Ordering::SeqCst);
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(cache.stats().cached_bytes, 0);
    wrapped.read_at(&mut buf, 0).unwrap();
    assert!(buf[..] == bytes[..MIB as usize]);
    assert_eq!(cache.stats().store_read_bytes, MIB);
}

/// A scan's fill that fails is returned to the reader and caches nothing; its huge buffer
/// goes back to the pool, and the same stream read again gets the bytes.
#[test]
fn a_failed_scan_fill_is_returned_and_not_cached() {
    let size = 32 * MIB;
    let bytes = content(14, size as usize);
    let (dev, cache, a, _) = two_readers(&bytes, 64 * MIB, 4 * MIB);
    // Past SCAN_AFTER_BYTES the stream is a scan; its next miss is a scan fill.
    let scan_from = block_cache::SCAN_AFTER_BYTES + MIB;
    stream(&*a, &bytes, 0..scan_from, 256 * KIB);
    let before = cache.stats();
    let mut buf = vec![0u8; (256 * KIB) as usize];
    dev.fail.store(true, Ordering::SeqCst);
    // Reads the last fill already holds succeed from the cache; the first miss fails.
    let mut at = scan_from;
    let err = loop {
        assert!(at < scan_from + 4 * MIB, "no scan fill within 4 MiB");
        match a.read_at(&mut buf, at) {
            Ok(()) => at += 256 * KIB,
            Err(e) => break e,
        }
    };
    dev.fail.store(false, Ordering::SeqCst);
    assert_eq!(err.kind(), ErrorKind::Io);
    let after = cache.stats();
    assert_eq!(after.cached_bytes, before.cached_bytes, "{after:?}");
    assert_eq!(after.store_read_bytes, before.store_read_bytes, "{after:?}");
    stream(&*a, &bytes, at..size, 256 * KIB);
    assert!(cache.stats().scan_evictions > 0, "{:?}", cache.stats());
}

#[test]
fn writes_trims_and_zeroes_are_refused() {
    let dev = Counting::new(vec![0u8; 1 << 20], 4096);
    let cache = BlockCache::new(1 << 20, 64 * 1024).unwrap();
    let wrapped = cache.wrap(key("a"), dev);
    let kinds = [
        wrapped.write_at(&[1], 0).unwrap_err().kind(),
        wrapped.trim(0, 4096).unwrap_err().kind(),
        wrapped.write_zeroes(0, 4096).unwrap_err().kind(),
    ];
    assert_eq!(kinds, [ErrorKind::ReadOnly; 3]);
    assert!(!wrapped.can_write());
}

/// A sequential 4 KiB reader gets later blocks from read-ahead once the stream has earned
/// it (its first 256 KiB), the prefetched blocks are counted as used, and no byte is read
/// from the store twice.
#[test]
fn sequential_reader_is_served_by_read_ahead() {
    const BLOCK: u64 = 64 * KIB;
    let dev = Counting::slow(
        content(9, (64 * BLOCK) as usize),
        BLOCK,
        Duration::from_micros(200),
    );
    let cache = BlockCache::new(1 << 30, BLOCK as u32).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    let mut buf = vec![0u8; 4096];
    for off in (0..64 * BLOCK).step_by(4096) {
        wrapped.read_at(&mut buf, off).unwrap();
    }
    let s = cache.stats();
    // How many reads beat the prefetch to a page depends on scheduling; that read-ahead ran,
    // was used, and never read a byte twice does not.
    assert!(s.read_ahead_jobs > 0 && s.read_ahead_blocks > 0, "{s:?}");
    assert!(s.read_ahead_used > 0, "{s:?}");
    assert_eq!(s.store_read_bytes, 64 * BLOCK, "{s:?}");
}

/// A reader faster than the store catches up with read-ahead and waits on its fills: each
/// prefetched block it then reads counts as used, so read-ahead is never judged wasted and
/// turned off (it once was, after the warm-up, for every reader that waited on a fill).
#[test]
fn blocks_a_reader_waited_for_count_as_read_ahead_used() {
    const BLOCK: u64 = 64 * KIB;
    const BLOCKS: u64 = 96;
    let dev = Counting::slow(
        content(11, (BLOCKS * BLOCK) as usize),
        BLOCK,
        Duration::from_millis(3),
    );
    let cache = BlockCache::new(1 << 30, BLOCK as u32).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    let mut buf = vec![0u8; BLOCK as usize];
    for off in (0..BLOCKS * BLOCK).step_by(BLOCK as usize) {
        wrapped.read_at(&mut buf, off).unwrap();
    }
    let s = cache.stats();
    assert!(
        s.inflight_waits > 0,
        "the reader never waited on a fill: {s:?}"
    );
    assert!(s.read_ahead_blocks > BLOCKS / 2, "{s:?}");
    // Every block was read once, so every prefetched one was used.
    assert_eq!(s.read_ahead_used, s.read_ahead_blocks, "{s:?}");
    assert_eq!(s.read_ahead_refused, 0, "{s:?}");
    assert_eq!(s.store_read_bytes, BLOCKS * BLOCK, "{s:?}");
}

/// Whole new blocks are read into a buffer per group (256 KiB) that the group's entries
/// share, with one store read per request however many groups it spans; under eviction
/// the entries of a group leave together, so the memory the cache holds follows its
/// charged bytes, and every byte read back is the store's. (Scans off: CLOCK alone evicts.)
#[test]
fn groups_are_read_once_and_leave_the_cache_together() {
    const BLOCK: u64 = 64 * KIB;
    const BLOCKS: u64 = 1024;
    let budget = 8 << 20;
    let bytes = content(12, (BLOCKS * BLOCK) as usize);
    let dev = Counting::new(bytes.clone(), BLOCK);
    let cfg = CacheConfig {
        budget_bytes: budget,
        block_bytes: BLOCK as u32,
        read_ahead_threads: 0,
        scan_window_bytes: 0,
        ..CacheConfig::default()
    };
    let cache = BlockCache::with_config(cfg).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    // A sequential pass in 1 MiB reads: 4 groups per read, 256 groups in all.
    let mut buf = vec![0u8; MIB as usize];
    let pass = |range: std::ops::Range<u64>, buf: &mut [u8]| {
        for off in range.step_by(MIB as usize) {
            wrapped.read_at(buf, off).unwrap();
            assert!(
                buf[..] == bytes[off as usize..(off + MIB) as usize],
                "at {off:#x}"
            );
        }
    };
    // The first 8 MiB, then a hit on one block of each of its groups (a set CLOCK bit),
    // then the rest: evicting a group's other entries alone would keep its whole buffer.
    pass(0..budget / 2, &mut buf);
    let mut one = vec![0u8; 4096];
    for g in (0..budget / 2).step_by((256 * KIB) as usize) {
        wrapped.read_at(&mut one, g + 3 * BLOCK).unwrap();
    }
    pass(budget / 2..BLOCKS * BLOCK, &mut buf);
    let s = cache.stats();
    assert_eq!(s.store_reads, BLOCKS * BLOCK / MIB, "{s:?}");
    assert_eq!(s.scan_evictions, 0, "{s:?}");
    assert_eq!(s.store_read_bytes, BLOCKS * BLOCK, "{s:?}");
    assert!(s.evictions > 0 && s.cached_bytes <= budget, "{s:?}");
    // Held beyond the budget: at most the read in flight and the pieces being copied out.
    assert!(
        s.resident_bytes_max <= budget + 2 * MIB,
        "resident max {} over budget {budget} + 2 MiB: evicted entries kept their group's buffer",
        s.resident_bytes_max
    );
    // Random reads across group boundaries after all that eviction: still the store's bytes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    for _ in 0..200 {
        let len = rng.gen_range(1..=300 * KIB) as usize;
        let off = rng.gen_range(0..BLOCKS * BLOCK - len as u64);
        let mut b = vec![0u8; len];
        wrapped.read_at(&mut b, off).unwrap();
        assert!(
            b[..] == bytes[off as usize..off as usize + len],
            "at {off:#x}+{len}"
        );
    }
    let s = cache.stats();
    assert!(s.resident_bytes_max <= budget + 2 * MIB, "{s:?}");
}

/// All-zero blocks keep no buffer: they are charged the entry overhead only.
#[test]
fn zero_blocks_are_charged_only_their_entry() {
    let dev = Counting::new(vec![0u8; 1 << 20], 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    cache.wrap(key("a"), dev).read_at(&mut buf, 0).unwrap();
    assert_eq!(cache.stats().cached_bytes, 16 * ENTRY_OVERHEAD_BYTES);
}

/// The last block of a device whose size is not a multiple of the granule is short.
#[test]
fn short_last_block_reads_correctly() {
    let bytes = content(10, 100_000);
    let dev = Counting::new(bytes.clone(), 4096);
    let cache = BlockCache::with_config(plain(1 << 30, 64 * 1024)).unwrap();
    let mut buf = vec![0u8; 100_000 - 65_000];
    cache.wrap(key("a"), dev).read_at(&mut buf, 65_000).unwrap();
    assert!(buf == bytes[65_000..]);
}

#[test]
fn read_past_the_end_is_out_of_bounds() {
    let dev = Counting::new(vec![0u8; 8192], 4096);
    let cache = BlockCache::new(1 << 20, 64 * 1024).unwrap();
    let mut buf = vec![0u8; 2];
    let err = cache
        .wrap(key("a"), dev)
        .read_at(&mut buf, 8191)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfBounds);
}

/// Reads `[0, size)` through `wrapped` in `req`-byte reads, checking every byte.
fn stream(wrapped: &dyn BlockDevice, bytes: &[u8], range: std::ops::Range<u64>, req: u64) {
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

/// A sequential pass over a chain larger than a quarter of the budget is a scan once it has
/// gone on for `SCAN_AFTER_BYTES`: only the last `scan_window_bytes` of what it filled stay
/// cached (the rest is evicted at once, however much budget is free), its fills reuse the
/// evicted buffers instead of new memory, and each byte still comes from the store once.
/// With scans off, the same pass keeps everything.
#[test]
fn a_scan_keeps_its_window_and_reuses_its_buffers() {
    const BLOCK: u64 = 64 * KIB;
    let size = 64 * MIB;
    let bytes = content(21, size as usize);
    for window in [4 * MIB, 0] {
        let dev = Counting::new(bytes.clone(), BLOCK);
        let cfg = CacheConfig {
            budget_bytes: 128 * MIB,
            block_bytes: BLOCK as u32,
            scan_window_bytes: window,
            ..CacheConfig::default()
        };
        let cache = BlockCache::with_config(cfg).unwrap();
        let wrapped = cache.wrap(key("a"), dev.clone());
        stream(&*wrapped, &bytes, 0..size, 256 * KIB);
        let s = cache.stats();
        assert_eq!(s.store_read_bytes, size, "window {window}: {s:?}");
        if window == 0 {
            assert_eq!((s.scan_evictions, s.buffers_reused), (0, 0), "{s:?}");
            assert!(s.cached_bytes >= size, "{s:?}");
            continue;
        }
        // Kept: the stream's first SCAN_AFTER_BYTES (not a scan yet), the window, and at
        // most one scan fill past it.
        let kept = block_cache::SCAN_AFTER_BYTES + window + block_cache::SCAN_FILL_BYTES;
        assert!(s.cached_bytes <= kept + MIB, "{s:?}");
        assert!(s.scan_evictions * BLOCK >= size - kept - MIB, "{s:?}");
        // A scan fill is one store read of SCAN_FILL_BYTES into one reused huge buffer.
        let fill = block_cache::SCAN_FILL_BYTES;
        assert!(s.buffers_reused * fill >= size / 2, "{s:?}");
        let scanned = size - block_cache::SCAN_AFTER_BYTES;
        assert!(
            s.store_reads <= (size - scanned) / BLOCK + scanned / fill + 2,
            "{s:?}"
        );
        assert!(s.resident_bytes <= kept + 2 * MIB, "{s:?}");
        // The window's blocks are still there: re-reading the last MiB reads nothing.
        let before = dev.bytes_read();
        stream(&*wrapped, &bytes, size - MIB..size, 256 * KIB);
        assert_eq!(dev.bytes_read(), before, "{:?}", cache.stats());
    }
}

/// Two wrappers of one chain holding `bytes` (64 KiB blocks) through a cache of `budget`
/// with a scan window of `window`: two connections reading the same vDisk.
fn two_readers(
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

/// A second reader close behind a scan (a second target copying the same vDisk) hits what
/// the first filled: the store is read once, and the blocks read twice survive the window.
#[test]
fn a_reader_close_behind_a_scan_shares_it() {
    let size = 48 * MIB;
    let bytes = content(22, size as usize);
    let (dev, cache, a, b) = two_readers(&bytes, 128 * MIB, 8 * MIB);
    // B follows A 1 MiB behind.
    let step = MIB;
    for off in (0..size + step).step_by(step as usize) {
        if off < size {
            stream(&*a, &bytes, off..off + step, 256 * KIB);
        }
        if off >= step {
            stream(&*b, &bytes, off - step..off, 256 * KIB);
        }
    }
    let s = cache.stats();
    assert_eq!(s.store_read_bytes, size, "{s:?}");
    assert_eq!(dev.bytes_read(), size, "each byte came from the store once");
    assert!(
        s.cached_bytes >= size - MIB,
        "blocks read twice stay: {s:?}"
    );
    // They were copied out of the scan's shared buffers, which went back to the pool (or were
    // unmapped): what is resident is what is cached, the window and the pool's idle buffers.
    assert!(s.scan_copies > 0, "{s:?}");
    let idle = block_cache::SCAN_POOL_BUFFERS_MAX as u64 * block_cache::SCAN_FILL_BYTES;
    assert!(
        s.resident_bytes <= s.cached_bytes + 8 * MIB + idle,
        "resident {} MiB for {} MiB cached: {s:?}",
        s.resident_bytes >> 20,
        s.cached_bytes >> 20
    );
}

/// A scan's fill is one huge buffer shared by its groups. When a second reader touches only
/// one group of each fill (256 KiB of every 2 MiB) before the window passes, those groups
/// stay, copied into buffers of their own: the fill buffers go back to the pool, so what is
/// resident stays near what is cached instead of a whole fill buffer per kept group.
#[test]
fn a_kept_scan_group_does_not_hold_its_fill_buffer() {
    let size = 96 * MIB;
    let fill = block_cache::SCAN_FILL_BYTES;
    let bytes = content(24, size as usize);
    let (dev, cache, a, b) = two_readers(&bytes, 256 * MIB, 8 * MIB);
    for off in (0..size).step_by(fill as usize) {
        stream(&*a, &bytes, off..off + fill, 256 * KIB);
        // B reads the first 256 KiB of the fill A just made.
        stream(&*b, &bytes, off..off + 256 * KIB, 256 * KIB);
    }
    let s = cache.stats();
    assert_eq!(s.store_read_bytes, size, "{s:?}");
    let scan_fills = (size - block_cache::SCAN_AFTER_BYTES) / fill;
    // Every fill the window has passed left one group copied out.
    assert!(s.scan_copies + 8 * MIB / fill + 2 >= scan_fills, "{s:?}");
    let idle = block_cache::SCAN_POOL_BUFFERS_MAX as u64 * fill;
    assert!(
        s.resident_bytes <= s.cached_bytes + 8 * MIB + fill + idle,
        "resident {} MiB for {} MiB cached: {s:?}",
        s.resident_bytes >> 20,
        s.cached_bytes >> 20
    );
    // The kept groups read right from their copies.
    let before = dev.bytes_read();
    for off in (0..size).step_by(fill as usize) {
        stream(&*b, &bytes, off..off + 256 * KIB, 256 * KIB);
    }
    assert_eq!(dev.bytes_read(), before, "{:?}", cache.stats());
}

/// A chain that fits in a quarter of the budget is never scanned: a whole pass stays cached
/// for the next reader.
#[test]
fn a_small_chain_is_never_scanned() {
    const BLOCK: u64 = 64 * KIB;
    let size = 24 * MIB;
    let bytes = content(23, size as usize);
    let dev = Counting::new(bytes.clone(), BLOCK);
    let cfg = CacheConfig {
        budget_bytes: 128 * MIB,
        block_bytes: BLOCK as u32,
        scan_window_bytes: 4 * MIB,
        ..CacheConfig::default()
    };
    let cache = BlockCache::with_config(cfg).unwrap();
    let wrapped = cache.wrap(key("a"), dev.clone());
    stream(&*wrapped, &bytes, 0..size, 256 * KIB);
    let s = cache.stats();
    assert_eq!(s.scan_evictions, 0, "{s:?}");
    assert!(s.cached_bytes >= size, "{s:?}");
}
