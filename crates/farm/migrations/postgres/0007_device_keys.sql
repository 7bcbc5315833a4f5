-- Device identity that nothing public reveals (issue 30), PostgreSQL. Keep in step with
-- ../sqlite/0007_device_keys.sql.
-- Each device's own key: 32 random bytes, hex, made by the farm (an administrator's reset,
-- or a diskless device's ticket login); NULL: the device has none and no proof logs it in.
-- Keys derived from the farm key (credential_generation before this) prove nothing now:
-- reset those devices' credentials.
ALTER TABLE devices ADD COLUMN device_key TEXT;
-- 1 when the device was added by a login (auto-add), for the collection's bounds.
ALTER TABLE devices ADD COLUMN auto_added BIGINT NOT NULL DEFAULT 0;
-- One-time login tickets of diskless boots (the boot script's ferry.ticket=), by SHA-256.
CREATE TABLE login_tickets (
    ticket_hash TEXT PRIMARY KEY,
    mac TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX login_tickets_mac ON login_tickets (mac);
-- The client address that asked for each nonce, so one address cannot hold them all.
ALTER TABLE login_nonces ADD COLUMN peer TEXT NOT NULL DEFAULT '';
CREATE INDEX login_nonces_peer ON login_nonces (peer);
-- How long a boot script's login ticket stays valid.
ALTER TABLE farm ADD COLUMN boot_ticket_secs BIGINT NOT NULL DEFAULT 120;
-- Auto-add bounds per collection: devices added automatically in all, and per minute.
ALTER TABLE collections ADD COLUMN auto_add_max BIGINT NOT NULL DEFAULT 500;
ALTER TABLE collections ADD COLUMN auto_add_per_minute BIGINT NOT NULL DEFAULT 60;
-- 1 when the device keeps its key in its TPM (it told the farm so, proving with that key):
-- the farm then issues and accepts no login ticket for it; an administrator's reset ends it.
ALTER TABLE devices ADD COLUMN tpm_bound BIGINT NOT NULL DEFAULT 0;
