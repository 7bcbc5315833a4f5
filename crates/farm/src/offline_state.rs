//! The offline state of one farm process (see [`crate::offline`]): whether the database
//! answers, the snapshot in use, and what waits for the database (nonces, tickets and
//! logins made meanwhile). Plain state: no database call here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
    pub(crate) fn while_down(&self, now_ms: i64) -> Option<Arc<Snapshot>> {
        let at = self.failed_at_ms.load(Ordering::Relaxed);
        if at == 0 || now_ms.saturating_sub(at) >= DOWN_RETRY_MS {
            return None;
        }
        self.snapshot()
    }

    pub(crate) fn down(&self, now_ms: i64) {
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

    pub(crate) fn up(&self, now_ms: i64) {
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

    /// Keeps a nonce issued while the database is away.
    pub(crate) fn put_nonce(
        &self,
        nonce: String,
        mac: &str,
        expires_at_ms: i64,
        now_ms: i64,
    ) -> Result<()> {
        let mut n = lock(&self.nonces);
        n.retain(|_, (_, exp)| *exp > now_ms);
        if n.len() >= OFFLINE_SECRETS_MAX {
            return Err(busy());
        }
        n.insert(nonce, (mac.to_string(), expires_at_ms));
        Ok(())
    }

    /// Uses up an offline nonce: `None` when this process did not issue it.
    pub(crate) fn take_nonce(&self, nonce: &str, mac: &str, now_ms: i64) -> Option<bool> {
        let (m, exp) = lock(&self.nonces).remove(nonce)?;
        Some(m == mac && exp > now_ms)
    }

    /// Keeps the hash of a ticket issued while the database is away.
    pub(crate) fn put_ticket(
        &self,
        hash: String,
        mac: &str,
        expires_at_ms: i64,
        now_ms: i64,
    ) -> Result<()> {
        let mut t = lock(&self.tickets);
        t.retain(|_, (_, exp)| *exp > now_ms);
        if t.len() >= OFFLINE_SECRETS_MAX {
            return Err(busy());
        }
        t.insert(hash, (mac.to_string(), expires_at_ms));
        Ok(())
    }

    /// Uses up an offline ticket by its hash: `None` when this process did not issue it.
    pub(crate) fn take_ticket(&self, h: &str, mac: &str, now_ms: i64) -> Option<bool> {
        let mut t = lock(&self.tickets);
        match t.get(h) {
            Some((m, exp)) if m == mac => {
                let live = *exp > now_ms;
                t.remove(h);
                Some(live)
            }
            Some(_) => Some(false),
            None => None,
        }
    }

    pub(crate) fn pend(&self, r: LoginRecord) -> Result<()> {
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

impl Offline {
    /// The state as [`DatabaseState`].
    pub(crate) fn state(&self) -> DatabaseState {
        let since = self.down_since_ms.load(Ordering::Relaxed);
        DatabaseState {
            up: since == 0,
            down_since_ms: (since != 0).then_some(since),
            up_since_ms: match self.up_since_ms.load(Ordering::Relaxed) {
                0 => None,
                t => Some(t),
            },
            snapshot_taken_at_ms: self.snapshot().map(|s| s.taken_at_ms),
            pending_logins: lock(&self.pending).len(),
        }
    }

    /// The first pending login, if any.
    pub(crate) fn first_pending(&self) -> Option<LoginRecord> {
        lock(&self.pending).first().cloned()
    }

    /// Forgets the pending login of `session_id`.
    pub(crate) fn done_pending(&self, session_id: &str) {
        lock(&self.pending).retain(|p| p.session_id != session_id);
    }
}
