//! Boot sets through a farm, device side (issue 21): a `ferry server --farm` records a
//! device's boot of a version into the farm, and the device's next login prefetches that
//! set (`POST /api/v1/device/boot-set`, `agent::boot_set_fetch`) ahead of its reads.
//!
//! * the first `ferry target` boot reads 2 MiB through its export (qemu-io); when it ends,
//!   the farm shows the version's set (`ferry version boot-set golden@0 --json`: one boot);
//! * the next `ferry target` of the device (with `--host-cache`), started after that, fetches
//!   the set from the farm
//!   and reads it from the server ahead of the machine (`ferry target status --json`: the
//!   prefetch is done and fetched the set's bytes); the machine then reads the version's own
//!   bytes (qemu-io verifies the patterns), its reads answered by the prefetched cache;
//! * `--no-prefetch` turns it off: no prefetch in the status.
//!
//! The set follows its version to every server and through a promotion: a set recorded by
//! one server while the version is in test is prefetched, after it is promoted to
//! production, by another server that never saw a boot of it, from the farm's copy (the
//! file beside the version is removed first), for a production device. That server reads
//! the set into its cache when it starts, before any device asks (the version is then in
//! production), and starts a prefetch of a version promoted while it runs.
//!
//! The second server asks for promoted versions every second (the hidden
//! `--member-promotion-check-every`; a farm's is 10 s): the test waits for the prefetch, not
//! for the production timer.
//!
//! Tool rule (STYLE.md §6): a missing qemu-io skips with a printed reason on a developer's
//! machine and fails under `CI=true`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::farm::{Farm, status};
use common::{WAIT, free_port, scrape, series};
use interop::{MIB, require};
use serde_json::Value;

const MAC: &str = "aa:bb:cc:00:21:01";

/// qemu-io reads of the golden pattern (0x21 at 0, 0x22 at 32 MiB), which must verify.
fn boot_reads(socket: &Path) {
    let out = Command::new("qemu-io")
        .stdin(Stdio::null())
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0x21 0 1M",
            "-c",
            "read -P 0x22 32M 1M",
        ])
        .arg(format!("nbd+unix:///?socket={}", socket.display()))
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

/// Polls `f` every 100 ms until it returns `Some`; a hang guard, not a measure.
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < WAIT * 2, "never {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The farm's boot set of `target` (NAME@V, `ferry version boot-set --json`) once it holds
/// one boot.
fn one_boot_set(f: &Farm, api: &str, target: &str) -> Value {
    wait_for(&format!("{target}'s boot set in the farm"), || {
        let out = common::ferry()
            .args(["version", "boot-set", target, "--json"])
            .args(["--api", api, "--token", &f.token])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        (out.status.success() && v["boots"] == 1).then_some(v)
    })
}

#[test]
fn a_device_prefetches_the_boot_set_its_farm_recorded() {
    if !require("qemu-io") {
        return;
    }
    let f = Farm::init();
    let (srv, api, _) = f.server("s1");
    f.objects(&api, &[(MAC, "pc1")]);

    // First boot: recorded when its connection ends.
    let (first, socket) = f.target(&api, MAC, "pc1");
    boot_reads(&socket);
    first.stop();
    let set = one_boot_set(&f, &api, "golden@0");
    let set_bytes = set["bytes"].as_u64().unwrap();
    assert!(set_bytes >= 2 * MIB, "{set}");

    // Next boot: the device fetches the set and reads it ahead.
    let hc_dir = f.dir.path().join("hc");
    std::fs::create_dir_all(&hc_dir).unwrap();
    let hc_arg = format!("--host-cache={}", hc_dir.display());
    let (second, socket) = f.target_with(&api, MAC, "pc1", &[&hc_arg]);
    let pf = wait_for("the prefetch done", || {
        let p = status(&socket)["prefetch"].clone();
        (p["state"] == "done").then_some(p)
    });
    assert!(pf["set_bytes"].as_u64().unwrap() >= set_bytes, "{pf}");
    assert!(pf["fetched_bytes"].as_u64().unwrap() >= set_bytes, "{pf}");
    boot_reads(&socket);
    let hc = status(&socket)["host_cache"].clone();
    assert!(hc["hit_bytes"].as_u64().unwrap() >= 2 * MIB, "{hc}");
    second.stop();

    // --no-prefetch: none.
    let (third, socket) = f.target_with(&api, MAC, "pc1", &[&hc_arg, "--no-prefetch"]);
    boot_reads(&socket);
    assert_eq!(status(&socket)["prefetch"], Value::Null);
    third.stop();
    srv.stop();
}

#[test]
fn a_set_follows_its_version_to_another_server_and_through_a_promotion() {
    if !require("qemu-io") {
        return;
    }
    const TESTER: &str = "aa:bb:cc:00:21:02";
    let f = Farm::init();
    let (s1, api1, _) = f.server("s1");
    f.objects(&api1, &[(MAC, "pc1")]);
    f.json(
        &api1,
        &[
            "device",
            "add",
            TESTER,
            "--name",
            "qa1",
            "--collection",
            "1",
            "--vdisk",
            "golden",
            "--type",
            "test",
        ],
    );
    // Version 1 in test: the test device boots it on s1, which records the set.
    f.json(&api1, &["version", "new", "--vdisk", "golden"]);
    f.json(&api1, &["version", "promote", "1", "--vdisk", "golden"]);
    let (qa, socket) = f.target(&api1, TESTER, "qa1");
    boot_reads(&socket);
    qa.stop();
    let set_bytes = one_boot_set(&f, &api1, "golden@1")["bytes"]
        .as_u64()
        .unwrap();
    f.json(&api1, &["version", "promote", "1", "--vdisk", "golden"]);

    // s1 goes away, and so does the copy it kept beside the version in the shared store:
    // s2, which never saw a boot of version 1, has only the farm's copy.
    s1.stop();
    let beside = f.store().join("golden.1.avhdx.bootset");
    assert!(beside.is_file(), "s1 kept the set beside the version");
    std::fs::remove_file(&beside).unwrap();
    let metrics = free_port();
    let (s2, api2, _) = f.server_with("s2", |c| {
        c.args(["--store", common::path_str(&f.store())])
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
            .arg("--member-promotion-check-every=1s");
    });
    // Version 1 is in production when s2 starts: s2 reads the farm's set into its cache
    // before any device asks.
    let prefetched = wait_for("s2 prefetching the farm's set at start", || {
        let n = series(&scrape(metrics), "ferry_bootset_prefetch_bytes_total");
        (n >= set_bytes).then_some(n)
    });
    assert!(prefetched >= set_bytes);
    let hc_dir = f.dir.path().join("hc");
    std::fs::create_dir_all(&hc_dir).unwrap();
    let hc_arg = format!("--host-cache={}", hc_dir.display());
    let (pc, socket) = f.target_with(&api2, MAC, "pc1", &[&hc_arg]);
    boot_reads(&socket);
    let pf = status(&socket)["prefetch"].clone();
    assert!(pf["set_bytes"].as_u64().unwrap() >= set_bytes, "{pf}");
    pc.stop();

    // Version 2, booted in test on s2 (which records its set), then promoted while s2
    // runs: s2 starts a prefetch run of it with no device asking.
    f.json(&api2, &["version", "new", "--vdisk", "golden"]);
    f.json(&api2, &["version", "promote", "2", "--vdisk", "golden"]);
    let (qa, socket) = f.target(&api2, TESTER, "qa1");
    boot_reads(&socket);
    qa.stop();
    one_boot_set(&f, &api2, "golden@2");
    let runs = series(&scrape(metrics), "ferry_bootset_prefetch_runs_total");
    f.json(&api2, &["version", "promote", "2", "--vdisk", "golden"]);
    wait_for("s2 prefetching the promoted version", || {
        (series(&scrape(metrics), "ferry_bootset_prefetch_runs_total") > runs).then_some(())
    });
    s2.stop();
}
