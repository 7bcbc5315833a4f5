//! `ferry vdisk boot-files`: the kernel, initramfs, command line and root of a real image
//! (a filesystem made by `mkfs.ext4 -d`, captured by `ferry vdisk capture`), as text and
//! JSON, and the message when no kernel is there. mkfs.ext4 follows the tool rule
//! (docs/testing.md): missing outside CI, the test prints why and returns; under `CI=true`
//! it fails.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const UUID: &str = "0b7c9d4e-3a51-4f0e-8c2d-6e1f2a3b4c5d";

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ferry")
}

fn have_mkfs() -> bool {
    let ok = Command::new("mkfs.ext4")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mkfs.ext4 is required under CI"
        );
        eprintln!("mkfs.ext4 not found: skipping");
    }
    ok
}

/// `dir` as a whole-disk ext4 captured into `t/NAME.vhdx`; returns the VHDX path.
fn image(t: &Path, name: &str, dir: &Path) -> String {
    let raw = t.join(format!("{name}.img"));
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-U", UUID, "-d"])
        .arg(dir)
        .arg(&raw)
        .arg("16M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vhdx = t.join(format!("{name}.vhdx"));
    let vhdx = vhdx.to_str().unwrap().to_string();
    let out = ferry(&["-q", "vdisk", "capture", raw.to_str().unwrap(), &vhdx]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    vhdx
}

#[test]
fn boot_files_lists_kernel_initrd_cmdline_and_root() {
    if !have_mkfs() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    for d in ["boot", "etc/kernel", "usr", "sbin"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("boot/vmlinuz-6.1.0-13-amd64"), vec![7u8; 123_456]).unwrap();
    std::fs::write(root.join("boot/initrd.img-6.1.0-13-amd64"), vec![9u8; 4321]).unwrap();
    std::fs::write(root.join("etc/kernel/cmdline"), "console=ttyS0 ro\n").unwrap();
    symlink("boot/vmlinuz-6.1.0-13-amd64", root.join("vmlinuz")).unwrap();
    let vhdx = image(t.path(), "debian", &root);

    let out = ferry(&["vdisk", "boot-files", &vhdx, "--json"]);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["table"], "none");
    assert_eq!(v["kernel"]["path"], "/boot/vmlinuz-6.1.0-13-amd64");
    assert_eq!(v["kernel"]["size"], 123_456);
    assert_eq!(v["kernel"]["version"], "6.1.0-13-amd64");
    assert_eq!(v["kernel"]["partition"], serde_json::Value::Null);
    assert_eq!(v["initrd"]["path"], "/boot/initrd.img-6.1.0-13-amd64");
    assert_eq!(v["initrd"]["size"], 4321);
    assert_eq!(v["cmdline"], "console=ttyS0 ro");
    assert_eq!(v["root"]["fs_uuid"], UUID);

    let text = ferry(&["vdisk", "boot-files", &vhdx]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("kernel:  /boot/vmlinuz-6.1.0-13-amd64 on the whole disk"),
        "{text}"
    );
    assert!(text.contains("cmdline: console=ttyS0 ro"), "{text}");
    assert!(text.contains(&format!("UUID={UUID}")), "{text}");
}

#[test]
fn boot_files_without_a_kernel_fails_naming_what_was_tried() {
    if !have_mkfs() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("usr")).unwrap();
    let vhdx = image(t.path(), "empty", &root);

    let out = ferry(&["vdisk", "boot-files", &vhdx, "--json"]);

    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "no kernel found: partitions tried: whole disk: ext, no vmlinuz-VERSION in /boot"
        ),
        "{err}"
    );
}
