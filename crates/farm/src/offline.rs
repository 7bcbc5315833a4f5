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
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::json;

use crate::db::{Farm, audit};
use crate::error::{FarmError, Kind, Result};
use crate::model::DeviceType;
use crate::snapshot::Snapshot;

/// After a call found the database unreachable, how long reads go to the snapshot before
/// one tries the database again (so that a down database costs one wait per period, not
/// one per call).
pub const DOWN_RETRY_MS: i64 = 2_000;
/// The most logins one process keeps pending while the database is away.
pub const PENDING_MAX: usize = 10_000;
/// The most nonces and tickets one process keeps while the database is away.
pub const OFFLINE_SECRETS_MAX: usize = 10_000;

/// A login to write to the database: made now, or made offline and pending.
#[derive(Debug, Clone)]
pub(crate) struct LoginRecord {
    pub session_id: String,
    pub device_id: i64,
    pub mac: String,
    pub vdisk_id: i64,
    pub version: i64,
    pub device_type: DeviceType,
    pub export_name: String,
    pub token_hash: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// A ticket login's new device key (hex).
    pub new_key: Option<String>,
}

/// The database's state as this process last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DatabaseState {
    /// False while the last call found it unreachable.
    pub up: bool,
    /// When the outage began (Unix ms), while down.
    pub down_since_ms: Option<i64>,
    /// Since when it has answered without a break, as this process saw it (`None` while
    /// down, or before its first answer).
    pub up_since_ms: Option<i64>,
    /// When the snapshot in use was read, if any.
    pub snapshot_taken_at_ms: Option<i64>,
    /// Logins made while it was down, not yet written.
    pub pending_logins: usize,
}

/// The offline state of one farm process (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Offline {
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    /// 0 while up; else when a call last found it unreachable.
    failed_at_ms: AtomicI64,
    /// 0 while up; else when the outage began.
    down_since_ms: AtomicI64,
    /// 0 while down or before the first answer; else since when it answers.
    up_since_ms: AtomicI64,
    /// Nonces issued offline: nonce → (MAC, expiry).
    nonces: Mutex<HashMap<String, (String, i64)>>,
    /// Tickets issued offline: hash → (MAC, expiry).
    tickets: Mutex<HashMap<String, (String, i64)>>,
    pending: Mutex<Vec<LoginRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Offline {
    pub(crate) fn keep(&self, s: Arc<Snapshot>) {
        *self
            .snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(s);
    }

    pub(crate) fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The snapshot, when a call found the database down less than [`DOWN_RETRY_MS`] ago.
    fn while_down(&self, now_ms: i64) -> Option<Arc<Snapshot>> {
        let at = self.failed_at_ms.load(Ordering::Relaxed);
        if at == 0 || now_ms.saturating_sub(at) >= DOWN_RETRY_MS {
            return None;
        }
        self.snapshot()
    }

    fn down(&self, now_ms: i64) {
        let now_ms = now_ms.max(1);
        self.failed_at_ms.store(now_ms, Ordering::Relaxed);
        self.up_since_ms.store(0, Ordering::Relaxed);
        if self
            .down_since_ms
            .compare_exchange(0, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let taken = self.snapshot().map(|s| s.taken_at_ms);
            tracing::warn!(snapshot_taken_at_ms = ?taken,
                "the farm database cannot be reached: known devices boot and fail over from this server's snapshot; changes wait");
        }
    }

    fn up(&self, now_ms: i64) {
        self.failed_at_ms.store(0, Ordering::Relaxed);
        let _ = self.up_since_ms.compare_exchange(
            0,
            now_ms.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let since = self.down_since_ms.swap(0, Ordering::Relaxed);
        if since != 0 {
            tracing::info!(
                down_ms = now_ms.saturating_sub(since),
                pending_logins = lock(&self.pending).len(),
                "the farm database is back"
            );
        }
    }

    fn offline_nonce(&self, mac: &str, now_ms: i64) -> Result<String> {
        let mut n = lock(&self.nonces);
        n.retain(|_, (_, exp)| *exp > now_ms);
        if n.len() >= OFFLINE_SECRETS_MAX {
            return Err(busy());
        }
        let nonce = hex::encode(crate::db::random_bytes::<32>());
        n.insert(
            nonce.clone(),
            (mac.to_string(), now_ms + crate::login::NONCE_TTL_MS),
        );
        Ok(nonce)
    }

    /// Uses up an offline nonce: `None` when this process did not issue it.
    pub(crate) fn take_nonce(&self, nonce: &str, mac: &str, now_ms: i64) -> Option<bool> {
        let (m, exp) = lock(&self.nonces).remove(nonce)?;
        Some(m == mac && exp > now_ms)
    }

    fn offline_ticket(&self, mac: &str, expires_at_ms: i64, now_ms: i64) -> Result<String> {
        let mut t = lock(&self.tickets);
        t.retain(|_, (_, exp)| *exp > now_ms);
        if t.len() >= OFFLINE_SECRETS_MAX {
            return Err(busy());
        }
        let ticket = format!(
            "{}{}",
            contract::login::TICKET_PREFIX,
            hex::encode(crate::db::random_bytes::<32>())
        );
        t.insert(
            crate::db::hash_secret(&ticket),
            (mac.to_string(), expires_at_ms),
        );
        Ok(ticket)
    }

    /// Uses up an offline ticket: `None` when this process did not issue it.
    pub(crate) fn take_ticket(&self, ticket: &str, mac: &str, now_ms: i64) -> Option<bool> {
        let mut t = lock(&self.tickets);
        let h = crate::db::hash_secret(ticket);
        match t.get(&h) {
            Some((m, exp)) if m == mac => {
                let live = *exp > now_ms;
                t.remove(&h);
                Some(live)
            }
            Some(_) => Some(false),
            None => None,
        }
    }

    fn pend(&self, r: LoginRecord) -> Result<()> {
        let mut p = lock(&self.pending);
        if p.len() >= PENDING_MAX {
            return Err(busy());
        }
        p.push(r);
        Ok(())
    }
}

fn busy() -> FarmError {
    FarmError::new(
        Kind::Unavailable,
        "the farm database cannot be reached and this server holds as many offline logins as it may; try again when the database is back",
    )
}

impl Farm {
    /// The database's state as this process last saw it.
    pub fn database_state(&self) -> DatabaseState {
        let since = self.offline.down_since_ms.load(Ordering::Relaxed);
        DatabaseState {
            up: since == 0,
            down_since_ms: (since != 0).then_some(since),
            up_since_ms: match self.offline.up_since_ms.load(Ordering::Relaxed) {
                0 => None,
                t => Some(t),
            },
            snapshot_taken_at_ms: self.offline.snapshot().map(|s| s.taken_at_ms),
            pending_logins: lock(&self.offline.pending).len(),
        }
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
        let nonce = self.offline.offline_nonce(mac, now)?;
        Ok((nonce, now + crate::login::NONCE_TTL_MS))
    }

    /// A boot ticket issued while the database is away, for `secs`.
    pub(crate) fn offline_ticket(&self, mac: &str, secs: i64) -> Result<String> {
        let now = self.now_ms();
        self.offline
            .offline_ticket(mac, now.saturating_add(secs.saturating_mul(1000)), now)
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
            let next = lock(&self.offline.pending).first().cloned();
            let Some(r) = next else {
                return Ok(written);
            };
            let (ended, kept) = self.watch(self.write_login(&r, true)).await?;
            lock(&self.offline.pending).retain(|p| p.session_id != r.session_id);
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
