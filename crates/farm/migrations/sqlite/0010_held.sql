-- Issue 31, SQLite: when a server last held a session's connections open. Keep in step with
-- ../postgres/0010_held.sql.
-- A server writes it for every session it serves, every member::Timing::vanish_check_every,
-- so that a session whose machine is there (streaming, reporting or not) is never taken for
-- vanished; one neither reported nor held for farm::counters::SESSION_VANISHED_MS ends.
-- NULL: never held.
ALTER TABLE sessions ADD COLUMN held_at_ms INTEGER;
