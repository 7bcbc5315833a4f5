//! Boot sets in the farm database (migration 0006), against SQLite and PostgreSQL: saved by
//! vDisk name, read back, replaced, cleared (audited), refused for an unknown version or
//! when too large, dropped with their version, and named to servers when their version is
//! the newest in production.

use crate::common;

use common::TestFarm;
use farm::Kind;
use farm::boot_sets::BOOT_SET_BYTES_MAX;
use farm::input::{NewStore, NewVDisk};

const ADMIN: &str = "admin";

/// A store and a 64 MiB vDisk "golden" with versions 0 and 1; returns the vDisk's id.
async fn golden(t: &TestFarm) -> i64 {
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = t.farm.create_store(&store, ADMIN).await.unwrap().id;
    let vdisk = NewVDisk {
        store_id: store,
        name: "golden".into(),
        size_bytes: Some(64 << 20),
        cache_mode: None,
        ram_bytes: None,
        description: String::new(),
    };
    let id = t.farm.create_vdisk(&vdisk, ADMIN).await.unwrap().id;
    t.farm.new_version(id, ADMIN).await.unwrap();
    id
}

async fn saved_read_replaced_and_cleared(t: TestFarm) {
    let id = golden(&t).await;
    let f = &t.farm;
    assert_eq!(f.boot_set_by_name("golden", 1).await.unwrap(), None);
    f.save_boot_set("golden", 1, b"first", (1, 2, 8192))
        .await
        .unwrap();
    f.save_boot_set("golden", 1, b"second", (2, 3, 12288))
        .await
        .unwrap();
    assert_eq!(
        f.boot_set_by_name("golden", 1).await.unwrap().as_deref(),
        Some(&b"second"[..])
    );
    let (summary, bytes) = f.boot_set(id, 1).await.unwrap().unwrap();
    assert_eq!(
        (summary.boots, summary.extents, summary.bytes),
        (2, 3, 12288)
    );
    assert_eq!(bytes, b"second");
    assert_eq!(f.boot_set(id, 0).await.unwrap(), None);
    assert!(f.clear_boot_set(id, 1, ADMIN).await.unwrap());
    assert!(!f.clear_boot_set(id, 1, ADMIN).await.unwrap());
    assert_eq!(f.boot_set_by_name("golden", 1).await.unwrap(), None);
}

async fn unknown_versions_and_huge_sets_are_refused(t: TestFarm) {
    let id = golden(&t).await;
    let f = &t.farm;
    let e = f
        .save_boot_set("golden", 7, b"x", (1, 1, 4096))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
    let e = f
        .save_boot_set("other", 1, b"x", (1, 1, 4096))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
    let huge = vec![0u8; BOOT_SET_BYTES_MAX + 1];
    let e = f
        .save_boot_set("golden", 1, &huge, (1, 1, 4096))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::InvalidInput);
    assert_eq!(
        f.clear_boot_set(id, 9, ADMIN).await.unwrap_err().kind(),
        Kind::NotFound
    );
}

async fn a_deleted_version_takes_its_set_with_it(t: TestFarm) {
    let id = golden(&t).await;
    let f = &t.farm;
    f.save_boot_set("golden", 1, b"set", (1, 1, 4096))
        .await
        .unwrap();
    f.delete_version(id, 1, ADMIN).await.unwrap();
    // A new version 1 (a new file, a new identity) starts without the old set.
    f.new_version(id, ADMIN).await.unwrap();
    assert_eq!(f.boot_set_by_name("golden", 1).await.unwrap(), None);
}

async fn servers_learn_the_newest_production_version_with_a_set(t: TestFarm) {
    let id = golden(&t).await;
    let f = &t.farm;
    // Version 0 is production without a set; version 1 is in maintenance with one.
    f.save_boot_set("golden", 1, b"one", (1, 1, 4096))
        .await
        .unwrap();
    assert_eq!(f.production_boot_sets().await.unwrap(), vec![]);
    f.save_boot_set("golden", 0, b"zero", (1, 1, 4096))
        .await
        .unwrap();
    assert_eq!(
        f.production_boot_sets().await.unwrap(),
        vec![("golden".to_string(), 0)]
    );
    // Promoted to test, then to production: version 1 is what devices boot now.
    f.promote(id, 1, ADMIN).await.unwrap();
    assert_eq!(
        f.production_boot_sets().await.unwrap(),
        vec![("golden".to_string(), 0)]
    );
    f.promote(id, 1, ADMIN).await.unwrap();
    assert_eq!(
        f.production_boot_sets().await.unwrap(),
        vec![("golden".to_string(), 1)]
    );
    // Its set cleared: nothing to prefetch (version 0's set is not what devices boot).
    f.clear_boot_set(id, 1, ADMIN).await.unwrap();
    assert_eq!(f.production_boot_sets().await.unwrap(), vec![]);
}

dual_tests!(
    servers_learn_the_newest_production_version_with_a_set,
    saved_read_replaced_and_cleared,
    unknown_versions_and_huge_sets_are_refused,
    a_deleted_version_takes_its_set_with_it,
);
