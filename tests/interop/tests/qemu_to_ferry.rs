//! Images written by qemu-img/qemu-io read identically in Ferry: `open::open(..).top()` over
//! the whole disk equals `qemu-img convert -O raw` byte for byte, the geometry matches
//! `qemu-img info`, and every range qemu-io wrote reads back with its pattern.
//!
//! (A qemu-written VHDX with a dirty log is hard to make on purpose; the dirty-log sample in
//! the vectors covers replay, see vectors.rs.)

use std::path::{Path, PathBuf};

use disk::BlockDevice;
use interop::*;

/// One qemu-io write.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `write -P byte offset len`
    Fill(u8, u64, u64),
    /// `write -z offset len`
    Zero(u64, u64),
}

impl Op {
    fn command(self) -> String {
        match self {
            Op::Fill(b, off, len) => format!("write -P {b:#x} {off} {len}"),
            Op::Zero(off, len) => format!("write -z {off} {len}"),
        }
    }
}

/// Writes with qemu-io, then checks that the ranges still visible after the later writes read
/// with their byte in Ferry. Ops are applied in order; only the final state is checked, so
/// each checked range is the part of an op that no later op overwrote.
fn assert_ops_visible(dev: &dyn BlockDevice, ops: &[Op]) {
    for (i, op) in ops.iter().enumerate() {
        let (byte, off, len) = match *op {
            Op::Fill(b, off, len) => (b, off, len),
            Op::Zero(off, len) => (0, off, len),
        };
        // Sub-ranges of this op not covered by a later op.
        let mut ranges = vec![(off, off + len)];
        for later in &ops[i + 1..] {
            let (lo, hi) = match *later {
                Op::Fill(_, o, l) | Op::Zero(o, l) => (o, o + l),
            };
            ranges = ranges
                .into_iter()
                .flat_map(|(a, b)| {
                    let mut v = Vec::new();
                    if a < lo.min(b) {
                        v.push((a, lo.min(b)));
                    }
                    if hi.max(a) < b {
                        v.push((hi.max(a), b));
                    }
                    v
                })
                .collect();
        }
        for (a, b) in ranges {
            assert!(
                device_all(dev, a, b - a, byte),
                "{op:?}: [{a:#x}, {b:#x}) does not read {byte:#04x}"
            );
        }
    }
}

fn qemu_write(fmt: &str, path: &Path, ops: &[Op]) {
    let cmds: Vec<String> = ops.iter().map(|o| o.command()).collect();
    qemu_io(fmt, path, &cmds);
}

/// `qemu-img convert -O raw` of `source` (given as `-f FMT FILE` or `--image-opts SPEC`).
fn qemu_raw(source: &[&str], out: &Path) -> PathBuf {
    let mut args: Vec<&std::ffi::OsStr> = vec!["convert".as_ref()];
    args.extend(source.iter().map(|s| std::ffi::OsStr::new(*s)));
    args.extend(["-O".as_ref(), "raw".as_ref(), out.as_os_str()]);
    qemu_img(&args);
    out.to_path_buf()
}

/// Creates a VHDX with `qemu-img create -f vhdx -o OPTS`, writes `ops` with qemu-io, and
/// checks Ferry against qemu's raw conversion.
fn check_vhdx(opts: &str, size: u64, ops: &[Op]) {
    if !require_all(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qemu.vhdx");
    let mut create: Vec<String> = vec!["create".into(), "-f".into(), "vhdx".into()];
    if !opts.is_empty() {
        create.extend(["-o".into(), opts.into()]);
    }
    create.extend([path.display().to_string(), size.to_string()]);
    qemu_img(&create);
    qemu_write("vhdx", &path, ops);
    assert_qemu_check_clean(&path);
    let info = qemu_info(&["-f", "vhdx"], &path);
    let raw = qemu_raw(
        &["-f", "vhdx", path.to_str().unwrap()],
        &dir.path().join("qemu.raw"),
    );

    let chain = open_ro(&path);
    let dev = chain.top();
    assert!(dev.warnings().is_empty(), "{:?}", dev.warnings());
    let g = dev.geometry();
    assert_eq!(g.size, size);
    assert_eq!(Some(g.size), info["virtual-size"].as_u64(), "{info}");
    assert_eq!(
        Some(u64::from(g.block_size)),
        info["cluster-size"].as_u64(),
        "{info}"
    );
    assert_eq!(g.logical_sector_size, 512);
    assert_ops_visible(dev.as_ref(), ops);
    assert_device_eq_file(dev.as_ref(), &raw);
}

/// Writes at several offsets: the first sector, across a block boundary (unaligned), inside a
/// block at an odd offset, a range then partly zeroed with `write -z`, a whole zeroed block,
/// and the last sector of the disk.
fn ops_for(block: u64, size: u64) -> Vec<Op> {
    vec![
        Op::Fill(0x11, 0, 4096),
        Op::Fill(0x22, block - 512, 1024),
        Op::Fill(0x33, 2 * block - 777, 3 * block / 2 + 1000),
        Op::Fill(0x44, 4 * block + 100, 3000),
        Op::Fill(0x55, 5 * block, 2 * block),
        Op::Zero(5 * block + 4096, 8192),
        Op::Zero(6 * block, block),
        Op::Fill(0x66, size - 512, 512),
    ]
}

#[test]
fn vhdx_dynamic_1m_blocks() {
    let size = 64 * MIB;
    check_vhdx("block_size=1M", size, &ops_for(MIB, size));
}

/// 8 MiB blocks and a size that is not a multiple of them (the last block is partial).
#[test]
fn vhdx_dynamic_8m_blocks_partial_last_block() {
    let size = 100 * MIB + 7 * 512;
    check_vhdx("block_size=8M", size, &ops_for(8 * MIB, size));
}

/// qemu picks the block size itself; Ferry must report the same one and read the same bytes.
#[test]
fn vhdx_dynamic_default_block_size() {
    let size = 300 * MIB;
    let mut ops = ops_for(32 * MIB, size);
    ops.push(Op::Fill(0x77, 100 * MIB - 3, 7));
    check_vhdx("", size, &ops);
}

#[test]
fn vhdx_fixed() {
    let size = 24 * MIB;
    check_vhdx(
        "subformat=fixed,block_size=2M",
        size,
        &ops_for(2 * MIB, size),
    );
}

/// A 4 MiB log (not Ferry's 1 MiB) with 2 MiB blocks.
#[test]
fn vhdx_with_4m_log() {
    let size = 40 * MIB;
    check_vhdx("log_size=4M,block_size=2M", size, &ops_for(2 * MIB, size));
}

/// `block_state_zero=off`: new blocks start NOT_PRESENT rather than ZERO.
#[test]
fn vhdx_block_state_zero_off() {
    let size = 32 * MIB;
    check_vhdx(
        "block_state_zero=off,block_size=1M",
        size,
        &ops_for(MIB, size),
    );
}

/// 1 MiB blocks with 512-byte sectors give a chunk of 4 GiB: past it the BAT interleaves a
/// sector-bitmap entry (index 4096), so qemu's blocks from 4 GiB on sit at index block + 1.
#[test]
fn vhdx_larger_than_one_chunk() {
    let size = 4 * GIB + 64 * MIB;
    let ops = vec![
        Op::Fill(0x11, 0, MIB),
        Op::Fill(0x22, 4 * GIB - 3 * MIB / 2, 3 * MIB),
        Op::Fill(0x33, 4 * GIB + 5 * MIB + 512, 4096),
        Op::Fill(0x44, size - 4096, 4096),
    ];
    check_vhdx("block_size=1M", size, &ops);
}

/// Creates a VHD with qemu-img (`-o OPTS`), writes with qemu-io, and compares Ferry with the
/// raw conversion made with `force_size_calc=current_size` or the default size rule, as given.
fn check_vpc(opts: &str, size: u64, expected_size: u64, ops: &[Op], size_calc: Option<&str>) {
    if !require_all(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qemu.vhd");
    qemu_img(&[
        "create",
        "-f",
        "vpc",
        "-o",
        opts,
        path.to_str().unwrap(),
        &size.to_string(),
    ]);
    qemu_write("vpc", &path, ops);
    let spec = match size_calc {
        Some(calc) => format!(
            "driver=vpc,force_size_calc={calc},file.filename={}",
            path.display()
        ),
        None => format!("driver=vpc,file.filename={}", path.display()),
    };
    let raw = qemu_raw(&["--image-opts", &spec], &dir.path().join("qemu.raw"));

    let chain = open_ro(&path);
    let dev = chain.top();
    assert_eq!(dev.format(), "vhd");
    assert_eq!(dev.size(), expected_size);
    assert_ops_visible(dev.as_ref(), ops);
    assert_device_eq_file(dev.as_ref(), &raw);
}

/// `force_size=on` keeps the exact size and makes qemu write creator "qem2", which sizes by
/// CurrentSize (as Ferry's size rule says).
#[test]
fn vpc_dynamic_force_size() {
    let size = 50 * MIB + 512;
    check_vpc(
        "subformat=dynamic,force_size=on",
        size,
        size,
        &ops_for(2 * MIB, size),
        Some("current_size"),
    );
}

#[test]
fn vpc_fixed_force_size() {
    let size = 30 * MIB;
    check_vpc(
        "subformat=fixed,force_size=on",
        size,
        size,
        &ops_for(2 * MIB, size),
        Some("current_size"),
    );
}

/// Without `force_size` qemu rounds the size up to the first CHS geometry that holds it
/// (1004/6/17 = 102408 sectors = 52432896 bytes), stores that as CurrentSize as well, and
/// writes creator "qemu" (sized by CHS under Ferry's rule): both read 52432896 bytes.
#[test]
fn vpc_dynamic_chs_sized() {
    if !require("qemu-img") {
        return;
    }
    let asked = 50 * MIB;
    let chs_size = 52_432_896;
    check_vpc(
        "subformat=dynamic",
        asked,
        chs_size,
        &ops_for(2 * MIB, chs_size),
        None,
    );
}
