//! Images Ferry writes pass `qemu-img check` and `qemu-img compare -f vhdx -F raw` against the
//! expected content, which each test builds itself as a sparse raw file (a [`RawModel`]).

use std::path::Path;

use disk::BlockDevice;
use disk::open::Image;
use disk::vhdx::CreateOptions;
use interop::*;
use vhdx::bat;

/// Checks a closed Ferry image with qemu: `check` is clean, `info` agrees on the virtual size
/// and block size, `compare` against the model finds no difference; and Ferry itself reads
/// the model back after a fresh open.
fn assert_qemu_accepts(path: &Path, model: &RawModel, block_size: u32) {
    assert_qemu_check_clean(path);
    let info = qemu_info(&["-f", "vhdx"], path);
    assert_eq!(info["virtual-size"].as_u64(), Some(model.size()), "{info}");
    assert_eq!(
        info["cluster-size"].as_u64(),
        Some(u64::from(block_size)),
        "{info}"
    );
    assert_qemu_compare(path, model.path());
    let chain = open_ro(path);
    assert!(
        chain.top().warnings().is_empty(),
        "{:?}",
        chain.top().warnings()
    );
    assert_device_eq_model(chain.top().as_ref(), model);
}

/// Writes of one session at places that matter for block `bs` on a disk of `size`: the first
/// sector, an unaligned write across the first block boundary, a small write at an odd offset,
/// a whole block, a write spanning three blocks, and the last sector.
fn typical_writes(dev: &dyn BlockDevice, model: &RawModel, bs: u64, seed: u64) {
    let size = model.size();
    let blocks = size.div_ceil(bs);
    write_both(dev, model, 0, &pattern(512, seed));
    write_both(dev, model, bs - 700, &pattern(1500, seed + 1));
    if blocks > 2 {
        write_both(dev, model, 2 * bs + 12_345, &pattern(777, seed + 2));
    }
    if blocks > 4 && bs <= 32 * MIB {
        write_both(dev, model, 3 * bs, &pattern(bs as usize, seed + 3));
        write_both(
            dev,
            model,
            4 * bs - 4096,
            &pattern(4096 + 2 * bs as usize + 512, seed + 4),
        );
    }
    write_both(dev, model, size - 512, &pattern(512, seed + 5));
}

fn check_dynamic(size: u64, block_size: u32) {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.vhdx");
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, block_size));
    session(&path, |d| {
        typical_writes(d, &model, u64::from(block_size), 1)
    });
    assert_qemu_accepts(&path, &model, block_size);
}

/// The oracle discriminates: one byte off in the expected raw file makes `qemu-img compare`
/// fail (so a passing compare means something).
#[test]
fn qemu_compare_detects_a_one_byte_difference() {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.vhdx");
    let size = 8 * MIB;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, 1 << 20));
    session(&path, |d| write_both(d, &model, MIB, &pattern(4096, 1)));
    assert_qemu_compare(&path, model.path());
    let b = model.read(MIB + 4095, 1)[0];
    model.write(MIB + 4095, &[b ^ 1]);
    let out = qemu_img_output(&[
        "compare".as_ref(),
        "-f".as_ref(),
        "vhdx".as_ref(),
        "-F".as_ref(),
        "raw".as_ref(),
        path.as_os_str(),
        model.path().as_os_str(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn dynamic_1m_blocks() {
    check_dynamic(40 * MIB, 1 << 20);
}

#[test]
fn dynamic_2m_blocks() {
    check_dynamic(40 * MIB, 2 << 20);
}

#[test]
fn dynamic_32m_blocks() {
    check_dynamic(200 * MIB, 32 << 20);
}

/// The largest block size: every touched block is a sparse 256 MiB extent of the file.
#[test]
fn dynamic_256m_blocks() {
    check_dynamic(600 * MIB, 256 << 20);
}

/// A virtual size that is not a multiple of the block size: the last block is partial, and its
/// last sector is written.
#[test]
fn dynamic_partial_last_block() {
    check_dynamic(37 * MIB + 5 * 512, 2 << 20);
}

/// Fixed (every block allocated up front, LeaveBlocksAllocated).
#[test]
fn fixed() {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fixed.vhdx");
    let size = 24 * MIB + 4096;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(
        &path,
        &CreateOptions {
            fixed: true,
            ..dynamic(size, 2 << 20)
        },
    );
    // Freshly created: qemu accepts it and it reads as zeros.
    assert_qemu_accepts(&path, &model, 2 << 20);
    session(&path, |d| {
        typical_writes(d, &model, 2 * MIB, 10);
        // A whole block zeroed stays allocated in a fixed image.
        d.write_zeroes(4 * MIB, 2 * MIB).unwrap();
        model.zero(4 * MIB, 2 * MIB);
    });
    assert_qemu_accepts(&path, &model, 2 << 20);
    let chain = open_ro(&path);
    let Image::Vhdx(img) = &chain.layers[0].image else {
        panic!("not vhdx")
    };
    let layout = img.layout();
    for block in 0..layout.data_blocks() {
        let e = img.bat()[layout.payload_index(block) as usize];
        assert_eq!(
            e.state(),
            bat::PAYLOAD_BLOCK_FULLY_PRESENT,
            "block {block} of a fixed image"
        );
    }
}

/// 1 MiB blocks with 512-byte sectors: a chunk covers 4096 blocks = 4 GiB, so on a 6 GiB disk
/// BAT index 4096 is the first sector-bitmap entry and payload block 4096 sits at index 4097.
/// Writes around the 4 GiB boundary exercise the interleave in Ferry's writer and qemu's reader.
#[test]
fn dynamic_larger_than_one_chunk() {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.vhdx");
    let size = 6 * GIB;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, 1 << 20));
    session(&path, |d| {
        write_both(d, &model, 0, &pattern(4096, 1));
        write_both(
            d,
            &model,
            4 * GIB - MIB - 512,
            &pattern(2 * MIB as usize + 1024, 2),
        );
        write_both(d, &model, 5 * GIB + 3, &pattern(1000, 3));
        write_both(d, &model, size - 4096, &pattern(4096, 4));
    });
    let chain = open_ro(&path);
    let Image::Vhdx(img) = &chain.layers[0].image else {
        panic!("not vhdx")
    };
    let layout = img.layout();
    let entries = img.bat();
    assert_eq!(layout.chunk_ratio(), 4096);
    assert_eq!(layout.payload_index(4096), 4097);
    assert!(bat::is_bitmap_index(&layout, 4096));
    assert_eq!(
        entries[4096].state(),
        bat::SB_BLOCK_NOT_PRESENT,
        "the sector bitmap entry of chunk 0"
    );
    for block in [4095u64, 4096, 4097, 5120, 6143] {
        let e = entries[layout.payload_index(block) as usize];
        assert_eq!(
            e.state(),
            bat::PAYLOAD_BLOCK_FULLY_PRESENT,
            "payload block {block}"
        );
    }
    drop(chain);
    assert_qemu_accepts(&path, &model, 1 << 20);
}

/// Trims and write_zeroes: whole blocks (which become PAYLOAD_BLOCK_ZERO), parts of blocks,
/// unaligned ranges (write_zeroes zeroes exactly its bytes), across block boundaries, and over
/// never-written blocks. A trim of a non-differencing image zeroes the sectors it covers
/// (Ferry punches the range or marks whole blocks ZERO), so the model zeroes trimmed sectors.
#[test]
fn after_trims_and_write_zeroes() {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trim.vhdx");
    let size = 48 * MIB;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, 2 << 20));
    session(&path, |d| {
        write_both(d, &model, 0, &pattern(20 * MIB as usize, 1))
    });
    session(&path, |d| {
        // Whole blocks.
        d.trim(2 * MIB, 4 * MIB).unwrap();
        model.zero(2 * MIB, 4 * MIB);
        d.write_zeroes(8 * MIB, 2 * MIB).unwrap();
        model.zero(8 * MIB, 2 * MIB);
        // Part of a block, sector aligned, across a boundary.
        d.trim(12 * MIB - 8192, 16_384).unwrap();
        model.zero(12 * MIB - 8192, 16_384);
        // Unaligned write_zeroes.
        d.write_zeroes(14 * MIB + 1000, 5000).unwrap();
        model.zero(14 * MIB + 1000, 5000);
        d.write_zeroes(16 * MIB - 100, 200).unwrap();
        model.zero(16 * MIB - 100, 200);
        // Never-written blocks.
        d.trim(30 * MIB, 4 * MIB).unwrap();
        d.write_zeroes(40 * MIB + 512, 3 * MIB).unwrap();
        // Data again over a trimmed block.
        write_both(d, &model, 3 * MIB + 512, &pattern(4096, 2));
    });
    assert_qemu_accepts(&path, &model, 2 << 20);
    let chain = open_ro(&path);
    let Image::Vhdx(img) = &chain.layers[0].image else {
        panic!("not vhdx")
    };
    let layout = img.layout();
    assert_eq!(
        img.bat()[layout.payload_index(4) as usize].state(),
        bat::PAYLOAD_BLOCK_ZERO,
        "block 4 (8 MiB) zeroed whole"
    );
}

/// Three write sessions on one file, each reopening it: new blocks are appended after the
/// ones of earlier sessions and old blocks are overwritten in place. qemu accepts the file
/// after every session.
#[test]
fn after_reopen_and_append_sessions() {
    if !require("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.vhdx");
    let size = 64 * MIB;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, 1 << 20));
    let mut len_before = std::fs::metadata(&path).unwrap().len();
    for s in 0..3u64 {
        session(&path, |d| {
            write_both(
                d,
                &model,
                (10 + 10 * s) * MIB + 512,
                &pattern(3 * MIB as usize, 10 * s),
            );
            write_both(d, &model, s * 4096, &pattern(4096, 10 * s + 1));
            write_both(d, &model, size - (s + 1) * 512, &pattern(512, 10 * s + 2));
        });
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(
            len > len_before,
            "session {s} allocated new blocks at the end ({len_before} -> {len})"
        );
        len_before = len;
        assert_qemu_accepts(&path, &model, 1 << 20);
    }
}

/// Mixed writers: Ferry writes, qemu-io appends blocks of its own (through its log), and Ferry
/// then appends more after qemu's blocks. Each tool reads the other's work.
#[test]
fn ferry_then_qemu_then_ferry() {
    if !require_all(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.vhdx");
    let size = 32 * MIB;
    let model = RawModel::new(&dir.path().join("expected.raw"), size);
    create_vhdx(&path, &dynamic(size, 1 << 20));
    session(&path, |d| {
        write_both(d, &model, MIB - 512, &pattern(MIB as usize, 1))
    });
    qemu_io(
        "vhdx",
        &path,
        &[
            "write -P 0x5a 5M 2M".into(),
            "write -P 0xa5 1000 2000".into(),
        ],
    );
    model.write(5 * MIB, &[0x5a; 2 << 20]);
    model.write(1000, &[0xa5; 2000]);
    assert_qemu_accepts(&path, &model, 1 << 20);
    session(&path, |d| {
        write_both(d, &model, 9 * MIB + 7, &pattern(MIB as usize, 2));
        write_both(d, &model, 6 * MIB - 256, &pattern(512, 3));
    });
    assert_qemu_accepts(&path, &model, 1 << 20);
}
