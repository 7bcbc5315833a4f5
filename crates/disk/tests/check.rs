//! `check` finds what is wrong and `--repair` fixes what can be fixed without losing data.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use disk::open::{self, OpenOptions};
use disk::ops::check::{CheckOptions, check};
use disk::vhdx::{CreateOptions, create};
use disk::{FileStorage, Storage};

fn make(path: &Path) {
    let f = std::fs::File::create_new(path).unwrap();
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    create(
        &s,
        &CreateOptions {
            size: 8 << 20,
            block_size: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let c = open::open(
        path,
        OpenOptions {
            writable: true,
            format: None,
        },
    )
    .unwrap();
    c.top().write_at(&vec![0x5a; 3 << 20], 1 << 20).unwrap();
    c.close().unwrap();
}

/// The BAT of a Ferry-created image starts at 3 MiB.
const BAT: u64 = 3 << 20;

#[test]
fn fresh_image_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(r.clean, "{}", r.render());
    assert!(r.warnings.is_empty(), "{}", r.render());
}

#[test]
fn bat_entry_over_headers_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    // Entry 1 (block 1) becomes FULLY_PRESENT at file offset 0.
    f.write_all_at(&6u64.to_le_bytes(), BAT + 8).unwrap();
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(!r.clean);
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("bat entry 1") && e.contains("over the file headers")),
        "{}",
        r.render()
    );
}

#[test]
fn overlapping_blocks_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let bytes = std::fs::read(&p).unwrap();
    let e1 = &bytes[(BAT + 8) as usize..(BAT + 16) as usize];
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(e1, BAT + 16).unwrap();
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("overlaps")),
        "{}",
        r.render()
    );
}

#[test]
fn bad_header_copy_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[0xff; 16], 0x10000 + 200).unwrap();
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(
        r.clean && r.warnings.iter().any(|w| w.contains("header 1")),
        "{}",
        r.render()
    );
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert!(
        r.repaired.iter().any(|x| x.contains("header")),
        "{}",
        r.render()
    );
    assert!(r.clean && r.warnings.is_empty(), "{}", r.render());
}

#[test]
fn leaked_space_is_reported_and_freed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[1u8; 8192], len).unwrap();
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(r.clean && r.leaked_bytes >= 8192, "{}", r.render());
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert_eq!(r.leaked_bytes, 0, "{}", r.render());
    assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
}

#[test]
fn dirty_log_sample_is_replayed_by_repair() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dirty.vhdx");
    let src = testkit::vectors_dir().join("qemu-iotest-dirtylog-10G-4M.vhdx.bz2");
    let out = Command::new("bzip2").arg("-dc").arg(&src).output().unwrap();
    assert!(
        out.status.success(),
        "bzip2 -dc {} failed (is shared/ beside the repository, or FERRY_VECTORS set?)",
        src.display()
    );
    std::fs::write(&p, out.stdout).unwrap();
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(
        r.clean && r.warnings.iter().any(|w| w.contains("log is dirty")),
        "{}",
        r.render()
    );
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert!(
        r.repaired.iter().any(|x| x.contains("replayed")),
        "{}",
        r.render()
    );
    assert!(
        r.clean && !r.warnings.iter().any(|w| w.contains("log")),
        "{}",
        r.render()
    );
}

#[test]
fn missing_parent_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("b.vhdx");
    let child = dir.path().join("b.1.avhdx");
    make(&base);
    disk::version::new_version(&base, &child).unwrap();
    std::fs::rename(&base, dir.path().join("elsewhere.vhdx")).unwrap();
    let r = check(&child, &CheckOptions::default()).unwrap();
    assert!(
        !r.clean && r.errors.iter().any(|e| e.contains("parent not found")),
        "{}",
        r.render()
    );
}

#[test]
fn unopenable_first_candidate_falls_back_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("b.vhdx");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    make(&base);
    let child = sub.join("b.1.avhdx");
    disk::version::new_version(&base, &child).unwrap();
    // The relative and absolute paths (both ../b.vhdx) now hold garbage; the last candidate,
    // the parent's file name next to the child, holds the real parent.
    std::fs::copy(&base, sub.join("b.vhdx")).unwrap();
    std::fs::write(&base, b"not an image").unwrap();
    let chain = open::open(&child, OpenOptions::default()).unwrap();
    assert_eq!(chain.layers.len(), 2);
    assert_eq!(chain.layers[1].path, sub.join("b.vhdx"));
}
