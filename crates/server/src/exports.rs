//! The export registry: turns an NBD export name into a device, as the server's
//! [`ExportSource`].
//!
//! ```text
//!   export = vdisk ["@" version]                       read-only, through the block cache
//!          | vdisk ["@" version] "+" device            server cache (discarded on release)
//!          | vdisk ["@" version] "+" device "+persistent"   server cache, persistent
//!          | vdisk "+private"                          the newest file itself, one writer
//!          | "ferry-s-" key                            a session: the SessionResolver maps
//!                                                      it to one of the above
//! ```
//!
//! The grammar is `contract::ExportName`'s (shared with the agent and the farm, which
//! print these names); this module only decides how each is served.
//!
//! Read-only chains are opened once per file and shared by every connection while any is
//! open (the top is kept through a `Weak`, re-opened when the file's identity changes), and
//! every connection gets its own [`block_cache::CachedDevice`] over it, so entries are
//! shared and read-ahead is per connection. Writable per-device exports put a diff cache
//! ([`crate::diff_cache`]) over such a cached wrapper.
//!
//! **Private mode and readers.** A private writer rewrites the newest file in place, so it
//! is exclusive with every other user of that file: `NAME+private` is refused (`Busy`)
//! while any export (read-only or a write cache on it) reads the file, and while it is
//! held, `NAME`, `NAME@newest` and write caches on the newest version are refused (`Busy`)
//! rather than served from a cache that would go stale; older versions stay available.
//! This is PVS's rule (a private-mode vDisk has one device). The in-process table enforces
//! it here, `flock` against other processes. When the writer is done, the file's
//! DataWriteGuid has changed, so readers get a new cache key and never see stale blocks.
//!
//! **A busy open waits a little.** A connection's export is released after the connection
//! ends (in-flight calls finished, the write cache flushed, closed and, for a discard cache,
//! deleted), which takes a moment. A device that reconnects at once (a reboot, a tool run
//! right after another) would find its own previous connection's cache still held, so an
//! open refused as busy is tried again for up to [`BUSY_WAIT_DEFAULT`] before the refusal
//! stands (counted and logged once).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use block_cache::{BlockCache, CachedDevice, ChainKey};
use contract::{DeviceName, ErrorChain, ExportName, SessionKey};
use disk::BlockDevice;
use disk::vhdx::VhdxImage;
use nbd_server::{ExportHandle, ExportInfo, ExportSource, OpenError, Peer};

use crate::access::{AccessPolicy, Caller, Refusal, SessionExport};
use crate::boot_sets::{BootSets, RecordAs};
use crate::diff_cache::{
    self, DiffCache, DiffCacheError, DiffCacheTarget, FileLock, Retention, WriteCounters,
    WritesCounted,
};
use crate::open_sessions::OpenSessions;
use crate::store::{Resolved, Store, StoreError};

mod list;
mod refusal;

use refusal::for_client;
pub use refusal::without_paths;

/// The most exports `list` returns.
pub const EXPORTS_LIST_MAX: usize = 10_000;

/// Metrics labels of the modes, in [`RegistryStats::open`] order.
pub const MODE_LABELS: [&str; 4] = ["read_only", "server_cache", "persistent", "private"];
/// Indexes of [`MODE_LABELS`].
const MODE_READ_ONLY: usize = 0;
const MODE_SERVER_CACHE: usize = 1;
const MODE_PERSISTENT: usize = 2;
const MODE_PRIVATE: usize = 3;

/// Where the registry finds vDisks and keeps write caches.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The store directory.
    pub store_dir: PathBuf,
    /// The write-cache directory (created if missing); best on a local disk.
    pub write_cache_dir: PathBuf,
}

/// Errors of building a registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The store cannot be read.
    #[error("open store")]
    Store(#[from] StoreError),
    /// The write-cache directory cannot be made or swept.
    #[error("prepare write-cache directory")]
    WriteCacheDir(#[from] DiffCacheError),
}

/// A snapshot of the registry's counters, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Open exports by mode, in [`MODE_LABELS`] order.
    pub open: [u64; 4],
    /// Successful opens.
    pub opens_total: u64,
    /// Opens refused as busy.
    pub busy_total: u64,
    /// Opens of unknown names.
    pub not_found_total: u64,
    /// Opens failed otherwise.
    pub open_errors_total: u64,
    /// Write-cache files open now.
    pub write_cache_files: u64,
    /// Their bytes on disk now.
    pub write_cache_bytes: u64,
    /// Bytes written by guests, by mode, in [`MODE_LABELS`] order (read-only stays 0).
    pub written_bytes_total: [u64; 4],
    /// Store directory scans.
    pub store_scans: u64,
    /// vDisks found by the last scan.
    pub vdisks: u64,
}

/// The identity of a file's current contents, as far as `stat` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> std::io::Result<FileId> {
        let m = std::fs::metadata(path)?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// A read-only chain shared by the connections that serve it.
#[derive(Debug)]
struct OpenChain {
    top: Weak<dyn BlockDevice>,
    key: ChainKey,
    id: FileId,
}

/// How a store file is used in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileUse {
    Readers(u64),
    Writer,
}

#[derive(Debug, Default)]
struct Counters {
    open: [AtomicU64; 4],
    opens_total: AtomicU64,
    busy_total: AtomicU64,
    not_found_total: AtomicU64,
    open_errors_total: AtomicU64,
    written: [Arc<WriteCounters>; 4],
}

#[derive(Debug)]
pub(crate) struct Inner {
    store: Store,
    cache: BlockCache,
    write_cache_dir: PathBuf,
    /// Shared read-only chains by canonical top path.
    chains: Mutex<HashMap<PathBuf, OpenChain>>,
    /// Virtual sizes for `list`, by path, valid while the file's identity holds.
    sizes: Mutex<HashMap<PathBuf, (FileId, u64)>>,
    /// Readers and writers of store files in this process (see the module docs).
    uses: Mutex<HashMap<PathBuf, FileUse>>,
    /// Open write caches, for the bytes-on-disk gauge.
    write_caches: Mutex<HashMap<PathBuf, Weak<VhdxImage>>>,
    counters: Counters,
    /// Resolves session-scoped export names (device login), when the server runs a farm.
    sessions: Mutex<Option<Arc<dyn SessionResolver>>>,
    /// How long a busy open keeps trying.
    busy_wait: Mutex<Duration>,
    /// Who may open what.
    access: Mutex<AccessPolicy>,
    /// Connections open on session exports, closed when their session ends.
    open_sessions: Arc<OpenSessions>,
    /// Reads store files' bytes from elsewhere than the files (a bucket through its tier
    /// directory, see the `bucket` crate); `None` for a local store.
    storages: Mutex<Option<Arc<dyn disk::open::StorageOpener>>>,
    /// Boot sets: recorded, kept and prefetched per read-only version (`boot_sets.rs`).
    boot_sets: BootSets,
}

/// How long an open of a busy export keeps trying by default (see the module docs).
pub const BUSY_WAIT_DEFAULT: Duration = Duration::from_secs(2);
/// The pause between two tries of a busy open.
const BUSY_RETRY: Duration = Duration::from_millis(20);

/// Turns a session-scoped export name (`ferry-s-KEY`: granted by device login, and served
/// only while the resolver knows it) into the export it stands for (e.g. `NAME@3`,
/// `NAME@3+DEVICE`, `NAME+private`). Implemented over the farm's session table.
pub trait SessionResolver: Send + Sync + std::fmt::Debug {
    /// What the live session `ferry-s-KEY` grants (the export, and the device it was
    /// granted to), or `None` (unknown, ended or expired).
    fn resolve(&self, session: &SessionKey) -> Option<SessionExport>;
}

/// The export registry. Cloning gives another handle to the same registry.
#[derive(Debug, Clone)]
pub struct Registry {
    pub(crate) inner: Arc<Inner>,
}

impl Registry {
    /// A registry over a store, serving read-only chains through `cache`. Deletes discard
    /// caches left by a server that stopped without releasing them.
    ///
    /// # Errors
    /// [`RegistryError`].
    pub fn new(config: RegistryConfig, cache: BlockCache) -> Result<Registry, RegistryError> {
        let store = Store::open(&config.store_dir)?;
        let dir = &config.write_cache_dir;
        std::fs::create_dir_all(dir).map_err(|source| DiffCacheError::Io {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
        let swept = diff_cache::sweep_discarded(dir)?;
        if swept > 0 {
            tracing::info!(swept, dir = %dir.display(), "deleted stale server-cache files");
        }
        Ok(Registry {
            inner: Arc::new(Inner {
                store,
                cache,
                write_cache_dir: config.write_cache_dir,
                chains: Mutex::default(),
                sizes: Mutex::default(),
                uses: Mutex::default(),
                write_caches: Mutex::default(),
                counters: Counters::default(),
                sessions: Mutex::default(),
                busy_wait: Mutex::new(BUSY_WAIT_DEFAULT),
                access: Mutex::new(AccessPolicy::default()),
                open_sessions: Arc::default(),
                storages: Mutex::default(),
                boot_sets: BootSets::default(),
            }),
        })
    }

    /// Reads every store file through `storages` from now on (the store directory is then a
    /// bucket's tier directory; its files are opened and confined as before, and their
    /// bytes come from the opener's storage).
    pub fn set_storage_opener(&self, storages: Arc<dyn disk::open::StorageOpener>) {
        *lock(&self.inner.storages) = Some(storages);
    }

    /// How long an open refused as busy keeps trying before the refusal stands (default
    /// [`BUSY_WAIT_DEFAULT`]; zero refuses at once).
    pub fn set_busy_wait(&self, wait: Duration) {
        *lock(&self.inner.busy_wait) = wait;
    }

    /// Sets who may open what (default [`AccessPolicy::STANDALONE`]).
    pub fn set_access(&self, policy: AccessPolicy) {
        *lock(&self.inner.access) = policy;
    }

    /// Closes every connection open on the session export `name` (its session ended);
    /// returns how many.
    pub fn revoke_session(&self, name: &str) -> usize {
        let n = self.inner.open_sessions.revoke(name);
        if n > 0 {
            tracing::info!(
                session = name,
                connections = n,
                "session ended: closing its connections"
            );
        }
        n
    }

    /// Closes every connection open on the session export `name` while the session stays
    /// valid (a draining server moving its devices away: they fail over); returns how many.
    pub fn move_session(&self, name: &str) -> usize {
        self.inner.open_sessions.revoke(name)
    }

    /// The session exports with open connections.
    pub fn open_session_names(&self) -> Vec<String> {
        self.inner.open_sessions.names()
    }

    /// Serves session-scoped export names (`ferry-s-…`) through `resolver`. Without one,
    /// such names are refused.
    pub fn set_sessions(&self, resolver: Arc<dyn SessionResolver>) {
        *lock(&self.inner.sessions) = Some(resolver);
    }

    /// The shared block cache.
    pub fn cache(&self) -> &BlockCache {
        &self.inner.cache
    }

    /// The boot sets (see [`crate::boot_sets`]).
    pub fn boot_sets(&self) -> &BootSets {
        &self.inner.boot_sets
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> RegistryStats {
        let c = &self.inner.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mut files, mut bytes) = (0, 0);
        let mut live = lock(&self.inner.write_caches);
        live.retain(|_, w| w.strong_count() > 0);
        for image in live.values().filter_map(Weak::upgrade) {
            files += 1;
            bytes += image.storage().len().unwrap_or(0);
        }
        drop(live);
        RegistryStats {
            open: std::array::from_fn(|i| load(&c.open[i])),
            opens_total: load(&c.opens_total),
            busy_total: load(&c.busy_total),
            not_found_total: load(&c.not_found_total),
            open_errors_total: load(&c.open_errors_total),
            write_cache_files: files,
            write_cache_bytes: bytes,
            written_bytes_total: std::array::from_fn(|i| load(&c.written[i].bytes)),
            store_scans: self.inner.store.scans(),
            vdisks: self.inner.store.vdisks_seen(),
        }
    }
}

impl ExportSource for Registry {
    fn list(&self, peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        let policy = *lock(&self.inner.access);
        policy.check_list(&caller_of(peer)).map_err(refused)?;
        match self.inner.list() {
            Ok(v) => Ok(v),
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "listing exports failed");
                Ok(Vec::new())
            }
        }
    }

    fn open(&self, name: &str, peer: &Peer) -> Result<ExportHandle, OpenError> {
        let wait = *lock(&self.inner.busy_wait);
        let caller = caller_of(peer);
        let start = Instant::now();
        let r = loop {
            match self.inner.open(name, &caller) {
                Err(OpenError::Busy(_)) if start.elapsed() < wait => {
                    std::thread::sleep(BUSY_RETRY);
                }
                r => break r,
            }
        };
        let c = &self.inner.counters;
        let counter = match &r {
            Ok(_) => &c.opens_total,
            Err(OpenError::Busy(_)) => &c.busy_total,
            Err(OpenError::NotFound(_)) => &c.not_found_total,
            Err(OpenError::Other(_) | OpenError::TlsRequired(_) | OpenError::Forbidden(_)) => {
                &c.open_errors_total
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // A refusal is logged by the NBD server, which knows the client and limits the
        // lines per client (a line here, per refusal, let one client flood the log); the
        // client gets the text without server paths.
        r.map_err(for_client)
    }
}

/// What a connection proved: local or not, TLS or not, and the identity its verified
/// client certificate names.
fn caller_of(peer: &Peer) -> Caller {
    Caller {
        local: peer.is_local(),
        tls: peer.tls,
        identity: peer.client_cert.as_deref().and_then(pki::identity_of),
    }
}

fn refused(r: Refusal) -> OpenError {
    match r {
        Refusal::TlsRequired(m) => OpenError::TlsRequired(m),
        Refusal::Forbidden(m) => OpenError::Forbidden(m),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn store_err(e: StoreError) -> OpenError {
    match e {
        StoreError::NotFound(_) | StoreError::NoVersion { .. } | StoreError::InvalidName { .. } => {
            OpenError::NotFound(e.to_string())
        }
        _ => OpenError::Other(ErrorChain(&e).to_string()),
    }
}

fn diff_err(e: DiffCacheError) -> OpenError {
    match e {
        DiffCacheError::Busy(_) => OpenError::Busy(e.to_string()),
        _ => OpenError::Other(ErrorChain(&e).to_string()),
    }
}

fn disk_err(path: &Path) -> impl FnOnce(disk::Error) -> OpenError {
    let path = path.to_path_buf();
    move |e| OpenError::Other(format!("{}: {}", path.display(), ErrorChain(&e)))
}

/// What one open export holds; dropping it (the handle's release) undoes the open in
/// order: commit and close (and delete a discard cache), unlock, end the use.
#[derive(Debug)]
struct Lease {
    inner: Arc<Inner>,
    mode: usize,
    path: PathBuf,
    writer: bool,
    lock: Option<FileLock>,
    diff_cache: Option<DiffCache>,
    private: Option<Arc<VhdxImage>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(dc) = self.diff_cache.take() {
            let path = dc.path().to_path_buf();
            if let Err(e) = dc.release() {
                tracing::warn!(path = %path.display(), error = %ErrorChain(&e), "releasing write cache failed");
            }
        }
        if let Some(image) = self.private.take() {
            match image.close() {
                Ok(()) => tracing::info!(path = %self.path.display(),
                    "private image closed: the maintenance writes are in the version"),
                Err(e) => tracing::warn!(path = %self.path.display(), error = %ErrorChain(&e),
                    "closing private image failed"),
            }
        }
        self.lock.take();
        let mut uses = lock(&self.inner.uses);
        match uses.get_mut(&self.path) {
            Some(FileUse::Readers(n)) if !self.writer && *n > 1 => *n -= 1,
            Some(FileUse::Readers(_)) if !self.writer => {
                uses.remove(&self.path);
            }
            Some(FileUse::Writer) if self.writer => {
                uses.remove(&self.path);
            }
            other => debug_assert!(false, "lease of {:?} found use {other:?}", self.path),
        }
        drop(uses);
        self.inner.counters.open[self.mode].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Inner {
    /// Opens `name` for `caller` if the access rule allows it (checked before anything
    /// is opened or created, so a refused caller leaves no file behind).
    fn open(self: &Arc<Self>, name: &str, caller: &Caller) -> Result<ExportHandle, OpenError> {
        let parsed = name.parse::<ExportName>().map_err(|e| {
            store_err(StoreError::InvalidName {
                name: name.to_string(),
                why: e.reason(),
            })
        })?;
        let policy = *lock(&self.access);
        let ExportName::Session(key) = &parsed else {
            policy.check(caller, &parsed, None).map_err(refused)?;
            let who = if policy.record_as(caller, None) {
                RecordAs::Trusted
            } else {
                RecordAs::Nobody
            };
            return self.open_export(parsed, who);
        };
        let resolver = lock(&self.sessions).clone();
        let session = resolver.and_then(|r| r.resolve(key));
        policy
            .check(caller, &parsed, session.as_ref())
            .map_err(refused)?;
        let Some(session) = session else {
            return Err(OpenError::NotFound("no live session of that name".into()));
        };
        if matches!(session.export, ExportName::Session(_)) {
            return Err(OpenError::Other("a session resolved to a session".into()));
        }
        let who = if policy.record_as(caller, Some(&session)) {
            RecordAs::Session(name)
        } else {
            RecordAs::Nobody
        };
        let tracked = self.open_sessions.track(name);
        let mut handle = self.open_export(session.export, who)?;
        handle.revoked = Some(tracked.token());
        let release = handle.release.take();
        handle.release = Some(Box::new(move || {
            if let Some(r) = release {
                r();
            }
            drop(tracked);
        }));
        Ok(handle)
    }

    fn open_export(
        self: &Arc<Self>,
        name: ExportName,
        who: RecordAs<'_>,
    ) -> Result<ExportHandle, OpenError> {
        let (vdisk, version, diff, mode) = match name {
            ExportName::Session(_) => {
                return Err(OpenError::Other(
                    "a session export is opened through its grant only".into(),
                ));
            }
            ExportName::Private { vdisk } => {
                let res = self.store.resolve_version(&vdisk, None);
                return self.open_private(res.map_err(store_err)?);
            }
            ExportName::ReadOnly { vdisk, version } => (vdisk, version, None, MODE_READ_ONLY),
            ExportName::ServerCache {
                vdisk,
                version,
                device,
            } => (
                vdisk,
                version,
                Some((device, Retention::Discard)),
                MODE_SERVER_CACHE,
            ),
            ExportName::Persistent {
                vdisk,
                version,
                device,
            } => (
                vdisk,
                version,
                Some((device, Retention::Persistent)),
                MODE_PERSISTENT,
            ),
        };
        let res = self
            .store
            .resolve_version(&vdisk, version)
            .map_err(store_err)?;
        let mut lease = self.begin_use(&res.path, mode, false)?;
        lease.lock = Some(FileLock::shared(&res.path).map_err(diff_err)?);
        let cached = self.cached_chain(&res.path)?;
        let cached = (self.boot_sets).watch(&res.vdisk, res.version, &res.path, cached, who);
        let Some((device, retention)) = diff else {
            return Ok(ExportHandle {
                device: cached,
                writable: false,
                release: Some(Box::new(move || drop(lease))),
                revoked: None,
            });
        };
        let dc = self.open_diff_cache(&res, &device, retention, cached)?;
        let device = Arc::new(WritesCounted::new(
            dc.image().clone(),
            self.counters.written[lease.mode].clone(),
        ));
        lease.diff_cache = Some(dc);
        Ok(ExportHandle {
            device,
            writable: true,
            release: Some(Box::new(move || drop(lease))),
            revoked: None,
        })
    }

    fn open_diff_cache(
        &self,
        res: &Resolved,
        device: &DeviceName,
        retention: Retention,
        parent: Arc<dyn BlockDevice>,
    ) -> Result<DiffCache, OpenError> {
        let target = DiffCacheTarget {
            dir: &self.write_cache_dir,
            device,
            vdisk: &res.vdisk,
            version: res.version,
            retention,
        };
        let dc = DiffCache::open(target, parent, &res.path).map_err(diff_err)?;
        lock(&self.write_caches).insert(dc.path().to_path_buf(), Arc::downgrade(dc.image()));
        Ok(dc)
    }

    fn open_private(self: &Arc<Self>, res: Resolved) -> Result<ExportHandle, OpenError> {
        let mut lease = self.begin_use(&res.path, MODE_PRIVATE, true)?;
        let image = diff_cache::open_private(&res.path).map_err(diff_err)?;
        // Entries cached under the file's current identity go stale with the first write.
        let path = canonical(&res.path)?;
        self.cache
            .invalidate(&ChainKey::new(path.clone(), image.linkage_id()));
        lock(&self.chains).remove(&path);
        if let Some(pref) = image.parent_ref() {
            let parent = self.cached_parent(&pref)?;
            image.attach_parent(parent).map_err(disk_err(&res.path))?;
        }
        let image = Arc::new(image);
        lease.private = Some(image.clone());
        let device = Arc::new(WritesCounted::new(
            image,
            self.counters.written[lease.mode].clone(),
        ));
        Ok(ExportHandle {
            device,
            writable: true,
            release: Some(Box::new(move || drop(lease))),
            revoked: None,
        })
    }

    /// Records a use of `path` (refused as busy against a private writer, or, for a
    /// writer, against anyone) and returns the lease that ends it.
    fn begin_use(
        self: &Arc<Self>,
        path: &Path,
        mode: usize,
        writer: bool,
    ) -> Result<Lease, OpenError> {
        let mut uses = lock(&self.uses);
        let busy = |why: String| Err(OpenError::Busy(format!("{}: {why}", path.display())));
        match (uses.get_mut(path), writer) {
            (Some(FileUse::Writer), _) => return busy("open in private mode".into()),
            (Some(FileUse::Readers(n)), true) => {
                return busy(format!(
                    "{n} export(s) read it; private mode needs it alone"
                ));
            }
            (Some(FileUse::Readers(n)), false) => *n += 1,
            (None, true) => {
                uses.insert(path.to_path_buf(), FileUse::Writer);
            }
            (None, false) => {
                uses.insert(path.to_path_buf(), FileUse::Readers(1));
            }
        }
        drop(uses);
        self.counters.open[mode].fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            inner: self.clone(),
            mode,
            path: path.to_path_buf(),
            writer,
            lock: None,
            diff_cache: None,
            private: None,
        })
    }

    /// A new connection's cached wrapper of the read-only chain whose top is `path`.
    pub(crate) fn cached_chain(&self, path: &Path) -> Result<Arc<CachedDevice>, OpenError> {
        let (top, key) = self.shared_chain(path)?;
        Ok(self.cache.wrap_device(key, top))
    }

    /// The shared read-only chain of `path`, opened if no connection holds it or the file
    /// changed since.
    fn shared_chain(&self, path: &Path) -> Result<(Arc<dyn BlockDevice>, ChainKey), OpenError> {
        let path = self.confined(path)?;
        let id = FileId::of(&path)
            .map_err(|e| OpenError::Other(format!("stat {}: {e}", path.display())))?;
        {
            let mut chains = lock(&self.chains);
            chains.retain(|_, c| c.top.strong_count() > 0);
            if let Some(c) = chains.get(&path)
                && c.id == id
                && let Some(top) = c.top.upgrade()
            {
                return Ok((top, c.key.clone()));
            }
        }
        // Every layer, the top included, is checked to be a regular file inside the store
        // before it is opened, and opened without following a symlink out of it.
        let opts = disk::open::OpenOptions::default();
        let storages = lock(&self.storages).clone();
        let chain = match storages {
            Some(s) => disk::open::open_confined_with(self.store.dir(), &path, opts, s.as_ref()),
            None => disk::open::open_confined(self.store.dir(), &path, opts),
        }
        .map_err(disk_err(&path))?;
        if let Err(e) = chain.advise_random_all() {
            tracing::debug!(path = %path.display(), error = %e, "fadvise failed");
        }
        // The block cache holds the chain's bytes: aligned store reads skip the page cache,
        // so they are neither copied once more nor held twice in RAM.
        match chain.direct_reads_all() {
            Ok(n) => tracing::debug!(path = %path.display(), layers = n, "direct reads"),
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "no direct reads"),
        }
        let top = chain.top();
        let key = ChainKey::of_device(path.clone(), top.as_ref());
        let entry = OpenChain {
            top: Arc::downgrade(&top),
            key: key.clone(),
            id,
        };
        lock(&self.chains).insert(path, entry);
        Ok((top, key))
    }

    /// The cached parent a differencing image names: the first candidate path whose chain
    /// has an accepted identity. A candidate outside the store is reported with one text
    /// whether or not it exists.
    fn cached_parent(
        &self,
        pref: &disk::device::ParentRef,
    ) -> Result<Arc<dyn BlockDevice>, OpenError> {
        let mut tried = Vec::new();
        for cand in &pref.paths {
            let real = match self.confined(cand) {
                Ok(real) => real,
                Err(e) => {
                    tried.push(e.to_string());
                    continue;
                }
            };
            match self.shared_chain(&real) {
                Ok((top, key)) if top.linkage_id().is_some_and(|g| pref.linkage.contains(&g)) => {
                    return Ok(self.cache.wrap(key, top));
                }
                Ok(_) => tried.push(format!("{} (identity mismatch)", cand.display())),
                Err(e) => tried.push(format!("{} ({e})", cand.display())),
            }
        }
        Err(OpenError::Other(format!(
            "parent not found; tried: {}",
            tried.join("; ")
        )))
    }

    /// The canonical path of `path` when it is inside the store directory (after symlinks
    /// are resolved; nothing is opened). A differencing image's parent locator is data
    /// inside the file: without this, a vDisk dropped into the store could name any image
    /// on the server as its parent and have it served to every client, or probe which paths
    /// exist (the refusal reads the same either way).
    fn confined(&self, path: &Path) -> Result<PathBuf, OpenError> {
        disk::file::confine(self.store.dir(), path).map_err(|e| match e.kind() {
            disk::ErrorKind::NotFound => OpenError::NotFound(e.to_string()),
            _ => OpenError::Other(format!(
                "{e}; a parent locator may only name files in the store"
            )),
        })
    }
}

fn canonical(path: &Path) -> Result<PathBuf, OpenError> {
    std::fs::canonicalize(path)
        .map_err(|e| OpenError::Other(format!("resolve {}: {e}", path.display())))
}
