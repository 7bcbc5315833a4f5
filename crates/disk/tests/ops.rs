//! The image operations (convert, capture, merge, compact) on real files, checked against our
//! own reader and against `qemu-img compare` / `qemu-img check`.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use disk::device::BlockDevice;
use disk::open::{self, Format, Image, OpenOptions};
use disk::ops::NoProgress;
use disk::ops::capture::{CaptureOptions, capture};
use disk::ops::compact::compact;
use disk::ops::convert::{ConvertOptions, convert};
use disk::ops::merge::{merge_base, merge_updates};
use disk::vhdx::{CreateOptions, VhdxImage, create};
use disk::{ErrorKind, FileStorage, Storage};
use sha2::{Digest, Sha256};
use vhdx::bat;

const MIB: u64 = 1 << 20;

fn new_vhdx(path: &Path, size: u64, block_size: u32) {
    let f = std::fs::File::create_new(path).unwrap();
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    create(
        &s,
        &CreateOptions {
            size,
            block_size,
            ..Default::default()
        },
    )
    .unwrap();
}

/// Bytes that are never zero, different per seed.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31).wrapping_add(seed)) | 1)
        .collect()
}

/// A change to an image: data at an offset, or zeroing of a range.
enum Op {
    Write(u64, Vec<u8>),
    Zero(u64, u64),
}

fn apply(path: &Path, ops: &[Op]) {
    let c = open::open(
        path,
        OpenOptions {
            writable: true,
            format: None,
        },
    )
    .unwrap();
    for op in ops {
        match op {
            Op::Write(at, data) => c.top().write_at(data, *at).unwrap(),
            Op::Zero(at, len) => c.top().write_zeroes(*at, *len).unwrap(),
        }
    }
    c.close().unwrap();
}

/// The whole virtual disk of the chain under `path`.
fn read_all(path: &Path) -> Vec<u8> {
    let c = open::open(path, OpenOptions::default()).unwrap();
    let mut buf = vec![0u8; c.top().size() as usize];
    c.top().read_at(&mut buf, 0).unwrap();
    buf
}

fn vhdx_image(path: &Path) -> Arc<VhdxImage> {
    match open::open_one(path, OpenOptions::default()).unwrap().image {
        Image::Vhdx(i) => i,
        other => panic!("{} is not vhdx: {other:?}", path.display()),
    }
}

/// The count of payload blocks in `state` ("fully_present", "zero", ...).
fn blocks_in_state(path: &Path, state: &str) -> u64 {
    let d = vhdx_image(path).details().unwrap();
    d.block_states
        .iter()
        .find(|(n, _)| n == state)
        .map_or(0, |(_, c)| *c)
}

/// The BAT state of each payload block of the virtual disk (differencing BATs have more
/// entries, up to a whole chunk; those are left out).
fn block_states(path: &Path) -> Vec<u8> {
    let img = vhdx_image(path);
    let (layout, bat) = (img.layout(), img.bat());
    (0..layout.data_blocks())
        .map(|b| bat[layout.payload_index(b) as usize].state())
        .collect()
}

fn qemu_img(args: &[&str], files: &[&Path]) -> std::process::Output {
    Command::new("qemu-img")
        .args(args)
        .args(files)
        .output()
        .expect("qemu-img must be installed")
}

fn assert_qemu_same(a: &Path, fa: &str, b: &Path, fb: &str) {
    let out = qemu_img(&["compare", "-f", fa, "-F", fb], &[a, b]);
    assert!(
        out.status.success(),
        "qemu-img compare: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn assert_qemu_check(p: &Path) {
    let out = qemu_img(&["check"], &[p]);
    assert!(
        out.status.success(),
        "qemu-img check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A 24 MiB dynamic VHDX with 1 MiB blocks: data in blocks 0, 3 (partly) and 10..12, an
/// explicitly zeroed block 5 and a block 7 written full of zeros (allocated but zero).
fn sample_vhdx(path: &Path) -> Vec<u8> {
    new_vhdx(path, 24 * MIB, 1 << 20);
    apply(
        path,
        &[
            Op::Write(0, pattern(MIB as usize, 1)),
            Op::Write(3 * MIB + 4096, pattern(8192, 2)),
            Op::Write(10 * MIB, pattern(2 * MIB as usize, 3)),
            Op::Zero(5 * MIB, MIB),
            Op::Write(7 * MIB, vec![0u8; MIB as usize]),
        ],
    );
    read_all(path)
}

#[test]
fn convert_vhdx_to_raw_and_back_is_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (src, raw, back) = (
        dir.path().join("a.vhdx"),
        dir.path().join("a.raw"),
        dir.path().join("b.vhdx"),
    );
    let want = sample_vhdx(&src);
    let s1 = convert(&src, &raw, &ConvertOptions::default(), &NoProgress).unwrap();
    let s2 = convert(
        &raw,
        &back,
        &ConvertOptions {
            block_size: Some(1 << 20),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    assert_eq!(std::fs::read(&raw).unwrap(), want);
    assert_eq!(read_all(&back), want);
    assert_eq!((s1.virtual_size, s2.virtual_size), (24 * MIB, 24 * MIB));
    assert_qemu_same(&src, "vhdx", &raw, "raw");
    assert_qemu_same(&back, "vhdx", &raw, "raw");
    assert_qemu_check(&back);
}

#[test]
fn convert_leaves_zero_blocks_unallocated() {
    let dir = tempfile::tempdir().unwrap();
    let (src, raw, out) = (
        dir.path().join("a.vhdx"),
        dir.path().join("a.raw"),
        dir.path().join("c.vhdx"),
    );
    sample_vhdx(&src);
    convert(&src, &raw, &ConvertOptions::default(), &NoProgress).unwrap();
    convert(&src, &out, &ConvertOptions::default(), &NoProgress).unwrap();
    // Blocks 0, 3, 10 and 11 hold data; block 7 was written with zeros and must not be copied.
    assert_eq!(
        vhdx_image(&out).metadata().block_size,
        1 << 20,
        "the source's block size is kept"
    );
    assert_eq!(blocks_in_state(&out, "fully_present"), 4);
    assert_eq!(vhdx_image(&out).allocated_bytes().unwrap(), 4 * MIB);
    // The raw output is sparse: at most the 3 MiB + 64 KiB of non-zero data is allocated.
    let m = std::fs::metadata(&raw).unwrap();
    assert_eq!(m.len(), 24 * MIB);
    assert!(
        m.blocks() * 512 <= 3 * MIB + (64 << 10),
        "raw output allocates {} bytes",
        m.blocks() * 512
    );
}

#[test]
fn convert_to_vhd_writes_a_dynamic_vhd_qemu_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (src, raw, vhd) = (
        dir.path().join("a.vhdx"),
        dir.path().join("a.raw"),
        dir.path().join("a.vhd"),
    );
    let want = sample_vhdx(&src);
    convert(&src, &raw, &ConvertOptions::default(), &NoProgress).unwrap();
    convert(&src, &vhd, &ConvertOptions::default(), &NoProgress).unwrap();
    assert_eq!(read_all(&vhd), want);
    assert_eq!(
        open::open(&vhd, OpenOptions::default()).unwrap().layers[0].format,
        Format::Vhd
    );
    assert_qemu_same(&vhd, "vpc", &raw, "raw");
    // Data lies in the 2 MiB blocks 0, 1 and 5 only: three blocks plus metadata.
    let len = std::fs::metadata(&vhd).unwrap().len();
    assert!(len > 3 * 2 * MIB && len < 4 * 2 * MIB, "vhd of {len} bytes");
}

#[test]
fn convert_keeps_4k_logical_sectors_and_can_make_a_fixed_image() {
    let dir = tempfile::tempdir().unwrap();
    let (src, out) = (dir.path().join("4k.vhdx"), dir.path().join("fixed.vhdx"));
    let f = std::fs::File::create_new(&src).unwrap();
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    let opts = CreateOptions {
        size: 12 * MIB,
        block_size: 1 << 20,
        logical_sector_size: 4096,
        ..Default::default()
    };
    create(&s, &opts).unwrap();
    drop(s);
    apply(
        &src,
        &[
            Op::Write(4096, pattern(8192, 1)),
            Op::Write(9 * MIB, pattern(MIB as usize, 2)),
        ],
    );
    let want = read_all(&src);
    convert(
        &src,
        &out,
        &ConvertOptions {
            fixed: true,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let img = vhdx_image(&out);
    assert_eq!(img.metadata().logical_sector_size, 4096);
    assert!(img.metadata().leave_blocks_allocated);
    assert_eq!(
        blocks_in_state(&out, "fully_present"),
        12,
        "a fixed image allocates every block"
    );
    assert_eq!(read_all(&out), want);
}

#[test]
fn convert_never_overwrites_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let (src, taken) = (dir.path().join("a.vhdx"), dir.path().join("taken.raw"));
    sample_vhdx(&src);
    std::fs::write(&taken, b"keep me").unwrap();
    let e = convert(&src, &taken, &ConvertOptions::default(), &NoProgress).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert_eq!(std::fs::read(&taken).unwrap(), b"keep me");
}

/// base.vhdx (data in blocks 0..4) ◄ top.avhdx (new data over block 1, a partial sector run in
/// block 2, zeros over block 3, data in block 6).
fn two_level_chain(dir: &Path) -> (PathBuf, PathBuf) {
    let (base, top) = (dir.join("base.vhdx"), dir.join("top.avhdx"));
    new_vhdx(&base, 16 * MIB, 1 << 20);
    apply(&base, &[Op::Write(0, pattern(4 * MIB as usize, 9))]);
    disk::version::new_version(&base, &top).unwrap();
    apply(
        &top,
        &[
            Op::Write(MIB, pattern(MIB as usize, 4)),
            Op::Write(2 * MIB + 1024, pattern(3072, 5)),
            Op::Zero(3 * MIB, MIB),
            Op::Write(6 * MIB, pattern(512, 6)),
        ],
    );
    (base, top)
}

#[test]
fn convert_chain_flattened_is_one_standalone_image() {
    let dir = tempfile::tempdir().unwrap();
    let (_, top) = two_level_chain(dir.path());
    let want = read_all(&top);
    let out = dir.path().join("flat.vhdx");
    convert(
        &top,
        &out,
        &ConvertOptions {
            flatten: true,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let c = open::open(&out, OpenOptions::default()).unwrap();
    assert_eq!(c.layers.len(), 1);
    assert_eq!(read_all(&out), want);
    assert_qemu_check(&out);
}

#[test]
fn convert_chain_without_flatten_converts_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let (_, top) = two_level_chain(dir.path());
    let want = read_all(&top);
    let outdir = dir.path().join("out");
    std::fs::create_dir(&outdir).unwrap();
    let out = outdir.join("top.avhdx");
    convert(&top, &out, &ConvertOptions::default(), &NoProgress).unwrap();
    let c = open::open(&out, OpenOptions::default()).unwrap();
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[1].path, outdir.join("base.vhdx"));
    assert_eq!(read_all(&out), want);
    // The child holds only its own blocks: 1 and 6 with data, 2 partly, 3 as ZERO.
    assert_eq!(blocks_in_state(&out, "fully_present"), 1);
    assert_eq!(blocks_in_state(&out, "partially_present"), 2);
    assert_eq!(blocks_in_state(&out, "zero"), 1);
}

#[test]
fn convert_vhd_vector_to_raw_matches_its_known_digest() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("ext2.raw");
    let src = testkit::vectors_dir().join("dfvfs-ext2.vhd");
    convert(&src, &raw, &ConvertOptions::default(), &NoProgress).unwrap();
    let got = sha256_hex(&std::fs::read(&raw).unwrap());
    assert_eq!(
        got,
        "870be7ae16c1fa8faab05c6eb9205dc9a7ae35c5f552c5cf8a267c0bc6a5cb99"
    );
}

#[test]
fn convert_vhd_chain_to_a_vhdx_chain_keeps_its_content() {
    // The child is found by its parent's file name, so both get the names the child expects.
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("dfvfs-image.vhd", "image.vhd"),
        ("dfvfs-image-differential.vhd", "image-differential.vhd"),
    ] {
        std::fs::copy(testkit::vectors_dir().join(from), dir.path().join(to)).unwrap();
    }
    let out = dir.path().join("out").join("image-differential.vhdx");
    std::fs::create_dir(out.parent().unwrap()).unwrap();
    convert(
        &dir.path().join("image-differential.vhd"),
        &out,
        &ConvertOptions::default(),
        &NoProgress,
    )
    .unwrap();
    let c = open::open(&out, OpenOptions::default()).unwrap();
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[1].format, Format::Vhdx);
    assert_eq!(
        sha256_hex(&read_all(&out)),
        "c6db12a7db548e193c29420c1b4533e4708b20c5033db5cc29ef075d48316d25"
    );
}

#[test]
fn capture_of_a_sparse_file_reads_only_data_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (src, out) = (dir.path().join("disk.img"), dir.path().join("golden.vhdx"));
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(96 * MIB).unwrap();
    f.write_all_at(&pattern(4096, 1), 0).unwrap();
    f.write_all_at(&pattern(MIB as usize, 2), 40 * MIB + 512)
        .unwrap();
    f.write_all_at(&vec![0u8; 2 * MIB as usize], 70 * MIB)
        .unwrap();
    f.write_all_at(&pattern(512, 3), 96 * MIB - 512).unwrap();
    drop(f);
    let opts = CaptureOptions {
        block_size: 1 << 20,
        verify: true,
    };
    let stats = capture(&src, &out, &opts, &NoProgress).unwrap();
    assert_eq!(read_all(&out), std::fs::read(&src).unwrap());
    // Data touches blocks 0, 40, 41 and 95; the zeros written at 70 MiB are not copied.
    assert_eq!(blocks_in_state(&out, "fully_present"), 4);
    assert!(
        stats.bytes_read < 8 * MIB,
        "holes are not read: read {}",
        stats.bytes_read
    );
    assert_qemu_same(&out, "vhdx", &src, "raw");
}

/// base ◄ v1 ◄ v2 ◄ v3 with overlapping writes, and zeros in v2 over data of base and v1.
fn three_version_chain(dir: &Path) -> (PathBuf, PathBuf) {
    let base = dir.join("base.vhdx");
    let vs: Vec<PathBuf> = (1..=3)
        .map(|i| dir.join(format!("base.v{i}.avhdx")))
        .collect();
    new_vhdx(&base, 20 * MIB, 1 << 20);
    apply(&base, &[Op::Write(0, pattern(8 * MIB as usize, 1))]);
    disk::version::new_version(&base, &vs[0]).unwrap();
    apply(
        &vs[0],
        &[
            Op::Write(2 * MIB, pattern(2 * MIB as usize, 2)),
            Op::Write(12 * MIB, pattern(4096, 3)),
        ],
    );
    disk::version::new_version(&vs[0], &vs[1]).unwrap();
    apply(
        &vs[1],
        &[
            Op::Zero(MIB, 2 * MIB),
            Op::Write(3 * MIB + 512, pattern(1024, 4)),
            Op::Zero(12 * MIB, 4096),
        ],
    );
    disk::version::new_version(&vs[1], &vs[2]).unwrap();
    apply(
        &vs[2],
        &[
            Op::Write(MIB + 4096, pattern(4096, 5)),
            Op::Write(15 * MIB, pattern(MIB as usize, 6)),
        ],
    );
    (base, vs[2].clone())
}

#[test]
fn merge_base_equals_the_chain_and_stands_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (_, top) = three_version_chain(dir.path());
    let want = read_all(&top);
    let out = dir.path().join("merged.vhdx");
    merge_base(&top, &out, &NoProgress).unwrap();
    assert_eq!(
        open::open(&out, OpenOptions::default())
            .unwrap()
            .layers
            .len(),
        1
    );
    assert_eq!(read_all(&out), want);
    assert_eq!(read_all(&top), want, "the inputs are unchanged");
    assert_qemu_check(&out);
}

#[test]
fn merge_updates_makes_one_version_over_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let (base, top) = three_version_chain(dir.path());
    let base_guid = vhdx_image(&base).header().data_write_guid;
    let want = read_all(&top);
    let out = dir.path().join("updates.avhdx");
    merge_updates(&top, &out, &NoProgress).unwrap();
    let c = open::open(&out, OpenOptions::default()).unwrap();
    assert_eq!(c.layers.len(), 2);
    assert_eq!(c.layers[1].path, dir.path().join("base.vhdx"));
    assert_eq!(
        vhdx_image(&out).locator().unwrap().linkage(),
        Some(base_guid)
    );
    assert_eq!(read_all(&out), want);
    // Blocks 1 (v3 data over v2 zeros), 2 (v2 zeros), 3 (v2 over v1), 12 (v2 zeros over v1
    // data) and 15 (v3) come from the versions; the 15 others fall through to the base.
    // Only block 2 is zero as a whole.
    let states = block_states(&out);
    assert_eq!(
        states
            .iter()
            .filter(|&&s| s == bat::PAYLOAD_BLOCK_NOT_PRESENT)
            .count(),
        15
    );
    assert_eq!(states[2], bat::PAYLOAD_BLOCK_ZERO);
    assert_eq!(states[3], bat::PAYLOAD_BLOCK_FULLY_PRESENT);
    assert_eq!(states[15], bat::PAYLOAD_BLOCK_FULLY_PRESENT);
}

#[test]
fn merge_updates_of_a_base_is_an_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("a.vhdx");
    sample_vhdx(&base);
    let e = merge_updates(&base, &dir.path().join("u.avhdx"), &NoProgress).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn compact_shrinks_a_trimmed_base_and_keeps_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let (base, child) = (
        dir.path().join("base.vhdx"),
        dir.path().join("base.1.avhdx"),
    );
    new_vhdx(&base, 16 * MIB, 1 << 20);
    apply(
        &base,
        &[
            Op::Write(0, pattern(8 * MIB as usize, 7)),
            Op::Write(9 * MIB, vec![0u8; MIB as usize]),
        ],
    );
    let c = open::open(
        &base,
        OpenOptions {
            writable: true,
            format: None,
        },
    )
    .unwrap();
    c.top().trim(2 * MIB, 4 * MIB).unwrap();
    c.close().unwrap();
    drop(c);
    disk::version::new_version(&base, &child).unwrap();
    apply(&child, &[Op::Write(MIB, pattern(4096, 8))]);
    let (want_base, want_child) = (read_all(&base), read_all(&child));
    let guid = vhdx_image(&base).header().data_write_guid;
    let stats = compact(&base, &NoProgress).unwrap();
    // Blocks 0, 1, 6, 7 keep data; 2..5 were trimmed (ZERO, their file space already
    // unused) and 9 is all zero: only block 9 held space that is now dropped.
    assert_eq!(stats.blocks_dropped, 1);
    assert!(stats.file_size_after < stats.file_size_before, "{stats:?}");
    assert_eq!(
        stats.file_size_after,
        std::fs::metadata(&base).unwrap().len()
    );
    assert_eq!(vhdx_image(&base).header().data_write_guid, guid);
    assert_eq!(blocks_in_state(&base, "fully_present"), 4);
    assert_eq!(read_all(&base), want_base);
    assert_eq!(
        read_all(&child),
        want_child,
        "the child still opens and reads the same"
    );
    assert!(!dir.path().join("base.vhdx.compact.tmp").exists());
    assert_qemu_check(&base);
}

#[test]
fn compact_of_a_version_keeps_zero_blocks_that_shadow_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let (_, top) = two_level_chain(dir.path());
    // A whole block of zeros written over the parent's data in block 0: after compaction it
    // must still read as zeros (ZERO state), not fall through to the parent.
    apply(&top, &[Op::Write(0, vec![0u8; MIB as usize])]);
    let want = read_all(&top);
    let stats = compact(&top, &NoProgress).unwrap();
    assert_eq!(read_all(&top), want);
    assert_eq!(blocks_in_state(&top, "zero"), 2, "blocks 0 and 3 stay ZERO");
    assert_eq!(stats.blocks_dropped, 1);
    assert!(
        open::open(&top, OpenOptions::default())
            .unwrap()
            .layers
            .len()
            == 2
    );
}
