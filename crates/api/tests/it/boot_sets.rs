//! Boot sets over the API through the router (no sockets), on SQLite and PostgreSQL: an
//! operator sees a version's set and clears it (audited); a read-only token sees it but may
//! not clear it; a caller without a token or with an unknown one gets nothing; a logged-in
//! device fetches the encoded set of the version its session boots, and an unknown or
//! malformed session name is refused.

use crate::common;

use crate::support;

use axum::http::{Method, StatusCode};
use bootset::{BootSet, Identity, Recorder};
use common::TestFarm;
use serde_json::json;
use support::Api;

/// A set of two boots of `golden@number`: 192 KiB in two extents.
fn a_set(number: u32) -> BootSet {
    let mut r = Recorder::new(64 << 20, 1 << 16);
    r.read(0, 64 << 10, 0);
    r.read(8 << 20, 128 << 10, 40);
    let one = r.finish(Identity {
        vdisk: "golden".into(),
        version: number,
        size_bytes: 64 << 20,
        stamp: [5; 16],
    });
    let one = one.unwrap();
    bootset::merge(&[one.clone(), one]).unwrap()
}

async fn operators_see_and_clear_outsiders_do_not(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, _) = a.fixture().await;
    let uri = format!("/api/v1/vdisks/{vdisk}/versions/0/boot-set");
    let (s, v) = a.call(Method::GET, &uri, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let set = a_set(0);
    let encoded = set.encode();
    a.t.farm
        .save_boot_set("golden", 0, &encoded, (2, 2, 192 << 10))
        .await
        .unwrap();
    let v = a.ok(Method::GET, &uri, None).await;
    assert_eq!(
        (&v["boots"], &v["extents"], &v["blocks"], &v["bytes"]),
        (&json!(2), &json!(2), &json!(48), &json!(192 << 10))
    );
    assert_eq!(v["encoded_bytes"], json!(encoded.len()));
    for token in [None, Some("fy_nope")] {
        for method in [Method::GET, Method::DELETE] {
            let (s, _) = a.raw(method.clone(), &uri, token, None).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} with {token:?}");
        }
    }
    let ro = a
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "viewer", "role": "read_only"})),
        )
        .await;
    let ro = ro["secret"].as_str().unwrap();
    let (s, _) = a.raw(Method::GET, &uri, Some(ro), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = a.raw(Method::DELETE, &uri, Some(ro), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        a.ok(Method::GET, &uri, None).await["boots"] == 2,
        "still there"
    );
    let before = a.audit_total().await;
    let (s, _) = a.call(Method::DELETE, &uri, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(a.audit_total().await, before + 1);
    let (s, _) = a.call(Method::GET, &uri, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

async fn a_device_fetches_the_set_of_the_version_it_boots(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    let mac = "aa:bb:cc:00:21:01";
    a.device(coll, vdisk, mac, "production").await;
    let (s, g) = a.login(mac).await;
    assert_eq!(s, StatusCode::OK, "{g}");
    let export = g["export_name"].as_str().unwrap().to_string();
    let path = format!("/{}", contract::boot_set::BOOT_SET_PATH);
    let body = json!({"export_name": export}).to_string();
    let (s, _, b) = a.bytes(Method::POST, &path, None, Some(&body)).await;
    assert_eq!((s, b.len()), (StatusCode::NO_CONTENT, 0), "no set yet");
    let set = a_set(0);
    a.t.farm
        .save_boot_set("golden", 0, &set.encode(), (2, 2, 192 << 10))
        .await
        .unwrap();
    let (s, ctype, b) = a.bytes(Method::POST, &path, None, Some(&body)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ctype.as_deref(), Some("application/octet-stream"));
    assert_eq!(BootSet::decode(&b), Ok(set));
    for name in ["ferry-s-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "golden", ""] {
        let body = json!({"export_name": name}).to_string();
        let (s, _, b) = a.bytes(Method::POST, &path, None, Some(&body)).await;
        assert_eq!(
            s,
            StatusCode::UNAUTHORIZED,
            "{name:?}: {}",
            String::from_utf8_lossy(&b)
        );
    }
    let (s, _, _) = a
        .bytes(
            Method::POST,
            &path,
            None,
            Some(r#"{"export_name":"x","more":1}"#),
        )
        .await;
    assert!(s.is_client_error());
}

dual_tests!(
    operators_see_and_clear_outsiders_do_not,
    a_device_fetches_the_set_of_the_version_it_boots,
);
