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

/// `try_write_at` (the inline overwrite an NBD server makes on its reactor) writes only
/// whole pages inside one block that the file already holds for the whole range, once a
/// write session started; anything else declines with nothing written, and what it wrote
/// is there after a reopen.
#[test]
fn inline_overwrites_only_what_the_file_already_holds() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.vhdx");
    new_file(
        &base,
        &CreateOptions {
            size: 16 * MIB,
            block_size: MIB as u32,
            ..Default::default()
        },
    );
    let child = dir.path().join("child.avhdx");
    disk::version::new_version(&base, &child).unwrap();
    let rw = OpenOptions {
        writable: true,
        format: None,
    };
    // Block 1 wholly the child's; block 0 only its first page (partially present).
    let c = open::open(&child, rw).unwrap();
    c.top().write_at(&pattern(MIB as usize, 2), MIB).unwrap();
    c.top().write_at(&pattern(4096, 1), 0).unwrap();
    c.close().unwrap();
    drop(c);

    let new = pattern(8192, 3);
    let c = open::open(&child, rw).unwrap();
    let top = c.top();
    assert!(
        top.try_write_at(&new, MIB).is_none(),
        "no write session yet"
    );
    top.write_at(&pattern(4096, 1), 0).unwrap();
    assert!(
        top.try_write_at(&new, 0).is_none(),
        "second page is the parent's"
    );
    assert!(
        top.try_write_at(&new, 4 * MIB).is_none(),
        "block not allocated"
    );
    assert!(
        top.try_write_at(&new[..512], MIB).is_none(),
        "not whole pages"
    );
    assert!(
        top.try_write_at(&new, MIB + 512).is_none(),
        "not page-aligned"
    );
    assert!(
        top.try_write_at(&new, 2 * MIB - 4096).is_none(),
        "crosses a block"
    );
    assert!(matches!(top.try_write_at(&new[..4096], 0), Some(Ok(()))));
    assert!(matches!(top.try_write_at(&new, MIB + 8192), Some(Ok(()))));
    c.close().unwrap();
    drop(c);

    let c = open::open(&child, OpenOptions::default()).unwrap();
    let mut r = vec![0u8; 5 * MIB as usize];
    c.top().read_at(&mut r, 0).unwrap();
    let mut want = vec![0u8; 5 * MIB as usize];
    want[..4096].copy_from_slice(&new[..4096]);
    want[MIB as usize..2 * MIB as usize].copy_from_slice(&pattern(MIB as usize, 2));
    want[(MIB + 8192) as usize..(MIB + 16384) as usize].copy_from_slice(&new);
    assert!(r == want);
}

/// `read_vectored_at` returns what `read_at` does, whatever the split: ranges inside one
/// fully present block (one vectored store read, direct or not), across blocks, over
/// unallocated blocks, and in a differencing child holding some sectors of a block.
#[test]
fn vectored_reads_equal_plain_reads() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
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
        c.top().write_at(&pattern(5 << 20, 3), 0).unwrap();
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
        c.top()
            .write_at(&pattern(8192, 9), (2 << 20) + 4096)
            .unwrap();
        c.close().unwrap();
    }
    for (path, direct) in [(&base, false), (&base, true), (&child, true)] {
        let c = open::open(path, OpenOptions::default()).unwrap();
        if direct {
            c.direct_reads_all().unwrap();
        }
        let top = c.top();
        // (offset, piece lengths): in one block, across a block boundary, a block the
        // base never wrote, the child's partial block.
        let cases: [(u64, &[usize]); 5] = [
            (0, &[256 << 10, 256 << 10, 512 << 10]),
            (1 << 20, &[4096; 16]),
            ((1 << 20) - (128 << 10), &[128 << 10, 128 << 10]),
            (6 << 20, &[65536, 65536]),
            (2 << 20, &[4096, 8192, 4096, 65536]),
        ];
        for (offset, lens) in cases {
            let total: usize = lens.iter().sum();
            let mut want = vec![0u8; total];
            top.read_at(&mut want, offset).unwrap();
            // Page-aligned buffers, so the direct path can take them.
            let mut backing = vec![0u8; total + 4096];
            let start = backing.as_ptr().align_offset(4096);
            let mut rest = &mut backing[start..start + total];
            let mut bufs: Vec<&mut [u8]> = Vec::new();
            for &len in lens {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
                bufs.push(head);
                rest = tail;
            }
            top.read_vectored_at(&mut bufs, offset).unwrap();
            assert!(
                backing[start..start + total] == want[..],
                "{path:?} at {offset:#x} in {lens:?} (direct {direct})"
            );
        }
    }
}
