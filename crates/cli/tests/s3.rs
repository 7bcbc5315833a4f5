//! End-to-end tests of vDisks in an S3-compatible bucket: a real S3 server (moto's server
//! mode, installed pinned by scripts/test.sh, found through `FERRY_MOTO`) on a free loopback
//! port per test, the real `ferry` binary (`vdisk push|fill|verify`, `server --store s3://…`)
//! and real NBD clients (nbdcopy).
//!
//! Bad input: an unreachable endpoint, a wrong credential (moto enforcing signatures once
//! `INITIAL_NO_AUTH_ACTION_COUNT` requests have passed), and an object overwritten behind
//! its manifest (the read fails with a hash mismatch; the client never gets those bytes).
//!
//! Tool rule (STYLE.md §6): a missing moto or nbdcopy skips a test with a printed reason on
//! a developer's machine and fails it under `CI=true`.

use bucket::Keys as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::moto::{BUCKET, Moto};
use common::{Proc, ferry, free_port, path_str, scrape, series, tool};
use interop::{MIB, create_vhdx, dynamic, pattern, require, run_ok, session, sha256_file};

/// The vDisk's virtual size.
const SIZE: u64 = 64 * MIB;
/// The prefix the vDisks go under.
const PREFIX: &str = "farm/a";

/// A local store with `golden.vhdx` and `golden.1.avhdx` and the raw conversions of both.
struct Fixture {
    dir: tempfile::TempDir,
    top_raw: PathBuf,
    base_raw: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let base = store.join("golden.vhdx");
        let top = store.join("golden.1.avhdx");
        create_vhdx(&base, &dynamic(SIZE, MIB as u32));
        session(&base, |d| {
            d.write_at(&pattern(3 * MIB as usize, 1), 0).unwrap();
            d.write_at(&pattern(8 * MIB as usize, 2), 20 * MIB).unwrap();
        });
        disk::version::new_version(&base, &top).unwrap();
        session(&top, |d| {
            d.write_at(&pattern(64 << 10, 3), MIB + 512).unwrap();
            d.write_at(&pattern(2 * MIB as usize, 4), 60 * MIB).unwrap();
        });
        let top_raw = dir.path().join("top.raw");
        let base_raw = dir.path().join("base.raw");
        for (src, dst) in [(&top, &top_raw), (&base, &base_raw)] {
            ok(ferry().args([
                "vdisk",
                "convert",
                path_str(src),
                path_str(dst),
                "--format",
                "raw",
            ]));
        }
        Fixture {
            dir,
            top_raw,
            base_raw,
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn url() -> String {
    format!("s3://{BUCKET}/{PREFIX}")
}

/// `ferry` with the S3 endpoint and (for moto, any) credentials.
fn ferry_s3(endpoint: &str) -> Command {
    let mut c = ferry();
    c.env("AWS_ACCESS_KEY_ID", "ferrytest")
        .env("AWS_SECRET_ACCESS_KEY", "ferrytest-secret")
        .env("FERRY_S3_ENDPOINT", endpoint)
        .env_remove("AWS_SESSION_TOKEN");
    c
}

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn push_all(f: &Fixture, endpoint: &str) {
    for name in ["golden.vhdx", "golden.1.avhdx"] {
        ok(ferry_s3(endpoint).args(["vdisk", "push", path_str(&f.store().join(name)), &url()]));
    }
}

/// `ferry server --store s3://…` on free ports, waiting until NBD accepts; the process, its
/// NBD port and its metrics port.
fn serve_bucket(f: &Fixture, endpoint: &str, tier: &Path) -> (Proc, u16, u16) {
    let (port, mport) = (free_port(), free_port());
    let mut proc = Proc::spawn(
        ferry_s3(endpoint)
            .args(["server", "--store", &url(), "--tier-dir", path_str(tier)])
            .arg(format!("--nbd-listen=127.0.0.1:{port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{mport}"))
            .arg("--cache-ram=64M"),
        f.scratch(&format!("server-{port}.log")),
    );
    proc.wait_until("NBD accepting", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
            && TcpStream::connect(("127.0.0.1", mport)).is_ok()
    });
    (proc, port, mport)
}

fn copy_sha(port: u16, export: &str, out: &Path) -> String {
    run_ok(
        tool("nbdcopy")
            .arg(format!("nbd://127.0.0.1:{port}/{export}"))
            .arg(out),
    );
    sha256_file(out)
}

/// Replaces object `name` behind its manifest, with a plain (not write-once) PUT.
fn overwrite(moto: &Moto, name: &str, bytes: Vec<u8>) {
    let url = bucket::BucketUrl::parse(&url()).unwrap();
    let config = bucket::S3Config {
        endpoint: Some(moto.endpoint()),
        ..Default::default()
    };
    // Credentials through a file: the test's own environment is left alone.
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds");
    std::fs::write(&creds, "AWS_ACCESS_KEY_ID=t\nAWS_SECRET_ACCESS_KEY=t\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = bucket::S3Config {
        credentials_file: Some(creds),
        ..config
    };
    use object_store::ObjectStore as _;
    let store = bucket::location::connect(&url, &config).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(store.put(&url.key(name), bytes.into()))
        .unwrap();
}

#[test]
fn bucket_chain_serves_the_local_bytes_and_restarts_from_the_tier() {
    if !require("nbdcopy") {
        return;
    }
    let f = Fixture::new();
    let Some(moto) = Moto::start(f.dir.path(), None) else {
        return;
    };
    push_all(&f, &moto.endpoint());
    // A published version is never rewritten.
    let again = ferry_s3(&moto.endpoint())
        .args([
            "vdisk",
            "push",
            path_str(&f.store().join("golden.vhdx")),
            &url(),
        ])
        .output()
        .unwrap();
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("already exists"), "{err}");

    let tier = f.scratch("tier");
    let (srv, port, mport) = serve_bucket(&f, &moto.endpoint(), &tier);
    let top = copy_sha(port, "golden", &f.scratch("golden.raw"));
    assert_eq!(top, sha256_file(&f.top_raw), "golden from the bucket");
    let base = copy_sha(port, "golden@0", &f.scratch("base.raw"));
    assert_eq!(base, sha256_file(&f.base_raw), "golden@0 from the bucket");
    // The tier's counters: every chunk came from the bucket, none from the tier yet.
    let m = scrape(mport);
    assert!(series(&m, "ferry_tier_gets_total") > 0, "{m}");
    assert!(
        series(&m, "ferry_tier_fetched_bytes_total") >= SIZE / 8,
        "{m}"
    );
    assert_eq!(series(&m, "ferry_tier_chunks_read_total"), 0, "{m}");
    assert_eq!(series(&m, "ferry_tier_hash_mismatches_total"), 0, "{m}");
    // The same bytes as the local store serves.
    let lport = free_port();
    let mut local = Proc::spawn(
        ferry()
            .args(["server", "--store", path_str(&f.store())])
            .arg(format!("--nbd-listen=127.0.0.1:{lport}"))
            .arg("--metrics-listen=")
            .arg("--cache-ram=64M"),
        f.scratch("local.log"),
    );
    local.wait_until("NBD accepting", || {
        TcpStream::connect(("127.0.0.1", lport)).is_ok()
    });
    assert_eq!(copy_sha(lport, "golden", &f.scratch("local.raw")), top);
    local.stop();
    srv.stop();

    // Placeholders are empty: nothing partial can be read from the tier directory directly.
    assert_eq!(
        std::fs::metadata(tier.join("golden.vhdx")).unwrap().len(),
        0
    );
    // With the bucket gone, a restarted server serves everything read before from its tier.
    drop(moto);
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (srv, port, mport) = serve_bucket(&f, &dead, &tier);
    assert_eq!(copy_sha(port, "golden", &f.scratch("again.raw")), top);
    let m = scrape(mport);
    assert_eq!(series(&m, "ferry_tier_gets_total"), 0, "{m}");
    assert!(series(&m, "ferry_tier_chunks_read_total") > 0, "{m}");
    let log = srv.log_text();
    assert!(log.contains("bucket unreachable"), "{log}");
    srv.stop();
}

#[test]
fn fill_then_verify_a_local_store() {
    let f = Fixture::new();
    let Some(moto) = Moto::start(f.dir.path(), None) else {
        return;
    };
    push_all(&f, &moto.endpoint());
    let filled = f.scratch("filled");
    let out =
        ok(ferry_s3(&moto.endpoint()).args(["vdisk", "fill", &url(), path_str(&filled), "--json"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["copied"].as_array().unwrap().len(), 2, "{r}");
    for name in ["golden.vhdx", "golden.1.avhdx"] {
        assert_eq!(
            sha256_file(&filled.join(name)),
            sha256_file(&f.store().join(name)),
            "{name}"
        );
    }
    let out = ok(ferry_s3(&moto.endpoint()).args([
        "vdisk",
        "verify",
        &url(),
        path_str(&filled),
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["objects"]["golden.vhdx"]["state"], "same", "{r}");
    // One changed byte in the second chunk: verify names that chunk and exits 2 (as
    // `ferry vdisk check` does when problems remain).
    let p = filled.join("golden.vhdx");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[MIB as usize + 7] ^= 0xff;
    std::fs::write(&p, bytes).unwrap();
    let out = ferry_s3(&moto.endpoint())
        .args(["vdisk", "verify", &url(), path_str(&filled), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["objects"]["golden.vhdx"]["state"], "differs", "{r}");
    assert_eq!(
        r["objects"]["golden.vhdx"]["chunks"],
        serde_json::json!([1]),
        "{r}"
    );
    assert_eq!(r["objects"]["golden.1.avhdx"]["state"], "same", "{r}");
    // A second fill puts the right bytes back and leaves the unchanged file alone.
    let out =
        ok(ferry_s3(&moto.endpoint()).args(["vdisk", "fill", &url(), path_str(&filled), "--json"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["copied"], serde_json::json!(["golden.vhdx"]), "{r}");
    assert_eq!(sha256_file(&p), sha256_file(&f.store().join("golden.vhdx")));
}

#[test]
fn unreachable_endpoint_is_a_clear_error() {
    let f = Fixture::new();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let out = ferry_s3(&dead)
        .args([
            "vdisk",
            "push",
            path_str(&f.store().join("golden.vhdx")),
            &url(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3://vdisks/farm/a/golden.vhdx"), "{err}");
    assert!(err.to_lowercase().contains("connect"), "{err}");
    // A server with an empty tier cannot serve an unreachable bucket: it says so and exits.
    let out = ferry_s3(&dead)
        .args(["server", "--store", &url(), "--tier-dir"])
        .arg(f.scratch("tier"))
        .args(["--nbd-listen=127.0.0.1:0", "--metrics-listen="])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("serve bucket store s3://vdisks/farm/a"),
        "{err}"
    );
    assert!(err.contains("list s3://vdisks/farm/a"), "{err}");
}

#[test]
fn wrong_credential_is_a_clear_error() {
    let f = Fixture::new();
    // One unsigned request (creating the bucket) passes; then moto checks every signature.
    let Some(moto) = Moto::start(f.dir.path(), Some(1)) else {
        return;
    };
    let creds = f.scratch("creds");
    std::fs::write(
        &creds,
        "AWS_ACCESS_KEY_ID=AKIAWRONGWRONGWRONG1\nAWS_SECRET_ACCESS_KEY=wrong\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = ferry()
        .args([
            "vdisk",
            "push",
            path_str(&f.store().join("golden.vhdx")),
            &url(),
        ])
        .args([
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-credentials",
            path_str(&creds),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3://vdisks/farm/a/golden.vhdx"), "{err}");
    assert!(
        err.contains("InvalidAccessKeyId") || err.contains("403"),
        "{err}"
    );
}

#[test]
fn object_changed_under_its_manifest_is_never_served() {
    if !require("nbdcopy") {
        return;
    }
    let f = Fixture::new();
    let Some(moto) = Moto::start(f.dir.path(), None) else {
        return;
    };
    push_all(&f, &moto.endpoint());
    // Overwrite the base behind its manifest: same size, its data chunks changed.
    let mut bytes = std::fs::read(f.store().join("golden.vhdx")).unwrap();
    let n = bytes.len();
    for b in &mut bytes[4 * MIB as usize..n] {
        *b ^= 0x5a;
    }
    overwrite(&moto, "golden.vhdx", bytes);

    let (srv, port, mport) = serve_bucket(&f, &moto.endpoint(), &f.scratch("tier"));
    let out_path = f.scratch("bad.raw");
    let out = tool("nbdcopy")
        .arg(format!("nbd://127.0.0.1:{port}/golden@0"))
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the changed object was served");
    let log = srv.log_text();
    assert!(
        log.contains("hash mismatch in s3://vdisks/farm/a/golden.vhdx chunk"),
        "{log}"
    );
    let m = scrape(mport);
    assert!(series(&m, "ferry_tier_hash_mismatches_total") > 0, "{m}");
    srv.stop();
}
