-- Load balancing at login (PostgreSQL). Keep in step with ../sqlite/0004_balance.sql.
-- A server's rating weighs how many devices it carries against the others of its site (a
-- server of rating 200 gets twice the devices of one of 100); a draining server is named to
-- devices last, after every other live server.
ALTER TABLE servers ADD COLUMN rating BIGINT NOT NULL DEFAULT 100;
ALTER TABLE servers ADD COLUMN draining BIGINT NOT NULL DEFAULT 0;
-- The server a session streams from: the one login named first, then the one its status
-- reports name (after a failover). NULL: not known.
ALTER TABLE sessions ADD COLUMN server_id BIGINT REFERENCES servers(id) ON DELETE SET NULL;
CREATE INDEX sessions_by_server ON sessions (server_id);
