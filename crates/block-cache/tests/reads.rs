//! Reads through the block cache return the inner device's bytes: any reads and budgets
//! (properties), partial blocks and their completion, sharing between wrappers, keys and
//! invalidation, store errors, and the refused writes.

mod common;

use std::sync::atomic::Ordering;

use block_cache::{BlockCache, CacheConfig, ENTRY_OVERHEAD_BYTES};
use common::{Counting, KIB, MIB, content, key, plain};
use disk::{BlockDevice, ErrorKind};
use proptest::prelude::*;

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
