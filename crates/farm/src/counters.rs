//! The counters devices report, shared between the farm's API processes (issue 31).
//!
//! A device reports to any API of its farm, and may change API when one goes away; the
//! console may read status through another. Each API process keeps the newest report of a
//! session in memory (`api::status`) and writes it here at most every [`SHARE_EVERY_MS`]
//! (at once when the device's server changed), so that every API shows every device's
//! counters, at most that much older than the newest.
//!
//! ```text
//!   report ─► API a: board (newest) ──every SHARE_EVERY_MS──► session_counters
//!   status ─► API b: its board ⋈ session_counters (the newer of the two per session)
//! ```

use crate::Farm;
use crate::error::Result;

/// How often one API process writes a session's counters to the database at most.
pub const SHARE_EVERY_MS: i64 = 10_000;
/// How long a session may go without a report (before its first: since its login) before
/// the farm takes its machine for gone: a maintenance session silent this long no longer
/// blocks the version's promotion or another maintenance device's login, and either ends
/// it. A running agent reports every 2 s; its reports reach the database at most
/// [`SHARE_EVERY_MS`] late. (A machine shut down cleanly ends its session at once.)
pub const SESSION_SILENT_MS: i64 = 120_000;

/// How long a session its machine ended (a clean shutdown) stays valid: the machine's last
/// reads and flushes between its word and the power going off are still served. It no
/// longer counts as booted meanwhile.
pub const SESSION_END_GRACE_MS: i64 = 15_000;

/// How long a session may go neither reported by its machine nor held open by a server
/// before the farm ends it: its machine vanished (power cut, network gone) without the clean
/// shutdown that ends a session at once. Counted only while the database has been up that
/// long at the server that sweeps (after an outage, devices and servers first get the time
/// to be heard again).
pub const SESSION_VANISHED_MS: i64 = 10 * 60 * 1000;

/// The condition on `sessions s LEFT JOIN session_counters c ON c.session_id = s.id` of a
/// session whose machine is there: not ended by it, and heard from since the bound it is
/// given (`$N`: now minus [`SESSION_SILENT_MS`]): reported, or held open by a server.
pub(crate) fn machine_there(param: u8) -> String {
    format!(
        "s.ended_at_ms IS NULL AND (COALESCE(c.reported_at_ms, s.created_at_ms) > ${param} \
         OR COALESCE(s.held_at_ms, 0) > ${param})"
    )
}

/// How many sessions one statement of [`Farm::hold_sessions`] names.
const HOLD_BATCH: usize = 500;

/// One session's counters as last shared.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SharedCounters {
    /// The session.
    pub session_id: String,
    /// The server the device streamed from, by id (when its address named a registered one
    /// or the report gave it).
    pub server_id: Option<i64>,
    /// The NBD address it reported streaming from.
    pub server_address: Option<String>,
    /// When the report came (the farm's clock, Unix ms).
    pub reported_at_ms: i64,
    /// Bytes read.
    pub bytes_read: i64,
    /// Bytes written.
    pub bytes_written: i64,
    /// Requests retried.
    pub retries: i64,
    /// Bytes its write cache holds.
    pub cache_used_bytes: i64,
    /// Bytes its host's read cache answered.
    pub host_cache_hit_bytes: i64,
    /// Bytes it read from the server below that cache.
    pub host_cache_server_bytes: i64,
}

/// A counter as the database keeps it (64-bit signed: a counter past `i64::MAX` stays
/// there).
pub fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Farm {
    /// Records that this server holds the sessions of `export_names` open now (see
    /// [`SESSION_VANISHED_MS`]).
    ///
    /// # Errors
    /// Database errors.
    pub async fn hold_sessions(&self, export_names: &[String]) -> Result<()> {
        let now = self.now_ms();
        for batch in export_names.chunks(HOLD_BATCH) {
            let marks: Vec<String> = (0..batch.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!(
                "UPDATE sessions SET held_at_ms = $1 WHERE export_name IN ({})",
                marks.join(", ")
            );
            let mut q = sqlx::query(&sql).bind(now);
            for name in batch {
                q = q.bind(name);
            }
            q.execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Ends the sessions neither reported by their machines, nor held open by a server,
    /// nor ended by their machines, for [`SESSION_VANISHED_MS`] (audited as the farm's);
    /// returns their export names. The caller sweeps only while the database has been up
    /// that long (`DatabaseState::up_since_ms`).
    ///
    /// # Errors
    /// Database errors.
    pub async fn end_vanished_sessions(&self) -> Result<Vec<String>> {
        let now = self.now_ms();
        let bound = now.saturating_sub(SESSION_VANISHED_MS);
        let mut tx = self.pool.begin().await?;
        let ended: Vec<(String, String)> = sqlx::query_as(
            "DELETE FROM sessions WHERE id IN (SELECT s.id FROM sessions s \
             LEFT JOIN session_counters c ON c.session_id = s.id \
             WHERE s.ended_at_ms IS NULL AND COALESCE(c.reported_at_ms, s.created_at_ms) <= $1 \
             AND COALESCE(s.held_at_ms, 0) <= $1) RETURNING id, export_name",
        )
        .bind(bound)
        .fetch_all(&mut *tx)
        .await?;
        for (id, _) in &ended {
            crate::db::audit(
                &mut tx,
                now,
                "farm",
                "session.end",
                "session",
                id,
                &serde_json::json!({ "by": "farm", "vanished_ms": SESSION_VANISHED_MS }),
            )
            .await?;
        }
        tx.commit().await?;
        for (_, export) in &ended {
            self.sessions.remove(export);
        }
        if !ended.is_empty() {
            tracing::info!(
                sessions = ended.len(),
                after_ms = SESSION_VANISHED_MS,
                "ended sessions whose machines vanished (neither reported nor held open)"
            );
        }
        Ok(ended.into_iter().map(|(_, e)| e).collect())
    }

    /// Writes `c` as its session's shared counters (replacing older ones). A session that
    /// ended meanwhile writes nothing.
    ///
    /// # Errors
    /// Database errors.
    pub async fn share_counters(&self, c: &SharedCounters) -> Result<()> {
        sqlx::query(
            "INSERT INTO session_counters (session_id, server_id, server_address, \
             reported_at_ms, bytes_read, bytes_written, retries, cache_used_bytes, \
             host_cache_hit_bytes, host_cache_server_bytes) \
             SELECT $1, (SELECT id FROM servers WHERE id = $2), $3, $4, $5, $6, $7, $8, $9, $10 \
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1) \
             ON CONFLICT (session_id) DO UPDATE SET server_id = excluded.server_id, \
             server_address = excluded.server_address, reported_at_ms = excluded.reported_at_ms, \
             bytes_read = excluded.bytes_read, bytes_written = excluded.bytes_written, \
             retries = excluded.retries, cache_used_bytes = excluded.cache_used_bytes, \
             host_cache_hit_bytes = excluded.host_cache_hit_bytes, \
             host_cache_server_bytes = excluded.host_cache_server_bytes \
             WHERE excluded.reported_at_ms >= session_counters.reported_at_ms",
        )
        .bind(&c.session_id)
        .bind(c.server_id)
        .bind(&c.server_address)
        .bind(c.reported_at_ms)
        .bind(c.bytes_read)
        .bind(c.bytes_written)
        .bind(c.retries)
        .bind(c.cache_used_bytes)
        .bind(c.host_cache_hit_bytes)
        .bind(c.host_cache_server_bytes)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The shared counters of the live sessions (at most one row per session).
    ///
    /// # Errors
    /// Database errors.
    pub async fn shared_counters(&self) -> Result<Vec<SharedCounters>> {
        Ok(sqlx::query_as(
            "SELECT c.session_id, c.server_id, c.server_address, c.reported_at_ms, \
             c.bytes_read, c.bytes_written, c.retries, c.cache_used_bytes, \
             c.host_cache_hit_bytes, c.host_cache_server_bytes \
             FROM session_counters c JOIN sessions s ON s.id = c.session_id \
             WHERE s.expires_at_ms > $1",
        )
        .bind(self.now_ms())
        .fetch_all(&self.pool)
        .await?)
    }
}
