//! A bucket served as a local store. The tier directory is laid out so that the server's
//! store scan finds the bucket's vDisks by their usual names:
//!
//! ```text
//! TIER/NAME.vhdx              empty placeholder (what the store scan lists)
//! TIER/NAME.vhdx.manifest     the manifest, pinned when first seen
//! TIER/.tier/NAME.vhdx        the object's bytes fetched so far (sparse, 0600)
//! TIER/.tier/NAME.vhdx.map    which chunks of it are present
//! ```
//!
//! [`TierStore`] is the [`disk::open::StorageOpener`] the server opens chains with: each
//! layer, found and confined inside the tier directory as in a local store, is read through
//! its [`TieredObject`]. A placeholder is empty, so a tool that opens it directly finds no
//! image rather than partial bytes.
//!
//! A manifest, once pinned, is kept: a bucket whose manifest of a published version changed
//! later is reported, and the pinned one stays the truth the bytes are checked against.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use manifest::Manifest;
use object_store::ObjectStore;

use crate::bridge::Bridge;
use crate::objects::{exists, get_manifest, list};
use crate::tier::{ObjectSource, TierStats, TieredObject};
use crate::{
    BucketError, BucketUrl, Keys, MANIFEST_SUFFIX, S3Config, is_vdisk_file, manifest_name,
};

/// The hidden directory inside the tier directory holding the fetched bytes.
pub const TIER_SUBDIR: &str = ".tier";
/// What [`TierStore::sync`] did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    /// Objects served.
    pub objects: Vec<String>,
    /// Objects skipped (no manifest, or a bad one).
    pub skipped: Vec<String>,
    /// Objects whose manifest in the bucket differs from the one pinned: still served,
    /// checked against the pinned one.
    pub changed: Vec<String>,
    /// The bucket could not be listed, and the tier's pinned manifests are served.
    pub offline: Option<String>,
}

/// A bucket prefix served through a local tier directory.
#[derive(Debug)]
pub struct TierStore {
    url: BucketUrl,
    store: Arc<dyn ObjectStore>,
    bridge: Arc<Bridge>,
    dir: PathBuf,
    objects: Mutex<HashMap<String, Arc<TieredObject>>>,
    stats: Arc<TierStats>,
}

fn write_new(path: &Path, bytes: &[u8]) -> Result<(), BucketError> {
    let tmp = path.with_extension("tmp");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(BucketError::io("write", path))
}

impl TierStore {
    /// Connects to `url` and lays out `dir` (created 0700 if missing) from its listing; see
    /// [`TierStore::sync`].
    ///
    /// # Errors
    /// Connection and local errors; an unreachable bucket when the tier holds nothing.
    pub fn open(
        url: BucketUrl,
        config: &S3Config,
        dir: &Path,
    ) -> Result<(TierStore, SyncReport), BucketError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join(TIER_SUBDIR))
            .map_err(BucketError::io("create tier directory", dir))?;
        let dir = std::fs::canonicalize(dir).map_err(BucketError::io("resolve", dir))?;
        let store = crate::location::connect(&url, config)?;
        let t = TierStore {
            url,
            store,
            bridge: Arc::new(Bridge::new()?),
            dir,
            objects: Mutex::default(),
            stats: Arc::default(),
        };
        let report = t.sync()?;
        Ok((t, report))
    }

    /// The tier directory: serve it as the store directory, with this opener.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bucket.
    pub fn url(&self) -> &BucketUrl {
        &self.url
    }

    /// Counters of the reads.
    pub fn stats(&self) -> Arc<TierStats> {
        self.stats.clone()
    }

    fn pinned(&self, name: &str) -> Option<Manifest> {
        let bytes = std::fs::read(self.dir.join(manifest_name(name))).ok()?;
        Manifest::parse(&bytes).ok()
    }

    /// Lists the bucket and adds every vDisk with a manifest to the tier directory (a
    /// placeholder and the pinned manifest). When the bucket cannot be listed but the tier
    /// already pins manifests, they are served (the report says so); with none, it fails.
    ///
    /// # Errors
    /// The listing's error when the tier is empty; local I/O.
    pub fn sync(&self) -> Result<SyncReport, BucketError> {
        let mut report = SyncReport::default();
        let store = self.store.clone();
        let url = self.url.clone();
        let listed = self
            .bridge
            .run(async move { list(store.as_ref(), &url).await })?;
        let listing = match listed {
            Ok(l) => l,
            Err(e) => {
                let local = self.local_objects()?;
                if local.is_empty() {
                    return Err(e);
                }
                tracing::warn!(bucket = %self.url, error = %e, objects = local.len(),
                    "bucket unreachable: serving the objects the tier pins");
                report.offline = Some(e.to_string());
                report.objects = local;
                return Ok(report);
            }
        };
        report.skipped.extend(listing.unmanifested.iter().cloned());
        for (name, size) in &listing.objects {
            let store = self.store.clone();
            let url = self.url.clone();
            let (n, s) = (name.clone(), *size);
            let got = self
                .bridge
                .run(async move { get_manifest(store.as_ref(), &url, &n, Some(s)).await })?;
            let m = match got {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "bucket object skipped");
                    report.skipped.push(name.clone());
                    continue;
                }
            };
            match self.pinned(name) {
                Some(p) if p != m => {
                    tracing::error!(object = %self.url.url_of(name),
                        "the manifest of a published version changed in the bucket; \
                         keeping the one pinned when it was first seen");
                    report.changed.push(name.clone());
                }
                Some(_) => {}
                None => write_new(&self.dir.join(manifest_name(name)), m.encode().as_bytes())?,
            }
            let placeholder = self.dir.join(name);
            if !placeholder.exists() {
                write_new(&placeholder, b"")?;
            }
            report.objects.push(name.clone());
        }
        Ok(report)
    }

    fn local_objects(&self) -> Result<Vec<String>, BucketError> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(&self.dir).map_err(BucketError::io("read", &self.dir))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(obj) = name.strip_suffix(MANIFEST_SUFFIX)
                && is_vdisk_file(obj)
                && self.dir.join(obj).is_file()
            {
                out.push(obj.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The tiered object of `name` (shared by every chain that uses it).
    ///
    /// # Errors
    /// No pinned manifest for it; tier I/O.
    pub fn object(&self, name: &str) -> Result<Arc<TieredObject>, BucketError> {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = objects.get(name) {
            return Ok(o.clone());
        }
        if !is_vdisk_file(name) {
            return Err(BucketError::Missing(format!(
                "{name:?} is not a vDisk file name"
            )));
        }
        let m = match self.pinned(name) {
            Some(m) => m,
            // Published since the last listing (a version promoted a moment ago).
            None => self.pin_from_bucket(name)?.ok_or_else(|| {
                BucketError::Missing(format!(
                    "{}: not an object of {}",
                    self.dir.join(name).display(),
                    self.url
                ))
            })?,
        };
        let tier = self.dir.join(TIER_SUBDIR);
        let o = Arc::new(TieredObject::open(
            ObjectSource {
                store: self.store.clone(),
                bridge: self.bridge.clone(),
                key: self.url.key(name),
                url: self.url.url_of(name),
            },
            Arc::new(m),
            &tier.join(name),
            &tier.join(format!("{name}.map")),
            self.stats.clone(),
        )?);
        objects.insert(name.to_string(), o.clone());
        Ok(o)
    }
}

impl TierStore {
    /// Fetches and pins object `name`'s manifest when the bucket holds one; `None` when it
    /// holds none (a version that is not published).
    fn pin_from_bucket(&self, name: &str) -> Result<Option<Manifest>, BucketError> {
        let (store, url, n) = (self.store.clone(), self.url.clone(), name.to_string());
        let got = self.bridge.run(async move {
            if !exists(store.as_ref(), &url, &manifest_name(&n)).await? {
                return Ok(None);
            }
            get_manifest(store.as_ref(), &url, &n, None).await.map(Some)
        })??;
        if let Some(m) = &got {
            write_new(&self.dir.join(manifest_name(name)), m.encode().as_bytes())?;
            tracing::info!(object = %self.url.url_of(name), "manifest pinned on first use");
        }
        Ok(got)
    }

    /// True when `name` is served from the bucket: pinned, or published in it now.
    fn is_object(&self, name: &str) -> Result<bool, BucketError> {
        // An object opened before: no manifest file to read and parse again.
        let opened = self
            .objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name);
        if opened || self.pinned(name).is_some() {
            return Ok(true);
        }
        Ok(self.pin_from_bucket(name)?.is_some())
    }
}

impl disk::open::StorageOpener for TierStore {
    fn open(
        &self,
        path: &Path,
        file: std::fs::File,
        writable: bool,
    ) -> disk::Result<Arc<dyn disk::Storage>> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| disk::Error::new(disk::ErrorKind::NotFound, "no file name"))?;
        if !self.is_object(name).map_err(BucketError::into_disk)? {
            // Not published: a version that lives only in this directory (a maintenance
            // version in a farm store's working directory). A placeholder is never one.
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if len == 0 {
                return Err(disk::Error::new(
                    disk::ErrorKind::NotFound,
                    format!(
                        "{}: empty, and not an object of {}",
                        path.display(),
                        self.url
                    ),
                ));
            }
            return Ok(Arc::new(disk::FileStorage::new(file)));
        }
        if writable {
            return Err(disk::Error::new(
                disk::ErrorKind::ReadOnly,
                format!("{}: bucket objects are read-only", path.display()),
            ));
        }
        let o = self.object(name).map_err(BucketError::into_disk)?;
        Ok(o)
    }
}
