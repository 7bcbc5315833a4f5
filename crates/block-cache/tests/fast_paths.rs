//! The block cache, a decorator with data of its own, reaches the fast path of the device
//! below it that its fills rely on (one vectored read per run of missing blocks), answers
//! hits on every read path itself and declines the rest; and it is the crate's only
//! device.

use std::sync::Arc;

use block_cache::{BlockCache, CacheConfig, ChainKey};
use disk::BlockDevice;
use testkit::{Expect, Fast, FastProbe, check_fast_paths, device_types};

#[test]
fn the_cached_device_is_the_only_device_of_the_crate() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_eq!(device_types(&src), ["CachedDevice"]);
}

fn cache() -> BlockCache {
    BlockCache::with_config(CacheConfig {
        budget_bytes: 16 << 20,
        read_ahead_threads: 0,
        ..CacheConfig::default()
    })
    .unwrap()
}

/// What the cached device decides for each fast path, once the blocks the reads ask for
/// are cached.
fn cached_device(path: Fast) -> Expect {
    match path {
        // Hits, from the cache's buffers (the vectored read as reads of each buffer).
        Fast::ReadVectoredAt
        | Fast::TryReadAt
        | Fast::TryReadShared
        | Fast::SharesReads
        | Fast::ReadShared => Expect::Answers,
        // A read-only export: writes go to a write cache above; misses fill on a blocking
        // thread.
        Fast::TryWriteAt | Fast::SubmitRead | Fast::SubmitWrite => Expect::Declines,
    }
}

#[test]
fn hits_are_answered_on_every_read_path_and_the_rest_declined() {
    let probe = Arc::new(FastProbe::new(4 << 20));
    let cache = cache();
    let dev = cache.wrap(ChainKey::new("probe", None), probe.clone());
    // The first block, which every read of the check asks for, is cached.
    dev.read_at(&mut vec![0; 64 << 10], 0).unwrap();

    check_fast_paths(dev.as_ref(), &probe, cached_device);
}

#[test]
fn a_miss_fills_with_one_vectored_read_of_the_device_below() {
    let probe = Arc::new(FastProbe::new(4 << 20));
    probe.write_at(&[5; 1 << 20], 0).unwrap();
    let cache = cache();
    let dev = cache.wrap(ChainKey::new("probe", None), probe.clone());
    // A read of several whole blocks: one run, filled group by group.
    let mut buf = vec![0u8; 1 << 20];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![5; 1 << 20]);
    assert!(
        probe.calls(Fast::ReadVectoredAt) >= 1,
        "the fill read the device without its vectored fast path"
    );
    // The hit is served from the cache's own buffers.
    let pieces = dev.try_read_shared(0, 65536).expect("a hit").unwrap();
    assert_eq!(pieces.iter().map(|p| p.len()).sum::<usize>(), 65536);
}
