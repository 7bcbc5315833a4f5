-- A server's identity (issue 31), PostgreSQL. Keep in step with ../sqlite/0008_server_identity.sql.
-- A random id the server made once and keeps in its state directory: the server registers
-- by it, and its name is a label that no other identity may take (two servers started with
-- one name are refused, never merged into one row). NULL: a row registered before this,
-- which the first server of that name to register with an id adopts.
ALTER TABLE servers ADD COLUMN uid TEXT;
CREATE UNIQUE INDEX servers_uid ON servers (uid);
