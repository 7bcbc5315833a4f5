//! Boot files found in real disk images: filesystems made by `mkfs.ext4`/`mkfs.ext2 -d`,
//! tables by `sfdisk`, captured into VHDX by Ferry's own `capture`, read through the chain.
//! The tools follow the tool rule (docs/testing.md): missing outside CI, a test prints why
//! and returns; under `CI=true` it fails.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use bootfiles::{BOOT_FILE_BYTES_MAX, BootFiles, BootFilesError, TableKind, find, read};
use disk::BlockDevice;
use disk::open::{self, OpenOptions};
use disk::ops::NoProgress;
use disk::ops::capture::{CaptureOptions, capture};

const MIB: u64 = 1 << 20;
const ROOT_UUID: &str = "2f4c1e8a-6b1d-4c77-9a1e-0d3b5f6a7c01";

/// True when every tool runs; outside CI a missing one is printed and the test returns.
fn have_tools() -> bool {
    for (tool, arg) in [
        ("mkfs.ext4", "-V"),
        ("mkfs.ext2", "-V"),
        ("sfdisk", "--version"),
    ] {
        let ok = Command::new(tool)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{tool} is required under CI"
            );
            eprintln!("{tool} not found: skipping");
            return false;
        }
    }
    true
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bytes that differ per name, longer than a few blocks.
fn fake(name: &str, len: usize) -> Vec<u8> {
    let mut x: u32 = name
        .bytes()
        .fold(2166136261, |h, b| (h ^ u32::from(b)).wrapping_mul(16777619));
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Writes files (`path`, bytes) and symlinks (`path`, `-> target`) under `root`.
fn tree(root: &Path, files: &[(&str, Vec<u8>)], links: &[(&str, &str)], dirs: &[&str]) {
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (p, bytes) in files {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    for (p, target) in links {
        symlink(target, root.join(p)).unwrap();
    }
}

/// `mkfs.<kind> -d dir` into a new file of `size` bytes.
fn mkfs(kind: &str, dir: &Path, out: &Path, size: u64, uuid: &str) {
    run(Command::new(format!("mkfs.{kind}"))
        .args(["-q", "-F", "-U", uuid, "-d"])
        .arg(dir)
        .arg(out)
        .arg(format!("{}k", size / 1024)));
}

/// A raw disk of `size` bytes with an sfdisk `script` and filesystem images at byte offsets.
fn disk_with(out: &Path, size: u64, script: &str, fs: &[(u64, &Path)]) {
    let f = std::fs::File::create(out).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let mut child = Command::new("sfdisk")
        .args(["--no-reread", "--no-tell-kernel", "-q"])
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "sfdisk failed for {script}"
    );
    let disk = std::fs::OpenOptions::new().write(true).open(out).unwrap();
    for (offset, img) in fs {
        use std::os::unix::fs::FileExt;
        disk.write_all_at(&std::fs::read(img).unwrap(), *offset)
            .unwrap();
    }
}

/// Captures `raw` into `vhdx` through Ferry and opens the chain.
fn to_vhdx(raw: &Path, vhdx: &Path) -> Arc<dyn BlockDevice> {
    capture(raw, vhdx, &CaptureOptions::default(), &NoProgress).unwrap();
    open::open(vhdx, OpenOptions::default()).unwrap().top()
}

/// `find`, then `read` of the kernel and initrd must give exactly `kernel` and `initrd`.
fn check_bytes(dev: &Arc<dyn BlockDevice>, found: &BootFiles, kernel: &[u8], initrd: &[u8]) {
    assert_eq!(
        read(dev, &found.kernel, BOOT_FILE_BYTES_MAX).unwrap(),
        kernel
    );
    let i = found.initrd.as_ref().expect("an initrd");
    assert_eq!(read(dev, i, BOOT_FILE_BYTES_MAX).unwrap(), initrd);
    let e = read(dev, &found.kernel, 1000).unwrap_err();
    assert!(matches!(e, BootFilesError::FileTooLarge { .. }), "{e}");
}

/// A Debian-like root: a linked kernel, a newer unlinked one, /etc/kernel/cmdline.
fn debian_root(dir: &Path, version: &str) -> (Vec<u8>, Vec<u8>) {
    let kernel = fake(&format!("vmlinuz-{version}"), 300_000);
    let initrd = fake(&format!("initrd-{version}"), 700_000);
    tree(
        dir,
        &[
            (&format!("boot/vmlinuz-{version}"), kernel.clone()),
            (&format!("boot/initrd.img-{version}"), initrd.clone()),
            ("boot/vmlinuz-6.2.0-99-amd64", fake("unlinked", 1000)),
            (
                "etc/kernel/cmdline",
                b"# made by a test\nro quiet\n".to_vec(),
            ),
        ],
        &[
            ("vmlinuz", &format!("boot/vmlinuz-{version}")),
            ("initrd.img", &format!("boot/initrd.img-{version}")),
        ],
        &["usr/bin", "sbin"],
    );
    (kernel, initrd)
}

#[test]
fn whole_disk_ext4_follows_debian_links() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (kernel, initrd) = debian_root(&t.path().join("root"), "6.1.0-1-amd64");
    let raw = t.path().join("disk.img");
    mkfs("ext4", &t.path().join("root"), &raw, 32 * MIB, ROOT_UUID);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let found = find(&dev).unwrap();

    assert_eq!(found.table, TableKind::None);
    assert_eq!(found.kernel.partition, None);
    assert_eq!(found.kernel.path, "/boot/vmlinuz-6.1.0-1-amd64");
    assert_eq!(found.kernel.size, kernel.len() as u64);
    assert_eq!(found.kernel.version.as_deref(), Some("6.1.0-1-amd64"));
    assert_eq!(
        found.initrd.as_ref().unwrap().path,
        "/boot/initrd.img-6.1.0-1-amd64"
    );
    assert_eq!(found.cmdline.as_deref(), Some("ro quiet"));
    let root = found.root.as_ref().unwrap();
    assert_eq!((root.partition, root.partuuid.as_deref()), (None, None));
    assert_eq!(root.fs_uuid, ROOT_UUID);
    check_bytes(&dev, &found, &kernel, &initrd);
}

/// Issue 30: links in the image that lead out of `/boot` (to the image's own secrets) are
/// never found nor read, and a path outside `/boot` is refused by `read`; the real kernel
/// in `/boot` is found instead.
#[test]
fn links_out_of_boot_are_neither_found_nor_read() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("root");
    let kernel = fake("kernel", 300_000);
    let initrd = fake("initrd", 100_000);
    tree(
        &dir,
        &[
            ("boot/vmlinuz-6.1.0-1-amd64", kernel.clone()),
            ("boot/initrd.img-6.1.0-1-amd64", initrd.clone()),
            (
                "etc/shadow",
                b"root:$6$secret:19000:0:99999:7:::\n".to_vec(),
            ),
            ("etc/ferry/farm.key", b"the farm key".to_vec()),
        ],
        &[
            ("vmlinuz", "etc/shadow"),
            ("initrd.img", "/etc/ferry/farm.key"),
            ("boot/vmlinuz-9.9.9-evil", "../etc/shadow"),
            ("boot/initrd.img-9.9.9-evil", "/etc/ferry/farm.key"),
        ],
        &["usr/bin", "sbin"],
    );
    let raw = t.path().join("disk.img");
    mkfs("ext4", &dir, &raw, 32 * MIB, ROOT_UUID);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let found = find(&dev).unwrap();

    assert_eq!(
        found.kernel.path, "/boot/vmlinuz-6.1.0-1-amd64",
        "{found:?}"
    );
    check_bytes(&dev, &found, &kernel, &initrd);
    for path in [
        "/etc/shadow",
        "/vmlinuz",
        "/initrd.img",
        "/boot/vmlinuz-9.9.9-evil",
        "/boot/initrd.img-9.9.9-evil",
    ] {
        let named = bootfiles::BootFile {
            path: path.to_string(),
            ..found.kernel.clone()
        };
        let e = read(&dev, &named, BOOT_FILE_BYTES_MAX).unwrap_err();
        assert!(
            matches!(e, BootFilesError::OutsideBoot { .. }),
            "{path}: {e}"
        );
    }
}

#[test]
fn mbr_root_partition_with_grub_defaults() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("root");
    let kernel = fake("mbr-kernel", 200_000);
    let initrd = fake("mbr-initrd", 50_000);
    tree(
        &dir,
        &[
            ("boot/vmlinuz-6.1.0-7-amd64", kernel.clone()),
            ("boot/initrd.img-6.1.0-7-amd64", initrd.clone()),
            (
                "etc/default/grub",
                b"GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\nGRUB_CMDLINE_LINUX=\"console=ttyS0\"\n"
                    .to_vec(),
            ),
        ],
        &[],
        &["usr", "sbin"],
    );
    let fs = t.path().join("root.ext4");
    mkfs("ext4", &dir, &fs, 40 * MIB, ROOT_UUID);
    let raw = t.path().join("disk.img");
    let script = format!(
        "label: dos\nlabel-id: 0x12345678\nstart=2048, size={}, type=83\n",
        40 * MIB / 512
    );
    disk_with(&raw, 48 * MIB, &script, &[(2048 * 512, &fs)]);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let found = find(&dev).unwrap();

    assert_eq!(found.table, TableKind::Mbr);
    assert_eq!(found.kernel.partition, Some(1));
    assert_eq!(found.kernel.path, "/boot/vmlinuz-6.1.0-7-amd64");
    assert_eq!(found.cmdline.as_deref(), Some("console=ttyS0 quiet"));
    let root = found.root.as_ref().unwrap();
    assert_eq!(root.partition, Some(1));
    assert_eq!(root.partuuid.as_deref(), Some("12345678-01"));
    check_bytes(&dev, &found, &kernel, &initrd);
}

/// A GPT disk: partition 1 an ext2 /boot with two kernels, partition 2 an ext4 root (with
/// `root_links`, Debian's links that dangle on the root when /boot is separate).
fn gpt_disk(t: &Path, root_links: &[(&str, &str)]) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let boot = t.join("boot");
    let k10 = fake("k10", 400_000);
    let i10 = fake("i10", 90_000);
    tree(
        &boot,
        &[
            ("vmlinuz-6.1.0-9-amd64", fake("k9", 300_000)),
            ("initrd.img-6.1.0-9-amd64", fake("i9", 80_000)),
            ("vmlinuz-6.1.0-10-amd64", k10.clone()),
            ("initrd.img-6.1.0-10-amd64", i10.clone()),
            ("config-6.1.0-10-amd64", b"CONFIG_NBD=m\n".to_vec()),
        ],
        &[],
        &[],
    );
    let root = t.join("rootdir");
    tree(
        &root,
        &[("etc/hostname", b"gpt\n".to_vec())],
        root_links,
        &["usr/lib", "boot"],
    );
    let boot_fs = t.join("boot.ext2");
    let root_fs = t.join("root.ext4");
    mkfs(
        "ext2",
        &boot,
        &boot_fs,
        16 * MIB,
        "11111111-2222-3333-4444-555555555555",
    );
    mkfs("ext4", &root, &root_fs, 40 * MIB, ROOT_UUID);
    let raw = t.join("disk.img");
    let script = format!(
        "label: gpt\nstart=2048, size={}, type=L, name=boot\n\
         start={}, size={}, type=L, name=root, uuid=6E0E8A2B-0E8B-4B53-9C6F-1A2B3C4D5E6F\n",
        16 * MIB / 512,
        2048 + 16 * MIB / 512,
        40 * MIB / 512
    );
    disk_with(
        &raw,
        64 * MIB,
        &script,
        &[(2048 * 512, &boot_fs), ((2048 * 512) + 16 * MIB, &root_fs)],
    );
    (raw, k10, i10)
}

#[test]
fn gpt_boot_partition_highest_version_wins() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (raw, kernel, initrd) = gpt_disk(t.path(), &[]);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let found = find(&dev).unwrap();

    assert_eq!(found.table, TableKind::Gpt);
    assert_eq!(found.kernel.partition, Some(1));
    assert_eq!(found.kernel.path, "/vmlinuz-6.1.0-10-amd64");
    assert_eq!(
        found.initrd.as_ref().unwrap().path,
        "/initrd.img-6.1.0-10-amd64"
    );
    assert_eq!(found.cmdline, None);
    let root = found.root.as_ref().unwrap();
    assert_eq!(root.partition, Some(2));
    assert_eq!(
        root.partuuid.as_deref(),
        Some("6e0e8a2b-0e8b-4b53-9c6f-1a2b3c4d5e6f")
    );
    assert_eq!(root.fs_uuid, ROOT_UUID);
    check_bytes(&dev, &found, &kernel, &initrd);
}

#[test]
fn the_roots_dangling_link_names_the_boot_partitions_kernel() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let links = [
        ("vmlinuz", "boot/vmlinuz-6.1.0-9-amd64"),
        ("initrd.img", "boot/initrd.img-6.1.0-9-amd64"),
    ];
    let (raw, _, _) = gpt_disk(t.path(), &links);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let found = find(&dev).unwrap();

    assert_eq!(found.kernel.partition, Some(1));
    assert_eq!(found.kernel.path, "/vmlinuz-6.1.0-9-amd64", "{found:?}");
    assert_eq!(
        found.initrd.as_ref().unwrap().path,
        "/initrd.img-6.1.0-9-amd64"
    );
    assert_eq!(
        read(&dev, &found.kernel, BOOT_FILE_BYTES_MAX).unwrap(),
        fake("k9", 300_000)
    );
}

#[test]
fn a_version_with_a_kernel_update_boots_its_own_kernel() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (old_k, _) = debian_root(&t.path().join("old"), "6.1.0-1-amd64");
    let (new_k, new_i) = debian_root(&t.path().join("new"), "6.1.0-2-amd64");
    let (old_raw, new_raw) = (t.path().join("old.img"), t.path().join("new.img"));
    mkfs("ext4", &t.path().join("old"), &old_raw, 32 * MIB, ROOT_UUID);
    mkfs("ext4", &t.path().join("new"), &new_raw, 32 * MIB, ROOT_UUID);
    let base = t.path().join("base.vhdx");
    let base_dev = to_vhdx(&old_raw, &base);
    let child = t.path().join("base.1.avhdx");
    disk::version::new_version(&base, &child).unwrap();
    // The update: every 64 KiB chunk that differs is written into the child.
    let chain = open::open(
        &child,
        OpenOptions {
            writable: true,
            format: None,
        },
    )
    .unwrap();
    let (old, new) = (
        std::fs::read(&old_raw).unwrap(),
        std::fs::read(&new_raw).unwrap(),
    );
    let mut written = 0;
    for (i, (a, b)) in old.chunks(64 << 10).zip(new.chunks(64 << 10)).enumerate() {
        if a != b {
            chain.top().write_at(b, i as u64 * (64 << 10)).unwrap();
            written += 1;
        }
    }
    chain.close().unwrap();
    assert!(
        written > 0 && written < old.len() / (64 << 10),
        "{written} chunks differ"
    );
    let child_dev = open::open(&child, OpenOptions::default()).unwrap().top();

    let on_child = find(&child_dev).unwrap();
    let on_base = find(&base_dev).unwrap();

    assert_eq!(on_child.kernel.version.as_deref(), Some("6.1.0-2-amd64"));
    assert_eq!(on_base.kernel.version.as_deref(), Some("6.1.0-1-amd64"));
    check_bytes(&child_dev, &on_child, &new_k, &new_i);
    assert_eq!(
        read(&base_dev, &on_base.kernel, BOOT_FILE_BYTES_MAX).unwrap(),
        old_k
    );
}

#[test]
fn no_kernel_names_every_partition_tried() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    tree(
        &root,
        &[("etc/hostname", b"x\n".to_vec())],
        &[],
        &["usr", "boot"],
    );
    let fs = t.path().join("root.ext4");
    mkfs("ext4", &root, &fs, 16 * MIB, ROOT_UUID);
    let raw = t.path().join("disk.img");
    let script = format!(
        "label: gpt\nstart=2048, size=2048, type=L\nstart=4096, size={}, type=L\n",
        16 * MIB / 512
    );
    disk_with(&raw, 24 * MIB, &script, &[(4096 * 512, &fs)]);
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let e = find(&dev).unwrap_err();

    assert_eq!(
        e.to_string(),
        "no kernel found: partitions tried: partition 1: no ext filesystem; \
         partition 2: ext, no vmlinuz-VERSION in /boot"
    );
}

#[test]
fn a_broken_gpt_is_a_typed_error() {
    if !have_tools() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (raw, _, _) = gpt_disk(t.path(), &[]);
    // Flip a byte of the first entry: the entries CRC no longer matches.
    let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0xAB], 1024 + 60).unwrap();
    let dev = to_vhdx(&raw, &t.path().join("disk.vhdx"));

    let e = find(&dev).unwrap_err();

    assert!(
        matches!(
            e,
            BootFilesError::Gpt(bootfiles::partition::GptError::EntriesCrc { .. })
        ),
        "{e}"
    );
}
