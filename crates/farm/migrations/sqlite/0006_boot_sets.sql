-- Boot sets (issue 21; SQLite). Keep in step with ../postgres/0006_boot_sets.sql.
-- A version's boot set: the bytes of an encoded `bootset::BootSet` (crates/bootset; it
-- carries the version's identity and its own checksum), recorded by a server and read by
-- every server of the farm. It goes with its version (ON DELETE CASCADE). boots, extents
-- and bytes summarise it for listings without decoding it.
CREATE TABLE boot_sets (
    vdisk_id INTEGER NOT NULL,
    number INTEGER NOT NULL,
    encoded BLOB NOT NULL,
    boots INTEGER NOT NULL,
    extents INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    recorded_at_ms INTEGER NOT NULL,
    PRIMARY KEY (vdisk_id, number),
    FOREIGN KEY (vdisk_id, number) REFERENCES versions (vdisk_id, number) ON DELETE CASCADE
);
