//! The boot-set prefetch and the host read cache layer against Ferry's NBD server in this
//! process (no external tools): a prefetched set is then read from the cache, not the
//! server; a set used against another version fills only that version's bytes; a boot
//! that reads outside the set stops the prefetch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent::host_read::HostCached;
use agent::prefetch::{BootSetSource, Prefetch, PrefetchConfig, PrefetchState};
use agent::remote::{Remote, RemoteConfig, Replay};
use disk::BlockDevice;
use disk::device::{Geometry, check_bounds};
use host_cache::{HostCache, VersionIdentity, VersionKey};
use nbd_server::{
    ExportHandle, ExportInfo, ExportSource, Listener, NoMetrics, OpenError, Peer, ServerConfig,
};

/// Size of each test version.
const SIZE: u64 = 16 << 20;

/// A read-only version in RAM whose bytes depend on `seed`; counts the bytes read.
#[derive(Debug)]
struct Version {
    data: Vec<u8>,
    read_bytes: AtomicU64,
}

impl Version {
    fn new(seed: u64) -> Arc<Version> {
        let data = (0..SIZE)
            .map(|i| ((i / 4096).wrapping_mul(seed) ^ i.wrapping_mul(31)) as u8)
            .collect();
        Arc::new(Version {
            data,
            read_bytes: AtomicU64::new(0),
        })
    }

    fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        &self.data[offset as usize..(offset + len) as usize]
    }
}

impl BlockDevice for Version {
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }
    fn geometry(&self) -> Geometry {
        Geometry {
            size: SIZE,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }
    fn format(&self) -> &'static str {
        "mem"
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        check_bounds(SIZE, offset, buf.len() as u64)?;
        buf.copy_from_slice(self.bytes(offset, buf.len() as u64));
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> disk::Result<()> {
        Err(disk::Error::new(disk::ErrorKind::ReadOnly, "read-only"))
    }
    fn flush(&self) -> disk::Result<()> {
        Ok(())
    }
    fn can_write(&self) -> bool {
        false
    }
}

struct Source(Arc<Version>);

impl ExportSource for Source {
    fn list(&self, _peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        Ok(vec![ExportInfo {
            name: "golden".into(),
            description: String::new(),
            size: SIZE,
        }])
    }
    fn open(&self, _name: &str, _peer: &Peer) -> Result<ExportHandle, OpenError> {
        Ok(ExportHandle {
            device: Arc::clone(&self.0) as Arc<dyn BlockDevice>,
            writable: false,
            release: None,
            revoked: None,
        })
    }
}

/// A server of `v` on 127.0.0.1:0 on its own runtime (ends with the test process).
fn serve(v: &Arc<Version>) -> String {
    let source = Arc::new(Source(Arc::clone(v)));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let config = ServerConfig {
                nbd_listen: Some("127.0.0.1:0".parse().unwrap()),
                ..ServerConfig::default()
            };
            let l = Listener::bind(config).await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (_keep, never) = tokio::sync::oneshot::channel::<()>();
            l.serve(source, Arc::new(NoMetrics), never).await;
        });
    });
    rx.recv().unwrap().to_string()
}

/// `v` served and read through `cache` under the key of version `version`.
fn layer(v: &Arc<Version>, cache: &Arc<HostCache>, version: u64) -> Arc<HostCached> {
    let remote = Remote::connect(RemoteConfig {
        servers: vec![serve(v)],
        export: "golden".into(),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        failover_timeout: Duration::from_secs(10),
        replay: Replay::None,
        replay_bytes_max: 0,
        tls: None,
        relogin: None,
        refresh: None,
    })
    .unwrap();
    let key = VersionKey::new(&VersionIdentity {
        vdisk: "golden",
        version,
        size_bytes: SIZE,
        extra: b"",
    });
    Arc::new(HostCached::new(
        remote as Arc<dyn BlockDevice>,
        Arc::clone(cache),
        key,
    ))
}

/// Waits (bounded) until the prefetch is past fetching.
fn settled(p: &Prefetch) -> PrefetchState {
    for _ in 0..1000 {
        let s = p.status().state;
        if s != PrefetchState::Starting && s != PrefetchState::Fetching {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    p.status().state
}

/// 1 MiB + 200 KiB at 1 MiB, 64 KiB at 5 MiB, the first page: 4 + 1 + 1 blocks of 64 KiB.
fn set() -> Arc<dyn BootSetSource> {
    Arc::new(vec![(1 << 20, 200 << 10), (5 << 20, 64 << 10), (0, 4096)])
}

fn never() -> agent::prefetch::BootEnded {
    Arc::new(|| false)
}

#[test]
fn a_prefetched_boot_set_is_then_read_from_the_cache() {
    let v = Version::new(7);
    let cache = Arc::new(HostCache::private(8 << 20, 64 << 10).unwrap());
    let dev = layer(&v, &cache, 1);
    let p = Prefetch::start(&dev, set(), PrefetchConfig::default(), never());
    assert_eq!(settled(&p), PrefetchState::Done);
    assert_eq!(p.status().fetched_bytes, 6 * (64 << 10));
    let fetched = v.read_bytes.load(Ordering::Relaxed);
    for (offset, len) in [(1u64 << 20, 200u64 << 10), (5 << 20, 64 << 10), (0, 4096)] {
        let mut buf = vec![0u8; len as usize];
        dev.read_at(&mut buf, offset).unwrap();
        assert!(buf == v.bytes(offset, len), "bytes at {offset}");
    }
    assert_eq!(
        v.read_bytes.load(Ordering::Relaxed),
        fetched,
        "a read reached the server"
    );
}

#[test]
fn a_set_used_against_another_version_fills_only_that_version_s_bytes() {
    let (v1, v2) = (Version::new(7), Version::new(11));
    let cache = Arc::new(HostCache::private(8 << 20, 64 << 10).unwrap());
    let (d1, d2) = (layer(&v1, &cache, 1), layer(&v2, &cache, 2));
    // Version 1's boot set, prefetched by a device attached to version 2.
    let p = Prefetch::start(&d2, set(), PrefetchConfig::default(), never());
    assert_eq!(settled(&p), PrefetchState::Done);
    let mut a = vec![0u8; 200 << 10];
    d1.read_at(&mut a, 1 << 20).unwrap();
    assert!(
        a == v1.bytes(1 << 20, 200 << 10),
        "version 1 read other bytes"
    );
    let mut b = vec![0u8; 200 << 10];
    d2.read_at(&mut b, 1 << 20).unwrap();
    assert!(
        b == v2.bytes(1 << 20, 200 << 10),
        "version 2 read other bytes"
    );
    assert!(
        v1.read_bytes.load(Ordering::Relaxed) > 0,
        "version 1 was read from the cache"
    );
}

#[test]
fn a_boot_reading_outside_the_set_stops_the_prefetch() {
    let v = Version::new(3);
    let cache = Arc::new(HostCache::private(8 << 20, 64 << 10).unwrap());
    let dev = layer(&v, &cache, 1);
    // A set far away, one block ahead at most: the prefetch waits for the boot to reach it.
    let far: Arc<dyn BootSetSource> = Arc::new(
        (0..64u64)
            .map(|i| ((8 << 20) + (i << 16), 4096))
            .collect::<Vec<_>>(),
    );
    let cfg = PrefetchConfig {
        ahead_bytes: 64 << 10,
        inflight_bytes: 64 << 10,
        request_bytes: 64 << 10,
    };
    let p = Prefetch::start(&dev, far, cfg, never());
    while p.status().state == PrefetchState::Starting {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut buf = [0u8; 512];
    for i in 0..agent::prefetch::OUTSIDE_READS_MAX {
        dev.read_at(&mut buf, (i * 512) % (1 << 20)).unwrap();
    }
    assert_eq!(settled(&p), PrefetchState::MovedPast);
    assert!(
        p.status().fetched_bytes < 64 * 4096 * 16,
        "{:?}",
        p.status()
    );
}
