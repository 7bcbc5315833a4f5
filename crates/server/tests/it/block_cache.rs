//! The block cache over real VHDX chains, through the registry: cached reads equal the
//! uncached chain (property), a writable server-cache export over the cached parent follows
//! a byte model (property), block status passes through, a boot storm reads each block
//! of the store once, and one cold read over NBD probes the cache once.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use block_cache::{BlockCache, CacheConfig};
use disk::BlockDevice;
use disk::device::extents;
use disk::vhdx::CreateOptions;
use nbd_proto::Command;
use nbd_server::{ExportSource, Peer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use server::exports::{Registry, RegistryConfig};

const MIB: u64 = 1 << 20;
/// The vDisk's virtual size (a multiple of every granule here; block-cache's own tests cover
/// a short last block).
const SIZE: u64 = 6 * MIB;

/// Pseudo-random bytes from a seed.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn write_layer(path: &Path, writes: &[(u64, u64, u64)]) {
    let opts = disk::open::OpenOptions {
        writable: true,
        format: None,
    };
    let chain = disk::open::open(path, opts).unwrap();
    for &(off, len, seed) in writes {
        chain.top().write_at(&pattern(seed, len), off).unwrap();
    }
    chain.close().unwrap();
}

/// `store/golden.vhdx` + `golden.1.avhdx` + `golden.2.avhdx`, each layer writing
/// overlapping ranges, some sector-unaligned to the 1 MiB blocks (partially present blocks).
fn make_store(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    std::fs::create_dir(&store).unwrap();
    let base = store.join("golden.vhdx");
    let f = std::fs::File::create_new(&base).unwrap();
    let storage: Arc<dyn disk::Storage> = Arc::new(disk::FileStorage::new(f));
    let opts = CreateOptions {
        size: SIZE,
        block_size: MIB as u32,
        ..CreateOptions::default()
    };
    disk::vhdx::create(&storage, &opts).unwrap();
    write_layer(&base, &[(0, 3 * MIB, 1), (4 * MIB + 512, 1024, 2)]);
    let v1 = store.join("golden.1.avhdx");
    disk::version::new_version(&base, &v1).unwrap();
    write_layer(&v1, &[(MIB + 512, MIB, 3), (5 * MIB, 4096, 4)]);
    let v2 = store.join("golden.2.avhdx");
    disk::version::new_version(&v1, &v2).unwrap();
    write_layer(&v2, &[(1536 << 10, 8192, 5), (2 * MIB + 4096, 2 * MIB, 6)]);
    v2
}

fn registry(dir: &Path, cache: CacheConfig) -> Registry {
    let config = RegistryConfig {
        store_dir: dir.join("store"),
        write_cache_dir: dir.join("wc"),
    };
    Registry::new(config, BlockCache::with_config(cache).unwrap()).unwrap()
}

fn uncached(top: &Path) -> Arc<dyn BlockDevice> {
    disk::open::open(top, disk::open::OpenOptions::default())
        .unwrap()
        .top()
}

fn read(dev: &dyn BlockDevice, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    dev.read_at(&mut buf, offset).unwrap();
    buf
}

/// (offset, length) pairs inside the disk.
fn ranges(max_len: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..SIZE, 1..max_len), 1..24)
        .prop_map(|v| v.into_iter().map(|(o, l)| (o, l.min(SIZE - o))).collect())
}

/// Reads through a read-only export, with budgets from 4 to 64 blocks of 4 KiB (so
/// eviction runs) and read-ahead on, equal reads of the uncached chain.
#[test]
fn cached_export_reads_equal_the_uncached_chain() {
    let dir = tempfile::tempdir().unwrap();
    let reference = uncached(&make_store(dir.path()));
    let mut runner = TestRunner::new(Config::with_cases(24));
    let strategy = (4u64..64, ranges(300_000));
    runner
        .run(&strategy, |(budget_blocks, reads)| {
            let cfg = CacheConfig {
                budget_bytes: budget_blocks * (4096 + block_cache::ENTRY_OVERHEAD_BYTES),
                block_bytes: 4096,
                ..CacheConfig::default()
            };
            let reg = registry(dir.path(), cfg);
            let export = reg.open("golden", &Peer::new(None, true)).unwrap();
            for (off, len) in reads {
                let got = read(export.device.as_ref(), off, len);
                prop_assert!(got == read(reference.as_ref(), off, len), "{len} at {off}");
            }
            Ok(())
        })
        .unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, len: u64, seed: u64 },
    Zero { offset: u64, len: u64 },
    Read { offset: u64, len: u64 },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    // Sector-aligned offsets and lengths, as NBD clients of a 512-byte-sector disk send.
    let range =
        (0..SIZE / 512, 1u64..512).prop_map(|(s, n)| (s * 512, (n * 512).min(SIZE - s * 512)));
    prop_oneof![
        4 => (range.clone(), any::<u64>()).prop_map(|((offset, len), seed)| Op::Write { offset, len, seed }),
        1 => range.clone().prop_map(|(offset, len)| Op::Zero { offset, len }),
        3 => range.prop_map(|(offset, len)| Op::Read { offset, len }),
        1 => Just(Op::Flush),
    ]
}

/// A server-cache export (writes in the device's differencing file, reads of the rest
/// through the cached parent with a small budget) reads like a byte model of the newest
/// version with the same writes; the golden chain itself never changes.
#[test]
fn server_cache_export_follows_a_byte_model() {
    let dir = tempfile::tempdir().unwrap();
    let top = make_store(dir.path());
    let golden = read(uncached(&top).as_ref(), 0, SIZE);
    let mut runner = TestRunner::new(Config::with_cases(16));
    runner
        .run(&prop::collection::vec(op(), 1..40), |ops| {
            let cfg = CacheConfig {
                budget_bytes: 16 * (64 << 10),
                ..CacheConfig::default()
            };
            let reg = registry(dir.path(), cfg);
            let export = reg.open("golden+model", &Peer::new(None, true)).unwrap();
            let dev = export.device.as_ref();
            let mut model = golden.clone();
            for op in ops {
                match op {
                    Op::Write { offset, len, seed } => {
                        let data = pattern(seed, len);
                        dev.write_at(&data, offset).unwrap();
                        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                    }
                    Op::Zero { offset, len } => {
                        dev.write_zeroes(offset, len).unwrap();
                        model[offset as usize..(offset + len) as usize].fill(0);
                    }
                    Op::Read { offset, len } => {
                        let want = &model[offset as usize..(offset + len) as usize];
                        prop_assert!(read(dev, offset, len) == want, "{len} at {offset}");
                    }
                    Op::Flush => dev.flush().unwrap(),
                }
            }
            prop_assert!(read(dev, 0, SIZE) == model);
            Ok(())
        })
        .unwrap();
    assert!(read(uncached(&top).as_ref(), 0, SIZE) == golden);
}

/// Block status of a cached export is the chain's (the wrapper forwards the allocation map
/// and the parent links).
#[test]
fn block_status_through_the_cache_equals_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let top = make_store(dir.path());
    let reg = registry(dir.path(), CacheConfig::default());
    let export = reg.open("golden", &Peer::new(None, true)).unwrap();
    let want = extents(uncached(&top).as_ref(), 0, SIZE).unwrap();
    assert_eq!(extents(export.device.as_ref(), 0, SIZE).unwrap(), want);
}

/// Block status of a writable export shows its own writes as data.
#[test]
fn block_status_of_a_server_cache_export_shows_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    make_store(dir.path());
    let reg = registry(dir.path(), CacheConfig::default());
    let export = reg.open("golden@0+pc1", &Peer::new(None, true)).unwrap();
    export.device.write_at(&[7; 4096], 5 * MIB).unwrap();
    let map = extents(export.device.as_ref(), 5 * MIB, 4096).unwrap();
    assert_eq!(map.len(), 1);
    assert_eq!(map[0].kind, disk::ExtentKind::Data);
}

/// 16 connections booting the same version at once read each cached block from the store
/// once: the store bytes read equal the disk's size (each 64 KiB granule once).
#[test]
fn boot_storm_reads_each_block_from_the_store_once() {
    const CLIENTS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let top = make_store(dir.path());
    let golden = read(uncached(&top).as_ref(), 0, SIZE);
    let reg = registry(dir.path(), CacheConfig::default());
    let start = Arc::new(Barrier::new(CLIENTS));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (reg, start, golden) = (reg.clone(), start.clone(), golden.clone());
            std::thread::spawn(move || {
                let export = reg.open("golden", &Peer::new(None, true)).unwrap();
                start.wait();
                for off in (0..SIZE).step_by(128 << 10) {
                    let got = read(export.device.as_ref(), off, 128 << 10);
                    assert!(got[..] == golden[off as usize..off as usize + (128 << 10)]);
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(reg.cache().stats().store_read_bytes, SIZE);
}

/// A cold 4 KiB read over NBD, sent whole so the reader's batch parses it, probes the cache
/// once: the batch tries it in memory, the cache declines, and the slow path hands it to the
/// blocking pool (one fill) without parsing, checking or probing it again. The same read
/// again is one more probe, a hit.
#[test]
fn a_cold_read_over_nbd_probes_the_cache_once() {
    let dir = tempfile::tempdir().unwrap();
    let top = make_store(dir.path());
    let want = read(uncached(&top).as_ref(), MIB + 512, 4096);
    let reg = registry(dir.path(), CacheConfig::default());
    let srv = common::Server::start(Arc::new(reg.clone()));
    let mut c = common::Raw::go(srv.addr, "golden", false);
    let before = reg.cache().stats();
    c.request(&common::req(Command::Read, 1, MIB + 512, 4096));
    assert_eq!(c.reply(4096).1, want);
    let cold = reg.cache().stats();
    assert_eq!(cold.probes - before.probes, 1, "probes of a cold read");
    assert_eq!(cold.misses - before.misses, 1, "blocks filled");
    assert_eq!(cold.hits, before.hits);
    c.request(&common::req(Command::Read, 2, MIB + 512, 4096));
    assert_eq!(c.reply(4096).1, want);
    let warm = reg.cache().stats();
    assert_eq!(warm.probes - cold.probes, 1, "probes of a hit");
    assert_eq!(warm.hits - cold.hits, 1);
    assert_eq!(warm.misses, cold.misses);
}
