//! Network boot in the farm, on SQLite and PostgreSQL: the boot decision by MAC (known
//! device, auto-add without creating a row, each refusal with its reason), diskless
//! devices that a boot's one-time ticket logs in at every boot (and ones with a disk it
//! never does), and the per-vDisk boot overrides.

use crate::common;

use common::TestFarm;
use farm::boot::{BootPlan, BootTarget, RefusalKind};
use farm::input::{DevicePatch, NewCollection, NewDevice, NewSite, NewStore, NewVDisk, VDiskPatch};
use farm::login::{ChallengeRequest, LoginGrant, LoginRequest, proof};
use farm::model::{CacheMode, DeviceType};
use farm::{Farm, Kind};

const ADMIN: &str = "admin";

struct Fx {
    site: i64,
    vdisk: i64,
    collection: i64,
}

/// A site with a server, a store, a vDisk "golden" (a real empty VHDX), and a collection
/// "lab" that adds no device.
async fn fixture(t: &TestFarm) -> Fx {
    let f = &t.farm;
    let site = NewSite {
        name: "hq".into(),
        description: String::new(),
    };
    let site = f.create_site(&site, ADMIN).await.unwrap().id;
    let server = farm::input::NewServer {
        site_id: site,
        name: "srv1".into(),
        address: "10.0.2.2:10809".into(),
        uid: None,
        api_url: None,
    };
    f.register_server(&server, ADMIN).await.unwrap();
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = f.create_store(&store, ADMIN).await.unwrap().id;
    let vdisk = NewVDisk {
        store_id: store,
        name: "golden".into(),
        size_bytes: Some(16 << 20),
        cache_mode: Some(CacheMode::Ram),
        ram_bytes: None,
        description: String::new(),
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
    Fx {
        site,
        vdisk,
        collection,
    }
}

async fn add(t: &TestFarm, fx: &Fx, mac: &str, vdisk: Option<i64>, diskless: bool) -> i64 {
    let d = NewDevice {
        collection_id: fx.collection,
        mac: mac.into(),
        name: format!("pc-{}", &mac[mac.len() - 2..]),
        device_type: Some(DeviceType::Production),
        vdisk_id: vdisk,
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless,
    };
    t.farm.create_device(&d, ADMIN).await.unwrap().id
}

fn booted(p: BootPlan) -> BootTarget {
    match p {
        BootPlan::Boot(t) => *t,
        BootPlan::Refuse(r) => panic!("refused: {}", r.reason),
    }
}

fn refused(p: BootPlan, kind: RefusalKind) -> String {
    match p {
        BootPlan::Refuse(r) => {
            assert_eq!(r.kind, kind, "{}", r.reason);
            r.reason
        }
        BootPlan::Boot(t) => panic!("boots {:?}", t.vdisk.name),
    }
}

async fn login(farm: &Farm, mac: &str, key_hex: &str) -> farm::Result<LoginGrant> {
    let c = farm
        .challenge(&ChallengeRequest { mac: mac.into() }, None)
        .await?;
    let hmac = proof(key_hex, &c.nonce, mac)?;
    let r = LoginRequest {
        mac: mac.into(),
        nonce: c.nonce,
        hmac,
        diskless: true,
        ticket: None,
    };
    farm.login(&r, None).await
}

async fn login_ticket(farm: &Farm, mac: &str, ticket: &str) -> farm::Result<LoginGrant> {
    let r = LoginRequest {
        mac: mac.into(),
        nonce: String::new(),
        hmac: String::new(),
        diskless: true,
        ticket: Some(ticket.into()),
    };
    farm.login(&r, None).await
}

async fn a_known_device_boots_its_vdisk_s_version_with_login_s_rules(t: TestFarm) {
    let fx = fixture(&t).await;
    add(&t, &fx, "52:54:00:00:00:01", Some(fx.vdisk), true).await;
    let b = booted(t.farm.boot_plan("52-54-00-00-00-01", None).await.unwrap());
    assert!(!b.auto_add);
    assert_eq!(b.device.name, "pc-01");
    assert!(b.device.diskless.0);
    assert_eq!((b.vdisk.name.as_str(), b.version.number), ("golden", 0));
    assert!(
        b.path.ends_with("main/golden.vhdx") && b.path.exists(),
        "{b:?}"
    );
    assert_eq!(b.cache_mode, CacheMode::Ram);
    assert_eq!(b.servers.len(), 1);
    assert_eq!(b.servers[0].address, "10.0.2.2:10809");
    // A new version in maintenance is not what a production device boots; once promoted
    // to production it is.
    let v1 = t.farm.new_version(fx.vdisk, ADMIN).await.unwrap();
    let b = booted(t.farm.boot_plan("52:54:00:00:00:01", None).await.unwrap());
    assert_eq!(b.version.number, 0);
    t.farm.promote(fx.vdisk, v1.number, ADMIN).await.unwrap();
    t.farm.promote(fx.vdisk, v1.number, ADMIN).await.unwrap();
    let b = booted(t.farm.boot_plan("52:54:00:00:00:01", None).await.unwrap());
    assert_eq!(b.version.number, v1.number);
    assert!(b.path.ends_with(&b.version.file_name));
}

async fn an_unknown_mac_is_refused_or_planned_for_auto_add_without_a_row(t: TestFarm) {
    let fx = fixture(&t).await;
    let mac = "52:54:00:00:00:02";
    let why = refused(
        t.farm.boot_plan(mac, None).await.unwrap(),
        RefusalKind::UnknownDevice,
    );
    assert!(
        why.contains(mac) && why.contains("ferry device add"),
        "{why}"
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
    let b = booted(t.farm.boot_plan(mac, None).await.unwrap());
    assert!(b.auto_add);
    assert_eq!(b.vdisk.name, "golden");
    assert!(t.farm.device_by_mac(mac).await.unwrap().is_none());
    // The ticket login that follows adds it, diskless, with a key of its own.
    let ticket = t
        .farm
        .issue_boot_ticket(mac)
        .await
        .unwrap()
        .expect("a ticket");
    let g = login_ticket(&t.farm, mac, &ticket).await.unwrap();
    let key = g.device_secret.expect("a new key");
    let d = t.farm.device_by_mac(mac).await.unwrap().unwrap();
    assert!(d.diskless.0);
    let g2 = login(&t.farm, mac, &key).await.unwrap();
    assert!(g2.device_secret.is_none());
}

async fn no_vdisk_no_version_and_a_missing_file_are_refused_with_reasons(t: TestFarm) {
    let fx = fixture(&t).await;
    let id = add(&t, &fx, "52:54:00:00:00:03", None, false).await;
    let why = refused(
        t.farm.boot_plan("52:54:00:00:00:03", None).await.unwrap(),
        RefusalKind::NoVdisk,
    );
    assert!(
        why.contains(&format!("ferry device set {id} --vdisk")),
        "{why}"
    );
    // A maintenance device with no maintenance version.
    let p = DevicePatch {
        vdisk_id: Some(Some(fx.vdisk)),
        device_type: Some(DeviceType::Maintenance),
        ..DevicePatch::default()
    };
    t.farm.update_device(id, &p, ADMIN).await.unwrap();
    let why = refused(
        t.farm.boot_plan("52:54:00:00:00:03", None).await.unwrap(),
        RefusalKind::NoVersion,
    );
    assert!(
        why.contains("golden") && why.contains("maintenance"),
        "{why}"
    );
    // The version's file gone from the store.
    let p = DevicePatch {
        device_type: Some(DeviceType::Production),
        ..DevicePatch::default()
    };
    t.farm.update_device(id, &p, ADMIN).await.unwrap();
    let b = booted(t.farm.boot_plan("52:54:00:00:00:03", None).await.unwrap());
    std::fs::remove_file(&b.path).unwrap();
    let why = refused(
        t.farm.boot_plan("52:54:00:00:00:03", None).await.unwrap(),
        RefusalKind::FileMissing,
    );
    assert!(why.contains("golden.vhdx"), "{why}");
    assert_eq!(
        t.farm
            .boot_plan("not-a-mac", None)
            .await
            .unwrap_err()
            .kind(),
        Kind::InvalidInput
    );
}

async fn a_ticket_logs_a_diskless_device_in_once_and_one_with_a_disk_never(t: TestFarm) {
    let fx = fixture(&t).await;
    let (diskless, disk) = ("52:54:00:00:00:04", "52:54:00:00:00:05");
    add(&t, &fx, diskless, Some(fx.vdisk), true).await;
    let id = add(&t, &fx, disk, Some(fx.vdisk), false).await;
    let ticket = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    let first = login_ticket(&t.farm, diskless, &ticket).await.unwrap();
    let key = first.device_secret.clone().expect("a key for this boot");
    // Single use.
    let e = login_ticket(&t.farm, diskless, &ticket).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    // The key of this boot logs it in again; the next boot's ticket makes a new one.
    login(&t.farm, diskless, &key).await.unwrap();
    let next = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    let second = login_ticket(&t.farm, diskless, &next).await.unwrap();
    assert_ne!(second.device_secret.as_deref(), Some(key.as_str()));
    let e = login(&t.farm, diskless, &key).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated, "the last boot's key");
    // A ticket of one MAC is nothing for another.
    let other = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    let e = login_ticket(&t.farm, disk, &other).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    // With a disk: no ticket in its boot script, and none accepted, even one of its MAC
    // from when it was diskless.
    assert_eq!(t.farm.issue_boot_ticket(disk).await.unwrap(), None);
    let p = DevicePatch {
        diskless: Some(true),
        ..DevicePatch::default()
    };
    t.farm.update_device(id, &p, ADMIN).await.unwrap();
    let old = t.farm.issue_boot_ticket(disk).await.unwrap().unwrap();
    let p = DevicePatch {
        diskless: Some(false),
        ..DevicePatch::default()
    };
    t.farm.update_device(id, &p, ADMIN).await.unwrap();
    let e = login_ticket(&t.farm, disk, &old).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    assert_eq!(t.farm.list_sessions(None, None).await.unwrap().total, 1);
}

async fn vdisk_boot_overrides_are_checked_and_kept(t: TestFarm) {
    let fx = fixture(&t).await;
    let p = VDiskPatch {
        boot_cmdline: Some("console=ttyS0,115200 quiet".into()),
        boot_kernel: Some(Some("/boot/vmlinuz-6.1.0".into())),
        ..VDiskPatch::default()
    };
    t.farm.update_vdisk(fx.vdisk, &p, ADMIN).await.unwrap();
    let v = t.farm.vdisk(fx.vdisk).await.unwrap();
    assert_eq!(v.boot_cmdline, "console=ttyS0,115200 quiet");
    assert_eq!(v.boot_kernel.as_deref(), Some("/boot/vmlinuz-6.1.0"));
    assert_eq!(v.boot_initrd, None);
    for bad in [
        VDiskPatch {
            boot_cmdline: Some("quiet\nshell".into()),
            ..VDiskPatch::default()
        },
        VDiskPatch {
            boot_initrd: Some(Some("../etc/shadow".into())),
            ..VDiskPatch::default()
        },
    ] {
        let e = t
            .farm
            .update_vdisk(fx.vdisk, &bad, ADMIN)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput);
    }
    let clear = VDiskPatch {
        boot_kernel: Some(None),
        ..VDiskPatch::default()
    };
    t.farm.update_vdisk(fx.vdisk, &clear, ADMIN).await.unwrap();
    let v = t.farm.vdisk(fx.vdisk).await.unwrap();
    assert_eq!(v.boot_kernel, None);
    assert_eq!(v.boot_cmdline, "console=ttyS0,115200 quiet");
}

dual_tests!(
    a_known_device_boots_its_vdisk_s_version_with_login_s_rules,
    an_unknown_mac_is_refused_or_planned_for_auto_add_without_a_row,
    no_vdisk_no_version_and_a_missing_file_are_refused_with_reasons,
    a_ticket_logs_a_diskless_device_in_once_and_one_with_a_disk_never,
    vdisk_boot_overrides_are_checked_and_kept,
);
