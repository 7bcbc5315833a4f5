//! Issue 31's server identities, on SQLite and PostgreSQL with a simulated clock: servers
//! register by the uid each keeps, so two started with one name never merge into one row (the
//! second is refused, naming the first), a renamed server keeps its row, a row registered
//! before uids is adopted by the first server of its name; an administrator removes a server
//! that is gone, which leaves every device's server list, and a running one is refused.

use crate::common;

use std::time::Duration;

use common::TestFarm;
use farm::input::NewServer;
use farm::model::SERVER_ALIVE_MS;
use farm::{Kind, SimClock};

const ADMIN: &str = "admin";
const UID_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const UID_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const UID_C: &str = "cccccccccccccccccccccccccccccccc";

fn server(site: i64, name: &str, address: &str, uid: Option<&str>) -> NewServer {
    NewServer {
        site_id: site,
        name: name.into(),
        address: address.into(),
        uid: uid.map(str::to_string),
        api_url: None,
    }
}

/// The farm's servers as (name, address), by id.
async fn rows(t: &TestFarm) -> Vec<(String, String)> {
    let page = t.farm.list_servers(None, None).await.unwrap();
    page.items
        .into_iter()
        .map(|s| (s.name, s.address))
        .collect()
}

async fn servers_with_one_name_never_merge(t: TestFarm, _c: SimClock) {
    let f = &t.farm;
    let (coll, _) = crate::identity::fixture(&t, 10, 10).await;
    let site = f.collection(coll).await.unwrap().site_id;
    let a = f
        .register_server(&server(site, "pvs1", "10.0.0.1:10809", Some(UID_A)), ADMIN)
        .await
        .unwrap();
    // Another server (another uid) with the same name, as two servers on one host or two
    // cloned hosts started without --server-name: refused, naming the first; nothing changed.
    let e = f
        .register_server(&server(site, "pvs1", "10.0.0.2:10809", Some(UID_B)), ADMIN)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("\"pvs1\"")
            && msg.contains(&format!("id {}", a.id))
            && msg.contains("10.0.0.1:10809"),
        "{msg}"
    );
    assert!(
        msg.contains("--server-name") && msg.contains("ferry farm server remove"),
        "{msg}"
    );
    assert_eq!(rows(&t).await, [("pvs1".into(), "10.0.0.1:10809".into())]);
    // Without a uid (an older server) the name is refused too: the row has an identity.
    let e = f
        .register_server(&server(site, "pvs1", "10.0.0.2:10809", None), ADMIN)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    // The same server again: its row, with its new address; renamed: still its row.
    let again = f
        .register_server(&server(site, "pvs1", "10.0.0.3:10809", Some(UID_A)), ADMIN)
        .await
        .unwrap();
    assert_eq!((again.id, again.address.as_str()), (a.id, "10.0.0.3:10809"));
    let renamed = f
        .register_server(
            &server(site, "pvs1-new", "10.0.0.3:10809", Some(UID_A)),
            ADMIN,
        )
        .await
        .unwrap();
    assert_eq!((renamed.id, renamed.name.as_str()), (a.id, "pvs1-new"));
    // The second server under a name of its own is a second row.
    let b = f
        .register_server(&server(site, "pvs2", "10.0.0.2:10809", Some(UID_B)), ADMIN)
        .await
        .unwrap();
    assert_ne!(b.id, a.id);
    // A rename onto a name another server holds is refused.
    let e = f
        .register_server(&server(site, "pvs2", "10.0.0.3:10809", Some(UID_A)), ADMIN)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    // A row registered before uids (by name only) is adopted by the first server with a uid
    // that registers under its name; after that the name is that server's.
    let old = f
        .register_server(&server(site, "legacy", "10.0.0.9:10809", None), ADMIN)
        .await
        .unwrap();
    let adopted = f
        .register_server(
            &server(site, "legacy", "10.0.0.9:10809", Some(UID_C)),
            ADMIN,
        )
        .await
        .unwrap();
    assert_eq!(adopted.id, old.id);
    let e = f
        .register_server(
            &server(site, "legacy", "10.0.0.8:10809", Some("dddddddddddddddd")),
            ADMIN,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    // A uid that is not 16 to 64 lowercase hex digits is bad input.
    for bad in [
        "abc",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "../../etc/passwd0000000",
    ] {
        let e = f
            .register_server(&server(site, "pvs9", "10.0.0.9:10809", Some(bad)), ADMIN)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{bad}: {e}");
    }
    assert_eq!(rows(&t).await.len(), 3);
}

async fn a_gone_server_is_removed_from_every_device_s_list(t: TestFarm, c: SimClock) {
    let f = &t.farm;
    let (coll, vdisk) = crate::identity::fixture(&t, 10, 10).await;
    let site = f.collection(coll).await.unwrap().site_id;
    let dev = crate::identity::device(&t, coll, vdisk, "52:54:00:00:31:04", false).await;
    let a = f
        .register_server(&server(site, "pvs1", "10.0.0.1:10809", Some(UID_A)), ADMIN)
        .await
        .unwrap();
    let b = f
        .register_server(&server(site, "pvs2", "10.0.0.2:10809", Some(UID_B)), ADMIN)
        .await
        .unwrap();
    let listed = |l: Vec<contract::login::LoginServer>| {
        let mut v: Vec<String> = l.into_iter().map(|s| s.address).collect();
        v.sort();
        v
    };
    assert_eq!(
        listed(f.device_servers(dev).await.unwrap()),
        ["10.0.0.1:10809", "10.0.0.2:10809"]
    );
    let before = f.list_audit(Some(1), None).await.unwrap().total;
    // Running (a heartbeat within SERVER_ALIVE_MS): refused, nothing changed.
    let e = f.remove_server(a.id, ADMIN).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Conflict, "{e}");
    assert!(e.to_string().contains("is running"), "{e}");
    assert_eq!(f.list_servers(None, None).await.unwrap().total, 2);
    // Quiet for longer: removed, audited, out of the device's list; the other still heartbeats.
    c.advance(Duration::from_millis(
        u64::try_from(SERVER_ALIVE_MS).unwrap() + 1_000,
    ));
    f.heartbeat(b.id).await.unwrap();
    f.remove_server(a.id, ADMIN).await.unwrap();
    assert_eq!(f.server(a.id).await.unwrap_err().kind(), Kind::NotFound);
    assert_eq!(
        listed(f.device_servers(dev).await.unwrap()),
        ["10.0.0.2:10809"]
    );
    assert_eq!(f.list_audit(Some(1), None).await.unwrap().total, before + 1);
    assert_eq!(
        f.remove_server(a.id, ADMIN).await.unwrap_err().kind(),
        Kind::NotFound
    );
    // Its identity may register again (a server brought back): a new row.
    let back = f
        .register_server(&server(site, "pvs1", "10.0.0.1:10809", Some(UID_A)), ADMIN)
        .await
        .unwrap();
    assert_ne!(back.id, a.id);
}

/// The API URLs boot scripts name beside their own server's: those the site's live servers
/// registered, serving before draining, none of a silent server; a URL that is not
/// http(s)://HOST:PORT of kernel-argument characters is refused.
async fn a_site_s_live_servers_api_urls_are_named(t: TestFarm, c: SimClock) {
    let f = &t.farm;
    let (coll, _) = crate::identity::fixture(&t, 10, 10).await;
    let site = f.collection(coll).await.unwrap().site_id;
    let with_api = |name: &str, n: u8, uid: &str| NewServer {
        api_url: Some(format!("https://10.0.0.{n}:8443")),
        ..server(site, name, &format!("10.0.0.{n}:10809"), Some(uid))
    };
    let a = f
        .register_server(&with_api("pvs1", 1, UID_A), ADMIN)
        .await
        .unwrap();
    assert_eq!(a.api_url.as_deref(), Some("https://10.0.0.1:8443"));
    f.register_server(&server(site, "pvs2", "10.0.0.2:10809", Some(UID_B)), ADMIN)
        .await
        .unwrap();
    let patch = farm::input::ServerPatch {
        draining: Some(true),
        ..Default::default()
    };
    f.set_server(a.id, &patch, ADMIN).await.unwrap();
    let c3 = f
        .register_server(&with_api("pvs3", 3, UID_C), ADMIN)
        .await
        .unwrap();
    assert_eq!(
        f.site_api_urls(coll).await.unwrap(),
        ["https://10.0.0.3:8443", "https://10.0.0.1:8443"],
        "serving first; pvs2 said none"
    );
    // pvs1 goes silent: only pvs3, which heartbeats, is named.
    c.advance(Duration::from_millis(
        u64::try_from(SERVER_ALIVE_MS).unwrap() + 1,
    ));
    f.heartbeat(c3.id).await.unwrap();
    assert_eq!(
        f.site_api_urls(coll).await.unwrap(),
        ["https://10.0.0.3:8443"]
    );
    for bad in [
        "10.0.0.4:8443",
        "https://",
        "https://a,b:1",
        "https://a b:1",
        "ftp://a:1",
    ] {
        let s = NewServer {
            api_url: Some(bad.into()),
            ..server(site, "pvs4", "10.0.0.4:10809", None)
        };
        let e = f.register_server(&s, ADMIN).await.unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{bad}: {e}");
    }
}

sim_tests!(
    servers_with_one_name_never_merge,
    a_gone_server_is_removed_from_every_device_s_list,
    a_site_s_live_servers_api_urls_are_named,
);
