//! The block cache, a decorator, reaches the fast path of the device below it that its
//! fills rely on: one vectored read per run of missing blocks.

use std::sync::Arc;

use block_cache::{BlockCache, CacheConfig, ChainKey};
use disk::BlockDevice;
use testkit::{Fast, FastProbe};

#[test]
fn a_miss_fills_with_one_vectored_read_of_the_device_below() {
    let probe = Arc::new(FastProbe::new(4 << 20));
    probe.write_at(&[5; 1 << 20], 0).unwrap();
    let cache = BlockCache::with_config(CacheConfig {
        budget_bytes: 16 << 20,
        read_ahead_threads: 0,
        ..CacheConfig::default()
    })
    .unwrap();
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
