//! Moving vDisks between a local store and a bucket: [`push`] uploads a file as a new,
//! write-once object with its manifest; [`fill`] copies a bucket prefix into a local
//! directory store, checking every chunk; [`verify`] compares a local store with the
//! bucket's manifests chunk by chunk.
//!
//! A version is published when its manifest object exists. Both the object and its
//! manifest are written with `PutMode::Create` (an `If-None-Match: *` PUT, refused by the
//! server when the key exists) where the upload is one request; larger objects go up in
//! parts after a check that neither key exists, and the manifest is still created
//! write-once last, so a second upload racing the first can never publish over it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use manifest::{Builder, CHUNK_SIZE, Manifest};
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, WriteMultipart};

use crate::objects::{exists, get_manifest, list};
use crate::{BucketError, BucketUrl, Keys, is_vdisk_file, manifest_name};

/// Files up to this size are uploaded in one write-once PUT; larger ones in parts.
pub const SINGLE_PUT_MAX: u64 = 64 << 20;
/// The size of one part of a multipart upload.
pub const PART_SIZE: usize = 16 << 20;
/// Parts uploaded at once.
pub const PARTS_IN_FLIGHT: usize = 4;

/// Progress callback: bytes done, bytes in all.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

async fn put_create(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    name: &str,
    payload: PutPayload,
) -> Result<(), BucketError> {
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.put_opts(&url.key(name), payload, opts).await {
        Ok(_) => Ok(()),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => Err(BucketError::Exists(url.url_of(name))),
        Err(e) => Err(BucketError::store("upload", url.url_of(name))(e)),
    }
}

/// Uploads `file` as object `name` under `url` with its manifest, refusing when either
/// already exists (a published version is never rewritten).
///
/// # Errors
/// [`BucketError::Exists`], store and local errors.
pub async fn push(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    file: &Path,
    name: &str,
    progress: Progress<'_>,
) -> Result<Manifest, BucketError> {
    if !is_vdisk_file(name) {
        return Err(BucketError::Missing(format!(
            "{name:?} is not a vDisk file name (NAME.vhdx or NAME.N.avhdx)"
        )));
    }
    for n in [name.to_string(), manifest_name(name)] {
        if exists(store, url, &n).await? {
            return Err(BucketError::Exists(url.url_of(&n)));
        }
    }
    let mut f = File::open(file).map_err(BucketError::io("open", file))?;
    let total = f.metadata().map_err(BucketError::io("stat", file))?.len();
    let mut builder = Builder::new(name, CHUNK_SIZE).map_err(|source| BucketError::Manifest {
        url: url.url_of(name),
        source,
    })?;
    let to_manifest_err = |source| BucketError::Manifest {
        url: url.url_of(name),
        source,
    };
    if total <= SINGLE_PUT_MAX {
        let mut bytes = Vec::with_capacity(total as usize);
        f.read_to_end(&mut bytes)
            .map_err(BucketError::io("read", file))?;
        builder.update(&bytes).map_err(to_manifest_err)?;
        put_create(store, url, name, PutPayload::from(bytes)).await?;
        progress(total, total);
    } else {
        let upload = store
            .put_multipart(&url.key(name))
            .await
            .map_err(BucketError::store("upload", url.url_of(name)))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut buf = vec![0u8; PART_SIZE];
        let mut done = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(BucketError::io("read", file))?;
            if n == 0 {
                break;
            }
            builder.update(&buf[..n]).map_err(to_manifest_err)?;
            w.wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(BucketError::store("upload", url.url_of(name)))?;
            w.write(&buf[..n]);
            done += n as u64;
            progress(done, total);
        }
        w.finish()
            .await
            .map_err(BucketError::store("upload", url.url_of(name)))?;
    }
    let m = builder.finish().map_err(to_manifest_err)?;
    put_create(
        store,
        url,
        &manifest_name(name),
        PutPayload::from(m.encode().into_bytes()),
    )
    .await?;
    Ok(m)
}

/// What [`publish`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Uploaded now.
    Uploaded,
    /// Already in the bucket with the same bytes (its manifest equals the file's).
    AlreadyThere,
}

/// [`push`], except that an object already published with the same bytes counts as done
/// (a retry after a crash between the upload and whatever recorded it). Other bytes under
/// the name stay an error: [`BucketError::Exists`].
///
/// # Errors
/// [`BucketError::Exists`] when the bucket holds other bytes (or only one of the object and
/// its manifest); store and local errors.
pub async fn publish(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    file: &Path,
    name: &str,
) -> Result<Published, BucketError> {
    match push(store, url, file, name, &|_, _| {}).await {
        Ok(_) => Ok(Published::Uploaded),
        Err(BucketError::Exists(what)) => {
            let there = match get_manifest(store, url, name, None).await {
                Ok(m) if exists(store, url, name).await? => m,
                _ => return Err(BucketError::Exists(what)),
            };
            let (f, n, c) = (file.to_path_buf(), name.to_string(), there.chunk_size);
            let local = tokio::task::spawn_blocking(move || hash_file(&f, &n, c))
                .await
                .map_err(|e| BucketError::Runtime(e.to_string()))??;
            if local == there {
                Ok(Published::AlreadyThere)
            } else {
                Err(BucketError::Exists(url.url_of(name)))
            }
        }
        Err(e) => Err(e),
    }
}

/// True when the bucket holds object `name` or its manifest.
///
/// # Errors
/// Store errors.
pub async fn holds(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    name: &str,
) -> Result<bool, BucketError> {
    Ok(exists(store, url, name).await? || exists(store, url, &manifest_name(name)).await?)
}

/// What [`fill`] did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FillReport {
    /// Objects copied.
    pub copied: Vec<String>,
    /// Objects already there with the same manifest and bytes.
    pub unchanged: Vec<String>,
    /// Bytes fetched.
    pub bytes: u64,
}

/// Copies every vDisk under `url` into the local store `dir` (created if missing): each
/// chunk is checked against the manifest before it is written; a file whose manifest and
/// bytes already match is left alone. Files are written under a hidden name and renamed
/// into place, with the manifest beside them.
///
/// # Errors
/// Store errors, [`BucketError::HashMismatch`], local I/O.
pub async fn fill(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<FillReport, BucketError> {
    std::fs::create_dir_all(dir).map_err(BucketError::io("create", dir))?;
    let listing = list(store, url).await?;
    let mut manifests = Vec::new();
    for (name, size) in &listing.objects {
        manifests.push(get_manifest(store, url, name, Some(*size)).await?);
    }
    let total: u64 = manifests.iter().map(|m| m.size).sum();
    let mut done = 0u64;
    let mut report = FillReport::default();
    for m in manifests {
        let path = dir.join(&m.name);
        if local_matches(&path, &m)? {
            done += m.size;
            progress(done, total);
            report.unchanged.push(m.name.clone());
            continue;
        }
        let part = dir.join(format!(".{}.part", m.name));
        let out = File::create(&part).map_err(BucketError::io("create", &part))?;
        let key = url.key(&m.name);
        for i in 0..m.chunk_count() {
            let (s, e) = m.chunk_range(i);
            let bytes = store
                .get_range(&key, s..e)
                .await
                .map_err(BucketError::store("read", url.url_of(&m.name)))?;
            if let Err(actual) = m.check_chunk(i, &bytes) {
                drop(out);
                let _ = std::fs::remove_file(&part);
                return Err(BucketError::HashMismatch {
                    object: url.url_of(&m.name),
                    chunk: i,
                    start: s,
                    end: e,
                    expected: hex::encode(m.chunks[i as usize]),
                    actual: hex::encode(actual),
                });
            }
            out.write_all_at(&bytes, s)
                .map_err(BucketError::io("write", &part))?;
            done += e - s;
            report.bytes += e - s;
            progress(done, total);
        }
        out.set_len(m.size)
            .and_then(|()| out.sync_all())
            .map_err(BucketError::io("write", &part))?;
        std::fs::write(dir.join(manifest_name(&m.name)), m.encode())
            .map_err(BucketError::io("write", dir.join(manifest_name(&m.name))))?;
        std::fs::rename(&part, &path).map_err(BucketError::io("rename", &part))?;
        report.copied.push(m.name.clone());
    }
    Ok(report)
}

/// True when `path` exists and its bytes have manifest `m`.
fn local_matches(path: &Path, m: &Manifest) -> Result<bool, BucketError> {
    match hash_file(path, &m.name, m.chunk_size) {
        Ok(local) => Ok(local == *m),
        Err(BucketError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The manifest of a local file.
///
/// # Errors
/// Local I/O; a name the manifest refuses.
pub fn hash_file(path: &Path, name: &str, chunk_size: u64) -> Result<Manifest, BucketError> {
    let mut f = File::open(path).map_err(BucketError::io("open", path))?;
    let merr = |source| BucketError::Manifest {
        url: path.display().to_string(),
        source,
    };
    let mut b = Builder::new(name, chunk_size).map_err(merr)?;
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).map_err(BucketError::io("read", path))?;
        if n == 0 {
            break;
        }
        b.update(&buf[..n]).map_err(merr)?;
    }
    b.finish().map_err(merr)
}

/// One object's state in [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ObjectState {
    /// The local file has the bucket manifest's bytes.
    Same,
    /// The local file is missing.
    Missing,
    /// These chunks differ (a different size counts every chunk past the shorter).
    Differs {
        /// Chunk indices.
        chunks: Vec<u64>,
        /// The chunk size.
        chunk_size: u64,
    },
    /// The bucket's own bytes of these chunks do not match its manifest (a corrupted or
    /// replaced object; only looked for with [`Depth::Bytes`]).
    BucketCorrupt {
        /// Chunk indices.
        chunks: Vec<u64>,
        /// The chunk size.
        chunk_size: u64,
    },
}

/// How deep [`verify`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The local files against the bucket's manifests (the manifests are read, not the
    /// objects): proves the local copy is what the bucket's manifests describe.
    Manifests,
    /// That, and every chunk of every object read from the bucket and hashed against its
    /// manifest: proves the bucket's bytes too.
    Bytes,
}

/// What [`verify`] found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct VerifyReport {
    /// Every bucket object, by name.
    pub objects: BTreeMap<String, ObjectState>,
    /// vDisk files in the local store that the bucket does not have.
    pub local_only: Vec<String>,
}

impl VerifyReport {
    /// True when every bucket object is in the local store with the same bytes.
    pub fn all_same(&self) -> bool {
        self.objects.values().all(|s| *s == ObjectState::Same)
    }
}

/// Compares the local store `dir` with the bucket's manifests, and with [`Depth::Bytes`]
/// the bucket's objects with their manifests.
///
/// # Errors
/// Store errors, local I/O other than missing files.
pub async fn verify(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    dir: &Path,
    depth: Depth,
    progress: Progress<'_>,
) -> Result<VerifyReport, BucketError> {
    let listing = list(store, url).await?;
    let mut report = VerifyReport::default();
    let mut manifests = Vec::new();
    for (name, size) in &listing.objects {
        manifests.push(get_manifest(store, url, name, Some(*size)).await?);
    }
    let passes = if depth == Depth::Bytes { 2 } else { 1 };
    let total: u64 = manifests.iter().map(|m| m.size).sum::<u64>() * passes;
    let mut done = 0;
    for m in &manifests {
        if depth == Depth::Bytes {
            let key = url.key(&m.name);
            let mut corrupt = Vec::new();
            for i in 0..m.chunk_count() {
                let (s, e) = m.chunk_range(i);
                let bytes = store
                    .get_range(&key, s..e)
                    .await
                    .map_err(BucketError::store("read", url.url_of(&m.name)))?;
                if m.check_chunk(i, &bytes).is_err() {
                    corrupt.push(i);
                }
                done += e - s;
                progress(done, total);
            }
            if !corrupt.is_empty() {
                report.objects.insert(
                    m.name.clone(),
                    ObjectState::BucketCorrupt {
                        chunks: corrupt,
                        chunk_size: m.chunk_size,
                    },
                );
                done += m.size;
                progress(done, total);
                continue;
            }
        }
        let path: PathBuf = dir.join(&m.name);
        let state = match hash_file(&path, &m.name, m.chunk_size) {
            Ok(local) if local == *m => ObjectState::Same,
            Ok(local) => ObjectState::Differs {
                chunks: m.differing_chunks(&local),
                chunk_size: m.chunk_size,
            },
            Err(BucketError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                ObjectState::Missing
            }
            Err(e) => return Err(e),
        };
        done += m.size;
        progress(done, total);
        report.objects.insert(m.name.clone(), state);
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if is_vdisk_file(&n) && !report.objects.contains_key(&n) {
                report.local_only.push(n);
            }
        }
    }
    report.local_only.sort();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    fn file(dir: &Path, name: &str, len: usize, seed: u8) -> PathBuf {
        let p = dir.join(name);
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn publish_counts_the_same_bytes_as_done_and_refuses_other_bytes() {
        let d = tempfile::tempdir().unwrap();
        let store = InMemory::new();
        let url = BucketUrl::parse("s3://bkt/p").unwrap();
        let one = file(d.path(), "a.vhdx", 2 << 20, 1);
        let rt = rt();
        let first = rt.block_on(publish(&store, &url, &one, "a.vhdx")).unwrap();
        assert_eq!(first, Published::Uploaded);
        assert!(rt.block_on(holds(&store, &url, "a.vhdx")).unwrap());
        assert!(!rt.block_on(holds(&store, &url, "a.1.avhdx")).unwrap());
        // A retry with the same bytes (a crash between the upload and the farm's row).
        let again = rt.block_on(publish(&store, &url, &one, "a.vhdx")).unwrap();
        assert_eq!(again, Published::AlreadyThere);
        // Other bytes under the published name: refused, the object unchanged.
        let other = file(d.path(), "b.vhdx", 2 << 20, 9);
        let r = rt.block_on(publish(&store, &url, &other, "a.vhdx"));
        assert!(matches!(r, Err(BucketError::Exists(_))), "{r:?}");
        let there = rt
            .block_on(async { store.get(&url.key("a.vhdx")).await.unwrap().bytes().await })
            .unwrap();
        assert_eq!(there.as_ref(), std::fs::read(&one).unwrap().as_slice());
    }

    #[test]
    fn push_is_write_once_and_fill_verify_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let store = InMemory::new();
        let url = BucketUrl::parse("s3://bkt/p").unwrap();
        // One small object (one write-once PUT) and one past SINGLE_PUT_MAX (multipart).
        let small = file(d.path(), "a.vhdx", 3 << 20, 1);
        let big = file(
            d.path(),
            "a.1.avhdx",
            SINGLE_PUT_MAX as usize + (5 << 20) + 17,
            2,
        );
        let rt = rt();
        let m = rt
            .block_on(push(&store, &url, &small, "a.vhdx", &|_, _| {}))
            .unwrap();
        assert_eq!(m.size, 3 << 20);
        let last = std::sync::atomic::AtomicU64::new(0);
        let mb = rt
            .block_on(push(&store, &url, &big, "a.1.avhdx", &|done, _| {
                last.store(done, std::sync::atomic::Ordering::Relaxed);
            }))
            .unwrap();
        assert_eq!(last.into_inner(), mb.size);
        let again = rt.block_on(push(&store, &url, &small, "a.vhdx", &|_, _| {}));
        assert!(matches!(again, Err(BucketError::Exists(_))), "{again:?}");
        assert!(matches!(
            rt.block_on(push(&store, &url, &small, "../x.vhdx", &|_, _| {})),
            Err(BucketError::Missing(_))
        ));

        let local = d.path().join("local");
        let r = rt.block_on(fill(&store, &url, &local, &|_, _| {})).unwrap();
        assert_eq!(r.copied.len(), 2);
        assert_eq!(
            std::fs::read(&big).unwrap(),
            std::fs::read(local.join("a.1.avhdx")).unwrap()
        );
        let v = rt
            .block_on(verify(&store, &url, &local, Depth::Manifests, &|_, _| {}))
            .unwrap();
        assert!(v.all_same(), "{v:?}");
        std::fs::remove_file(local.join("a.vhdx")).unwrap();
        std::fs::write(local.join("extra.vhdx"), b"x").unwrap();
        let v = rt
            .block_on(verify(&store, &url, &local, Depth::Manifests, &|_, _| {}))
            .unwrap();
        assert_eq!(v.objects["a.vhdx"], ObjectState::Missing);
        assert_eq!(v.local_only, vec!["extra.vhdx".to_string()]);
    }

    #[test]
    fn fill_refuses_a_changed_object_and_leaves_no_file() {
        let d = tempfile::tempdir().unwrap();
        let store = InMemory::new();
        let url = BucketUrl::parse("s3://bkt").unwrap();
        let small = file(d.path(), "b.vhdx", 2 << 20, 3);
        let rt = rt();
        rt.block_on(push(&store, &url, &small, "b.vhdx", &|_, _| {}))
            .unwrap();
        let mut bytes = std::fs::read(&small).unwrap();
        bytes[(1 << 20) + 5] ^= 1;
        rt.block_on(store.put(&url.key("b.vhdx"), bytes.into()))
            .unwrap();
        let local = d.path().join("local");
        let e = rt
            .block_on(fill(&store, &url, &local, &|_, _| {}))
            .unwrap_err();
        assert!(
            matches!(e, BucketError::HashMismatch { chunk: 1, .. }),
            "{e}"
        );
        assert!(!local.join("b.vhdx").exists());
    }

    /// Issue 31: verify compared the local copy with the bucket's manifest only, so a
    /// corrupted object verified "same". With `Depth::Bytes` the bucket's chunks are read
    /// and hashed: the corrupted chunk is named; the manifests-only check still finds the
    /// local copy the same.
    #[test]
    fn verify_with_bytes_finds_a_corrupted_object_the_manifests_do_not() {
        let d = tempfile::tempdir().unwrap();
        let store = InMemory::new();
        let url = BucketUrl::parse("s3://bkt").unwrap();
        let small = file(d.path(), "c.vhdx", 3 << 20, 4);
        let rt = rt();
        rt.block_on(push(&store, &url, &small, "c.vhdx", &|_, _| {}))
            .unwrap();
        let local = d.path().join("local");
        rt.block_on(fill(&store, &url, &local, &|_, _| {})).unwrap();
        let deep = rt
            .block_on(verify(&store, &url, &local, Depth::Bytes, &|_, _| {}))
            .unwrap();
        assert!(deep.all_same(), "{deep:?}");
        let mut bytes = std::fs::read(&small).unwrap();
        bytes[(2 << 20) + 7] ^= 1;
        rt.block_on(store.put(&url.key("c.vhdx"), bytes.into()))
            .unwrap();
        let shallow = rt
            .block_on(verify(&store, &url, &local, Depth::Manifests, &|_, _| {}))
            .unwrap();
        assert!(
            shallow.all_same(),
            "the manifests cannot see it: {shallow:?}"
        );
        let last = std::sync::atomic::AtomicU64::new(0);
        let deep = rt
            .block_on(verify(
                &store,
                &url,
                &local,
                Depth::Bytes,
                &|done, total| {
                    assert!(done <= total);
                    last.store(done, std::sync::atomic::Ordering::Relaxed);
                },
            ))
            .unwrap();
        assert_eq!(
            deep.objects["c.vhdx"],
            ObjectState::BucketCorrupt {
                chunks: vec![2],
                chunk_size: 1 << 20
            }
        );
        assert!(!deep.all_same());
        assert_eq!(last.into_inner(), 2 * (3 << 20), "both passes counted");
    }
}
