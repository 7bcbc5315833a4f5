-- Secrets out of the database, per-device credentials (PostgreSQL). Keep in step with
-- ../sqlite/0002_credentials.sql.
-- farm.farm_key is blanked when Farm::open moves the key to DATA/secrets/farm.key; the row
-- keeps only the key's SHA-256 (hex), to recognize the secrets directory that goes with it.
ALTER TABLE farm ADD COLUMN key_fingerprint TEXT NOT NULL DEFAULT '';
-- The generation of the device's key (HMAC of the farm key, the MAC and this number);
-- NULL: never enrolled, so the farm key may enrol it once.
ALTER TABLE devices ADD COLUMN credential_generation BIGINT;
