//! Session grants from the database: a session this process did not grant itself, because
//! another server of the farm did, or because this server restarted since. The database is
//! the source of truth; the [`crate::SessionTable`] only saves a round trip.
//!
//! ```text
//!   NBD_OPT_GO "ferry-s-…" ──► SessionTable::lookup ──► Some(grant)  → open
//!                                   │ None
//!                                   ▼
//!                          Farm::session_grant ──► sessions row (not expired)
//!                                   │               + device, vDisk, version, store
//!                                   ▼
//!                          SessionTable::insert ──► open
//! ```
//!
//! While the database cannot be reached, the session row comes from the server's snapshot
//! ([`crate::offline`]): a device whose server died fails over to one that knew its
//! session when the snapshot was read.

use crate::db::Farm;
use crate::error::Result;
use crate::login::effective_cache_mode;
use crate::model::{DeviceType, Session};
use crate::sessions::SessionGrant;

impl Farm {
    /// The live grant of the session export `export_name` as the database records it,
    /// rebuilt for the server `server_id` (its store path), and remembered in the session
    /// table; `None` when no unexpired session has that name.
    ///
    /// The cache mode and RAM size are the device's and vDisk's as they are now (the ones
    /// its next login would get); the version is the session's own.
    ///
    /// # Errors
    /// Database errors; a session whose device, vDisk or version is gone is `None`.
    pub async fn session_grant(
        &self,
        export_name: &str,
        server_id: Option<i64>,
    ) -> Result<Option<SessionGrant>> {
        // While the database is away, the sessions of this server's snapshot (offline).
        let now = self.now_ms();
        let db = self.session_by_export(export_name);
        let found = self
            .or_snapshot(db, |snap| Ok(snap.session_by_export(export_name, now)))
            .await?;
        let Some(s) = found else {
            return Ok(None);
        };
        let Some(g) = self.grant_of(&s, server_id).await? else {
            return Ok(None);
        };
        self.session_table().insert(g.clone(), self.now_ms())?;
        Ok(Some(g))
    }

    async fn grant_of(&self, s: &Session, server_id: Option<i64>) -> Result<Option<SessionGrant>> {
        let gone = |e: &crate::FarmError| e.kind() == crate::Kind::NotFound;
        let device = match self.device(s.device_id).await {
            Err(e) if gone(&e) => return Ok(None),
            r => r?,
        };
        let vdisk = match self.vdisk(s.vdisk_id).await {
            Err(e) if gone(&e) => return Ok(None),
            r => r?,
        };
        let version = match self.version(s.vdisk_id, s.version_number).await {
            Err(e) if gone(&e) => return Ok(None),
            r => r?,
        };
        let store_dir = self.store_dir(vdisk.store_id, server_id).await?;
        let cache_mode = effective_cache_mode(s.device_type, device.cache_mode, vdisk.cache_mode);
        Ok(Some(SessionGrant {
            session_id: s.id.clone(),
            export_name: s.export_name.clone(),
            device_id: device.id,
            mac: device.mac,
            device_type: s.device_type,
            vdisk_id: vdisk.id,
            vdisk_name: vdisk.name,
            version: version.number,
            path: store_dir.join(&version.file_name),
            store_dir,
            cache_mode,
            ram_bytes: device.ram_bytes.unwrap_or(vdisk.ram_bytes),
            writable: s.device_type == DeviceType::Maintenance,
            expires_at_ms: s.expires_at_ms,
        }))
    }
}
