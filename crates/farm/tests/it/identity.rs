//! Issue 30's login bounds and identities, on SQLite and PostgreSQL with a simulated clock:
//! a challenge flood from one address does not starve another's login; auto-add stops at
//! its collection's bounds; a boot ticket is single use, expires, and is refused for a
//! device with a disk and for one bound to its TPM; a reset key revokes the old one.

use crate::common;

use std::net::IpAddr;
use std::time::Duration;

use common::TestFarm;
use farm::input::{NewCollection, NewDevice, NewSite, NewStore, NewVDisk};
use farm::login::{ChallengeRequest, LoginGrant, LoginLimits, LoginRequest, proof};
use farm::model::DeviceType;
use farm::{Farm, Kind, SimClock};

const ADMIN: &str = "admin";

/// A site, a store, a vDisk "golden" and a collection adding at most `max` devices, `per_minute`
/// a minute; returns (collection, vdisk).
pub(crate) async fn fixture(t: &TestFarm, max: i64, per_minute: i64) -> (i64, i64) {
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
        size_bytes: Some(64 << 20),
        cache_mode: None,
        ram_bytes: None,
        description: String::new(),
    };
    let vdisk = f.create_vdisk(&vdisk, ADMIN).await.unwrap().id;
    let c = NewCollection {
        site_id: site,
        name: "lab".into(),
        auto_add: true,
        default_vdisk_id: Some(vdisk),
        auto_add_max: Some(max),
        auto_add_per_minute: Some(per_minute),
    };
    (f.create_collection(&c, ADMIN).await.unwrap().id, vdisk)
}

pub(crate) async fn device(t: &TestFarm, coll: i64, vdisk: i64, mac: &str, diskless: bool) -> i64 {
    let d = NewDevice {
        collection_id: coll,
        mac: mac.into(),
        name: format!("pc-{}", mac.replace(':', "")),
        device_type: Some(DeviceType::Production),
        vdisk_id: Some(vdisk),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless,
    };
    t.farm.create_device(&d, ADMIN).await.unwrap().id
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

async fn challenge(f: &Farm, mac: &str, peer: &str) -> farm::Result<String> {
    let r = ChallengeRequest { mac: mac.into() };
    Ok(f.challenge(&r, ip(peer)).await?.nonce)
}

async fn prove(f: &Farm, mac: &str, key: &str, nonce: String) -> farm::Result<LoginGrant> {
    let r = LoginRequest {
        mac: mac.into(),
        hmac: proof(key, &nonce, mac)?,
        nonce,
        diskless: false,
        ticket: None,
    };
    f.login(&r, None).await
}

async fn ticket(f: &Farm, mac: &str, ticket: &str) -> farm::Result<LoginGrant> {
    let r = LoginRequest {
        mac: mac.into(),
        nonce: String::new(),
        hmac: String::new(),
        diskless: true,
        ticket: Some(ticket.into()),
    };
    f.login(&r, None).await
}

async fn a_challenge_flood_from_one_address_does_not_starve_another(t: TestFarm, clock: SimClock) {
    let (coll, vdisk) = fixture(&t, 10, 10).await;
    let id = device(&t, coll, vdisk, "aa:bb:cc:00:30:01", false).await;
    let key = t
        .farm
        .reset_device_credential(id, ADMIN)
        .await
        .unwrap()
        .device_secret;
    // A table of 24 nonces, 16 an address: small, so that a short flood fills it.
    t.farm.set_login_limits(LoginLimits {
        nonces_max: 24,
        nonces_per_address: 16,
    });
    let mut refused = 0;
    for n in 0..200 {
        // Any MAC: a flood need not name devices.
        match challenge(
            &t.farm,
            &format!("aa:bb:cc:00:31:{:02x}", n % 256),
            "127.0.0.2",
        )
        .await
        {
            Ok(_) => {}
            Err(e) if e.kind() == Kind::LimitReached => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        refused,
        200 - 16,
        "the flooder gets its own bound and no more"
    );
    // Others fill the rest of the table...
    for n in 0..8 {
        challenge(&t.farm, "aa:bb:cc:00:32:01", &format!("10.0.0.{n}"))
            .await
            .unwrap();
    }
    // ...and a device from yet another address still gets its challenge (the flooder's
    // oldest nonce goes) and logs in.
    let nonce = challenge(&t.farm, "aa:bb:cc:00:30:01", "127.0.0.3")
        .await
        .unwrap();
    prove(&t.farm, "aa:bb:cc:00:30:01", &key, nonce)
        .await
        .unwrap();
    // The flooder may take back the one place it lost, and is then at its bound again
    // until its nonces expire.
    challenge(&t.farm, "aa:bb:cc:00:31:01", "127.0.0.2")
        .await
        .unwrap();
    let e = challenge(&t.farm, "aa:bb:cc:00:31:01", "127.0.0.2")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::LimitReached);
    clock.advance(Duration::from_millis(farm::login::NONCE_TTL_MS as u64 + 1));
    challenge(&t.farm, "aa:bb:cc:00:31:01", "127.0.0.2")
        .await
        .unwrap();
}

async fn auto_add_stops_at_its_collection_s_bounds(t: TestFarm, clock: SimClock) {
    // At most 2 a minute and 3 in all.
    fixture(&t, 3, 2).await;
    let mut added = 0;
    for round in 0..3 {
        for n in 0..4 {
            let mac = format!("aa:bb:cc:00:40:{round}{n}");
            let tk = t
                .farm
                .issue_boot_ticket(&mac)
                .await
                .unwrap()
                .expect("auto-add takes it");
            match ticket(&t.farm, &mac, &tk).await {
                Ok(_) => added += 1,
                Err(e) => {
                    assert_eq!(e.kind(), Kind::LimitReached, "{e}");
                    assert!(e.to_string().contains("auto_add"), "{e}");
                    assert!(t.farm.device_by_mac(&mac).await.unwrap().is_none());
                }
            }
        }
        let expect = [2, 3, 3][round];
        assert_eq!(added, expect, "after round {round}");
        clock.advance(Duration::from_secs(61));
    }
    assert_eq!(
        t.farm.list_devices(None, None, None).await.unwrap().total,
        3
    );
}

async fn a_ticket_is_single_use_expires_and_only_for_a_diskless_device_without_a_tpm(
    t: TestFarm,
    clock: SimClock,
) {
    let (coll, vdisk) = fixture(&t, 10, 10).await;
    let (diskless, disk) = ("aa:bb:cc:00:50:01", "aa:bb:cc:00:50:02");
    device(&t, coll, vdisk, diskless, true).await;
    let disk_id = device(&t, coll, vdisk, disk, false).await;
    let settings = farm::input::SettingsPatch {
        boot_ticket_secs: Some(10),
        ..Default::default()
    };
    t.farm.update_settings(&settings, ADMIN).await.unwrap();
    let tk = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    assert!(tk.starts_with("ft_") && tk.len() == 67, "{tk}");
    let key = ticket(&t.farm, diskless, &tk)
        .await
        .unwrap()
        .device_secret
        .unwrap();
    let e = ticket(&t.farm, diskless, &tk).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated, "used");
    let late = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    clock.advance(Duration::from_secs(10));
    let e = ticket(&t.farm, diskless, &late).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated, "expired");
    // A device with a disk: no ticket for it, and a forged one is refused like any other.
    assert_eq!(t.farm.issue_boot_ticket(disk).await.unwrap(), None);
    let e = ticket(&t.farm, disk, &format!("ft_{}", "00".repeat(32)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    // Its own key logs it in; a reset revokes that key at once.
    let old = t
        .farm
        .reset_device_credential(disk_id, ADMIN)
        .await
        .unwrap()
        .device_secret;
    let nonce = challenge(&t.farm, disk, "127.0.0.1").await.unwrap();
    prove(&t.farm, disk, &old, nonce).await.unwrap();
    let new = t
        .farm
        .reset_device_credential(disk_id, ADMIN)
        .await
        .unwrap()
        .device_secret;
    let nonce = challenge(&t.farm, disk, "127.0.0.1").await.unwrap();
    let e = prove(&t.farm, disk, &old, nonce).await.unwrap_err();
    assert_eq!(
        e.kind(),
        Kind::Unauthenticated,
        "the reset key's predecessor"
    );
    let nonce = challenge(&t.farm, disk, "127.0.0.1").await.unwrap();
    prove(&t.farm, disk, &new, nonce).await.unwrap();
    // A diskless device that keeps its key in its TPM (it says so, proving with the key)
    // gets no ticket and accepts none, also one issued before; its key logs it in.
    let early = t.farm.issue_boot_ticket(diskless).await.unwrap().unwrap();
    let nonce = challenge(&t.farm, diskless, "127.0.0.1").await.unwrap();
    let bind = LoginRequest {
        mac: diskless.into(),
        hmac: proof(&key, &nonce, diskless).unwrap(),
        nonce,
        diskless: true,
        ticket: None,
    };
    t.farm.bind_tpm(&bind).await.unwrap();
    assert_eq!(t.farm.issue_boot_ticket(diskless).await.unwrap(), None);
    let e = ticket(&t.farm, diskless, &early).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated, "a TPM-bound device");
    let nonce = challenge(&t.farm, diskless, "127.0.0.1").await.unwrap();
    prove(&t.farm, diskless, &key, nonce).await.unwrap();
    // Binding needs the key: a wrong proof binds nothing.
    let nonce = challenge(&t.farm, disk, "127.0.0.1").await.unwrap();
    let wrong = LoginRequest {
        mac: disk.into(),
        hmac: proof(&"00".repeat(32), &nonce, disk).unwrap(),
        nonce,
        diskless: true,
        ticket: None,
    };
    assert_eq!(
        t.farm.bind_tpm(&wrong).await.unwrap_err().kind(),
        Kind::Unauthenticated
    );
    // An administrator's reset ends the binding: the next boot gets a ticket again.
    let id = t.farm.device_by_mac(diskless).await.unwrap().unwrap().id;
    t.farm.reset_device_credential(id, ADMIN).await.unwrap();
    assert!(t.farm.issue_boot_ticket(diskless).await.unwrap().is_some());
    // Bad settings are refused.
    for secs in [0, 4, 3601] {
        let p = farm::input::SettingsPatch {
            boot_ticket_secs: Some(secs),
            ..Default::default()
        };
        let e = t.farm.update_settings(&p, ADMIN).await.unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{secs}");
    }
}

sim_tests!(
    a_challenge_flood_from_one_address_does_not_starve_another,
    auto_add_stops_at_its_collection_s_bounds,
    a_ticket_is_single_use_expires_and_only_for_a_diskless_device_without_a_tpm,
);
