//! Warming a range (a boot set read ahead of a boot): exactly the missing pages are read
//! from the store, once, and a later demand read of them reads nothing more and returns the
//! inner device's bytes.

mod common;

use block_cache::{BlockCache, CacheConfig};
use common::{Counting, KIB, MIB, content, key, plain};
use disk::BlockDevice;
use proptest::prelude::*;

fn cache() -> BlockCache {
    BlockCache::with_config(CacheConfig {
        read_ahead_threads: 0,
        ..plain(64 * MIB, 64 << 10)
    })
    .unwrap()
}

#[test]
fn a_warmed_range_is_read_once_and_then_hits() {
    let size = 4 * MIB;
    let dev = Counting::new(content(1, size as usize), 4096);
    let cache = cache();
    let w = cache.wrap_device(key("a"), dev.clone());
    // 200 KiB from 10 KiB in: pages 2 to 52 (51 pages), three 64 KiB blocks and a part.
    let read = w.warm(10 * KIB, 200 * KIB).unwrap();
    assert_eq!(read, 51 * 4 * KIB);
    assert_eq!(dev.bytes_read(), 51 * 4 * KIB);
    assert_eq!(w.warm(10 * KIB, 200 * KIB).unwrap(), 0);
    let mut got = vec![0u8; 200 * KIB as usize];
    w.read_at(&mut got, 10 * KIB).unwrap();
    assert_eq!(dev.bytes_read(), 51 * 4 * KIB);
    let want = &content(1, size as usize)[10 * KIB as usize..210 * KIB as usize];
    assert!(got == want);
    assert_eq!(cache.stats().warm_bytes, 51 * 4 * KIB);
}

#[test]
fn a_warm_past_the_end_is_refused() {
    let dev = Counting::new(content(2, MIB as usize), 4096);
    let w = cache().wrap_device(key("a"), dev);
    assert!(w.warm(MIB - 4096, 8192).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any warms followed by any reads: warming the same ranges again reads nothing (the
    /// budget holds everything), and the reads return the inner bytes.
    #[test]
    fn warms_then_reads_read_each_page_once(
        seed in any::<u64>(),
        warms in prop::collection::vec((0u64..(2 << 20), 1u64..200_000), 1..20),
        reads in prop::collection::vec((0u64..(2 << 20), 1u64..200_000), 1..20),
    ) {
        let size = 2 * MIB;
        let bytes = content(seed, size as usize);
        let dev = Counting::new(bytes.clone(), 4096);
        let cache = cache();
        let w = cache.wrap_device(key("a"), dev.clone());
        for &(o, l) in &warms {
            w.warm(o, l.min(size - o)).unwrap();
        }
        let before = dev.bytes_read();
        for &(o, l) in &warms {
            prop_assert_eq!(w.warm(o, l.min(size - o)).unwrap(), 0);
        }
        prop_assert_eq!(dev.bytes_read(), before);
        for (o, l) in reads {
            let l = l.min(size - o) as usize;
            let mut got = vec![0u8; l];
            w.read_at(&mut got, o).unwrap();
            prop_assert!(got[..] == bytes[o as usize..o as usize + l]);
        }
    }
}
