//! Session resolution and boot-set mirroring: the two traits `server` declares for its farm,
//! implemented over `farm::Farm`.
//!
//! A session this process does not hold (granted by another server of the farm, or by this
//! one before a restart) is looked up in the farm database and remembered: the database is
//! the source of truth, the session table a cache of it.
//!
//! ```text
//!   NBD_OPT_GO ferry-s-KEY ──► FarmSessions::resolve ──► SessionTable (this process's)
//!                                                    └─► Farm::session_grant (any server's)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use contract::{CacheMode, DeviceName, ExportName, Mac, SessionKey, VdiskName};
use farm::sessions::{SessionGrant, SessionLookup as _, SessionTable};

use crate::FarmHandle;

/// Maps the farm's session grants to the export names of [`server::exports::Registry`].
#[derive(Debug)]
pub struct FarmSessions {
    table: Arc<SessionTable>,
    farm: Arc<farm::Farm>,
    server_id: i64,
    runtime: tokio::runtime::Handle,
    store_dir: PathBuf,
}

impl FarmSessions {
    /// Grants of `handle`'s farm whose store is `store_dir` (the one this registry
    /// serves); database lookups run on `runtime` (the resolver is called on its blocking
    /// pool). Time is the farm's clock.
    pub fn new(
        handle: &FarmHandle,
        runtime: tokio::runtime::Handle,
        store_dir: &Path,
    ) -> FarmSessions {
        let store_dir = store_dir
            .canonicalize()
            .unwrap_or_else(|_| store_dir.to_path_buf());
        FarmSessions {
            table: handle.farm.session_table(),
            farm: Arc::clone(&handle.farm),
            server_id: handle.server_id,
            runtime,
            store_dir,
        }
    }

    /// The live grant of `export_name`: the table's, else the database's.
    fn grant(&self, export_name: &str) -> Option<SessionGrant> {
        if let Some(g) = self.table.lookup(export_name, self.farm.now_ms()) {
            return Some(g);
        }
        let found = self
            .runtime
            .block_on(self.farm.session_grant(export_name, Some(self.server_id)));
        match found {
            Ok(g) => {
                if g.is_some() {
                    tracing::info!(
                        session = export_name,
                        "session found in the farm database (granted by another server or before a restart)"
                    );
                }
                g
            }
            Err(e) => {
                tracing::warn!(session = export_name, error = %e, "farm database lookup of a session failed");
                None
            }
        }
    }
}

/// The registry export a grant stands for (`NAME@V`, `NAME@V+aa-bb-cc-dd-ee-ff`,
/// `...+persistent`, or `NAME+private` when it writes the version itself), or why there is
/// none.
///
/// # Errors
/// A grant whose vDisk name, MAC or version does not make an export name.
pub fn export_for(g: &SessionGrant) -> Result<ExportName, String> {
    let vdisk = VdiskName::new(&g.vdisk_name).map_err(|e| format!("vdisk name: {e}"))?;
    let mac: Mac = g.mac.parse().map_err(|e| format!("mac {:?}: {e}", g.mac))?;
    let device = DeviceName::of_mac(mac);
    if g.writable || g.cache_mode == CacheMode::Private {
        return Ok(ExportName::Private { vdisk });
    }
    let version = u32::try_from(g.version).map_err(|_| format!("version {}", g.version))?;
    ExportName::for_cache_mode(g.cache_mode, vdisk, Some(version), device.as_str())
        .map_err(|e| e.to_string())
}

impl server::exports::SessionResolver for FarmSessions {
    fn resolve(&self, key: &SessionKey) -> Option<server::access::SessionExport> {
        let export_name = ExportName::Session(key.clone()).to_string();
        let g = self.grant(&export_name)?;
        let dir = g.store_dir.canonicalize().unwrap_or(g.store_dir.clone());
        if dir != self.store_dir {
            tracing::warn!(
                session = export_name,
                store = %g.store_dir.display(),
                served = %self.store_dir.display(),
                "session's vDisk lives in a store this server does not serve"
            );
            return None;
        }
        let device: Mac = g
            .mac
            .parse()
            .inspect_err(|e| tracing::warn!(session = export_name, error = %e, "session's MAC"))
            .ok()?;
        export_for(&g)
            .inspect_err(|why| {
                tracing::warn!(session = export_name, why, "session names no export");
            })
            .ok()
            .map(|export| server::access::SessionExport { export, device })
    }
}

/// Keeps the boot sets this server records in the farm database, and reads those other
/// servers recorded (`server::boot_sets::BootSetMirror`): a set follows its version to
/// every server and goes with it.
#[derive(Debug)]
pub struct FarmBootSets {
    farm: Arc<farm::Farm>,
    runtime: tokio::runtime::Handle,
}

impl FarmBootSets {
    /// The boot sets of `handle`'s farm; database calls run on `runtime` (the mirror is
    /// called from the blocking pool and the server's own threads).
    pub fn new(handle: &FarmHandle, runtime: tokio::runtime::Handle) -> FarmBootSets {
        FarmBootSets {
            farm: Arc::clone(&handle.farm),
            runtime,
        }
    }
}

impl server::boot_sets::BootSetMirror for FarmBootSets {
    fn load(&self, vdisk: &str, version: u32) -> Result<Option<Vec<u8>>, String> {
        self.runtime
            .block_on(self.farm.boot_set_by_name(vdisk, i64::from(version)))
            .map_err(|e| contract::ErrorChain(&e).to_string())
    }

    fn save(&self, vdisk: &str, version: u32, encoded: &[u8]) -> Result<(), String> {
        let set = bootset::BootSet::decode(encoded).map_err(|e| e.to_string())?;
        let summary = (
            i64::from(set.boots),
            i64::try_from(set.extents.len()).unwrap_or(i64::MAX),
            i64::try_from(set.bytes()).unwrap_or(i64::MAX),
        );
        self.runtime
            .block_on(
                self.farm
                    .save_boot_set(vdisk, i64::from(version), encoded, summary),
            )
            .map_err(|e| contract::ErrorChain(&e).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_map_to_registry_exports() {
        let grant = |cache_mode, writable| SessionGrant {
            session_id: "s".into(),
            export_name: "ferry-s-00".into(),
            device_id: 1,
            mac: "aa:bb:cc:00:00:01".into(),
            device_type: farm::model::DeviceType::Production,
            vdisk_id: 1,
            vdisk_name: "golden".into(),
            version: 3,
            store_dir: PathBuf::from("/s"),
            path: PathBuf::from("/s/golden.3.avhdx"),
            cache_mode,
            ram_bytes: 0,
            writable,
            expires_at_ms: 0,
        };
        let got = [
            grant(CacheMode::Ram, false),
            grant(CacheMode::Server, false),
            grant(CacheMode::ServerPersistent, false),
            grant(CacheMode::Private, true),
        ]
        .map(|g| export_for(&g).unwrap().to_string());
        assert_eq!(
            got,
            [
                "golden@3",
                "golden@3+aa-bb-cc-00-00-01",
                "golden@3+aa-bb-cc-00-00-01+persistent",
                "golden+private"
            ]
        );
    }
}
