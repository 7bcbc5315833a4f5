//! `ferry quickstart --linux` (issue 31, part 8): on a fresh data directory, the quickstart
//! builds the Debian 12 image with the static boot agent (from the guest root the suite
//! cached, `scripts/guest-root.sh`), captures it as vDisk `debian`, and a QEMU machine (TCG)
//! with no root disk network-boots it from the farm through iPXE to multi-user; `--check`
//! stops there and fails otherwise. One boot, headless.
//!
//! Needs root, qemu-system-x86_64 with iPXE ROMs, the guest root (built beforehand by
//! scripts/test.sh, else by the quickstart itself) and the static boot agent
//! (`FERRY_BOOT_AGENT`, or target/x86_64-unknown-linux-musl/boot-agent/ferry-boot as
//! scripts/test.sh builds it). Under CI=true a missing one fails.

use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::boot::{boot_agent, runnable};
use interop::free_port;
use serde_json::Value;

/// `ferry quickstart --linux ARGS` on `data` with free loopback ports.
fn quickstart(data: &Path, args: &[&str]) -> Output {
    let port = |flag: &str| [flag.to_owned(), format!("127.0.0.1:{}", free_port())];
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["quickstart", "--linux", "--data-dir"])
        .arg(data)
        .args(port("--api-listen"))
        .args(port("--nbd-listen"))
        .args(port("--boot-listen"))
        .args(args)
        .output()
        .expect("run ferry quickstart --linux")
}

/// The one boot: a fresh data directory, so the image is built (from the cached root) and
/// the vDisk created; the machine reaches multi-user and the farm shows its session.
#[test]
fn quickstart_linux_check_boots_a_diskless_machine_to_multi_user() {
    if !runnable("quickstart_linux_check_boots_a_diskless_machine_to_multi_user") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let suite_tar = guest::root_tar(&guest::default_cache());
    let tar_was_there = suite_tar.is_file();
    let agent = boot_agent();
    let out = quickstart(
        &data,
        &["--check", "--json", "--agent", agent.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "quickstart --linux --check: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let linux = &v["linux"];
    println!("{stderr}");

    // The root the suite cached (the name scripts/guest-root.sh gives it), not a new one.
    let listed = Command::new("bash")
        .arg(guest::recipe())
        .arg("--path")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).trim().to_owned();
    assert_eq!(linux["guest_root"], listed.as_str(), "{linux}");
    assert_eq!(linux["guest_root_built"], !tar_was_there, "{linux}");
    // A fresh data directory: the image was built and is the vDisk's base (one file).
    assert_eq!(linux["image_built"], true, "{linux}");
    assert_eq!(linux["vdisk_action"], "created", "{linux}");
    let image = Path::new(linux["image"].as_str().unwrap());
    let base = Path::new(linux["vdisk_file"].as_str().unwrap());
    assert!(image.starts_with(data.join("cache")), "{}", image.display());
    {
        use std::os::unix::fs::MetadataExt as _;
        let (a, b) = (image.metadata().unwrap(), base.metadata().unwrap());
        assert_eq!(
            (a.dev(), a.ino()),
            (b.dev(), b.ino()),
            "the base links the cache"
        );
    }

    // Multi-user, on the machine's own console, through the boot agent's NBD root.
    let console = std::fs::read_to_string(linux["console_log"].as_str().unwrap()).unwrap();
    assert!(
        console.contains("FERRY-BOOT-OK version=quickstart-linux"),
        "{console}"
    );
    assert!(
        console.contains("ferry-boot: /dev/nbd0 is vDisk debian version 0 of device linux-1"),
        "{console}"
    );
    assert!(!console.contains("cannot boot"), "{console}");

    // The farm's status (through its API) shows the device's session on version 0 and the
    // counters it reported for that session.
    let device = &linux["farm_status"];
    assert_eq!(device["mac"], "52:54:00:fe:00:01", "{device}");
    assert_eq!(device["vdisk_name"], "debian", "{device}");
    assert_eq!(device["session"]["version"], 0, "{device}");
    assert_eq!(
        device["counters"]["session_id"], device["session"]["id"],
        "{device}"
    );
    assert!(
        device["counters"]["bytes_read"].as_u64().unwrap_or(0) > 0,
        "{device}"
    );
    assert!(
        v["console"]
            .as_str()
            .is_some_and(|c| c.starts_with("https://127.0.0.1:") && c.ends_with("/#/devices")),
        "{v}"
    );
    // Each step was said on stderr, the machine's milestones included.
    for step in [
        "Ferry: device linux-1 (52:54:00:fe:00:01) boots vDisk debian version 0",
        "systemd reached multi-user",
        "check passed",
    ] {
        assert!(stderr.contains(step), "no {step:?} on stderr: {stderr}");
    }
}

/// A dynamically linked agent (`/bin/sh` here) cannot run in an initramfs: the quickstart
/// stops with one error naming it, before it makes a farm.
#[test]
fn quickstart_linux_refuses_a_dynamic_agent_with_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = quickstart(&data, &["--check", "--agent", "/bin/sh"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ferry quickstart --linux cannot boot a machine here; missing: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("--agent /bin/sh is dynamically linked"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one error: {stderr}");
    assert!(!data.join("farm.db").exists(), "no farm was made");
}
