//! Issue 18's farm findings over the REST API, on SQLite and PostgreSQL: the store-root rule
//! holds for chains, new store paths and store directories swapped for symlinks; bad images
//! and failed merges answer 4xx naming what is wrong; a read-only token never sees a
//! session's export name; an unknown device's login leaves nothing behind. Issue 30: boot
//! file overrides outside `/boot` are refused.

use crate::common;

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use axum::http::{Method, StatusCode};
use common::TestFarm;
use serde_json::json;
use support::Api;

/// A directory beside the store root that no store may reach.
fn outside(a: &Api) -> PathBuf {
    let dir = a.t.dir.path().join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn store_dir(a: &Api) -> PathBuf {
    a.t.farm.store_dir(1, None).await.unwrap()
}

/// A vDisk whose parent is outside the store is refused at import, naming the layer; one
/// whose parent inside the store was later swapped for a symlink to a file outside is
/// refused at merge and at a new version.
async fn chains_leaving_the_store_are_refused(t: TestFarm) {
    let a = Api::new(t);
    a.fixture().await;
    let (store, out) = (store_dir(&a).await, outside(&a));
    let secret = out.join("secret.vhdx");
    std::fs::copy(store.join("golden.vhdx"), &secret).unwrap();
    disk::version::new_version(&secret, &store.join("child.vhdx")).unwrap();
    let body = json!({"store_id": 1, "name": "child"});
    a.refused(
        Method::POST,
        "/api/v1/vdisks",
        Some(body),
        StatusCode::BAD_REQUEST,
        "secret.vhdx",
    )
    .await;

    // An import whose chain stays inside, then its parent swapped for a link out.
    let parent = store.join("parent.vhdx");
    std::fs::copy(store.join("golden.vhdx"), &parent).unwrap();
    disk::version::new_version(&parent, &store.join("inner.vhdx")).unwrap();
    let v = a
        .ok(
            Method::POST,
            "/api/v1/vdisks",
            Some(json!({"store_id": 1, "name": "inner"})),
        )
        .await;
    let id = v["id"].as_i64().unwrap();
    std::fs::remove_file(&parent).unwrap();
    std::os::unix::fs::symlink(&secret, &parent).unwrap();
    a.refused(
        Method::POST,
        &format!("/api/v1/vdisks/{id}/merge"),
        Some(json!({"mode": "base", "access": "production"})),
        StatusCode::CONFLICT,
        "parent.vhdx",
    )
    .await;
    a.refused(
        Method::POST,
        &format!("/api/v1/vdisks/{id}/versions"),
        None,
        StatusCode::CONFLICT,
        "outside the store",
    )
    .await;
    let names: Vec<String> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("inner.") && n != "inner.vhdx"),
        "a merge or version was written: {names:?}"
    );
}

/// `POST /stores` with a path through a symlink that leads out of the root is refused and
/// makes no directory outside.
async fn store_path_through_a_symlink_is_refused(t: TestFarm) {
    let a = Api::new(t);
    let out = outside(&a);
    let root = a.t.farm.store_root().to_path_buf();
    std::os::unix::fs::symlink(&out, root.join("evil-link")).unwrap();
    for path in ["evil-link/x", "evil-link/x/y", "evil-link"] {
        a.refused(
            Method::POST,
            "/api/v1/stores",
            Some(json!({"name": "evil", "path": path})),
            StatusCode::BAD_REQUEST,
            "escapes the store root",
        )
        .await;
    }
    assert!(!out.join("x").exists(), "a directory was made outside");
    // A per-server path through the link is refused too.
    let site = a
        .ok(Method::POST, "/api/v1/sites", Some(json!({"name": "hq"})))
        .await;
    let body = json!({"site_id": site["id"], "name": "s1", "address": "127.0.0.1:10809"});
    let server = a.ok(Method::POST, "/api/v1/servers", Some(body)).await;
    a.ok(
        Method::POST,
        "/api/v1/stores",
        Some(json!({"name": "main", "path": "main"})),
    )
    .await;
    a.refused(
        Method::PUT,
        &format!("/api/v1/stores/1/paths/{}", server["id"]),
        Some(json!({"path": "evil-link/y"})),
        StatusCode::BAD_REQUEST,
        "escapes the store root",
    )
    .await;
}

/// A store directory replaced by a symlink to a directory outside after its creation is
/// not followed: adding a vDisk and a new version are refused, and nothing is written
/// outside.
async fn store_dir_swapped_for_a_symlink_is_refused(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, _) = a.fixture().await;
    let store = store_dir(&a).await;
    let out = outside(&a);
    std::fs::copy(store.join("golden.vhdx"), out.join("golden.vhdx")).unwrap();
    std::fs::rename(&store, store.with_file_name("main.old")).unwrap();
    std::os::unix::fs::symlink(&out, &store).unwrap();
    let body = json!({"store_id": 1, "name": "more", "size_bytes": 1 << 20});
    a.refused(
        Method::POST,
        "/api/v1/vdisks",
        Some(body),
        StatusCode::CONFLICT,
        "leaves the store root",
    )
    .await;
    a.refused(
        Method::POST,
        &format!("/api/v1/vdisks/{vdisk}/versions"),
        None,
        StatusCode::CONFLICT,
        "leaves the store root",
    )
    .await;
    let err = a.t.farm.store_dir(1, None).await.unwrap_err();
    assert_eq!(err.kind(), farm::Kind::Conflict, "{err}");
    let names: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(names.len(), 1, "files were written outside: {names:?}");
}

/// A child whose parent is missing, and a merge whose output file already exists, answer
/// 4xx with a message naming the problem (they answered 500).
async fn bad_images_and_failed_merges_answer_4xx(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, _) = a.fixture().await;
    let store = store_dir(&a).await;
    let gone = store.join("gone.vhdx");
    std::fs::copy(store.join("golden.vhdx"), &gone).unwrap();
    disk::version::new_version(&gone, &store.join("orphan.vhdx")).unwrap();
    std::fs::remove_file(&gone).unwrap();
    a.refused(
        Method::POST,
        "/api/v1/vdisks",
        Some(json!({"store_id": 1, "name": "orphan"})),
        StatusCode::CONFLICT,
        "parent not found",
    )
    .await;
    std::fs::write(store.join("junk.vhdx"), b"not an image").unwrap();
    a.refused(
        Method::POST,
        "/api/v1/vdisks",
        Some(json!({"store_id": 1, "name": "junk"})),
        StatusCode::CONFLICT,
        "junk.vhdx",
    )
    .await;
    // The merge's output name is taken by a stray file.
    std::fs::write(store.join("golden.1.vhdx"), b"stray").unwrap();
    a.refused(
        Method::POST,
        &format!("/api/v1/vdisks/{vdisk}/merge"),
        Some(json!({"mode": "base", "access": "production"})),
        StatusCode::CONFLICT,
        "golden.1.vhdx",
    )
    .await;
    assert_eq!(
        std::fs::read(store.join("golden.1.vhdx")).unwrap(),
        b"stray"
    );
}

/// A new token's secret.
async fn token(a: &Api, name: &str, role: &str) -> String {
    let body = json!({"name": name, "role": role});
    let t = a.ok(Method::POST, "/api/v1/tokens", Some(body)).await;
    t["secret"].as_str().unwrap().to_string()
}

/// No answer a read-only token gets holds a session's export name; an operator's does.
async fn read_only_token_sees_no_export_name(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, coll) = a.fixture().await;
    let mac = "aa:bb:cc:00:03:01";
    let device = a.device(coll, vdisk, mac, "production").await;
    let (s, g) = a.login(mac).await;
    assert_eq!(s, StatusCode::OK, "{g}");
    let export = g["export_name"].as_str().unwrap().to_string();
    let ro = token(&a, "viewer", "read_only").await;
    let op = token(&a, "op", "operator").await;
    let uris = [
        "/api/v1/sessions".to_string(),
        "/api/v1/status".to_string(),
        "/api/v1/devices".to_string(),
        format!("/api/v1/devices/{device}"),
        "/api/v1/audit?limit=1000".to_string(),
        format!("/api/v1/vdisks/{vdisk}/versions"),
    ];
    for uri in &uris {
        let (s, v) = a.raw(Method::GET, uri, Some(&ro), None).await;
        assert_eq!(s, StatusCode::OK, "{uri}: {v}");
        assert!(
            !v.to_string().contains(&export),
            "{uri} shows the export name to a read_only token: {v}"
        );
    }
    let (_, v) = a
        .raw(Method::GET, "/api/v1/sessions", Some(&ro), None)
        .await;
    assert_eq!(v["total"], 1, "{v}");
    let (_, v) = a
        .raw(Method::GET, "/api/v1/sessions", Some(&op), None)
        .await;
    assert_eq!(v["items"][0]["export_name"], export.as_str(), "{v}");
}

/// The names of every file under `dir`, recursively.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(tree(&p));
        }
        out.insert(p);
    }
    out
}

/// A login of an unknown MAC while no collection adds devices leaves no device, no audit
/// entry and no file.
async fn unknown_device_login_leaves_nothing(t: TestFarm) {
    let a = Api::new(t);
    a.fixture().await;
    let before = (a.audit_total().await, tree(a.t.dir.path()));
    for i in 0..20 {
        let (s, v) = a.login(&format!("aa:bb:cc:00:04:{i:02x}")).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    }
    let devices = a.ok(Method::GET, "/api/v1/devices", None).await;
    assert_eq!(devices["total"], 0);
    assert_eq!((a.audit_total().await, tree(a.t.dir.path())), before);
}

/// Issue 30: a vDisk's `boot_kernel`/`boot_initrd` naming anything but a file under
/// `/boot` is refused with a reason (the boot port serves boot files to anyone on the boot
/// network: `/etc/shadow` or the farm's key must never become one).
async fn boot_file_overrides_outside_boot_are_refused(t: TestFarm) {
    let a = Api::new(t);
    let (vdisk, _) = a.fixture().await;
    let uri = format!("/api/v1/vdisks/{vdisk}");
    for (field, path) in [
        ("boot_kernel", "/etc/shadow"),
        ("boot_initrd", "/var/lib/ferry/secrets/farm.key"),
        ("boot_kernel", "/boot/../etc/shadow"),
        ("boot_initrd", "/vmlinuz"),
    ] {
        a.refused(
            Method::PATCH,
            &uri,
            Some(json!({ field: path })),
            StatusCode::BAD_REQUEST,
            "must name a file under /boot",
        )
        .await;
    }
    let v = a
        .ok(
            Method::PATCH,
            &uri,
            Some(json!({"boot_kernel": "/boot/vmlinuz-6.1.0-13-amd64"})),
        )
        .await;
    assert_eq!(v["boot_kernel"], "/boot/vmlinuz-6.1.0-13-amd64", "{v}");
}

dual_tests!(
    chains_leaving_the_store_are_refused,
    store_path_through_a_symlink_is_refused,
    store_dir_swapped_for_a_symlink_is_refused,
    bad_images_and_failed_merges_answer_4xx,
    read_only_token_sees_no_export_name,
    unknown_device_login_leaves_nothing,
    boot_file_overrides_outside_boot_are_refused,
);
