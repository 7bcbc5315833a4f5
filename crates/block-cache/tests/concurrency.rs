//! The block cache under concurrent readers: single-flight (each block read from the
//! store once however many readers miss it at once) and the memory bound (resident bytes
//! stay within the budget plus what each reader and worker holds in flight).

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use block_cache::{BlockCache, CacheConfig, ENTRY_OVERHEAD_BYTES};
use common::{Counting, KIB, content, key, plain};
use disk::BlockDevice;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

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
