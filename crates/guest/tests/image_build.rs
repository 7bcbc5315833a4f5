//! `ImageBuilder` on the real test OS, without booting: a command run in the chroot
//! (`update-initramfs` after adding an initramfs hook, as the agent's hook will be) shows in
//! the initramfs, and the disk holds a GPT whose one partition is the ext4 root with the added
//! files, owners and modes.

use std::process::Command;

use guest::{ImageBuilder, PARTITION_START, guest_root};

/// An initramfs-tools hook that leaves a marker file in the initramfs.
const HOOK: &str = "#!/bin/sh\n\
case \"$1\" in prereqs) exit 0 ;; esac\n\
echo ferry-hook-ran >\"$DESTDIR/ferry-hook-marker\"\n";

#[test]
fn hook_and_files_reach_the_initramfs_and_the_partition() {
    if !guest::can_run_or_skip("image_build") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host_file = dir.path().join("agent");
    std::fs::write(&host_file, b"not really an agent").unwrap();
    let out = dir.path().join("out");
    let image = ImageBuilder::new(guest_root())
        .version("v-image")
        .file("/etc/initramfs-tools/hooks/ferry-test-hook", HOOK, 0o755)
        .copy(&host_file, "/usr/local/sbin/ferry", 0o755)
        .run_in_root("update-initramfs -u -k all")
        .run_in_root("lsinitramfs /boot/initrd.img-* >/root/initrd.list")
        .build(&out)
        .unwrap();
    assert!(!out.join("root").exists(), "the extracted root is removed");

    let table = run("sfdisk", &["--dump", image.disk.to_str().unwrap()]);
    assert!(table.contains("label: gpt"), "{table}");
    let start = table
        .split("start=")
        .nth(1)
        .and_then(|t| t.split(',').next());
    assert_eq!(start.map(str::trim), Some("2048"), "{table}");
    assert_eq!(PARTITION_START, 2048 * 512);
    assert_eq!(image.fs_offset, PARTITION_START);

    let fs = format!("{}?offset={}", image.disk.display(), image.fs_offset);
    let listing = run("debugfs", &["-R", "cat /root/initrd.list", &fs]);
    assert!(
        listing.lines().any(|l| l == "ferry-hook-marker"),
        "the hook ran in the chroot"
    );
    assert_eq!(
        run("debugfs", &["-R", "cat /etc/ferry-version", &fs]),
        "v-image"
    );
    assert_eq!(
        run("debugfs", &["-R", "cat /usr/local/sbin/ferry", &fs]),
        "not really an agent"
    );
    let stat = run("debugfs", &["-R", "stat /usr/local/sbin/ferry", &fs]);
    assert!(
        stat.contains("Mode:  0755") && stat.contains("User:     0"),
        "{stat}"
    );
    // The initramfs copied out is the one the command made.
    let copied = std::fs::read(&image.initrd).unwrap();
    let in_image = debugfs_bytes(&fs, "/boot/initrd.img-*", &listing);
    assert_eq!(
        copied.len(),
        in_image,
        "the copied initramfs is the rebuilt one"
    );
}

/// The size of the one file in /boot matching `initrd.img-*` in the file system `fs`.
fn debugfs_bytes(fs: &str, _pattern: &str, _listing: &str) -> usize {
    let names = run("debugfs", &["-R", "ls -l /boot", fs]);
    let line = names
        .lines()
        .find(|l| l.contains("initrd.img-"))
        .expect("an initrd in /boot");
    line.split_whitespace()
        .nth(5)
        .and_then(|n| n.parse().ok())
        .expect("a size")
}

/// The stdout of a tool that must succeed.
fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
