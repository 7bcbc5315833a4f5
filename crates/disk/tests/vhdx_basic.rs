//! End-to-end checks of the VHDX reader/writer on real files.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use disk::open::{self, OpenOptions};
use disk::vhdx::{CreateOptions, create};
use disk::{FileStorage, Storage};

fn new_file(path: &Path, opts: &CreateOptions) {
    let f = std::fs::File::create_new(path).unwrap();
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    create(&s, opts).unwrap();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_reopen_read_dynamic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    new_file(
        &p,
        &CreateOptions {
            size: 64 << 20,
            block_size: 1 << 20,
            ..Default::default()
        },
    );
    let w = pattern(3 << 20, 7);
    {
        let c = open::open(
            &p,
            OpenOptions {
                writable: true,
                format: None,
            },
        )
        .unwrap();
        c.top().write_at(&w, (5 << 20) + 512).unwrap();
        c.top().write_at(b"hello", 100).unwrap();
        c.close().unwrap();
    }
    let c = open::open(&p, OpenOptions::default()).unwrap();
    let mut r = vec![0u8; 3 << 20];
    c.top().read_at(&mut r, (5 << 20) + 512).unwrap();
    assert_eq!(r, w);
    let mut h = [0u8; 5];
    c.top().read_at(&mut h, 100).unwrap();
    assert_eq!(&h, b"hello");
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
}

#[test]
fn differencing_child_reads_parent_and_own_sectors() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.vhdx");
    let child = dir.path().join("base.1.avhdx");
    new_file(
        &base,
        &CreateOptions {
            size: 16 << 20,
            block_size: 1 << 20,
            ..Default::default()
        },
    );
    {
        let c = open::open(
            &base,
            OpenOptions {
                writable: true,
                format: None,
            },
        )
        .unwrap();
        c.top().write_at(&vec![0xaa; 4 << 20], 0).unwrap();
        c.close().unwrap();
    }
    disk::version::new_version(&base, &child).unwrap();
    {
        let c = open::open(
            &child,
            OpenOptions {
                writable: true,
                format: None,
            },
        )
        .unwrap();
        assert_eq!(c.layers.len(), 2);
        c.top().write_at(&[0xbb; 4096], 8192).unwrap();
        c.close().unwrap();
    }
    let c = open::open(&child, OpenOptions::default()).unwrap();
    let mut r = vec![0u8; 3 * 4096];
    c.top().read_at(&mut r, 4096).unwrap();
    assert!(r[..4096].iter().all(|&b| b == 0xaa));
    assert!(r[4096..8192].iter().all(|&b| b == 0xbb));
    assert!(r[8192..].iter().all(|&b| b == 0xaa));
}
