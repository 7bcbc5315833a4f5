//! A farm whose store is a bucket (issue 20): moto's S3 server on loopback, two
//! `ferry server --farm` processes and a `ferry target` device.
//!
//! * The lifecycle publishes: adding the vDisk uploads version 0; a new version stays in the
//!   working directory while in maintenance and is uploaded when promoted; a merged base is
//!   uploaded as it is made. `ferry vdisk verify` proves the bucket holds the working
//!   directory's bytes.
//! * A published version is never rewritten: reverting one to maintenance is refused, a
//!   deleted version's object stays in the bucket, and the next new version takes a number
//!   the bucket does not hold.
//! * A second server, whose store directory is its own tier (`ferry store set-path`), serves
//!   the device the promoted version from the bucket: placeholders and the tier's chunk map
//!   in its directory, the bytes verified by qemu-io through the device.
//! * Bad input: a bucket URL that is not one is refused when the store is added; a bucket
//!   that does not exist makes adding a vDisk fail with the object named, and the vDisk is
//!   not added.
//!
//! Tool rule (STYLE.md §6): a missing moto or qemu-io skips with a printed reason on a
//! developer's machine and fails under `CI=true`.

use std::path::Path;
use std::process::{Command, Stdio};

mod common;

use common::farm::Farm;
use common::moto::{BUCKET, Moto};
use common::{ferry, path_str};
use interop::{MIB, require, session};
use serde_json::Value;

const MAC: &str = "aa:bb:cc:00:20:51";
/// The bucket's prefix for this farm's store.
const PREFIX: &str = "site-a";

/// The S3 environment of a process reaching moto (which takes any credential here).
fn s3_env(c: &mut Command, moto: &Moto) {
    c.env("AWS_ACCESS_KEY_ID", "ferrytest")
        .env("AWS_SECRET_ACCESS_KEY", "ferrytest-secret")
        .env("FERRY_S3_ENDPOINT", moto.endpoint())
        .env_remove("AWS_SESSION_TOKEN");
}

/// True when the bucket lists object `name` under the store's prefix (an unsigned
/// ListObjectsV2; moto answers an unsigned HEAD with 403).
fn listed(moto: &Moto, name: &str) -> bool {
    let (status, body) = moto.http(
        "GET",
        &format!("/{BUCKET}?list-type=2&prefix={PREFIX}/"),
        b"",
    );
    assert_eq!(status, 200, "{body}");
    body.contains(&format!("<Key>{PREFIX}/{name}</Key>"))
}

/// `ferry ARGS --api API --token ..`, which must fail; its stderr.
fn refused(f: &Farm, api: &str, args: &[&str]) -> String {
    let out = ferry()
        .args(args)
        .args(["--api", api, "--token", &f.token])
        .output()
        .unwrap();
    assert!(!out.status.success(), "ferry {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn qemu_io_reads(socket: &Path, cmds: &[&str]) {
    let mut c = Command::new("qemu-io");
    c.stdin(Stdio::null()).args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c
        .arg(format!("nbd+unix:///?socket={}", path_str(socket)))
        .output()
        .unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !t.contains("failed"),
        "qemu-io: {t}"
    );
}

#[test]
fn a_bucket_store_publishes_its_versions_and_a_server_serves_them_from_the_bucket() {
    if !require("qemu-io") {
        return;
    }
    let f = Farm::init();
    let Some(moto) = Moto::start(f.dir.path(), None) else {
        return;
    };
    let url = format!("s3://{BUCKET}/{PREFIX}");
    // s1 hosts the API the lifecycle runs in (the store does not exist yet: it serves the
    // working directory as a directory store).
    let (s1, api1, _) = f.server_with("s1", |c| {
        s3_env(c, &moto);
        c.args(["--store", path_str(&f.store())]);
    });

    // A bucket URL that is not one is refused, naming what is wrong.
    let e = refused(
        &f,
        &api1,
        &[
            "store",
            "add",
            "bad",
            "--path",
            "bad",
            "--bucket",
            "s3://No_Such",
        ],
    );
    assert!(e.contains("bucket name"), "{e}");

    // Adding the vDisk publishes version 0.
    f.objects_in(
        &api1,
        &["--path", "main", "--bucket", &url],
        &[(MAC, "pc1")],
    );
    let stores = f.json(&api1, &["store", "list"]);
    assert_eq!(stores["items"][0]["bucket"], url.as_str(), "{stores}");
    assert!(listed(&moto, "golden.vhdx"), "golden.vhdx");
    assert!(
        listed(&moto, "golden.vhdx.manifest"),
        "golden.vhdx.manifest"
    );

    // A new version is made in the working directory and stays out of the bucket while in
    // maintenance; the administrator changes it there; promote publishes it.
    f.json(&api1, &["version", "new", "--vdisk", "golden"]);
    let v1 = f.store().join("golden.1.avhdx");
    assert!(v1.is_file());
    assert!(!listed(&moto, "golden.1.avhdx"), "golden.1.avhdx");
    session(&v1, |d| d.write_at(&vec![0x33; MIB as usize], 0).unwrap());
    f.json(&api1, &["version", "promote", "1", "--vdisk", "golden"]);
    assert!(listed(&moto, "golden.1.avhdx"), "golden.1.avhdx");
    f.json(&api1, &["version", "promote", "1", "--vdisk", "golden"]);

    // Published means never rewritten: no way back to maintenance.
    f.json(&api1, &["version", "revert", "1", "--vdisk", "golden"]);
    let e = refused(&f, &api1, &["version", "revert", "1", "--vdisk", "golden"]);
    assert!(e.contains("never rewritten"), "{e}");
    f.json(&api1, &["version", "promote", "1", "--vdisk", "golden"]);

    // A merged base is published as it is made; deleting it leaves the object, and the
    // next version does not reuse its number.
    let m = f.json(
        &api1,
        &[
            "version", "merge", "--vdisk", "golden", "--mode", "base", "--access", "test",
        ],
    );
    assert_eq!(m["number"], 2, "{m}");
    assert!(listed(&moto, "golden.2.vhdx"), "golden.2.vhdx");
    f.json(&api1, &["version", "delete", "2", "--vdisk", "golden"]);
    assert!(!f.store().join("golden.2.vhdx").exists());
    assert!(listed(&moto, "golden.2.vhdx"), "golden.2.vhdx");
    let n = f.json(&api1, &["version", "new", "--vdisk", "golden"]);
    assert_eq!(n["number"], 3, "{n}");
    assert_eq!(n["file_name"], "golden.3.avhdx", "{n}");
    f.json(&api1, &["version", "delete", "3", "--vdisk", "golden"]);

    // The bucket holds the working directory's bytes, chunk for chunk.
    let mut verify = ferry();
    s3_env(&mut verify, &moto);
    let out = verify
        .args(["vdisk", "verify", &url, path_str(&f.store()), "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    for name in ["golden.vhdx", "golden.1.avhdx", "golden.2.vhdx"] {
        let state = &report["objects"][name]["state"];
        let want = if name == "golden.2.vhdx" {
            "missing"
        } else {
            "same"
        };
        assert_eq!(state, want, "{name}: {report}");
    }

    // A second server with its own tier directory serves the device from the bucket.
    let (s2, api2, _) = f.server_with("s2", |c| s3_env(c, &moto));
    let servers = f.json(&api2, &["farm", "server", "list"]);
    let id2 = servers["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "s2")
        .and_then(|s| s["id"].as_i64())
        .unwrap();
    s2.stop();
    f.json(
        &api1,
        &[
            "store",
            "set-path",
            "1",
            "--server",
            &id2.to_string(),
            "--path",
            "tier-s2",
        ],
    );
    s1.stop();
    let (s2, api2, _) = f.server_with("s2", |c| s3_env(c, &moto));
    let (target, socket) = f.target(&api2, MAC, "pc1");
    qemu_io_reads(&socket, &["read -P 0x33 0 1M", "read -P 0x22 32M 1M"]);
    let tier = f.data().join("stores").join("tier-s2");
    for name in ["golden.vhdx", "golden.1.avhdx"] {
        let placeholder = std::fs::metadata(tier.join(name)).unwrap();
        assert_eq!(placeholder.len(), 0, "{name} is a placeholder in the tier");
        assert!(
            tier.join(".tier").join(format!("{name}.map")).is_file(),
            "{name}"
        );
    }
    target.stop();

    // A bucket that does not exist: adding a vDisk fails naming the object; no vDisk added.
    f.json(
        &api2,
        &[
            "store",
            "add",
            "gone",
            "--path",
            "gone",
            "--bucket",
            "s3://no-such-bucket/x",
        ],
    );
    std::fs::copy(
        f.store().join("golden.vhdx"),
        f.data().join("stores").join("gone").join("other.vhdx"),
    )
    .unwrap();
    let e = refused(
        &f,
        &api2,
        &["farm", "vdisk", "add", "other", "--store", "2"],
    );
    assert!(e.contains("s3://no-such-bucket/x/other.vhdx"), "{e}");
    let vdisks = f.json(&api2, &["farm", "vdisk", "list"]);
    assert_eq!(
        vdisks["items"].as_array().map(Vec::len),
        Some(1),
        "{vdisks}"
    );
    s2.stop();
}
