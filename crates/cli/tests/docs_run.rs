//! Docs that run (issue 31): the command blocks an administrator follows, marked
//! `<!-- docs-run: NAME -->` on their pages, run as written (`common::docs_run`), with a
//! scratch directory and free ports swapped in for the documented ones.
//!
//! * docs/farm.md, `farm-setup`: a farm from nothing in the one start order that works
//!   (init, the API alone, a site, a store and a vDisk, then a server), ending with the
//!   server registered and alive and version 0 in production; then docs/scale.md,
//!   `second-server`: a second server joins the running farm, and both are listed.
//!
//! * docs/s3.md, `s3`: two vDisk files pushed to a bucket (moto, the bucket made), a server
//!   serving the bucket, a local store filled from it and verified, with and without the
//!   bucket's bytes.
//!
//! jq, curl and moto follow the tool rule.

mod common;

use common::docs_run;
use common::moto::Moto;
use common::{ferry, free_port, path_str};
use interop::run_ok;

#[test]
fn docs_farm_setup_and_a_second_server_run_as_written() {
    if !interop::require_all(&["jq", "curl"]) {
        return;
    }
    let page = std::fs::read_to_string(docs_run::docs().join("farm.md")).unwrap();
    let scale = std::fs::read_to_string(docs_run::docs().join("scale.md")).unwrap();
    let script = format!(
        "{}{}",
        docs_run::block(&page, "farm-setup"),
        docs_run::block(&scale, "second-server")
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let api = format!("127.0.0.1:{}", free_port());
    let swap = [
        ("/srv/ferry", dir.join("farm").display().to_string()),
        ("127.0.0.1:8080", api.clone()),
        ("127.0.0.1:10809", format!("127.0.0.1:{}", free_port())),
        ("127.0.0.1:9810", format!("127.0.0.1:{}", free_port())),
        ("127.0.0.1:8081", format!("127.0.0.1:{}", free_port())),
        ("127.0.0.1:10810", format!("127.0.0.1:{}", free_port())),
        ("127.0.0.1:9811", format!("127.0.0.1:{}", free_port())),
    ];
    // The object commands' default API (http://127.0.0.1:8080) is the one the block's
    // servers listen on: the same swap.
    let env = [("FERRY_API", format!("http://{api}"))];
    let out = docs_run::run(&script, &swap, dir, &env);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "docs/farm.md farm-setup failed:\n{said}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("s1"), "the server is listed:\n{said}");
    assert!(
        stdout.contains("production"),
        "version 0 is in production:\n{said}"
    );
}

#[test]
fn docs_s3_commands_run_as_written() {
    if !interop::require("curl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let Some(moto) = Moto::start(dir, None) else {
        return;
    };
    let golden = dir.join("golden.vhdx");
    run_ok(ferry().args(["vdisk", "create", path_str(&golden), "--size", "8M"]));
    let v1 = dir.join("golden.1.avhdx");
    run_ok(ferry().args(["vdisk", "version", "new", path_str(&golden), path_str(&v1)]));
    let page = std::fs::read_to_string(docs_run::docs().join("s3.md")).unwrap();
    let store = dir.join("store");
    let swap = [
        (
            "AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=…",
            "AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test".to_string(),
        ),
        ("http://10.0.0.5:9000", moto.endpoint()),
        (
            "/var/cache/ferry/tier",
            dir.join("tier").display().to_string(),
        ),
        ("/srv/ferry/store", store.display().to_string()),
        ("0.0.0.0:10809", format!("127.0.0.1:{}", free_port())),
        ("127.0.0.1:9810", format!("127.0.0.1:{}", free_port())),
    ];
    let out = docs_run::run(&docs_run::block(&page, "s3"), &swap, dir, &[]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "docs/s3.md s3 failed:\n{said}");
    for f in ["golden.vhdx", "golden.1.avhdx"] {
        assert_eq!(
            std::fs::read(store.join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f} filled from the bucket differs"
        );
    }
}
