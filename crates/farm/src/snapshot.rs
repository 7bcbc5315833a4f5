//! A server's snapshot of the farm: what its devices' boots and failovers read, kept in
//! memory so that they go on while the database is away ([`crate::offline`]).
//!
//! ```text
//!   member runtime, every SNAPSHOT_EVERY_MS ──► Farm::refresh_snapshot(server) ──► Snapshot
//!   database unreachable ──► device_by_mac, device, vdisk, versions, store_dir,
//!                            site_servers, site_api_urls, auto_add_collection,
//!                            device_key, tpm_bound, a session by export name
//!                            answered from the Snapshot
//! ```
//!
//! It holds what login and the boot path read, nothing an administrator lists: devices (with
//! their keys: it lives in the server's memory only, never on disk), vDisks, versions, the
//! store directories as this server sees them, each collection's servers and API URLs in the
//! order a login names them, the auto-add collection, the live sessions and the boot tickets'
//! life. Bounded by the farm itself (one query per table; devices are the most rows).

use std::collections::HashMap;
use std::path::PathBuf;

use contract::login::LoginServer;

use crate::error::{FarmError, Result};
use crate::model::{Device, Session, VDisk, Version};

/// How often a server refreshes its snapshot: the most it can lag behind the database at
/// the start of an outage.
pub const SNAPSHOT_EVERY_MS: i64 = 15_000;

/// One device as the snapshot keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    pub(crate) device: Device,
    pub(crate) key_hex: Option<String>,
    pub(crate) tpm_bound: bool,
}

/// The farm as one server last read it (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When it was read (Unix ms, the farm's clock).
    pub taken_at_ms: i64,
    pub(crate) devices: HashMap<i64, Known>,
    pub(crate) by_mac: HashMap<String, i64>,
    pub(crate) vdisks: HashMap<i64, VDisk>,
    pub(crate) versions: HashMap<i64, Vec<Version>>,
    pub(crate) store_dirs: HashMap<i64, PathBuf>,
    pub(crate) site_servers: HashMap<i64, Vec<LoginServer>>,
    pub(crate) site_api_urls: HashMap<i64, Vec<String>>,
    pub(crate) auto_add: Option<(i64, Option<i64>)>,
    pub(crate) sessions: HashMap<String, Session>,
    pub(crate) boot_ticket_secs: i64,
}

fn gone(what: String) -> FarmError {
    FarmError::not_found(what)
}

impl Snapshot {
    /// How many devices it knows.
    pub fn devices(&self) -> usize {
        self.devices.len()
    }

    /// How many live sessions it knows.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    pub(crate) fn device_by_mac(&self, mac: &str) -> Option<Device> {
        let id = self.by_mac.get(mac)?;
        self.devices.get(id).map(|k| k.device.clone())
    }

    pub(crate) fn device(&self, id: i64) -> Result<Device> {
        self.devices
            .get(&id)
            .map(|k| k.device.clone())
            .ok_or_else(|| gone(format!("no device {id}")))
    }

    pub(crate) fn device_key(&self, id: i64) -> Option<String> {
        self.devices.get(&id).and_then(|k| k.key_hex.clone())
    }

    pub(crate) fn tpm_bound(&self, id: i64) -> bool {
        self.devices.get(&id).is_some_and(|k| k.tpm_bound)
    }

    pub(crate) fn vdisk(&self, id: i64) -> Result<VDisk> {
        self.vdisks
            .get(&id)
            .cloned()
            .ok_or_else(|| gone(format!("no vdisk {id}")))
    }

    pub(crate) fn versions(&self, vdisk_id: i64) -> Result<Vec<Version>> {
        self.vdisk(vdisk_id)?;
        Ok(self.versions.get(&vdisk_id).cloned().unwrap_or_default())
    }

    pub(crate) fn version(&self, vdisk_id: i64, number: i64) -> Result<Version> {
        self.versions(vdisk_id)?
            .into_iter()
            .find(|v| v.number == number)
            .ok_or_else(|| gone(format!("vdisk {vdisk_id} has no version {number}")))
    }

    pub(crate) fn store_dir(&self, store_id: i64) -> Result<PathBuf> {
        self.store_dirs
            .get(&store_id)
            .cloned()
            .ok_or_else(|| gone(format!("no store {store_id}")))
    }

    pub(crate) fn site_servers(&self, collection_id: i64) -> Result<Vec<LoginServer>> {
        self.site_servers
            .get(&collection_id)
            .cloned()
            .ok_or_else(|| gone(format!("no collection {collection_id}")))
    }

    pub(crate) fn site_api_urls(&self, collection_id: i64) -> Result<Vec<String>> {
        self.site_api_urls
            .get(&collection_id)
            .cloned()
            .ok_or_else(|| gone(format!("no collection {collection_id}")))
    }

    pub(crate) fn auto_add_collection(&self) -> Option<(i64, Option<i64>)> {
        self.auto_add
    }

    pub(crate) fn session_by_export(&self, export_name: &str, now_ms: i64) -> Option<Session> {
        self.sessions
            .get(export_name)
            .filter(|s| s.expires_at_ms > now_ms)
            .cloned()
    }

    pub(crate) fn boot_ticket_secs(&self) -> i64 {
        self.boot_ticket_secs
    }
}
