//! The registry's listing of exports (with virtual sizes cached per file identity), and
//! the boot sets prefetched when a server starts.

use std::path::Path;
use std::sync::Arc;

use contract::ErrorChain;
use nbd_server::ExportInfo;

use super::{EXPORTS_LIST_MAX, FileId, Inner, Registry, lock};
use crate::boot_sets::{self, BOOT_SET_SUFFIX};
use crate::store::StoreError;

impl Registry {
    /// Starts the prefetch of every version in the store that has a boot set (a server
    /// starting), after deleting sets whose version is gone; returns how many started.
    pub fn warm_boot_sets(&self) -> usize {
        let inner: &Arc<Inner> = &self.inner;
        if !inner.boot_sets.enabled() {
            return 0;
        }
        let swept = boot_sets::sweep(inner.store.dir());
        if swept > 0 {
            tracing::info!(swept, "deleted boot sets of versions that are gone");
        }
        let Ok(vdisks) = inner.store.scan() else {
            return 0;
        };
        let mut n = 0;
        for vd in vdisks {
            for (&version, path) in &vd.versions {
                if !boot_sets::set_path(path).exists() {
                    continue;
                }
                match inner.prefetch_at(&vd.name, version, path) {
                    Ok(found) => n += usize::from(found),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "boot set not prefetched")
                    }
                }
            }
        }
        tracing::info!(
            versions = n,
            suffix = BOOT_SET_SUFFIX,
            "boot sets prefetching"
        );
        n
    }

    /// Starts the prefetch of the boot set of `vdisk@version` (a version promoted in the
    /// farm, or found in production when the server starts), unless one runs. Returns
    /// whether the version is in this server's store and has a set (from its file or the
    /// farm). Blocking: the farm's copy may be read.
    ///
    /// # Errors
    /// A bad name, a version this store does not hold, or its chain failing to open.
    pub fn prefetch_boot_set(&self, vdisk: &str, version: u32) -> Result<bool, String> {
        let inner: &Arc<Inner> = &self.inner;
        if !inner.boot_sets.enabled() {
            return Ok(false);
        }
        let name = contract::VdiskName::new(vdisk).map_err(|e| format!("{vdisk:?}: {e}"))?;
        let res = inner
            .store
            .resolve_version(&name, Some(version))
            .map_err(|e| ErrorChain(&e).to_string())?;
        inner
            .prefetch_at(&res.vdisk, res.version, &res.path)
            .map_err(|e| ErrorChain(&e).to_string())
    }
}

impl Inner {
    /// Starts the prefetch of the set of `vdisk@version`, whose top file is `path`, through
    /// its cached chain; returns whether it has a set.
    fn prefetch_at(
        self: &Arc<Self>,
        vdisk: &str,
        version: u32,
        path: &Path,
    ) -> Result<bool, nbd_server::OpenError> {
        let dev = self.cached_chain(path)?;
        Ok(self.boot_sets.prefetch(vdisk, version, path, &dev))
    }

    pub(super) fn list(&self) -> Result<Vec<ExportInfo>, StoreError> {
        let mut out = Vec::new();
        for vd in self.store.scan()? {
            let Some(newest) = vd.newest() else { continue };
            for (&version, path) in &vd.versions {
                let Some(size) = self.size_of(path) else {
                    continue;
                };
                if version == newest {
                    out.push(ExportInfo {
                        name: vd.name.clone(),
                        description: format!("vDisk {} (newest: version {version})", vd.name),
                        size,
                    });
                }
                out.push(ExportInfo {
                    name: format!("{}@{version}", vd.name),
                    description: format!("vDisk {} version {version}", vd.name),
                    size,
                });
                if out.len() >= EXPORTS_LIST_MAX {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The virtual size of a store file (cached while the file is unchanged); `None`, with
    /// a warning, for a file that does not open.
    fn size_of(&self, path: &Path) -> Option<u64> {
        let id = FileId::of(path).ok()?;
        if let Some((known, size)) = lock(&self.sizes).get(path)
            && *known == id
        {
            return Some(*size);
        }
        let opts = disk::open::OpenOptions::default();
        let storages = lock(&self.storages).clone();
        let opened = match storages {
            Some(s) => disk::open::open_one_confined_with(self.store.dir(), path, opts, s.as_ref()),
            None => disk::open::open_one(path, opts),
        };
        match opened {
            Ok(layer) => {
                let size = layer.image.device().size();
                lock(&self.sizes).insert(path.to_path_buf(), (id, size));
                Some(size)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %ErrorChain(&e), "store file does not open");
                None
            }
        }
    }
}
