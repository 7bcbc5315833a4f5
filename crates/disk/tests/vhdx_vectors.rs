//! The VHDX sample images in shared/vectors read as their README documents.

use std::path::{Path, PathBuf};
use std::process::Command;

use disk::BlockDevice;
use disk::open::{self, OpenOptions};

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
}

fn unpack(name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(name.trim_end_matches(".bz2"));
    let data = Command::new("bzip2")
        .arg("-dc")
        .arg(vectors().join(name))
        .output()
        .unwrap();
    assert!(data.status.success(), "bzip2 failed on {name}");
    std::fs::write(&out, data.stdout).unwrap();
    out
}

fn all(dev: &dyn BlockDevice, offset: u64, len: u64, byte: u8) -> bool {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(buf.len() as u64) as usize;
        dev.read_at(&mut buf[..n], pos).unwrap();
        if buf[..n].iter().any(|&b| b != byte) {
            return false;
        }
        pos += n as u64;
    }
    true
}

#[test]
fn hyperv_dynamic_1g_reads_the_iotest_064_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let p = unpack("qemu-iotest-dynamic-1G.vhdx.bz2", dir.path());
    let c = open::open(&p, OpenOptions::default()).unwrap();
    let d = c.top();
    assert_eq!(d.size(), 1 << 30);
    assert_eq!(d.geometry().block_size, 32 << 20);
    assert!(all(d.as_ref(), 0, 33 << 20, 0xa5));
    assert!(all(d.as_ref(), 33 << 20, 33 << 20, 0x96));
    assert!(all(d.as_ref(), 66 << 20, 34 << 20, 0));
}

#[test]
fn dirty_log_read_only_replays_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let p = unpack("qemu-iotest-dirtylog-10G-4M.vhdx.bz2", dir.path());
    let before = std::fs::read(&p).unwrap();
    let c = open::open(&p, OpenOptions::default()).unwrap();
    let d = c.top();
    assert!(
        d.warnings()
            .iter()
            .any(|w| w.contains("replayed in memory")),
        "{:?}",
        d.warnings()
    );
    assert!(all(d.as_ref(), 0, 18 << 20, 0xa5));
    assert!(all(d.as_ref(), 18 << 20, 2 << 20, 0));
    drop(c);
    assert_eq!(
        std::fs::read(&p).unwrap(),
        before,
        "a read-only open must not modify the file"
    );
}

#[test]
fn dirty_log_writable_open_replays_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = unpack("qemu-iotest-dirtylog-10G-4M.vhdx.bz2", dir.path());
    {
        let c = open::open(
            &p,
            OpenOptions {
                writable: true,
                format: None,
            },
        )
        .unwrap();
        assert!(all(c.top().as_ref(), 0, 18 << 20, 0xa5));
        c.close().unwrap();
    }
    let out = Command::new("qemu-img")
        .arg("check")
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new("qemu-io")
        .args(["-r", "-f", "vhdx", "-c", "read -P 0xa5 0 18M"])
        .arg(&p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("Pattern verification failed"),
        "{text}"
    );
}

#[test]
fn disk2vhd_equal_headers_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = unpack("qemu-test-disk2vhd.vhdx.bz2", dir.path());
    let c = open::open(&p, OpenOptions::default()).unwrap();
    let d = c.top();
    assert_eq!(d.size(), 256 << 20);
    assert_eq!(d.geometry().block_size, 2 << 20);
    let mut mbr = [0u8; 512];
    d.read_at(&mut mbr, 0).unwrap();
    assert_eq!(&mbr[510..], &[0x55, 0xaa]);
    assert!(all(d.as_ref(), 512, (256 << 20) - 512, 0));
}
