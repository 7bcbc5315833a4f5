//! The farm while its database is away: what goes on, what waits, and how it catches up.
//!
//! PVS calls it offline database support; here it is the same promise, stated:
//!
//! ```text
//!   database up ──────► every call as always; each success marks it up
//!   a call finds it unreachable (Kind::Unavailable) ──► marked down (logged once)
//!   while down (each retry after DOWN_RETRY_MS may find it back):
//!     reads of the boot path and of failover ──► the server's Snapshot (crate::snapshot)
//!     a login of a known device ──► nonce / ticket / session kept in this process;
//!                                   the session is served at once and remembered as
//!                                   pending (with a ticket login's new device key)
//!     a change (admin API, status report, auto-add, maintenance login) ──► Unavailable:
//!                                   nothing changed, HTTP 503 with Retry-After
//!   database back ──► Farm::catch_up writes the pending logins (newest login of a device
//!                     wins), audited as made offline; the next snapshot is fresh
//! ```
//!
//! What it does not do: a server started while the database is down does not start (it has
//! no snapshot); a session granted offline is known to the server that granted it only, so
//! its device fails over to another server only once the database is back; an unknown MAC
//! is not added, and a maintenance device does not log in (one writer cannot be proven).
//! A snapshot is at most [`crate::snapshot::SNAPSHOT_EVERY_MS`] older than the outage.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use serde_json::json;

use crate::db::{Farm, audit, hash_secret, random_bytes};
use crate::error::{Kind, Result};
use crate::model::{Device, Session, VDisk, Version};
use crate::offline_state::LoginRecord;
pub use crate::offline_state::{DOWN_RETRY_MS, DatabaseState, OFFLINE_SECRETS_MAX, PENDING_MAX};
use crate::snapshot::{Known, Snapshot};

impl Farm {
    /// The database's state as this process last saw it.
    pub fn database_state(&self) -> DatabaseState {
        self.offline.state()
    }

    /// The snapshot in use, if any.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.offline.snapshot()
    }

    /// Runs a database call, marking the database up when it answers and down when it
    /// cannot be reached.
    pub(crate) async fn watch<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let r = call.await;
        match &r {
            Ok(_) => self.offline.up(self.now_ms()),
            Err(e) if e.kind() == Kind::Unavailable => self.offline.down(self.now_ms()),
            Err(_) => {}
        }
        r
    }

    /// `call` against the database, or `offline` against the snapshot while the database
    /// cannot be reached (and a snapshot exists).
    pub(crate) async fn or_snapshot<T>(
        &self,
        call: impl Future<Output = Result<T>>,
        offline: impl FnOnce(&Snapshot) -> Result<T>,
    ) -> Result<T> {
        if let Some(s) = self.offline.while_down(self.now_ms()) {
            return offline(&s);
        }
        match self.watch(call).await {
            Err(e) if e.kind() == Kind::Unavailable => match self.offline.snapshot() {
                Some(s) => offline(&s),
                None => Err(e),
            },
            r => r,
        }
    }

    /// A login nonce issued while the database is away.
    pub(crate) fn offline_challenge(&self, mac: &str) -> Result<(String, i64)> {
        let now = self.now_ms();
        let nonce = hex::encode(random_bytes::<32>());
        let expires = now + crate::login::NONCE_TTL_MS;
        self.offline.put_nonce(nonce.clone(), mac, expires, now)?;
        Ok((nonce, expires))
    }

    /// A boot ticket issued while the database is away, for `secs`.
    pub(crate) fn offline_ticket(&self, mac: &str, secs: i64) -> Result<String> {
        let now = self.now_ms();
        let ticket = format!(
            "{}{}",
            contract::login::TICKET_PREFIX,
            hex::encode(random_bytes::<32>())
        );
        let expires = now.saturating_add(secs.saturating_mul(1000));
        self.offline
            .put_ticket(hash_secret(&ticket), mac, expires, now)?;
        Ok(ticket)
    }

    /// Writes a login's session (and a ticket login's key) to the database, ending the
    /// device's older sessions; returns their export names. While the database cannot be
    /// reached, keeps it pending instead (when this process has a snapshot) and returns
    /// none: the session table already ended the device's older sessions here.
    pub(crate) async fn record_login(&self, r: LoginRecord) -> Result<Vec<String>> {
        if self.offline.while_down(self.now_ms()).is_some() {
            self.offline.pend(r)?;
            return Ok(Vec::new());
        }
        match self.watch(self.write_login(&r, false)).await {
            Err(e) if e.kind() == Kind::Unavailable && self.offline.snapshot().is_some() => {
                self.offline.pend(r)?;
                Ok(Vec::new())
            }
            other => other.map(|(old, _)| old),
        }
    }

    /// Writes `r`; returns the export names of the device's sessions it ended and whether
    /// `r`'s session was written. A live login ends every other session of its device; a
    /// pending one (`offline`) only older ones, and is not written when a newer login of
    /// its device (on another server) is already there.
    async fn write_login(&self, r: &LoginRecord, offline: bool) -> Result<(Vec<String>, bool)> {
        let mut tx = self.pool.begin().await?;
        let actor = format!("device:{}", r.mac);
        let before = if offline { r.created_at_ms } else { i64::MAX };
        let old: Vec<String> = sqlx::query_scalar(
            "DELETE FROM sessions WHERE device_id = $1 AND created_at_ms <= $2 \
             RETURNING export_name",
        )
        .bind(r.device_id)
        .bind(before)
        .fetch_all(&mut *tx)
        .await?;
        let newer: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE device_id = $1")
            .bind(r.device_id)
            .fetch_one(&mut *tx)
            .await?;
        if newer > 0 {
            tx.commit().await?;
            return Ok((old, false));
        }
        if let Some(key) = &r.new_key {
            let generation =
                crate::credentials::store_device_key(&mut tx, r.device_id, key).await?;
            let detail = json!({ "mac": r.mac, "generation": generation, "offline": offline });
            audit(
                &mut tx,
                r.created_at_ms,
                &actor,
                "device.ticket_login",
                "device",
                &r.device_id.to_string(),
                &detail,
            )
            .await?;
        }
        sqlx::query(
            "INSERT INTO sessions (id, device_id, vdisk_id, version_number, device_type, \
             export_name, token_hash, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&r.session_id)
        .bind(r.device_id)
        .bind(r.vdisk_id)
        .bind(r.version)
        .bind(r.device_type.as_str())
        .bind(&r.export_name)
        .bind(&r.token_hash)
        .bind(r.created_at_ms)
        .bind(r.expires_at_ms)
        .execute(&mut *tx)
        .await?;
        let detail = json!({ "vdisk_id": r.vdisk_id, "version": r.version,
            "session": r.session_id, "offline": offline });
        audit(
            &mut tx,
            r.created_at_ms,
            &actor,
            "device.login",
            "device",
            &r.device_id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok((old, true))
    }

    /// Writes the logins made while the database was away, oldest first; returns how many
    /// were written. Stops at the first that fails (kept for the next call); a session a
    /// newer login of its device replaced is ended here.
    ///
    /// # Errors
    /// The database's, when it is still away.
    pub async fn catch_up(&self) -> Result<usize> {
        let mut written = 0;
        loop {
            let Some(r) = self.offline.first_pending() else {
                return Ok(written);
            };
            let (ended, kept) = self.watch(self.write_login(&r, true)).await?;
            self.offline.done_pending(&r.session_id);
            for e in ended.into_iter().filter(|e| *e != r.export_name) {
                self.sessions.remove(&e);
            }
            if kept {
                written += 1;
                tracing::info!(session = %r.session_id, device = r.device_id,
                    "wrote a login made while the farm database was away");
            } else {
                // The device logged in again elsewhere since: this session is over.
                self.sessions.remove(&r.export_name);
            }
        }
    }
}

impl Farm {
    /// Reads a new snapshot for server `server_id` (its store paths) from the database
    /// and keeps it; returns it.
    ///
    /// # Errors
    /// Database errors (the previous snapshot is kept).
    pub async fn refresh_snapshot(
        &self,
        server_id: Option<i64>,
    ) -> Result<std::sync::Arc<Snapshot>> {
        let s = self.watch(self.read_snapshot(server_id)).await?;
        let s = std::sync::Arc::new(s);
        self.offline.keep(std::sync::Arc::clone(&s));
        Ok(s)
    }

    async fn read_snapshot(&self, server_id: Option<i64>) -> Result<Snapshot> {
        let now = self.now_ms();
        let devices: Vec<Device> = sqlx::query_as(&format!(
            "SELECT {} FROM devices",
            crate::devices::DEVICE_COLUMNS
        ))
        .fetch_all(&self.pool)
        .await?;
        let keys: Vec<(i64, Option<String>, i64)> =
            sqlx::query_as("SELECT id, device_key, tpm_bound FROM devices")
                .fetch_all(&self.pool)
                .await?;
        let keys: HashMap<i64, (Option<String>, i64)> =
            keys.into_iter().map(|(id, k, t)| (id, (k, t))).collect();
        let mut s = Snapshot {
            taken_at_ms: now,
            ..Snapshot::default()
        };
        for device in devices {
            let (key_hex, tpm) = keys.get(&device.id).cloned().unwrap_or((None, 0));
            s.by_mac.insert(device.mac.clone(), device.id);
            s.devices.insert(
                device.id,
                Known {
                    device,
                    key_hex,
                    tpm_bound: tpm == 1,
                },
            );
        }
        let vdisks: Vec<VDisk> = sqlx::query_as(&format!(
            "SELECT {} FROM vdisks",
            crate::vdisks::VDISK_COLUMNS
        ))
        .fetch_all(&self.pool)
        .await?;
        let versions: Vec<Version> = sqlx::query_as(&format!(
            "SELECT {} FROM versions ORDER BY vdisk_id, number",
            crate::lifecycle::VERSION_COLUMNS
        ))
        .fetch_all(&self.pool)
        .await?;
        for v in versions {
            s.versions.entry(v.vdisk_id).or_default().push(v);
        }
        for v in &vdisks {
            if let std::collections::hash_map::Entry::Vacant(e) = s.store_dirs.entry(v.store_id) {
                e.insert(self.store_dir_db(v.store_id, server_id).await?);
            }
        }
        s.vdisks = vdisks.into_iter().map(|v| (v.id, v)).collect();
        let collections: Vec<i64> = sqlx::query_scalar("SELECT id FROM collections")
            .fetch_all(&self.pool)
            .await?;
        for c in collections {
            s.site_servers.insert(c, self.site_servers_db(c).await?);
            s.site_api_urls.insert(c, self.site_api_urls_db(c).await?);
        }
        s.auto_add = sqlx::query_as(
            "SELECT id, default_vdisk_id FROM collections WHERE auto_add = 1 ORDER BY id",
        )
        .fetch_optional(&self.pool)
        .await?;
        let sessions: Vec<Session> = sqlx::query_as(&format!(
            "SELECT {} FROM sessions WHERE expires_at_ms > $1",
            crate::devices::SESSION_COLUMNS
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        s.sessions = sessions
            .into_iter()
            .map(|x| (x.export_name.clone(), x))
            .collect();
        s.boot_ticket_secs = self.boot_ticket_secs_db().await?;
        Ok(s)
    }
}
