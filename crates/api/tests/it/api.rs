//! The REST API end to end through the router (no sockets), on SQLite and PostgreSQL: the
//! happy path of a farm, device login, and every bad-input case of issue 5 item 8, each
//! checked for its status, its message, and that nothing changed.

use crate::common;

use crate::support;

use axum::http::{Method, StatusCode};
use common::TestFarm;
use serde_json::json;
use support::Api;

async fn farm_flow_and_login(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    let mac = "aa:bb:cc:00:01:01";
    a.device(coll, vdisk, mac, "production").await;
    let (s, g) = a.login(mac).await;
    assert_eq!(s, StatusCode::OK, "{g}");
    assert_eq!(g["version"], 0);
    assert!(g["export_name"].as_str().unwrap().starts_with("ferry-s-"));
    let v = a
        .ok(
            Method::POST,
            &format!("/api/v1/vdisks/{vdisk}/versions"),
            None,
        )
        .await;
    assert_eq!(
        (v["number"].as_i64(), v["access"].as_str()),
        (Some(1), Some("maintenance"))
    );
    for expect in ["test", "production"] {
        let v = a
            .ok(
                Method::POST,
                &format!("/api/v1/vdisks/{vdisk}/versions/1/promote"),
                None,
            )
            .await;
        assert_eq!(v["access"], expect);
    }
    // After the promote, the production device's next login boots version 1.
    let (_, g) = a.login(mac).await;
    assert_eq!(
        (g["version"].as_i64(), g["access"].as_str()),
        (Some(1), Some("production"))
    );
    let list = a
        .ok(
            Method::GET,
            &format!("/api/v1/vdisks/{vdisk}/versions"),
            None,
        )
        .await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let sessions = a.ok(Method::GET, "/api/v1/sessions", None).await;
    assert_eq!(sessions["total"], 1);
    let audit = a.ok(Method::GET, "/api/v1/audit?limit=1000", None).await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.contains(&"version.promote") && actions.contains(&"device.login"),
        "{actions:?}"
    );
}

async fn openapi_document_describes_every_route(t: TestFarm) {
    let a = Api::new(t);
    let (s, doc) = a.raw(Method::GET, "/api/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/sites",
        "/api/v1/vdisks/{id}/versions/{number}/promote",
        "/api/v1/login",
        "/api/v1/stores/{id}/paths/{server_id}",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    // Every route of api::router but openapi.json itself (30, the console's 2 status
    // routes, the 2 boot-set routes, and a device's session end).
    assert_eq!(paths.len(), 35);
    assert!(paths.contains_key("/api/v1/device/session/end"));
    assert!(paths.contains_key("/api/v1/login/tpm"));
    assert!(paths.contains_key("/api/v1/vdisks/{id}/versions/{number}/boot-set"));
    assert!(paths.contains_key("/api/v1/device/boot-set"));
    assert!(paths.contains_key("/api/v1/devices/{id}/credential"));
}

async fn a_device_credential_reset_over_the_api_replaces_its_secret(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    let mac = "aa:bb:cc:00:03:01";
    let id = a.device(coll, vdisk, mac, "production").await;
    // The login helper gives it its first key by a reset (generation 1).
    let (s, g) = a.login(mac).await;
    assert_eq!(s, StatusCode::OK, "{g}");
    let old = match a.t.credential(mac).await {
        crate::common::Credential::Key(k) => k,
        crate::common::Credential::Ticket(_) => panic!("a key"),
    };
    let v = a
        .ok(
            Method::POST,
            &format!("/api/v1/devices/{id}/credential"),
            None,
        )
        .await;
    assert_eq!(
        (v["device_id"].as_i64(), v["generation"].as_i64()),
        (Some(id), Some(2))
    );
    let new = v["device_secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    // The old secret (kept by the login helper) is refused; the new one logs in.
    let (s, _) = a.login(mac).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    a.t.keep_secret(mac, Some(&new));
    let (s, g) = a.login(mac).await;
    assert_eq!(s, StatusCode::OK, "{g}");
    assert!(g.get("device_secret").is_none());
    let (s, _) = a
        .call(Method::POST, "/api/v1/devices/9999/credential", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = a
        .raw(
            Method::POST,
            &format!("/api/v1/devices/{id}/credential"),
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "no token, no reset");
}

async fn tokens_and_roles(t: TestFarm) {
    let a = Api::new(t);
    let before = a.audit_total().await;
    let (s, v) = a.raw(Method::GET, "/api/v1/sites", None, None).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("missing bearer token"))
    );
    let (s, v) = a
        .raw(Method::GET, "/api/v1/sites", Some("fy_nope"), None)
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unknown token"))
    );
    let ro = a
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "viewer", "role": "read_only"})),
        )
        .await;
    let secret = ro["secret"].as_str().unwrap();
    let (s, _) = a
        .raw(Method::GET, "/api/v1/sites", Some(secret), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = a
        .raw(
            Method::POST,
            "/api/v1/sites",
            Some(secret),
            Some(r#"{"name":"x"}"#),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("read_only token may not")
    );
    // Only the token creation was recorded.
    assert_eq!(a.audit_total().await, before + 1);
    let total = a.ok(Method::GET, "/api/v1/sites", None).await["total"].as_i64();
    assert_eq!(total, Some(0));
}

async fn bad_input_is_refused_and_changes_nothing(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    use Method as M;
    use StatusCode as S;
    // Malformed JSON, wrong types, unknown fields.
    let before = a.audit_total().await;
    let (s, v) = a
        .raw(
            M::POST,
            "/api/v1/sites",
            Some(&a.admin()),
            Some("{\"name\": "),
        )
        .await;
    assert_eq!(s, S::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("json"), "{v}");
    assert_eq!(a.audit_total().await, before);
    a.refused(
        M::POST,
        "/api/v1/sites",
        Some(json!({"name": 5})),
        S::UNPROCESSABLE_ENTITY,
        "invalid type",
    )
    .await;
    a.refused(
        M::POST,
        "/api/v1/sites",
        Some(json!({"name": "x", "bogus": 1})),
        S::UNPROCESSABLE_ENTITY,
        "unknown field",
    )
    .await;
    a.refused(
        M::POST,
        "/api/v1/sites",
        Some(json!({"name": "a/b"})),
        S::BAD_REQUEST,
        "must not contain",
    )
    .await;
    a.refused(
        M::POST,
        "/api/v1/devices",
        Some(json!({"collection_id": coll, "mac": "zz", "name": "d"})),
        S::BAD_REQUEST,
        "invalid mac",
    )
    .await;
    // Unknown ids.
    a.refused(
        M::GET,
        "/api/v1/sites/999",
        None,
        S::NOT_FOUND,
        "no site with id 999",
    )
    .await;
    a.refused(
        M::POST,
        "/api/v1/vdisks/999/versions/1/promote",
        None,
        S::NOT_FOUND,
        "no version 1",
    )
    .await;
    a.refused(
        M::POST,
        "/api/v1/devices",
        Some(json!({"collection_id": 999, "mac": "aa:bb:cc:00:02:09", "name": "d"})),
        S::NOT_FOUND,
        "no collection",
    )
    .await;
    a.refused(M::GET, "/api/v1/sites/abc", None, S::BAD_REQUEST, "invalid")
        .await;
    a.refused(
        M::GET,
        "/api/v1/nowhere",
        None,
        S::NOT_FOUND,
        "no such route",
    )
    .await;
    // Bad pages.
    a.refused(
        M::GET,
        "/api/v1/sites?limit=0",
        None,
        S::BAD_REQUEST,
        "limit must be",
    )
    .await;
    a.refused(
        M::GET,
        "/api/v1/sites?limit=5000",
        None,
        S::BAD_REQUEST,
        "limit must be",
    )
    .await;
    a.refused(
        M::GET,
        "/api/v1/sites?offset=-1",
        None,
        S::BAD_REQUEST,
        "offset",
    )
    .await;
    // A vDisk size the image library refuses, and no file is left behind.
    let body = json!({"store_id": 1, "name": "odd", "size_bytes": 1000});
    a.refused(
        M::POST,
        "/api/v1/vdisks",
        Some(body),
        S::BAD_REQUEST,
        "multiple of 512",
    )
    .await;
    assert!(
        !a.t.farm
            .store_dir(1, None)
            .await
            .unwrap()
            .join("odd.vhdx")
            .exists()
    );
    // A store path that escapes the store root.
    a.refused(
        M::POST,
        "/api/v1/stores",
        Some(json!({"name": "evil", "path": "../../etc"})),
        S::BAD_REQUEST,
        "escapes the store root",
    )
    .await;
    // Forbidden transitions: promoting past production, deleting a used version.
    a.refused(
        M::POST,
        &format!("/api/v1/vdisks/{vdisk}/versions/0/promote"),
        None,
        S::CONFLICT,
        "already in production",
    )
    .await;
    a.ok(M::POST, &format!("/api/v1/vdisks/{vdisk}/versions"), None)
        .await;
    a.refused(
        M::POST,
        &format!("/api/v1/vdisks/{vdisk}/versions"),
        None,
        S::CONFLICT,
        "in maintenance",
    )
    .await;
    a.refused(
        M::DELETE,
        &format!("/api/v1/vdisks/{vdisk}/versions/0"),
        None,
        S::CONFLICT,
        "only the newest",
    )
    .await;
    a.device(coll, vdisk, "aa:bb:cc:00:02:01", "maintenance")
        .await;
    a.device(coll, vdisk, "aa:bb:cc:00:02:02", "maintenance")
        .await;
    assert_eq!(a.login("aa:bb:cc:00:02:01").await.0, S::OK);
    a.refused(
        M::DELETE,
        &format!("/api/v1/vdisks/{vdisk}/versions/1"),
        None,
        S::CONFLICT,
        "in use",
    )
    .await;
    a.refused(
        M::POST,
        &format!("/api/v1/vdisks/{vdisk}/versions/1/promote"),
        None,
        S::CONFLICT,
        "booted by a maintenance device",
    )
    .await;
    // A second maintenance device (its key made first: a reset is audited).
    a.t.credential("aa:bb:cc:00:02:02").await;
    let before = a.audit_total().await;
    let (s, v) = a.login("aa:bb:cc:00:02:02").await;
    assert_eq!(s, S::CONFLICT);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("another maintenance device"),
        "{v}"
    );
    assert_eq!(a.audit_total().await, before);
    // Unknown device, wrong proof.
    let (s, v) = a.login("aa:bb:cc:00:02:99").await;
    assert_eq!(s, S::FORBIDDEN, "{v}");
    let (_, c) = a
        .raw(
            M::POST,
            "/api/v1/login/challenge",
            None,
            Some(r#"{"mac":"aa:bb:cc:00:02:01"}"#),
        )
        .await;
    let body = json!({"mac": "aa:bb:cc:00:02:01", "nonce": c["nonce"], "hmac": "00".repeat(32)})
        .to_string();
    let (s, v) = a.raw(M::POST, "/api/v1/login", None, Some(&body)).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (S::UNAUTHORIZED, Some("login refused: bad or expired proof"))
    );
    // The version is still in maintenance and its file is still there.
    let v = a
        .ok(M::GET, &format!("/api/v1/vdisks/{vdisk}/versions/1"), None)
        .await;
    assert_eq!(v["access"], "maintenance");
    let dir = a.t.farm.store_dir(1, None).await.unwrap();
    assert!(dir.join("golden.1.avhdx").exists());
}

/// Issue 31: `DELETE /servers/{id}` names who may remove a server (an outsider 401, a
/// read-only token 403) and refuses a running one (409, nothing removed); a second server
/// registering a name another uid holds is refused (409) instead of merged.
async fn removing_a_server_checks_who_asks_and_refuses_a_running_one(t: TestFarm) {
    let a = Api::new(t);
    let site = a
        .ok(Method::POST, "/api/v1/sites", Some(json!({"name": "hq"})))
        .await;
    let server = |name: &str, uid: &str| json!({"site_id": site["id"], "name": name, "address": "10.0.0.1:10809", "uid": uid});
    let s = a
        .ok(
            Method::POST,
            "/api/v1/servers",
            Some(server("pvs1", "aaaaaaaaaaaaaaaa")),
        )
        .await;
    let uri = format!("/api/v1/servers/{}", s["id"]);
    let (st, _) = a.raw(Method::DELETE, &uri, None, None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let ro = a
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "viewer", "role": "read_only"})),
        )
        .await;
    let (st, _) = a
        .raw(Method::DELETE, &uri, ro["secret"].as_str(), None)
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = a.raw(Method::DELETE, &uri, Some(&a.admin()), None).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("is running"), "{v}");
    a.ok(Method::GET, &uri, None).await;
    let body = server("pvs1", "bbbbbbbbbbbbbbbb").to_string();
    let (st, v) = a
        .raw(
            Method::POST,
            "/api/v1/servers",
            Some(&a.admin()),
            Some(&body),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let total = a.ok(Method::GET, "/api/v1/servers", None).await["total"].as_i64();
    assert_eq!(total, Some(1));
}

dual_tests!(
    removing_a_server_checks_who_asks_and_refuses_a_running_one,
    a_device_credential_reset_over_the_api_replaces_its_secret,
    farm_flow_and_login,
    openapi_document_describes_every_route,
    tokens_and_roles,
    bad_input_is_refused_and_changes_nothing,
);
