//! Load balancing at login (issue 20), on SQLite and PostgreSQL: devices logging in are
//! spread over the live servers of their site in proportion to the servers' ratings; a
//! draining server is named after every other live one; a session's server follows what
//! its status reports name; bad ratings and unknown servers are refused.

use crate::common;

use common::TestFarm;
use farm::balance::{RATING_MAX, SessionServer};
use farm::input::{NewCollection, NewDevice, NewServer, NewSite, NewStore, NewVDisk, ServerPatch};
use farm::login::{ChallengeRequest, LoginGrant};
use farm::model::{CacheMode, DeviceType, Server};
use farm::{Farm, Kind};

const ADMIN: &str = "admin";

/// A site with three servers (ratings 100, 100, 200), a store, a vDisk and a collection.
async fn fixture(t: &TestFarm) -> (Vec<Server>, i64, i64) {
    let f = &t.farm;
    let site = NewSite {
        name: "hq".into(),
        description: String::new(),
    };
    let site = f.create_site(&site, ADMIN).await.unwrap().id;
    let mut servers = Vec::new();
    for (i, rating) in [(1, 100), (2, 100), (3, 200)] {
        let s = NewServer {
            site_id: site,
            name: format!("srv{i}"),
            address: format!("10.0.0.{i}:10809"),
            uid: None,
            api_url: None,
        };
        let s = f.register_server(&s, ADMIN).await.unwrap();
        assert_eq!(s.rating, farm::balance::DEFAULT_RATING);
        let p = ServerPatch {
            rating: Some(rating),
            draining: None,
        };
        servers.push(f.set_server(s.id, &p, ADMIN).await.unwrap());
    }
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
    (servers, vdisk, collection)
}

/// A diskless production device `n` (the farm key logs it in at every boot).
async fn add(t: &TestFarm, collection: i64, vdisk: i64, n: u8) -> String {
    let mac = format!("52:54:00:00:01:{n:02x}");
    let d = NewDevice {
        collection_id: collection,
        mac: mac.clone(),
        name: format!("pc-{n}"),
        device_type: Some(DeviceType::Production),
        vdisk_id: Some(vdisk),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless: true,
    };
    t.farm.create_device(&d, ADMIN).await.unwrap();
    mac
}

async fn login(t: &TestFarm, mac: &str) -> LoginGrant {
    let farm: &Farm = &t.farm;
    let c = farm
        .challenge(&ChallengeRequest { mac: mac.into() }, None)
        .await
        .unwrap();
    let how = t.credential(mac).await;
    farm.login(&TestFarm::request(mac, &how, &c.nonce), None)
        .await
        .unwrap()
}

/// Live sessions of each of `servers`, in their order.
async fn counts(t: &TestFarm, servers: &[Server]) -> Vec<i64> {
    let per = t.farm.sessions_per_server().await.unwrap();
    servers
        .iter()
        .map(|s| {
            per.iter()
                .find(|(id, _)| *id == s.id)
                .map_or(0, |(_, n)| *n)
        })
        .collect()
}

async fn logins_spread_in_proportion_to_ratings_and_avoid_a_draining_server(t: TestFarm) {
    let (servers, vdisk, collection) = fixture(&t).await;
    let mut first = Vec::new();
    for n in 0..40 {
        let mac = add(&t, collection, vdisk, n).await;
        let g = login(&t, &mac).await;
        assert_eq!(
            g.servers.len(),
            3,
            "every server of the site, to fail over to"
        );
        assert!(g.servers.iter().all(|s| s.alive));
        first.push(g.servers[0].name.clone());
    }
    assert_eq!(counts(&t, &servers).await, [10, 10, 20], "{first:?}");

    // A login again replaces the device's session: the counts stay.
    let again = login(&t, "52:54:00:00:01:00").await;
    assert_eq!(counts(&t, &servers).await.iter().sum::<i64>(), 40);
    assert_eq!(again.servers.len(), 3);

    // Draining srv3: every new login names it last.
    let p = ServerPatch {
        rating: None,
        draining: Some(true),
    };
    let s3 = t.farm.set_server(servers[2].id, &p, ADMIN).await.unwrap();
    assert!(s3.draining.0);
    for n in 40..46 {
        let mac = add(&t, collection, vdisk, n).await;
        let g = login(&t, &mac).await;
        let names: Vec<&str> = g.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.last(), Some(&"srv3"), "{names:?}");
    }
    assert_eq!(counts(&t, &servers).await, [13, 13, 20]);
}

async fn a_session_s_server_follows_its_status_reports(t: TestFarm) {
    let (servers, vdisk, collection) = fixture(&t).await;
    let mac = add(&t, collection, vdisk, 1).await;
    let g = login(&t, &mac).await;
    assert_eq!(g.servers[0].name, "srv3", "the highest rating, all empty");
    assert_eq!(counts(&t, &servers).await, [0, 0, 1]);
    // After a failover the agent reports the server it streams from: by address, by id.
    t.farm
        .note_session_server(&g.session_id, SessionServer::Address("10.0.0.1:10809"))
        .await
        .unwrap();
    assert_eq!(counts(&t, &servers).await, [1, 0, 0]);
    t.farm
        .note_session_server(&g.session_id, SessionServer::Id(servers[1].id))
        .await
        .unwrap();
    assert_eq!(counts(&t, &servers).await, [0, 1, 0]);
    // A server nobody registered changes nothing.
    t.farm
        .note_session_server(&g.session_id, SessionServer::Address("10.9.9.9:1"))
        .await
        .unwrap();
    t.farm
        .note_session_server(&g.session_id, SessionServer::Id(i64::MAX))
        .await
        .unwrap();
    assert_eq!(counts(&t, &servers).await, [0, 1, 0]);
}

async fn bad_ratings_and_unknown_servers_are_refused(t: TestFarm) {
    let (servers, _, _) = fixture(&t).await;
    for r in [0, -1, RATING_MAX + 1] {
        let p = ServerPatch {
            rating: Some(r),
            draining: None,
        };
        let e = t
            .farm
            .set_server(servers[0].id, &p, ADMIN)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{r}: {e}");
        assert!(e.to_string().contains("rating"), "{e}");
    }
    assert_eq!(t.farm.server(servers[0].id).await.unwrap().rating, 100);
    let e = t
        .farm
        .set_server(i64::MAX, &ServerPatch::default(), ADMIN)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
}

dual_tests!(
    logins_spread_in_proportion_to_ratings_and_avoid_a_draining_server,
    a_session_s_server_follows_its_status_reports,
    bad_ratings_and_unknown_servers_are_refused,
);
