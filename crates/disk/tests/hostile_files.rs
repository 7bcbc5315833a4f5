//! Hostile files and crafted images: a FIFO where an image was expected must not block an
//! open; BAT offsets near 2^64 must not wrap past the placement check; a log must not
//! stretch the file (or the read-only view of it) beyond what its own writes reach, and
//! `check --repair` must leave such a file's length alone; chains opened confined to a
//! directory never reach outside it.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use disk::open::{self, OpenOptions};
use disk::ops::check::{CheckOptions, check};
use disk::vhdx::{CreateOptions, create};
use disk::{ErrorKind, FileStorage, Storage};
use vhdx::Guid;
use vhdx::header::{self, HEADER_LEN};
use vhdx::log::{NewEntry, SECTOR};

const MIB: u64 = 1 << 20;
/// The BAT of a Ferry-created image starts at 3 MiB.
const BAT: u64 = 3 << 20;
/// Present, at a file offset near 2^64: `start + len` wraps to a small number.
const WRAPPING_ENTRY: u64 = 0xFFFF_FFFF_FFF0_0000 | 6;
/// How long a hang guard waits before it declares an open blocked (an open that does not
/// block returns in microseconds; this only turns a hang into a failure).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// An 8 MiB image of 1 MiB blocks with blocks 1..=3 allocated.
fn make(path: &Path) {
    let f = std::fs::File::create_new(path).unwrap();
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    let opts = CreateOptions {
        size: 8 << 20,
        block_size: 1 << 20,
        ..Default::default()
    };
    create(&s, &opts).unwrap();
    let writable = OpenOptions {
        writable: true,
        format: None,
    };
    let c = open::open(path, writable).unwrap();
    c.top().write_at(&vec![0x5a; 3 << 20], 1 << 20).unwrap();
    c.close().unwrap();
}

fn len_of(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

fn patch(p: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

/// Marks the log of `p` dirty with one entry: `data` sectors written at their offsets,
/// and the entry's FlushedFileOffset (the file's length) and `last_file_offset`.
fn dirty_log(p: &Path, data: &[(u64, &[u8])], last_file_offset: u64) {
    let bytes = std::fs::read(p).unwrap();
    let h1 = &bytes[0x10000..0x10000 + HEADER_LEN];
    let h2 = &bytes[0x20000..0x20000 + HEADER_LEN];
    let mut hdr = header::choose(h1, h2).unwrap().header;
    hdr.log_guid = Guid([0x42; 16]);
    hdr.sequence_number += 1;
    let entry = NewEntry {
        sequence_number: 1,
        tail: 0,
        log_guid: hdr.log_guid,
        flushed_file_offset: bytes.len() as u64,
        last_file_offset,
        data,
        zeros: &[],
    }
    .encode();
    patch(p, hdr.log_offset, &entry);
    patch(p, 0x10000, &hdr.to_bytes());
    patch(p, 0x20000, &hdr.to_bytes());
}

/// The first BAT page of `p` with entry `index` set to `raw`.
fn bat_page_with(p: &Path, index: u64, raw: u64) -> Vec<u8> {
    let bytes = std::fs::read(p).unwrap();
    let mut page = bytes[BAT as usize..BAT as usize + SECTOR].to_vec();
    page[index as usize * 8..index as usize * 8 + 8].copy_from_slice(&raw.to_le_bytes());
    page
}

fn fifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// Runs `f` on another thread; if it has not returned within [`HANG_GUARD`], opens the
/// FIFO `pipe` for writing (which releases a reader blocked in `open`) and fails.
fn unblocked<T: Send + 'static>(pipe: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    match rx.recv_timeout(HANG_GUARD) {
        Ok(v) => v,
        Err(_) => {
            let _ = std::fs::OpenOptions::new().write(true).open(pipe);
            panic!("opening {} blocked on the fifo", pipe.display());
        }
    }
}

#[test]
fn bat_offset_that_wraps_is_refused_by_open_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    patch(&p, BAT + 8, &WRAPPING_ENTRY.to_le_bytes());
    let e = open::open(&p, OpenOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(
        e.to_string().contains("bat entry 1") && e.to_string().contains("past the end"),
        "{e}"
    );
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("bat entry 1")),
        "{}",
        r.render()
    );
}

#[test]
fn log_with_stretched_last_file_offset_is_refused_and_never_extends_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    // The log says the file is 1 TiB long and maps block 4 near its end.
    let far = (1u64 << 40) - MIB;
    let page = bat_page_with(&p, 4, far | 6);
    dirty_log(&p, &[(BAT, &page)], 1 << 40);
    let len = len_of(&p);
    let e = open::open(&p, OpenOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("LastFileOffset"), "{e}");
    let r = check(&p, &CheckOptions::default()).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("LastFileOffset")),
        "{}",
        r.render()
    );
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert!(!r.clean && r.repaired.is_empty(), "{}", r.render());
    assert_eq!(len_of(&p), len, "check --repair changed the file's length");
    let writable = OpenOptions {
        writable: true,
        format: None,
    };
    assert!(open::open(&p, writable).is_err());
    assert_eq!(len_of(&p), len, "a writable open changed the file's length");
}

#[test]
fn log_write_far_past_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let len = len_of(&p);
    let sector = vec![0u8; SECTOR];
    dirty_log(&p, &[(1 << 40, &sector)], len);
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("descriptor 0") && e.contains("FileOffset 0x10000000000")),
        "{}",
        r.render()
    );
    assert_eq!(len_of(&p), len);
}

#[test]
fn log_may_grow_the_file_as_far_as_its_writes_reach() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.vhdx");
    make(&p);
    let len = len_of(&p);
    // An allocation the crash left unextended: block 4 at the old end, its BAT page logged,
    // and a log write inside the new block that grows the file.
    let page = bat_page_with(&p, 4, len | 6);
    let sector = vec![0u8; SECTOR];
    dirty_log(&p, &[(BAT, &page), (len + MIB - 4096, &sector)], len + MIB);
    let r = check(&p, &CheckOptions { repair: true }).unwrap();
    assert!(r.errors.is_empty(), "{}", r.render());
    assert!(
        r.repaired.iter().any(|x| x.contains("replayed")),
        "{}",
        r.render()
    );
    assert_eq!(len_of(&p), len + MIB);
}

#[test]
fn fifo_is_refused_at_once_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("pipe.vhdx");
    fifo(&pipe);
    let p = pipe.clone();
    let e = unblocked(&pipe, move || {
        open::open(&p, OpenOptions::default()).map(|_| ())
    })
    .unwrap_err();
    assert!(e.to_string().contains("pipe.vhdx: is a fifo"), "{e}");
    let p = pipe.clone();
    let r = unblocked(&pipe, move || {
        check(&p, &CheckOptions::default()).map(|_| ())
    });
    assert!(r.is_err());
}

/// A child in `root` whose parent locator names `parent` (made there, then removed or
/// replaced by the caller).
fn child_of(parent: &Path, child: &Path) {
    make(parent);
    disk::version::new_version(parent, child).unwrap();
}

fn confined_err(root: &Path, top: &Path) -> String {
    open::open_confined(root, top, OpenOptions::default())
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[test]
fn confined_chain_reads_the_same_for_outside_parents_that_exist_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let out = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let root = std::fs::canonicalize(root).unwrap();
    child_of(&out.join("there.vhdx"), &root.join("a.vhdx"));
    child_of(&out.join("gone.vhdx"), &root.join("b.vhdx"));
    // One parent exists but is not an image, the other does not exist.
    std::fs::write(out.join("there.vhdx"), b"not an image").unwrap();
    std::fs::remove_file(out.join("gone.vhdx")).unwrap();
    let a = confined_err(&root, &root.join("a.vhdx"));
    let b = confined_err(&root, &root.join("b.vhdx"));
    assert!(a.contains("there.vhdx: outside"), "{a}");
    let norm = |s: &str, top: &str, parent: &str| s.replace(top, "TOP").replace(parent, "PARENT");
    assert_eq!(
        norm(&a, "a.vhdx", "there.vhdx"),
        norm(&b, "b.vhdx", "gone.vhdx")
    );
    // The unconfined open still tells them apart (a CLI user may open any file).
    let a = open::open(&root.join("a.vhdx"), OpenOptions::default()).unwrap_err();
    assert!(a.to_string().contains("there.vhdx"), "{a}");
}

#[test]
fn confined_chain_refuses_a_symlink_out_of_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let out = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let root = std::fs::canonicalize(root).unwrap();
    make(&out.join("secret.vhdx"));
    std::os::unix::fs::symlink(out.join("secret.vhdx"), root.join("link.vhdx")).unwrap();
    let e = open::open_confined(&root, &root.join("link.vhdx"), OpenOptions::default())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutsideRoot, "{e}");
    // A chain wholly inside opens, and its layers are known by canonical paths.
    let inside: PathBuf = root.join("in.vhdx");
    child_of(&root.join("base.vhdx"), &inside);
    let c = open::open_confined(&root, &inside, OpenOptions::default()).unwrap();
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[1].path, root.join("base.vhdx"));
}
