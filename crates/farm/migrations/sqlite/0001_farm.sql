-- The farm schema (SQLite). Keep in step with ../postgres/0001_farm.sql: same tables, columns
-- and constraints; only the dialect differs (INTEGER PRIMARY KEY vs BIGSERIAL).
CREATE TABLE farm (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL,
    farm_key TEXT NOT NULL,
    auto_merge_chain_max INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE sites (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE servers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    site_id INTEGER NOT NULL REFERENCES sites(id),
    name TEXT NOT NULL UNIQUE,
    address TEXT NOT NULL,
    registered_at_ms INTEGER NOT NULL,
    heartbeat_at_ms INTEGER NOT NULL
);
CREATE TABLE stores (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE store_paths (
    store_id INTEGER NOT NULL REFERENCES stores(id) ON DELETE CASCADE,
    server_id INTEGER NOT NULL REFERENCES servers(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    PRIMARY KEY (store_id, server_id)
);
CREATE TABLE vdisks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    store_id INTEGER NOT NULL REFERENCES stores(id),
    name TEXT NOT NULL,
    cache_mode TEXT NOT NULL,
    ram_bytes INTEGER NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    size_bytes INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    UNIQUE (store_id, name)
);
CREATE TABLE versions (
    vdisk_id INTEGER NOT NULL REFERENCES vdisks(id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    file_name TEXT NOT NULL,
    parent_number INTEGER,
    access TEXT NOT NULL,
    origin TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    changed_at_ms INTEGER NOT NULL,
    changed_by TEXT NOT NULL,
    PRIMARY KEY (vdisk_id, number)
);
CREATE TABLE collections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    site_id INTEGER NOT NULL REFERENCES sites(id),
    name TEXT NOT NULL,
    auto_add INTEGER NOT NULL DEFAULT 0,
    default_vdisk_id INTEGER REFERENCES vdisks(id),
    created_at_ms INTEGER NOT NULL,
    UNIQUE (site_id, name)
);
CREATE TABLE devices (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    collection_id INTEGER NOT NULL REFERENCES collections(id),
    mac TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    device_type TEXT NOT NULL,
    vdisk_id INTEGER REFERENCES vdisks(id),
    cache_mode TEXT NOT NULL DEFAULT '',
    ram_bytes INTEGER,
    pinned_version INTEGER,
    created_at_ms INTEGER NOT NULL,
    changed_at_ms INTEGER NOT NULL
);
CREATE TABLE api_tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    object_type TEXT NOT NULL,
    object_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE login_nonces (
    nonce TEXT PRIMARY KEY,
    mac TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    device_id INTEGER NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    vdisk_id INTEGER NOT NULL REFERENCES vdisks(id),
    version_number INTEGER NOT NULL,
    device_type TEXT NOT NULL,
    export_name TEXT NOT NULL UNIQUE,
    token_hash TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE INDEX sessions_by_version ON sessions (vdisk_id, version_number);
CREATE INDEX devices_by_collection ON devices (collection_id);
