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

/// The condition on `sessions s LEFT JOIN session_counters c ON c.session_id = s.id` of a
/// session whose machine is there: not ended by it, and heard from since the bound it is
/// given (`$N`: now minus [`SESSION_SILENT_MS`]).
pub(crate) fn machine_there(param: u8) -> String {
    format!("s.ended_at_ms IS NULL AND COALESCE(c.reported_at_ms, s.created_at_ms) > ${param}")
}

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
