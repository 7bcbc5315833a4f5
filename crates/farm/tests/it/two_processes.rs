//! Two farm processes on one database (issue 20), on SQLite and PostgreSQL: lifecycle
//! changes of one vDisk from both at once are serialized by the farm's own lock (an
//! advisory lock, or an flock beside the SQLite file), so exactly one new version is made
//! and the other answers a clean conflict, never a half-made chain.

use crate::common;

use std::sync::Arc;

use common::TestFarm;
use farm::input::{NewSite, NewStore, NewVDisk};
use farm::model::CacheMode;
use farm::{Farm, Kind};

const ADMIN: &str = "admin";

async fn golden(f: &Farm) -> i64 {
    let site = NewSite {
        name: "hq".into(),
        description: String::new(),
    };
    f.create_site(&site, ADMIN).await.unwrap();
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = f.create_store(&store, ADMIN).await.unwrap().id;
    let vdisk = NewVDisk {
        store_id: store,
        name: "golden".into(),
        size_bytes: Some(64 << 20),
        cache_mode: Some(CacheMode::Ram),
        ram_bytes: None,
        description: String::new(),
    };
    f.create_vdisk(&vdisk, ADMIN).await.unwrap().id
}

async fn concurrent_new_versions_make_one_and_refuse_the_other(t: TestFarm) {
    let a = Arc::clone(&t.farm);
    let b = Arc::new(
        Farm::open(&t.config())
            .await
            .expect("a second process's farm"),
    );
    let id = golden(&a).await;
    for round in 0..4 {
        let (ra, rb) = tokio::join!(
            {
                let a = Arc::clone(&a);
                async move { a.new_version(id, "a").await }
            },
            {
                let b = Arc::clone(&b);
                async move { b.new_version(id, "b").await }
            }
        );
        let (ok, err) = match (ra, rb) {
            (Ok(v), Err(e)) | (Err(e), Ok(v)) => (v, e),
            (Ok(x), Ok(y)) => panic!(
                "round {round}: two new versions {} and {}",
                x.number, y.number
            ),
            (Err(x), Err(y)) => panic!("round {round}: both failed: {x} / {y}"),
        };
        assert_eq!(ok.number, round + 1);
        assert_eq!(err.kind(), Kind::Conflict, "round {round}: {err}");
        assert!(err.to_string().contains("maintenance"), "{err}");
        // Promote it so that the next round may make another.
        a.promote(id, ok.number, ADMIN).await.unwrap();
    }
    let versions = b.versions(id).await.unwrap();
    assert_eq!(versions.len(), 5, "the base and four versions");
    if a.backend() == farm::Backend::Sqlite {
        use std::os::unix::fs::PermissionsExt as _;
        let lock = a.data_dir().join("locks").join(format!("vdisk-{id}.lock"));
        let mode = std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", lock.display());
    }
}

dual_tests!(concurrent_new_versions_make_one_and_refuse_the_other);
