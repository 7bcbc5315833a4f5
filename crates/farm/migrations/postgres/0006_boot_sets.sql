-- Boot sets (issue 21; PostgreSQL). Keep in step with ../sqlite/0006_boot_sets.sql.
-- A version's boot set: the bytes of an encoded `bootset::BootSet` (crates/bootset; it
-- carries the version's identity and its own checksum), recorded by a server and read by
-- every server of the farm. It goes with its version (ON DELETE CASCADE). boots, extents
-- and bytes summarise it for listings without decoding it.
CREATE TABLE boot_sets (
    vdisk_id BIGINT NOT NULL,
    number BIGINT NOT NULL,
    encoded BYTEA NOT NULL,
    boots BIGINT NOT NULL,
    extents BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    recorded_at_ms BIGINT NOT NULL,
    PRIMARY KEY (vdisk_id, number),
    FOREIGN KEY (vdisk_id, number) REFERENCES versions (vdisk_id, number) ON DELETE CASCADE
);
