//! Sequential readers through the block cache: read-ahead and its accounting, groups (one
//! store read and one buffer per group, evicted together), and scans (a window of recent
//! fills, reused buffers, readers close behind, kept groups copied out, failed fills).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use block_cache::{BlockCache, CacheConfig};
use common::{Counting, KIB, MIB, content, key, stream, two_readers};
use disk::ErrorKind;
use rand::{Rng, SeedableRng};

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
