//! The repository, the version lifecycle (with real vDisk files in the store) and device
//! login, each run against SQLite and PostgreSQL.

use crate::common;

use common::{Credential, TestFarm};
use farm::input::{
    DevicePatch, MergeRequest, NewCollection, NewDevice, NewServer, NewSite, NewStore, NewVDisk,
    SettingsPatch,
};
use farm::login::{ChallengeRequest, LoginRequest, proof};
use farm::model::{AccessMode, CacheMode, DeviceType, MergeMode};
use farm::{Kind, SessionLookup};

const ADMIN: &str = "admin";
/// 64 MiB: a small dynamic vDisk (its file is a few MiB of metadata).
const SIZE: i64 = 64 << 20;

/// A site, a store, a vDisk "golden" (version 0 production) and a collection.
struct Fixture {
    site: i64,
    store: i64,
    vdisk: i64,
    collection: i64,
}

async fn fixture(t: &TestFarm) -> Fixture {
    let f = &t.farm;
    let site = NewSite {
        name: "hq".into(),
        description: String::new(),
    };
    let site = f.create_site(&site, ADMIN).await.unwrap().id;
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = f.create_store(&store, ADMIN).await.unwrap().id;
    let vdisk = NewVDisk {
        store_id: store,
        name: "golden".into(),
        size_bytes: Some(SIZE),
        cache_mode: None,
        ram_bytes: None,
        description: "test image".into(),
    };
    let vdisk = f.create_vdisk(&vdisk, ADMIN).await.unwrap().id;
    let c = NewCollection {
        site_id: site,
        name: "lab".into(),
        auto_add: false,
        default_vdisk_id: None,
        auto_add_max: None,
        auto_add_per_minute: None,
    };
    let collection = f.create_collection(&c, ADMIN).await.unwrap().id;
    Fixture {
        site,
        store,
        vdisk,
        collection,
    }
}

async fn add_device(t: &TestFarm, fx: &Fixture, mac: &str, ty: DeviceType) -> i64 {
    let d = NewDevice {
        collection_id: fx.collection,
        mac: mac.into(),
        name: format!("pc-{}", &mac[mac.len() - 2..]),
        device_type: Some(ty),
        vdisk_id: Some(fx.vdisk),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless: false,
    };
    t.farm.create_device(&d, ADMIN).await.unwrap().id
}

async fn login(t: &TestFarm, mac: &str) -> farm::Result<farm::login::LoginGrant> {
    let c = t
        .farm
        .challenge(&ChallengeRequest { mac: mac.into() }, None)
        .await?;
    let how = t.credential(mac).await;
    let g = t
        .farm
        .login(&TestFarm::request(mac, &how, &c.nonce), None)
        .await?;
    t.keep_secret(mac, g.device_secret.as_deref());
    Ok(g)
}

async fn audit_len(t: &TestFarm) -> i64 {
    t.farm.list_audit(Some(1), None).await.unwrap().total
}

async fn init_twice_is_a_conflict(t: TestFarm) {
    let e = t.farm.init("again").await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
}

async fn token_authenticates_by_secret_only(t: TestFarm) {
    let tok = t
        .farm
        .authenticate(&t.secrets.admin_token)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tok.name, "admin");
    assert!(t.farm.authenticate("fy_wrong").await.unwrap().is_none());
}

async fn crud_and_audit(t: TestFarm) {
    let fx = fixture(&t).await;
    let f = &t.farm;
    let before = audit_len(&t).await;
    let dup = NewSite {
        name: "hq".into(),
        description: String::new(),
    };
    assert_eq!(
        f.create_site(&dup, ADMIN).await.unwrap_err().kind(),
        Kind::Conflict
    );
    assert_eq!(f.site(999).await.unwrap_err().kind(), Kind::NotFound);
    let s = NewServer {
        site_id: fx.site,
        name: "srv1".into(),
        address: "10.0.0.1:10809".into(),
        uid: None,
        api_url: None,
    };
    let srv = f.register_server(&s, ADMIN).await.unwrap();
    let s2 = NewServer {
        address: "10.0.0.2:10809".into(),
        ..s
    };
    let again = f.register_server(&s2, ADMIN).await.unwrap();
    assert_eq!(
        (again.id, again.address.as_str()),
        (srv.id, "10.0.0.2:10809")
    );
    assert_eq!(f.list_servers(None, None).await.unwrap().total, 1);
    let id = add_device(&t, &fx, "AA-BB-CC-00-00-01", DeviceType::Production).await;
    assert_eq!(f.device(id).await.unwrap().mac, "aa:bb:cc:00:00:01");
    let patch = DevicePatch {
        cache_mode: Some(Some(CacheMode::Ram)),
        ..DevicePatch::default()
    };
    assert_eq!(
        f.update_device(id, &patch, ADMIN)
            .await
            .unwrap()
            .cache_mode
            .0,
        Some(CacheMode::Ram)
    );
    let page = f
        .list_devices(Some(fx.collection), Some(1), Some(0))
        .await
        .unwrap();
    assert_eq!((page.items.len(), page.total), (1, 1));
    // The collection still holds a device: deleting it is refused and changes nothing.
    assert_eq!(
        f.delete_collection(fx.collection, ADMIN)
            .await
            .unwrap_err()
            .kind(),
        Kind::Conflict
    );
    assert!(f.collection(fx.collection).await.is_ok());
    // site, server x2, device, device update: 5 audited changes (failures add none).
    assert_eq!(audit_len(&t).await - before, 4);
}

/// A bucket store's bad URL is refused when the store is added; without a publisher (no
/// S3 access in this process) adding a vDisk to it fails saying so, and adds nothing.
async fn a_bucket_store_needs_a_good_url_and_s3_access(t: TestFarm) {
    let f = &t.farm;
    let bad = NewStore {
        name: "bad".into(),
        path: "bad".into(),
        bucket: "s3://No_Such".into(),
    };
    let e = f.create_store(&bad, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::InvalidInput);
    assert!(e.message().contains("bucket name"), "{}", e.message());
    let good = NewStore {
        name: "cloud".into(),
        path: "cloud".into(),
        bucket: "s3://vdisks/site-a/".into(),
    };
    let store = f.create_store(&good, ADMIN).await.unwrap();
    assert_eq!(store.bucket, "s3://vdisks/site-a");
    let vdisk = NewVDisk {
        store_id: store.id,
        name: "golden".into(),
        size_bytes: Some(SIZE),
        cache_mode: None,
        ram_bytes: None,
        description: String::new(),
    };
    let e = f.create_vdisk(&vdisk, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Bucket);
    assert!(e.message().contains("no S3 access"), "{}", e.message());
    assert_eq!(f.list_vdisks(None, None).await.unwrap().total, 0);
}

async fn store_path_escaping_the_root_is_refused(t: TestFarm) {
    let f = &t.farm;
    for path in ["../outside", "/etc", "a/../../b"] {
        let e = f
            .create_store(
                &NewStore {
                    name: "x".into(),
                    path: path.into(),
                    bucket: String::new(),
                },
                ADMIN,
            )
            .await;
        let e = e.unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{path}");
        assert!(
            e.message().contains("escapes the store root"),
            "{}",
            e.message()
        );
    }
    assert_eq!(f.list_stores(None, None).await.unwrap().total, 0);
}

async fn new_version_makes_the_avhdx_on_the_chain(t: TestFarm) {
    let fx = fixture(&t).await;
    let v = t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    assert_eq!(
        (v.number, v.access, v.file_name.as_str()),
        (1, AccessMode::Maintenance, "golden.1.avhdx")
    );
    let dir = t.farm.store_dir(fx.store, None).await.unwrap();
    let chain = disk::open::open(
        &dir.join("golden.1.avhdx"),
        disk::open::OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(chain.layers.len(), 2);
    assert_eq!(chain.top().geometry().size, SIZE as u64);
    // A second new while version 1 is in maintenance is refused, and makes no file.
    let e = t.farm.new_version(fx.vdisk, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert!(!dir.join("golden.2.avhdx").exists());
}

async fn promote_runs_maintenance_test_production_then_stops(t: TestFarm) {
    let fx = fixture(&t).await;
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    assert_eq!(
        t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap().access,
        AccessMode::Test
    );
    let v = t.farm.promote(fx.vdisk, 1, "ops").await.unwrap();
    assert_eq!(
        (v.access, v.changed_by.as_str()),
        (AccessMode::Production, "ops")
    );
    let e = t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert!(e.message().contains("already in production"));
    assert_eq!(
        t.farm.version(fx.vdisk, 1).await.unwrap().access,
        AccessMode::Production
    );
}

async fn revert_goes_one_step_back_and_not_while_booted(t: TestFarm) {
    let fx = fixture(&t).await;
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    add_device(&t, &fx, "aa:bb:cc:00:00:02", DeviceType::Production).await;
    assert_eq!(login(&t, "aa:bb:cc:00:00:02").await.unwrap().version, 1);
    let e = t.farm.revert(fx.vdisk, 1, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert!(
        e.message().contains("booted by a production device"),
        "{}",
        e.message()
    );
    let sessions = t.farm.list_sessions(None, None).await.unwrap();
    t.farm
        .end_session(&sessions.items[0].id, ADMIN)
        .await
        .unwrap();
    assert_eq!(
        t.farm.revert(fx.vdisk, 1, ADMIN).await.unwrap().access,
        AccessMode::Test
    );
    assert_eq!(
        t.farm.revert(fx.vdisk, 1, ADMIN).await.unwrap().access,
        AccessMode::Maintenance
    );
    assert_eq!(
        t.farm.revert(fx.vdisk, 1, ADMIN).await.unwrap_err().kind(),
        Kind::Conflict
    );
}

async fn delete_only_the_newest_and_unused_version(t: TestFarm) {
    let fx = fixture(&t).await;
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    let dir = t.farm.store_dir(fx.store, None).await.unwrap();
    assert_eq!(
        t.farm
            .delete_version(fx.vdisk, 1, ADMIN)
            .await
            .unwrap_err()
            .kind(),
        Kind::Conflict
    );
    // A device pinned to version 2 keeps it.
    let d = add_device(&t, &fx, "aa:bb:cc:00:00:03", DeviceType::Production).await;
    let pin = DevicePatch {
        pinned_version: Some(Some(2)),
        ..DevicePatch::default()
    };
    t.farm.update_device(d, &pin, ADMIN).await.unwrap();
    let e = t.farm.delete_version(fx.vdisk, 2, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert!(dir.join("golden.2.avhdx").exists());
    let unpin = DevicePatch {
        pinned_version: Some(None),
        ..DevicePatch::default()
    };
    t.farm.update_device(d, &unpin, ADMIN).await.unwrap();
    t.farm.delete_version(fx.vdisk, 2, ADMIN).await.unwrap();
    assert!(!dir.join("golden.2.avhdx").exists());
    assert_eq!(t.farm.versions(fx.vdisk).await.unwrap().len(), 2);
}

async fn merge_updates_and_base_make_new_versions(t: TestFarm) {
    let fx = fixture(&t).await;
    for n in 1..=2 {
        t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
        t.farm.promote(fx.vdisk, n, ADMIN).await.unwrap();
    }
    let up = MergeRequest {
        mode: MergeMode::Updates,
        access: AccessMode::Test,
    };
    let v = t.farm.merge(fx.vdisk, &up, ADMIN).await.unwrap();
    assert_eq!(
        (v.number, v.parent_number, v.file_name.as_str()),
        (3, Some(0), "golden.3.avhdx")
    );
    let base = MergeRequest {
        mode: MergeMode::Base,
        access: AccessMode::Production,
    };
    let v = t.farm.merge(fx.vdisk, &base, ADMIN).await.unwrap();
    assert_eq!(
        (v.number, v.parent_number, v.access),
        (4, None, AccessMode::Production)
    );
    let path = t
        .farm
        .store_dir(fx.store, None)
        .await
        .unwrap()
        .join("golden.4.vhdx");
    let chain = disk::open::open(&path, disk::open::OpenOptions::default()).unwrap();
    assert_eq!(chain.layers.len(), 1);
    if interop::require("qemu-img") {
        let info = interop::qemu_img(&["info", "--output=json", path.to_str().unwrap()]);
        assert!(info.contains("\"format\": \"vhdx\""), "{info}");
        assert!(
            info.contains(&format!("\"virtual-size\": {SIZE}")),
            "{info}"
        );
    }
    // Merged updates of a base is refused; so is any merge while a maintenance version exists.
    assert_eq!(
        t.farm.merge(fx.vdisk, &up, ADMIN).await.unwrap_err().kind(),
        Kind::Conflict
    );
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    assert_eq!(
        t.farm
            .merge(fx.vdisk, &base, ADMIN)
            .await
            .unwrap_err()
            .kind(),
        Kind::Conflict
    );
}

async fn auto_merge_makes_a_base_when_the_chain_is_full(t: TestFarm) {
    let fx = fixture(&t).await;
    let s = SettingsPatch {
        auto_merge_chain_max: Some(2),
        ..SettingsPatch::default()
    };
    t.farm.update_settings(&s, ADMIN).await.unwrap();
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    // Version 1's chain holds 2 files: the next new first merges it into base 2.
    let v = t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    assert_eq!((v.number, v.parent_number), (3, Some(2)));
    let merged = t.farm.version(fx.vdisk, 2).await.unwrap();
    assert_eq!(
        (merged.origin.as_str(), merged.access),
        ("merged_base", AccessMode::Test)
    );
}

async fn login_gives_the_version_of_the_device_type(t: TestFarm) {
    let fx = fixture(&t).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:10", DeviceType::Production).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:11", DeviceType::Test).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:12", DeviceType::Maintenance).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:13", DeviceType::Maintenance).await;
    t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    let m = login(&t, "aa:bb:cc:00:00:12").await.unwrap();
    assert_eq!(
        (m.version, m.cache_mode, m.writable),
        (1, CacheMode::Private, true)
    );
    let e = login(&t, "aa:bb:cc:00:00:13").await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict);
    assert!(e.message().contains("another maintenance device"));
    let grant = t
        .farm
        .session_table()
        .lookup(&m.export_name, t.farm.now_ms())
        .unwrap();
    assert!(grant.path.ends_with("golden.1.avhdx"));
    t.farm.end_session(&m.session_id, ADMIN).await.unwrap();
    assert!(
        t.farm
            .session_table()
            .lookup(&m.export_name, t.farm.now_ms())
            .is_none()
    );
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    let p = login(&t, "aa:bb:cc:00:00:10").await.unwrap();
    assert_eq!(
        (p.version, p.cache_mode, p.writable),
        (0, CacheMode::RamOverflow, false)
    );
    assert_eq!(login(&t, "aa:bb:cc:00:00:11").await.unwrap().version, 1);
    t.farm.promote(fx.vdisk, 1, ADMIN).await.unwrap();
    assert_eq!(login(&t, "aa:bb:cc:00:00:10").await.unwrap().version, 1);
    assert!(
        t.farm
            .session_by_export(&p.export_name)
            .await
            .unwrap()
            .is_none()
    );
}

async fn login_with_a_wrong_proof_or_reused_nonce_is_refused(t: TestFarm) {
    let fx = fixture(&t).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:20", DeviceType::Production).await;
    let mac = "aa:bb:cc:00:00:20";
    let c = t
        .farm
        .challenge(&ChallengeRequest { mac: mac.into() }, None)
        .await
        .unwrap();
    let Credential::Key(key) = t.credential(mac).await else {
        panic!("a known device proves with a key");
    };
    let wrong = proof(&"00".repeat(32), &c.nonce, mac).unwrap();
    let r = LoginRequest {
        mac: mac.into(),
        nonce: c.nonce.clone(),
        hmac: wrong,
        diskless: false,
        ticket: None,
    };
    assert_eq!(
        t.farm.login(&r, None).await.unwrap_err().kind(),
        Kind::Unauthenticated
    );
    // The nonce was used up by the failed attempt.
    let right = proof(&key, &c.nonce, mac).unwrap();
    let r = LoginRequest { hmac: right, ..r };
    assert_eq!(
        t.farm.login(&r, None).await.unwrap_err().kind(),
        Kind::Unauthenticated
    );
    assert_eq!(t.farm.list_sessions(None, None).await.unwrap().total, 0);
}

async fn unknown_device_is_refused_or_auto_added(t: TestFarm) {
    let fx = fixture(&t).await;
    let e = login(&t, "aa:bb:cc:00:00:30").await.unwrap_err();
    assert_eq!(e.kind(), Kind::Forbidden);
    assert_eq!(
        t.farm.list_devices(None, None, None).await.unwrap().total,
        0
    );
    let c = NewCollection {
        site_id: fx.site,
        name: "auto".into(),
        auto_add: true,
        default_vdisk_id: Some(fx.vdisk),
        auto_add_max: None,
        auto_add_per_minute: None,
    };
    t.farm.create_collection(&c, ADMIN).await.unwrap();
    let g = login(&t, "aa:bb:cc:00:00:30").await.unwrap();
    assert_eq!(
        (g.device.name.as_str(), g.version),
        ("auto-aabbcc000030", 0)
    );
}

async fn pinned_production_device_boots_its_pinned_version(t: TestFarm) {
    let fx = fixture(&t).await;
    for n in 1..=2 {
        t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
        t.farm.promote(fx.vdisk, n, ADMIN).await.unwrap();
        t.farm.promote(fx.vdisk, n, ADMIN).await.unwrap();
    }
    let d = add_device(&t, &fx, "aa:bb:cc:00:00:40", DeviceType::Production).await;
    assert_eq!(login(&t, "aa:bb:cc:00:00:40").await.unwrap().version, 2);
    let pin = DevicePatch {
        pinned_version: Some(Some(1)),
        ..DevicePatch::default()
    };
    t.farm.update_device(d, &pin, ADMIN).await.unwrap();
    assert_eq!(login(&t, "aa:bb:cc:00:00:40").await.unwrap().version, 1);
    // Pinning a version that does not exist is refused and keeps the old pin.
    let bad = DevicePatch {
        pinned_version: Some(Some(9)),
        ..DevicePatch::default()
    };
    let e = t.farm.update_device(d, &bad, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
    assert_eq!(t.farm.device(d).await.unwrap().pinned_version, Some(1));
}

/// A server that restarted (a new `Farm` on the same database, its session table empty),
/// or another server of the farm, rebuilds a live session's grant from the database; an
/// ended session is gone everywhere.
async fn a_session_outlives_the_process_that_granted_it(t: TestFarm) {
    let fx = fixture(&t).await;
    add_device(&t, &fx, "aa:bb:cc:00:00:30", DeviceType::Production).await;
    let g = login(&t, "aa:bb:cc:00:00:30").await.unwrap();
    let config = farm::FarmConfig {
        data_dir: t.dir.path().join("data"),
        db_url: t.db_url.clone(),
        store_root: None,
    };
    let restarted = farm::Farm::open(&config).await.unwrap();
    let now = restarted.now_ms();
    assert!(
        restarted
            .session_table()
            .lookup(&g.export_name, now)
            .is_none()
    );
    let rebuilt = restarted
        .session_grant(&g.export_name, None)
        .await
        .unwrap()
        .expect("a live session is found in the database");
    let original = t.farm.session_table().lookup(&g.export_name, now).unwrap();
    assert_eq!(rebuilt, original);
    assert!(
        restarted
            .session_table()
            .lookup(&g.export_name, now)
            .is_some()
    );
    t.farm.end_session(&g.session_id, ADMIN).await.unwrap();
    assert!(
        restarted
            .session_grant(&g.export_name, None)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        restarted
            .session_grant("ferry-s-00000000000000000000000000000000", None)
            .await
            .unwrap()
            .is_none()
    );
}

dual_tests!(
    a_session_outlives_the_process_that_granted_it,
    pinned_production_device_boots_its_pinned_version,
    init_twice_is_a_conflict,
    token_authenticates_by_secret_only,
    crud_and_audit,
    store_path_escaping_the_root_is_refused,
    a_bucket_store_needs_a_good_url_and_s3_access,
    new_version_makes_the_avhdx_on_the_chain,
    promote_runs_maintenance_test_production_then_stops,
    revert_goes_one_step_back_and_not_while_booted,
    delete_only_the_newest_and_unused_version,
    merge_updates_and_base_make_new_versions,
    auto_merge_makes_a_base_when_the_chain_is_full,
    login_gives_the_version_of_the_device_type,
    login_with_a_wrong_proof_or_reused_nonce_is_refused,
    unknown_device_is_refused_or_auto_added,
);
