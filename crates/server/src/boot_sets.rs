//! Boot sets at the server: recording the first boots of each version, keeping the merged
//! set with the version, and reading it into the block cache ahead of the next boot.
//!
//! ```text
//!   open NAME@V ──► BootSets::watch ──► Slot (one per version file, by identity)
//!                      │                  ├── loaded set (file NAME.V.avhdx.bootset, or
//!                      │                  │   the farm through a BootSetMirror)
//!                      │                  ├── recordings: the first BOOTS_RECORDED_MAX boots
//!                      │                  └── one prefetch at a time: PREFETCH_DEPTH threads
//!                      ▼                      warming the set's extents in boot order
//!                   BootWatch (the connection's device: observes and records its reads)
//! ```
//!
//! # Design notes
//!
//! * **Only a device's own session records** (issue 30): a set is read ahead by every later
//!   boot and fixed at [`BOOTS_RECORDED_MAX`] boots, so recording is a write ([`RecordAs`]:
//!   a session opened with its device's certificate, once per session and version, or a
//!   caller trusted to write). An anonymous reader is never recorded, and a merge covering
//!   more than [`BOOT_SHARE_MAX_PERCENT`] of the disk is dropped.
//! * **A boot is a connection.** Each device boots over its own connection, so a
//!   connection's reads in its first [`BOOT_WINDOW`] (and at most
//!   [`BOOT_RECORD_BYTES_MAX`]) are one boot's. A connection that read less than
//!   [`BOOT_RECORD_BYTES_MIN`] (`nbdinfo`, a probe), or more than
//!   [`BOOT_SHARE_MAX_PERCENT`] of the disk (a copy, a backup), is not counted as a boot.
//! * **Identity.** A slot is keyed by the version's file and holds the version's
//!   [`bootset::Identity`] (name, number, virtual size, and the top file's DataWriteGuid or,
//!   without one, a digest of its device, inode, length and mtime). A persisted set whose
//!   identity differs is stale: it is deleted, never applied. The prefetch reads through the
//!   connection's own cached wrapper, whose chain key is that same file and identity, so it
//!   cannot put another version's bytes in front of this one.
//! * **Reading only the set.** The prefetch warms exactly the set's pages that are not
//!   cached (`block_cache::CachedDevice::warm`), so its store reads are the set's bytes at
//!   most once per run, and a storm of boots runs one prefetch (the others find it
//!   running); demand reads and the prefetch meet in the cache's single-flight claims.
//! * **Deep and ordered.** [`PREFETCH_DEPTH`] threads take the set's pieces (extents cut at
//!   [`PREFETCH_READ_BYTES_MAX`]) in boot order from one cursor, so several store reads are
//!   in flight and the next ones the boot needs come first. A piece more than
//!   [`PREFETCH_BEHIND_EXTENTS`] extents behind the furthest extent a boot has read is
//!   skipped: the boot has moved past it. A run ends when every piece is taken or after
//!   [`BOOT_WINDOW`].
//! * **No read-ahead beside it.** A connection to a version with a set reads with its
//!   wrapper's read-ahead off: the set already says what the boot reads, and read-ahead
//!   past it would read what the boot does not need.
//! * **Cleared.** A set removed from its file (or from the farm) is dropped at the next
//!   boot's open, and the next boots record again.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use block_cache::CachedDevice;
use bootset::{BootSet, EXTENTS_MAX, Identity, NAME_BYTES_MAX, OffsetIndex, PAGE_BYTES};
use disk::BlockDevice;

pub use crate::boot_watch::RecordAs;
use crate::boot_watch::{BootObserver, BootWatch, Recording};

/// Boots of a version recorded and merged into its set.
pub const BOOTS_RECORDED_MAX: u32 = 3;
/// How long after its first read a connection's reads are its boot's.
pub const BOOT_WINDOW: Duration = Duration::from_secs(120);
/// The most distinct bytes one boot's recording keeps.
pub const BOOT_RECORD_BYTES_MAX: u64 = 4 << 30;
/// A connection that read fewer distinct bytes was not a boot.
pub const BOOT_RECORD_BYTES_MIN: u64 = 256 << 10;
/// A connection that read more than this share of the version's virtual size was a copy
/// or a scan (a backup, `nbdcopy`), not a boot: a boot reads a few percent of its disk.
pub const BOOT_SHARE_MAX_PERCENT: u64 = 50;
/// The most sessions one version's slot remembers as having recorded (past it, sessions
/// record no more until the server restarts or the version changes).
pub const SESSIONS_RECORDED_MAX: usize = 1024;
/// Store reads a prefetch keeps in flight.
pub const PREFETCH_DEPTH: usize = 8;
/// The largest single warm a prefetch issues (the cache cuts it at `fill_blocks_max`).
pub const PREFETCH_READ_BYTES_MAX: u64 = 1 << 20;
/// How far behind the boot's furthest extent a prefetch may still read.
pub const PREFETCH_BEHIND_EXTENTS: usize = 256;
/// How often a boot's open asks the farm again whether the set changed.
pub const MIRROR_RECHECK: Duration = Duration::from_secs(10);
/// The suffix of a set's file beside its version (`NAME.V.avhdx.bootset`).
pub const BOOT_SET_SUFFIX: &str = ".bootset";
/// The largest boot set file read.
pub const BOOT_SET_FILE_BYTES_MAX: usize = bootset::encoded_len(NAME_BYTES_MAX, EXTENTS_MAX);

/// Where boot sets are kept besides the store (the farm database): the same encoded bytes,
/// by vDisk name and version number. Implemented by the CLI over the farm.
pub trait BootSetMirror: Send + Sync + std::fmt::Debug {
    /// The encoded set of `vdisk@version`, if any.
    ///
    /// # Errors
    /// A message when the mirror cannot be asked.
    fn load(&self, vdisk: &str, version: u32) -> Result<Option<Vec<u8>>, String>;
    /// Keeps `encoded` as the set of `vdisk@version`.
    ///
    /// # Errors
    /// A message when it could not be kept.
    fn save(&self, vdisk: &str, version: u32, encoded: &[u8]) -> Result<(), String>;
}

/// A snapshot of the boot-set counters, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BootSetStats {
    /// Boots recorded and merged into a set.
    pub recorded_total: u64,
    /// Recordings dropped as too small to be a boot.
    pub discarded_total: u64,
    /// Prefetch runs started.
    pub prefetch_runs_total: u64,
    /// Bytes the prefetch read from the store.
    pub prefetch_bytes_total: u64,
    /// Bytes clients read from extents the prefetch had warmed.
    pub prefetch_hit_bytes_total: u64,
    /// Persisted sets found stale (another version's identity) and deleted.
    pub stale_total: u64,
    /// Sets that could not be saved (file or farm).
    pub save_errors_total: u64,
}

#[derive(Debug, Default)]
struct Counters {
    recorded: AtomicU64,
    discarded: AtomicU64,
    runs: AtomicU64,
    bytes: AtomicU64,
    hits: AtomicU64,
    stale: AtomicU64,
    save_errors: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    /// Recordings being merged and saved (see [`BootSets::wait_saved`]).
    saving: AtomicUsize,
    counters: Counters,
    mirror: Mutex<Option<Arc<dyn BootSetMirror>>>,
    enabled: AtomicBool,
}

/// The server's boot sets (one per registry). Cloning gives another handle.
#[derive(Debug, Clone)]
pub struct BootSets {
    shared: Arc<Shared>,
    slots: Arc<Mutex<HashMap<PathBuf, Arc<Slot>>>>,
}

impl Default for BootSets {
    fn default() -> Self {
        BootSets {
            shared: Arc::new(Shared {
                saving: AtomicUsize::new(0),
                counters: Counters::default(),
                mirror: Mutex::default(),
                enabled: AtomicBool::new(true),
            }),
            slots: Arc::default(),
        }
    }
}

/// A set in use: the set, its offset index, and which extents a prefetch warmed.
#[derive(Debug)]
pub(crate) struct Loaded {
    set: BootSet,
    index: OffsetIndex,
    warmed: Vec<AtomicBool>,
}

impl Loaded {
    fn new(set: BootSet) -> Arc<Loaded> {
        let index = OffsetIndex::new(&set);
        let warmed = set.extents.iter().map(|_| AtomicBool::new(false)).collect();
        Arc::new(Loaded { set, index, warmed })
    }
}

/// What a slot knows of its persisted copy, to notice a clear.
#[derive(Debug, Default)]
struct Persisted {
    /// The file's (length, mtime ns) when last read or written; `None`: no file.
    file: Option<(u64, i128)>,
    /// When the mirror was last asked.
    mirror_checked: Option<Instant>,
}

/// One version's boot-set state.
#[derive(Debug)]
pub(crate) struct Slot {
    shared: Arc<Shared>,
    identity: Identity,
    /// The set's file beside the version.
    file: PathBuf,
    loaded: RwLock<Option<Arc<Loaded>>>,
    persisted: Mutex<Persisted>,
    /// Connections recording now.
    recording: AtomicU32,
    /// The sessions that began a recording here (at most [`SESSIONS_RECORDED_MAX`]).
    sessions: Mutex<HashSet<String>>,
    prefetching: AtomicBool,
    /// The furthest extent (index in the set) a boot has read during this prefetch run.
    boot_pos: AtomicUsize,
}

impl BootSets {
    /// Turns boot sets on or off (on by default); off, versions are served unwatched.
    pub fn set_enabled(&self, on: bool) {
        self.shared.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether boot sets are on.
    pub fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Relaxed)
    }

    /// Keeps sets in `mirror` (the farm) too, and takes them from it.
    pub fn set_mirror(&self, mirror: Arc<dyn BootSetMirror>) {
        *lock(&self.shared.mirror) = Some(mirror);
    }

    /// Waits (up to `timeout`) until no recording is being merged and saved; returns
    /// whether none is (a server stopping calls it, so the last boot's set is kept).
    pub fn wait_saved(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        while self.shared.saving.load(Ordering::Acquire) > 0 {
            if start.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> BootSetStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BootSetStats {
            recorded_total: l(&c.recorded),
            discarded_total: l(&c.discarded),
            prefetch_runs_total: l(&c.runs),
            prefetch_bytes_total: l(&c.bytes),
            prefetch_hit_bytes_total: l(&c.hits),
            stale_total: l(&c.stale),
            save_errors_total: l(&c.save_errors),
        }
    }

    /// The device a connection to `vdisk@version` (top file `path`) reads: `dev` watched,
    /// recording for `who` (see [`RecordAs`]) if the version has fewer than
    /// [`BOOTS_RECORDED_MAX`] boots, and the version's set prefetched if it has one and no
    /// prefetch runs.
    pub fn watch(
        &self,
        vdisk: &str,
        version: u32,
        path: &Path,
        dev: Arc<CachedDevice>,
        who: RecordAs<'_>,
    ) -> Arc<dyn BlockDevice> {
        if !self.enabled() {
            return dev;
        }
        let slot = self.slot(vdisk, version, path, dev.as_ref());
        slot.refresh();
        let record = slot.begin_recording(who);
        if read_lock(&slot.loaded).is_some() {
            // The set says what this boot reads: read-ahead past it would only add store
            // reads the boot does not need.
            dev.set_read_ahead(false);
        }
        slot.start_prefetch(&dev);
        Arc::new(BootWatch::new(dev, slot, record))
    }

    /// Prefetches the set of `vdisk@version` (top file `path`) through `dev` if it has one
    /// (a server starting). Returns whether a set was found.
    pub fn prefetch(
        &self,
        vdisk: &str,
        version: u32,
        path: &Path,
        dev: &Arc<CachedDevice>,
    ) -> bool {
        let slot = self.slot(vdisk, version, path, dev.as_ref());
        slot.refresh();
        let found = read_lock(&slot.loaded).is_some();
        slot.start_prefetch(dev);
        found
    }

    /// The slot of a version, made (and its persisted set loaded) if new or if the file's
    /// identity changed.
    fn slot(&self, vdisk: &str, version: u32, path: &Path, dev: &dyn BlockDevice) -> Arc<Slot> {
        let identity = identity_of(vdisk, version, path, dev);
        let file = set_path(path);
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(&file)
            && s.identity == identity
        {
            return s.clone();
        }
        let slot = Arc::new(Slot {
            shared: self.shared.clone(),
            identity,
            file: file.clone(),
            loaded: RwLock::default(),
            persisted: Mutex::default(),
            recording: AtomicU32::new(0),
            sessions: Mutex::default(),
            prefetching: AtomicBool::new(false),
            boot_pos: AtomicUsize::new(0),
        });
        slots.insert(file, slot.clone());
        drop(slots);
        slot.load_file();
        slot
    }
}

/// The file that keeps the set of the version whose top file is `path`.
pub fn set_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(BOOT_SET_SUFFIX);
    PathBuf::from(s)
}

/// The identity of the opened version `vdisk@version` whose top file is `path`.
pub fn identity_of(vdisk: &str, version: u32, path: &Path, dev: &dyn BlockDevice) -> Identity {
    let stamp = match dev.linkage_id() {
        Some(g) => g.to_le_bytes(),
        None => file_stamp(path),
    };
    Identity {
        vdisk: vdisk.to_string(),
        version,
        size_bytes: dev.size(),
        stamp,
    }
}

/// A digest of a file's device, inode, length and mtime (for formats without a write GUID).
fn file_stamp(path: &Path) -> [u8; 16] {
    let Ok(m) = std::fs::metadata(path) else {
        return [0; 16];
    };
    let mut out = [0u8; 16];
    for (i, salt) in [0x5eed_u64, 0xb007].into_iter().enumerate() {
        let mut h = std::hash::DefaultHasher::new();
        (salt, m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()).hash(&mut h);
        out[i * 8..i * 8 + 8].copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

impl BootObserver for Slot {
    fn window(&self) -> Duration {
        BOOT_WINDOW
    }

    fn record_bytes_max(&self) -> u64 {
        BOOT_RECORD_BYTES_MAX
    }

    fn record_pages_max(&self) -> usize {
        usize::try_from(BOOT_RECORD_BYTES_MAX / PAGE_BYTES).unwrap_or(usize::MAX)
    }

    /// Notes a client's read: where the boot is, and whether it read a warmed extent.
    fn observe(&self, offset: u64, len: u64) {
        let loaded = read_lock(&self.loaded);
        let Some(l) = loaded.as_ref() else { return };
        let Some(i) = l.index.find(offset) else {
            return;
        };
        self.boot_pos.fetch_max(i, Ordering::Relaxed);
        if l.warmed[i].load(Ordering::Relaxed) {
            self.shared.counters.hits.fetch_add(len, Ordering::Relaxed);
        }
    }

    /// A connection's recording ended (`None`: nothing recorded): merges it into the set
    /// and persists the result, on a thread of its own (a merge and an fsync are not for a
    /// reader's thread).
    fn recorded(self: Arc<Self>, rec: Option<Recording>) {
        let slot = self.clone();
        self.shared.saving.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("ferry-bootset-save".into())
            .spawn(move || {
                slot.merge_recording(rec);
                slot.recording.fetch_sub(1, Ordering::AcqRel);
                slot.shared.saving.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            // The closure (and the recording) is gone with the error: the boot is lost.
            self.recording.fetch_sub(1, Ordering::AcqRel);
            self.shared.saving.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "boot set recording dropped");
        }
    }
}

impl Slot {
    /// Whether a new connection of `who` records: not for nobody, once per session, and
    /// while fewer boots are merged and recording than the limit.
    fn begin_recording(&self, who: RecordAs<'_>) -> bool {
        let mut sessions = match who {
            RecordAs::Nobody => return false,
            RecordAs::Trusted => None,
            RecordAs::Session(name) => {
                let seen = lock(&self.sessions);
                if seen.contains(name) || seen.len() >= SESSIONS_RECORDED_MAX {
                    return false;
                }
                Some((seen, name))
            }
        };
        let boots = read_lock(&self.loaded).as_ref().map_or(0, |l| l.set.boots);
        let r = self
            .recording
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (boots + n < BOOTS_RECORDED_MAX).then_some(n + 1)
            });
        if r.is_ok()
            && let Some((seen, name)) = sessions.as_mut()
        {
            seen.insert((*name).to_string());
        }
        r.is_ok()
    }

    fn merge_recording(&self, rec: Option<Recording>) {
        let c = &self.shared.counters;
        let size = self.identity.size_bytes;
        let Some(rec) = rec.filter(|r| {
            let bytes = r.recorder.bytes();
            bytes >= BOOT_RECORD_BYTES_MIN
                && !r.recorder.is_full()
                && u128::from(bytes) * 100 <= u128::from(size) * u128::from(BOOT_SHARE_MAX_PERCENT)
        }) else {
            c.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(one) = rec.recorder.finish(self.identity.clone()) else {
            return;
        };
        let mut loaded = write_lock(&self.loaded);
        let merged = match loaded.as_ref() {
            Some(l) => bootset::merge(&[l.set.clone(), one]),
            None => Ok(one),
        };
        let set = match merged {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(file = %self.file.display(), error = %e, "boot set merge failed");
                return;
            }
        };
        if u128::from(set.bytes()) * 100 > u128::from(size) * u128::from(BOOT_SHARE_MAX_PERCENT) {
            // Boots together reading most of the disk are no boot set (or not honest ones).
            c.discarded.fetch_add(1, Ordering::Relaxed);
            tracing::info!(file = %self.file.display(), bytes = set.bytes(),
                "boot set merge would cover most of the disk: dropped");
            return;
        }
        let encoded = set.encode();
        let (boots, extents, bytes) = (set.boots, set.extents.len(), set.bytes());
        *loaded = Some(Loaded::new(set));
        drop(loaded);
        c.recorded.fetch_add(1, Ordering::Relaxed);
        tracing::info!(file = %self.file.display(), boots, extents, bytes, "boot set recorded");
        self.save(&encoded);
    }

    /// Writes the set's file (0600, atomically) and gives it to the mirror.
    fn save(&self, encoded: &[u8]) {
        let mut persisted = lock(&self.persisted);
        match write_atomic(&self.file, encoded) {
            Ok(stamp) => persisted.file = Some(stamp),
            Err(e) => {
                self.shared
                    .counters
                    .save_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %self.file.display(), error = %e, "boot set not saved");
            }
        }
        let mirror = lock(&self.shared.mirror).clone();
        if let Some(m) = mirror {
            let id = &self.identity;
            if let Err(e) = m.save(&id.vdisk, id.version, encoded) {
                self.shared
                    .counters
                    .save_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(vdisk = %id.vdisk, version = id.version, error = %e,
                    "boot set not saved in the farm");
            }
            persisted.mirror_checked = Some(Instant::now());
        }
    }

    /// Loads the set's file (a stale one is deleted), else the mirror's copy.
    fn load_file(&self) {
        let mut persisted = lock(&self.persisted);
        persisted.file = stat(&self.file);
        if persisted.file.is_some() {
            let set = read_limited(&self.file).and_then(|b| self.accept(&b, "file"));
            match set {
                Some(set) => *write_lock(&self.loaded) = Some(Loaded::new(set)),
                None => {
                    let _ = std::fs::remove_file(&self.file);
                    persisted.file = None;
                }
            }
        }
        drop(persisted);
        if read_lock(&self.loaded).is_none() {
            self.load_mirror();
        }
    }

    /// Takes the mirror's copy, if there is a mirror and it has a valid one; drops ours if
    /// the mirror has none (it was cleared).
    fn load_mirror(&self) {
        let Some(m) = lock(&self.shared.mirror).clone() else {
            return;
        };
        lock(&self.persisted).mirror_checked = Some(Instant::now());
        let id = &self.identity;
        match m.load(&id.vdisk, id.version) {
            Ok(Some(bytes)) => {
                let Some(set) = self.accept(&bytes, "farm") else {
                    return;
                };
                let same = read_lock(&self.loaded)
                    .as_ref()
                    .is_some_and(|l| l.set == set);
                if !same {
                    if let Ok(stamp) = write_atomic(&self.file, &bytes) {
                        lock(&self.persisted).file = Some(stamp);
                    }
                    *write_lock(&self.loaded) = Some(Loaded::new(set));
                }
            }
            Ok(None) => {
                if write_lock(&self.loaded).take().is_some() {
                    tracing::info!(vdisk = %id.vdisk, version = id.version, "boot set cleared in the farm");
                    let _ = std::fs::remove_file(&self.file);
                    lock(&self.persisted).file = None;
                }
            }
            Err(e) => tracing::debug!(error = %e, "farm boot set not read"),
        }
    }

    /// At a boot's open: notices a set cleared or replaced since it was loaded.
    fn refresh(&self) {
        let now = stat(&self.file);
        let known = lock(&self.persisted).file;
        if now != known {
            *write_lock(&self.loaded) = None;
            self.load_file();
            return;
        }
        let due = lock(&self.persisted)
            .mirror_checked
            .is_none_or(|t| t.elapsed() >= MIRROR_RECHECK);
        if due {
            self.load_mirror();
        }
    }

    /// Decodes a persisted set and checks it is this version's.
    fn accept(&self, bytes: &[u8], from: &str) -> Option<BootSet> {
        match BootSet::decode(bytes) {
            Ok(s) if s.identity == self.identity => Some(s),
            Ok(s) => {
                self.shared.counters.stale.fetch_add(1, Ordering::Relaxed);
                tracing::info!(from, file = %self.file.display(), recorded_for = %format!("{}@{}", s.identity.vdisk, s.identity.version),
                    "boot set of another version identity ignored");
                None
            }
            Err(e) => {
                tracing::warn!(from, file = %self.file.display(), error = %e, "boot set invalid");
                None
            }
        }
    }

    /// Starts a prefetch run through `dev` unless one runs or there is no set.
    fn start_prefetch(self: &Arc<Self>, dev: &Arc<CachedDevice>) {
        let Some(l) = read_lock(&self.loaded).clone() else {
            return;
        };
        if self.prefetching.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.counters.runs.fetch_add(1, Ordering::Relaxed);
        self.boot_pos.store(0, Ordering::Relaxed);
        let (slot, dev) = (self.clone(), dev.clone());
        let run = move || {
            slot.run_prefetch(&l, &dev);
            slot.prefetching.store(false, Ordering::Release);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("ferry-bootset".into())
            .spawn(run)
        {
            self.prefetching.store(false, Ordering::Release);
            tracing::warn!(error = %e, "boot set prefetch not started");
        }
    }

    fn run_prefetch(&self, l: &Arc<Loaded>, dev: &CachedDevice) {
        let started = Instant::now();
        let pieces = pieces(&l.set);
        let cursor = AtomicUsize::new(0);
        let read = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..PREFETCH_DEPTH {
                s.spawn(|| {
                    loop {
                        let k = cursor.fetch_add(1, Ordering::Relaxed);
                        let Some(&(i, offset, len)) = pieces.get(k) else {
                            return;
                        };
                        let current = read_lock(&self.loaded)
                            .as_ref()
                            .is_some_and(|now| Arc::ptr_eq(now, l));
                        if started.elapsed() > BOOT_WINDOW || !current {
                            return;
                        }
                        let pos = self.boot_pos.load(Ordering::Relaxed);
                        if pos > i + PREFETCH_BEHIND_EXTENTS {
                            continue;
                        }
                        match dev.warm(offset, len) {
                            Ok(n) => {
                                read.fetch_add(n, Ordering::Relaxed);
                                self.shared.counters.bytes.fetch_add(n, Ordering::Relaxed);
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, offset, len, "boot set warm failed");
                            }
                        }
                        l.warmed[i].store(true, Ordering::Relaxed);
                    }
                });
            }
        });
        tracing::debug!(file = %self.file.display(), read = read.load(Ordering::Relaxed),
            ms = started.elapsed().as_millis() as u64, "boot set prefetched");
    }
}

/// The set's extents cut into warms of at most [`PREFETCH_READ_BYTES_MAX`], in set order:
/// `(extent index, offset, len)`.
fn pieces(set: &BootSet) -> Vec<(usize, u64, u64)> {
    let mut out = Vec::with_capacity(set.extents.len());
    for (i, e) in set.extents.iter().enumerate() {
        let mut at = e.offset;
        while at < e.end() {
            let len = PREFETCH_READ_BYTES_MAX.min(e.end() - at);
            out.push((i, at, len));
            at += len;
        }
    }
    out
}

fn stat(path: &Path) -> Option<(u64, i128)> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.len(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

/// Reads a set's file, refusing one larger than [`BOOT_SET_FILE_BYTES_MAX`].
fn read_limited(path: &Path) -> Option<Vec<u8>> {
    let len = std::fs::metadata(path).ok()?.len();
    if len > BOOT_SET_FILE_BYTES_MAX as u64 {
        tracing::warn!(file = %path.display(), len, "boot set file too large");
        return None;
    }
    std::fs::read(path).ok()
}

/// Writes `bytes` to `path` through a 0600 temporary file, fsync and rename; returns the
/// new file's (length, mtime).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<(u64, i128)> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    stat(path).ok_or_else(|| std::io::Error::other("boot set file vanished"))
}

/// Deletes set files in `dir` whose version file is gone (and temporary files left by a
/// crash); returns how many.
pub fn sweep(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten().take(crate::store::STORE_ENTRIES_MAX) {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let orphan = match name.split_once(BOOT_SET_SUFFIX) {
            Some((version, "")) => !dir.join(version).exists(),
            Some((_, rest)) => rest.starts_with(".tmp"),
            None => false,
        };
        if orphan && std::fs::remove_file(e.path()).is_ok() {
            n += 1;
        }
    }
    n
}

/// Appends the boot-set metrics in Prometheus text format.
pub fn render_metrics(s: &BootSetStats, out: &mut String) {
    use std::fmt::Write as _;
    let rows: [(&str, &str, u64); 7] = [
        (
            "recorded",
            "Boots recorded and merged into a version's boot set",
            s.recorded_total,
        ),
        (
            "discarded",
            "Connections too small to record as a boot",
            s.discarded_total,
        ),
        (
            "prefetch_runs",
            "Boot set prefetch runs started",
            s.prefetch_runs_total,
        ),
        (
            "prefetch_bytes",
            "Bytes boot set prefetches read from the store",
            s.prefetch_bytes_total,
        ),
        (
            "prefetch_hit_bytes",
            "Bytes clients read from extents a prefetch had warmed",
            s.prefetch_hit_bytes_total,
        ),
        (
            "stale",
            "Persisted boot sets of another version identity, ignored and deleted",
            s.stale_total,
        ),
        (
            "save_errors",
            "Boot sets that could not be saved",
            s.save_errors_total,
        ),
    ];
    for (name, help, v) in rows {
        let _ = writeln!(out, "# HELP ferry_bootset_{name}_total {help}.");
        let _ = writeln!(out, "# TYPE ferry_bootset_{name}_total counter");
        let _ = writeln!(out, "ferry_bootset_{name}_total {v}");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_lock<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}
