//! The boot service's located versions: each version's [`Located`] boot files (the search's
//! result and the chain it opened), found once and kept, so a boot's script, kernel and
//! initramfs requests search the version once between them, and a boot storm once in all.
//!
//! Entries are keyed like the boot file cache ([`CacheKey`]: vDisk, version, the version
//! file's size and modification time, the overrides), so a version file that changed is
//! searched again; the entry of its older state is dropped then (with its open chain).
//!
//! # Design notes
//!
//! Each key holds a `OnceCell`: the first request searches (under one of the service's
//! fill permits, on the blocking pool) and the others wait for its result instead of
//! searching beside it. A failed search leaves the cell empty, so the next request tries
//! again (the version file may be written meanwhile). An entry holds its chain open, so the
//! map keeps at most [`VERSIONS_MAX`] entries and drops the oldest one past that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OnceCell, Semaphore};

use crate::boot_cache::CacheKey;
use crate::boot_source::{BootSource, Located};

/// The most versions whose located boot files (and open chains) are kept.
pub const VERSIONS_MAX: usize = 32;

/// One version's slot: its search, done or under way, and when it was added.
#[derive(Debug)]
struct Slot {
    cell: Arc<OnceCell<Arc<dyn Located>>>,
    added: u64,
}

/// The located versions (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Versions {
    slots: Mutex<HashMap<CacheKey, Slot>>,
    /// Entries ever added: the age of a slot, for dropping the oldest.
    added: AtomicU64,
}

/// What a search needs: where boot files come from, the permits of reads through a chain,
/// and the counter of searches made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Search<'a> {
    pub source: &'a Arc<dyn BootSource>,
    pub fills: &'a Semaphore,
    pub searches: &'a AtomicU64,
}

impl Versions {
    /// The located boot files of the version `key` whose file is `image`: kept, or found
    /// now through `s.source` under a permit of `s.fills` (counted in `s.searches`).
    ///
    /// # Errors
    /// The search's error (not kept: the next call searches again).
    pub(crate) async fn located(
        &self,
        key: &CacheKey,
        image: &std::path::Path,
        s: Search<'_>,
    ) -> Result<Arc<dyn Located>, String> {
        let cell = self.slot(key);
        let found = cell
            .get_or_try_init(|| async {
                let _fill = s.fills.acquire().await.map_err(|e| e.to_string())?;
                s.searches.fetch_add(1, Ordering::Relaxed);
                let (source, image) = (Arc::clone(s.source), image.to_path_buf());
                tokio::task::spawn_blocking(move || source.locate(&image))
                    .await
                    .map_err(|e| format!("boot file search stopped: {e}"))?
            })
            .await?;
        Ok(Arc::clone(found))
    }

    /// The slot of `key`, added (dropping the slots of the version's older file states, and
    /// the oldest slot when full) when it is new.
    fn slot(&self, key: &CacheKey) -> Arc<OnceCell<Arc<dyn Located>>> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.get(key) {
            return Arc::clone(&s.cell);
        }
        slots.retain(|k, _| !k.same_version(key));
        if slots.len() >= VERSIONS_MAX
            && let Some(oldest) = slots
                .iter()
                .min_by_key(|(_, s)| s.added)
                .map(|(k, _)| k.clone())
        {
            slots.remove(&oldest);
        }
        let cell = Arc::new(OnceCell::new());
        let added = self.added.fetch_add(1, Ordering::Relaxed);
        slots.insert(
            key.clone(),
            Slot {
                cell: Arc::clone(&cell),
                added,
            },
        );
        debug_assert!(slots.len() <= VERSIONS_MAX, "at most VERSIONS_MAX slots");
        cell
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::boot_script::RootDev;
    use crate::boot_source::{BootFileKind, BootInfo, BootOverrides};

    /// Finds the same nothing in every image, and counts how often.
    #[derive(Debug, Default)]
    struct Counting {
        calls: AtomicU64,
    }

    #[derive(Debug)]
    struct Nothing;

    impl Located for Nothing {
        fn info(&self, _overrides: &BootOverrides) -> BootInfo {
            BootInfo {
                initrd: false,
                cmdline: None,
                root: RootDev::Unknown,
            }
        }

        fn read(&self, _: BootFileKind, _: &BootOverrides, _: u64) -> Result<Vec<u8>, String> {
            Ok(Vec::new())
        }
    }

    impl BootSource for Counting {
        fn locate(&self, _image: &Path) -> Result<Arc<dyn Located>, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(Nothing))
        }
    }

    async fn key(image: &Path, number: i64) -> CacheKey {
        crate::boot_cache::key_of(image, 1, number, &BootOverrides::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn concurrent_requests_for_a_version_search_it_once() {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("g.vhdx");
        std::fs::write(&image, b"one").unwrap();
        let counting = Arc::new(Counting::default());
        let source: Arc<dyn BootSource> = counting.clone();
        let (v, fills, searches) = (Versions::default(), Semaphore::new(2), AtomicU64::new(0));
        let s = Search {
            source: &source,
            fills: &fills,
            searches: &searches,
        };
        let k = key(&image, 0).await;
        // Three requests at once, as a boot's script, kernel and initrd requests.
        let (a, b, c) = tokio::join!(
            v.located(&k, &image, s),
            v.located(&k, &image, s),
            v.located(&k, &image, s),
        );
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        assert_eq!(counting.calls.load(Ordering::SeqCst), 1);
        assert_eq!(searches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_changed_version_file_is_searched_again_and_its_old_state_dropped() {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("g.vhdx");
        std::fs::write(&image, b"one").unwrap();
        let source: Arc<dyn BootSource> = Arc::new(Counting::default());
        let (v, fills, searches) = (Versions::default(), Semaphore::new(2), AtomicU64::new(0));
        let s = Search {
            source: &source,
            fills: &fills,
            searches: &searches,
        };
        let k1 = key(&image, 0).await;
        v.located(&k1, &image, s).await.unwrap();
        // A longer file: another size, so another key.
        std::fs::write(&image, b"longer").unwrap();
        let k2 = key(&image, 0).await;
        v.located(&k2, &image, s).await.unwrap();
        v.located(&k2, &image, s).await.unwrap();
        assert_eq!(searches.load(Ordering::SeqCst), 2);
        assert_eq!(v.slots.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn past_versions_max_the_oldest_slot_goes() {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("g.vhdx");
        std::fs::write(&image, b"one").unwrap();
        let source: Arc<dyn BootSource> = Arc::new(Counting::default());
        let (v, fills, searches) = (Versions::default(), Semaphore::new(2), AtomicU64::new(0));
        let s = Search {
            source: &source,
            fills: &fills,
            searches: &searches,
        };
        for n in 0..=VERSIONS_MAX as i64 {
            v.located(&key(&image, n).await, &image, s).await.unwrap();
        }
        let first = key(&image, 0).await;
        let slots = v.slots.lock().unwrap();
        assert_eq!(slots.len(), VERSIONS_MAX);
        assert!(!slots.contains_key(&first));
    }
}
