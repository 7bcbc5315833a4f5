//! [`TieredObject`]: a read-only [`disk::Storage`] over one object of a bucket.
//!
//! Reads are served chunk by chunk (the manifest's chunk size, 1 MiB by default). A chunk
//! not yet in the local tier is fetched by one ranged GET and hashed; only when its BLAKE3
//! hash is the manifest's is it written to the tier file (sparse, 0600), made durable, and
//! marked present in the tier's map file, so a restarted server reads it from the tier
//! instead of the bucket. A chunk whose bytes differ is never returned: the read fails with
//! [`BucketError::HashMismatch`] naming the object, the chunk and both hashes. A chunk read
//! from the tier is hashed once per process before its first use, so a damaged tier file is
//! fetched again rather than served.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use manifest::Manifest;
use object_store::ObjectStore;
use object_store::path::Path as ObjPath;

use crate::BucketError;
use crate::bridge::Bridge;

/// The first bytes of a tier map file, followed by the manifest digest in hex and a newline.
pub const MAP_MAGIC: &[u8] = b"ferry-tier 1 ";
/// The length of a map file's header.
pub const MAP_HEADER_LEN: usize = MAP_MAGIC.len() + manifest::HASH_LEN * 2 + 1;
/// How many locks chunk fetches are spread over (one fetch per chunk at a time).
const FETCH_STRIPES: usize = 64;
/// The mode of tier files: the server's own cache.
pub const TIER_FILE_MODE: u32 = 0o600;

/// Counters of tiered reads, shared by every object of a store.
#[derive(Debug, Default)]
pub struct TierStats {
    /// Ranged GETs made.
    pub gets: AtomicU64,
    /// Bytes fetched by them.
    pub fetched_bytes: AtomicU64,
    /// Chunks read from the tier (first use in this process).
    pub tier_chunks: AtomicU64,
    /// Chunks refused for a hash mismatch (from the bucket or the tier).
    pub mismatches: AtomicU64,
}

impl TierStats {
    /// The GETs made so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::Relaxed)
    }
}

/// Where an object's bytes come from and where the tier keeps them.
#[derive(Debug)]
pub struct ObjectSource {
    /// The client.
    pub store: Arc<dyn ObjectStore>,
    /// The runtime its requests run on.
    pub bridge: Arc<Bridge>,
    /// The object's key.
    pub key: ObjPath,
    /// `s3://BUCKET/KEY`, for messages.
    pub url: String,
}

#[derive(Debug)]
struct Bits {
    present: Vec<u8>,
    verified: Vec<u8>,
}

fn bit(v: &[u8], i: u64) -> bool {
    v[(i / 8) as usize] & (1 << (i % 8)) != 0
}

fn set_bit(v: &mut [u8], i: u64, on: bool) {
    let b = &mut v[(i / 8) as usize];
    if on {
        *b |= 1 << (i % 8);
    } else {
        *b &= !(1 << (i % 8));
    }
}

/// A read-only, hash-verified, locally tiered view of one object.
#[derive(Debug)]
pub struct TieredObject {
    source: ObjectSource,
    manifest: Arc<Manifest>,
    data: File,
    data_path: PathBuf,
    map: File,
    map_path: PathBuf,
    bits: Mutex<Bits>,
    stripes: Vec<Mutex<()>>,
    stats: Arc<TierStats>,
}

fn open_tier_file(path: &Path) -> Result<File, BucketError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(TIER_FILE_MODE)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(BucketError::io("open tier file", path))
}

impl TieredObject {
    /// Opens the tier of `manifest`'s object: `data` (the bytes, sparse) and `map` (the
    /// chunks present), created if missing and started afresh when the map belongs to
    /// another manifest.
    ///
    /// # Errors
    /// [`BucketError::Io`] on the tier files.
    pub fn open(
        source: ObjectSource,
        manifest: Arc<Manifest>,
        data_path: &Path,
        map_path: &Path,
        stats: Arc<TierStats>,
    ) -> Result<TieredObject, BucketError> {
        let data = open_tier_file(data_path)?;
        let map = open_tier_file(map_path)?;
        let n = manifest.chunk_count();
        let bitmap_len = n.div_ceil(8) as usize;
        let mut header = Vec::with_capacity(MAP_HEADER_LEN);
        header.extend_from_slice(MAP_MAGIC);
        header.extend_from_slice(hex::encode(manifest.digest).as_bytes());
        header.push(b'\n');
        let mut have = vec![0u8; MAP_HEADER_LEN + bitmap_len];
        let len = map
            .metadata()
            .map_err(BucketError::io("stat", map_path))?
            .len();
        let fresh = len != have.len() as u64
            || map.read_exact_at(&mut have, 0).is_err()
            || have[..MAP_HEADER_LEN] != header[..];
        let present = if fresh {
            // Another manifest's tier, or none yet: its bytes are dropped.
            let err = BucketError::io("reset tier file", data_path);
            data.set_len(0).map_err(err)?;
            have[..MAP_HEADER_LEN].copy_from_slice(&header);
            have[MAP_HEADER_LEN..].fill(0);
            map.set_len(0)
                .and_then(|()| map.write_all_at(&have, 0))
                .and_then(|()| map.sync_data())
                .map_err(BucketError::io("write tier map", map_path))?;
            vec![0u8; bitmap_len]
        } else {
            have[MAP_HEADER_LEN..].to_vec()
        };
        data.set_len(manifest.size)
            .map_err(BucketError::io("size tier file", data_path))?;
        Ok(TieredObject {
            source,
            manifest,
            data,
            data_path: data_path.to_path_buf(),
            map,
            map_path: map_path.to_path_buf(),
            bits: Mutex::new(Bits {
                present,
                verified: vec![0u8; bitmap_len],
            }),
            stripes: (0..FETCH_STRIPES).map(|_| Mutex::new(())).collect(),
            stats,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How many chunks the tier holds.
    pub fn chunks_present(&self) -> u64 {
        let b = self.bits.lock().unwrap_or_else(|e| e.into_inner());
        b.present.iter().map(|x| u64::from(x.count_ones())).sum()
    }

    fn state(&self, i: u64) -> (bool, bool) {
        let b = self.bits.lock().unwrap_or_else(|e| e.into_inner());
        (bit(&b.present, i), bit(&b.verified, i))
    }

    fn mismatch(&self, object: String, i: u64, actual: manifest::Hash) -> BucketError {
        self.stats.mismatches.fetch_add(1, Ordering::Relaxed);
        let (start, end) = self.manifest.chunk_range(i);
        BucketError::HashMismatch {
            object,
            chunk: i,
            start,
            end,
            expected: hex::encode(self.manifest.chunks[i as usize]),
            actual: hex::encode(actual),
        }
    }

    /// Makes chunk `i` present and verified; returns its bytes when they were read here
    /// (so the caller need not read them again), `None` when the tier file holds them.
    fn ensure(&self, i: u64) -> Result<Option<Vec<u8>>, BucketError> {
        if self.state(i) == (true, true) {
            return Ok(None);
        }
        let _one = self.stripes[(i as usize) % FETCH_STRIPES]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (present, verified) = self.state(i);
        if present && verified {
            return Ok(None);
        }
        let (start, end) = self.manifest.chunk_range(i);
        if present {
            let mut buf = vec![0u8; (end - start) as usize];
            self.data
                .read_exact_at(&mut buf, start)
                .map_err(BucketError::io("read tier file", &self.data_path))?;
            match self.manifest.check_chunk(i, &buf) {
                Ok(()) => {
                    self.stats.tier_chunks.fetch_add(1, Ordering::Relaxed);
                    let mut b = self.bits.lock().unwrap_or_else(|e| e.into_inner());
                    set_bit(&mut b.verified, i, true);
                    return Ok(Some(buf));
                }
                Err(actual) => {
                    let e = self.mismatch(self.data_path.display().to_string(), i, actual);
                    tracing::warn!(error = %e, "tier chunk damaged; fetching it again");
                }
            }
        }
        let store = self.source.store.clone();
        let key = self.source.key.clone();
        let got = self
            .source
            .bridge
            .run(async move { store.get_range(&key, start..end).await })?
            .map_err(BucketError::store("read", self.source.url.clone()))?;
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        self.stats
            .fetched_bytes
            .fetch_add(got.len() as u64, Ordering::Relaxed);
        if let Err(actual) = self.manifest.check_chunk(i, &got) {
            return Err(self.mismatch(self.source.url.clone(), i, actual));
        }
        // The bytes are durable before the map says they are there.
        self.data
            .write_all_at(&got, start)
            .and_then(|()| self.data.sync_data())
            .map_err(BucketError::io("write tier file", &self.data_path))?;
        let mut b = self.bits.lock().unwrap_or_else(|e| e.into_inner());
        set_bit(&mut b.present, i, true);
        set_bit(&mut b.verified, i, true);
        let byte = b.present[(i / 8) as usize];
        self.map
            .write_all_at(&[byte], (MAP_HEADER_LEN as u64) + i / 8)
            .map_err(BucketError::io("write tier map", &self.map_path))?;
        Ok(Some(got.to_vec()))
    }

    /// Reads `buf.len()` bytes at `offset` (zeros past the end).
    ///
    /// # Errors
    /// [`BucketError`]: a failed GET, a hash mismatch, tier I/O.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), BucketError> {
        let size = self.manifest.size;
        let end = offset.saturating_add(buf.len() as u64);
        let data_end = end.min(size);
        if offset >= size {
            buf.fill(0);
            return Ok(());
        }
        buf[(data_end - offset) as usize..].fill(0);
        let mut pos = offset;
        while pos < data_end {
            let i = pos / self.manifest.chunk_size;
            let (start, chunk_end) = self.manifest.chunk_range(i);
            let n = (chunk_end.min(data_end) - pos) as usize;
            let at = (pos - offset) as usize;
            match self.ensure(i)? {
                Some(bytes) => {
                    let from = (pos - start) as usize;
                    buf[at..at + n].copy_from_slice(&bytes[from..from + n]);
                }
                None => self
                    .data
                    .read_exact_at(&mut buf[at..at + n], pos)
                    .map_err(BucketError::io("read tier file", &self.data_path))?,
            }
            pos += n as u64;
        }
        Ok(())
    }
}

fn read_only() -> disk::Error {
    disk::Error::new(disk::ErrorKind::ReadOnly, "a bucket object is read-only")
}

impl disk::Storage for TieredObject {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        self.read(buf, offset).map_err(|e| {
            tracing::error!(error = %e, "bucket read failed");
            e.into_disk()
        })
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> disk::Result<()> {
        Err(read_only())
    }
    fn flush(&self) -> disk::Result<()> {
        Ok(())
    }
    fn len(&self) -> disk::Result<u64> {
        Ok(self.manifest.size)
    }
    fn set_len(&self, _len: u64) -> disk::Result<()> {
        Err(read_only())
    }
    fn punch_hole(&self, _offset: u64, _len: u64) -> disk::Result<()> {
        Err(read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    fn setup(data: &[u8]) -> (Arc<InMemory>, Arc<Bridge>, Arc<Manifest>, tempfile::TempDir) {
        let store = Arc::new(InMemory::new());
        let bridge = Arc::new(Bridge::new().unwrap());
        let s = store.clone();
        let bytes = data.to_vec();
        bridge
            .run(async move {
                s.put(&ObjPath::from("p/d.vhdx"), PutPayload::from(bytes))
                    .await
            })
            .unwrap()
            .unwrap();
        let m = manifest::of_bytes("d.vhdx", manifest::MIN_CHUNK_SIZE, data).unwrap();
        (store, bridge, Arc::new(m), tempfile::tempdir().unwrap())
    }

    fn open(
        store: &Arc<InMemory>,
        bridge: &Arc<Bridge>,
        m: &Arc<Manifest>,
        dir: &Path,
        stats: Arc<TierStats>,
    ) -> TieredObject {
        TieredObject::open(
            ObjectSource {
                store: store.clone(),
                bridge: bridge.clone(),
                key: ObjPath::from("p/d.vhdx"),
                url: "s3://b/p/d.vhdx".into(),
            },
            m.clone(),
            &dir.join("d.vhdx"),
            &dir.join("d.vhdx.map"),
            stats,
        )
        .unwrap()
    }

    fn data() -> Vec<u8> {
        (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn reads_verify_and_a_reopen_fetches_nothing_again() {
        let d = data();
        let (store, bridge, m, dir) = setup(&d);
        let stats = Arc::new(TierStats::default());
        let o = open(&store, &bridge, &m, dir.path(), stats.clone());
        let mut buf = vec![0u8; 6000];
        o.read(&mut buf, 3000).unwrap();
        assert_eq!(buf, d[3000..9000]);
        assert_eq!(stats.gets(), 3, "chunks 0, 1 and 2");
        o.read(&mut buf, 3000).unwrap();
        assert_eq!(stats.gets(), 3, "served from the tier");
        // Past the end reads as zeros.
        let mut tail = vec![1u8; 100];
        o.read(&mut tail, 19_950).unwrap();
        assert_eq!(&tail[..50], &d[19_950..]);
        assert!(tail[50..].iter().all(|&b| b == 0));
        drop(o);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("d.vhdx"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, TIER_FILE_MODE);
        // A new process (a new object over the same tier) fetches nothing it had.
        let stats2 = Arc::new(TierStats::default());
        let o = open(&store, &bridge, &m, dir.path(), stats2.clone());
        assert_eq!(o.chunks_present(), 4, "chunks 0, 1, 2 and 4");
        o.read(&mut buf, 3000).unwrap();
        assert_eq!(buf, d[3000..9000]);
        assert_eq!(stats2.gets(), 0);
    }

    #[test]
    fn a_changed_object_is_a_hash_mismatch_and_never_returned() {
        let d = data();
        let (store, bridge, m, dir) = setup(&d);
        let mut changed = d.clone();
        changed[5000] ^= 1;
        let s = store.clone();
        bridge
            .run(async move {
                s.put(&ObjPath::from("p/d.vhdx"), PutPayload::from(changed))
                    .await
            })
            .unwrap()
            .unwrap();
        let o = open(&store, &bridge, &m, dir.path(), Arc::default());
        let mut buf = vec![0u8; 100];
        o.read(&mut buf, 0).unwrap();
        let mut buf = vec![0u8; 100];
        let e = o.read(&mut buf, 4900).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("s3://b/p/d.vhdx chunk 1"), "{text}");
        assert!(text.contains(&hex::encode(m.chunks[1])), "{text}");
        assert!(
            buf.iter().all(|&b| b == 0),
            "no byte of the chunk was copied"
        );
        assert_eq!(o.chunks_present(), 1);
    }

    #[test]
    fn a_damaged_tier_chunk_is_fetched_again() {
        let d = data();
        let (store, bridge, m, dir) = setup(&d);
        let o = open(&store, &bridge, &m, dir.path(), Arc::default());
        let mut buf = vec![0u8; 4096];
        o.read(&mut buf, 0).unwrap();
        drop(o);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("d.vhdx"))
            .unwrap();
        f.write_all_at(b"XXXX", 10).unwrap();
        let stats = Arc::new(TierStats::default());
        let o = open(&store, &bridge, &m, dir.path(), stats.clone());
        o.read(&mut buf, 0).unwrap();
        assert_eq!(buf, d[..4096]);
        assert_eq!(stats.gets(), 1);
        assert_eq!(stats.mismatches.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_map_of_another_manifest_starts_afresh() {
        let d = data();
        let (store, bridge, m, dir) = setup(&d);
        let o = open(&store, &bridge, &m, dir.path(), Arc::default());
        o.read(&mut [0u8; 10], 0).unwrap();
        drop(o);
        let mut other = (*m).clone();
        other.digest[0] ^= 1;
        let o = open(
            &store,
            &bridge,
            &Arc::new(other),
            dir.path(),
            Arc::default(),
        );
        assert_eq!(o.chunks_present(), 0);
    }
}
