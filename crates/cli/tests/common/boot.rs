//! What the QEMU boot tests (`netboot`, `quickstart_linux`) share: the static boot agent
//! they put into images, the tool rule with it, and the stripped `ferry` binary an image
//! carries.

use std::path::{Path, PathBuf};

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The static boot agent: `FERRY_BOOT_AGENT`, or the boot-agent profile's output as
/// scripts/test.sh builds it.
pub fn boot_agent() -> PathBuf {
    match std::env::var_os("FERRY_BOOT_AGENT") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/x86_64-unknown-linux-musl/boot-agent/ferry-boot"),
    }
}

/// The tool rule (docs/testing.md): `true` when this machine can run the test; else it
/// says why and returns `false`, or fails under CI. The harness checks root and its tools
/// (`guest::can_run_or_skip`); this adds the boot agent.
pub fn runnable(test: &str) -> bool {
    if !guest::can_run_or_skip(test) {
        return false;
    }
    if boot_agent().is_file() {
        return true;
    }
    let why = format!(
        "no boot agent at {} (cargo build --profile boot-agent --target \
         x86_64-unknown-linux-musl -p boot-agent, or FERRY_BOOT_AGENT)",
        boot_agent().display()
    );
    assert!(!ci(), "CI=true and {why}");
    eprintln!("{test}: skipped: {why}");
    false
}

/// `ferry vdisk capture RAW VHDX`, which must succeed.
pub fn capture(raw: &Path, vhdx: &Path) {
    let out = super::ferry()
        .args([
            "vdisk",
            "capture",
            super::path_str(raw),
            super::path_str(vhdx),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "capture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `ferry` binary under test without its debug information (the image carries it for
/// `ferry target install-initramfs` and `ferry target status`).
pub fn stripped_ferry(dir: &Path) -> PathBuf {
    let out = dir.join("ferry");
    let status = std::process::Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .status()
        .expect("run strip");
    assert!(status.success(), "strip ferry");
    out
}

/// The golden image of a farm whose CA is `ca`: the guest root with `ferry`, the boot agent
/// and the CA (no secret) installed by `ferry target install-initramfs` as docs/netboot.md's
/// `image` block says (issue 31: docs that run), `test_script` run at boot, version `v1`.
pub fn golden_image(dir: &Path, ca: &Path, test_script: &str) -> guest::GuestImage {
    let page = std::fs::read_to_string(super::docs_run::docs().join("netboot.md")).unwrap();
    let documented = super::docs_run::block(&page, "image").replace("\\\n", " ");
    let install = format!(
        "{} && rm /root/ferry-boot && ! test -e /etc/ferry/farm.key",
        documented.trim()
    );
    guest::ImageBuilder::new(guest::guest_root())
        .copy(stripped_ferry(dir), "/usr/local/bin/ferry", 0o755)
        .copy(boot_agent(), "/root/ferry-boot", 0o755)
        .copy(ca, "/root/ca-cert.pem", 0o644)
        .version("v1")
        .test_script(test_script)
        .quick_init()
        .run_in_root(&install)
        .build(&dir.join("image"))
        .expect("build the golden image")
}
