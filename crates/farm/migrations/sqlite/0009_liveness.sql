-- Issue 31, SQLite: the counters devices report, shared between API processes; where a
-- server's API is reached; sessions ended by their machines. Keep in step with
-- ../postgres/0009_liveness.sql.
-- Every API process keeps the newest reports in memory and writes them here at most every
-- farm::counters::SHARE_EVERY_MS per session (and at once when the device's server changed),
-- so that the status through any server's API shows every device. A row goes with its
-- session.
CREATE TABLE session_counters (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    server_id INTEGER REFERENCES servers(id) ON DELETE SET NULL,
    server_address TEXT,
    reported_at_ms INTEGER NOT NULL,
    bytes_read INTEGER NOT NULL,
    bytes_written INTEGER NOT NULL,
    retries INTEGER NOT NULL,
    cache_used_bytes INTEGER NOT NULL,
    host_cache_hit_bytes INTEGER NOT NULL,
    host_cache_server_bytes INTEGER NOT NULL
);

-- Where devices reach a server's farm API (`https://HOST:PORT`, as its boot scripts name
-- it), so that a boot script names the APIs of the site's other live servers as well and a
-- device keeps reporting when the one it booted from goes away. NULL: not said.
ALTER TABLE servers ADD COLUMN api_url TEXT;

-- When a session's machine ended it (a clean shutdown): the session no longer counts as
-- booted (a maintenance version is promotable at once) but stays valid for
-- farm::counters::SESSION_END_GRACE_MS, so that the machine's last reads and flushes before
-- the power goes are still served.
ALTER TABLE sessions ADD COLUMN ended_at_ms INTEGER;

-- The server a session's device was last told to move to first (its refreshed list's first
-- serving server other than its own; farm::moves): a rebalancing server moves only sessions
-- whose destination has room. NULL: not known since the session's server changed.
ALTER TABLE sessions ADD COLUMN move_to INTEGER;
