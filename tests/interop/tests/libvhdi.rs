//! Ferry's differencing chains (and 4 KiB-sector images, which qemu refuses) read identically
//! through libyal/libvhdi: `vhdiinfo` reports every file and its parent link, and `vhdimount`
//! exposes every layer with the bytes Ferry reads and the test's own model expects.
//!
//! vhdimount finds a parent by the file name at the end of the parent path stored in the child
//! (for VHDX, `absolute_win32_path`), in the child's directory, recursively; it then exposes
//! the base as `vhdi1` and the named image as the highest `vhdiN`.

use std::path::{Path, PathBuf};

use disk::BlockDevice;
use disk::vhdx::CreateOptions;
use interop::*;

/// Virtual size of the chain tests: 20 MiB plus three sectors, so that the last 1 MiB block is
/// partial.
fn chain_size(sector: u32) -> u64 {
    20 * MIB + 3 * u64::from(sector)
}

/// An in-memory model of a small disk.
struct Model(Vec<u8>);

impl Model {
    fn write(&mut self, dev: &dyn BlockDevice, offset: u64, data: &[u8]) {
        dev.write_at(data, offset)
            .unwrap_or_else(|e| panic!("write {} bytes at {offset:#x}: {e}", data.len()));
        self.0[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    fn zero(&mut self, dev: &dyn BlockDevice, offset: u64, len: u64) {
        dev.write_zeroes(offset, len)
            .unwrap_or_else(|e| panic!("write_zeroes {len} at {offset:#x}: {e}"));
        self.0[offset as usize..(offset + len) as usize].fill(0);
    }
}

fn vhdx_data_write_guid(path: &Path) -> vhdx::Guid {
    vhdx_header(path).data_write_guid
}

/// The base's writes: data in the first blocks, a fully written block that is then zeroed
/// whole (ZERO state), and the partial last block up to the last sector.
fn write_base(dev: &dyn BlockDevice, m: &mut Model, sector: u64) {
    m.write(dev, 0, &pattern(6 * MIB as usize, 100));
    m.write(dev, 10 * MIB, &pattern(MIB as usize, 101));
    m.zero(dev, 10 * MIB, MIB);
    let size = m.0.len() as u64;
    m.write(dev, size - 5 * sector, &pattern(5 * sector as usize, 102));
}

/// Version `k`'s writes: each leaves blocks PARTIALLY_PRESENT with a few sector bits set.
///
/// * one sector in a block the chain never wrote (bits in an otherwise empty block);
/// * a sub-sector write at an odd offset (read-modify-write of the parent's sector);
/// * a write straddling a block boundary inside the parent's data;
/// * a whole block (FULLY_PRESENT in the child);
/// * a partial write_zeroes over the parent's data (zeros stored in the child);
/// * one sector over the base's ZERO block;
/// * the last sector of the disk (in the partial last block).
fn write_version(dev: &dyn BlockDevice, m: &mut Model, sector: u64, k: u64) {
    let seed = 1000 * k;
    m.write(
        dev,
        (12 + k) * MIB + 3 * sector,
        &pattern(sector as usize, seed + 1),
    );
    m.write(dev, k * MIB + 1000 + 77 * k, &pattern(100, seed + 2));
    m.write(
        dev,
        (2 + k) * MIB - 3 * sector,
        &pattern(6 * sector as usize, seed + 3),
    );
    if k == 1 {
        m.write(dev, 7 * MIB, &pattern(MIB as usize, seed + 4));
    }
    m.zero(dev, 4 * MIB + 7 * sector * k + 11, 5 * sector + 100);
    m.write(
        dev,
        10 * MIB + k * sector,
        &pattern(sector as usize, seed + 6),
    );
    let size = m.0.len() as u64;
    m.write(dev, size - sector, &pattern(sector as usize, seed + 5));
}

/// Builds base + `versions` differencing versions with `sector`-byte logical sectors.
/// Returns the files (base first) and the expected content of each.
fn build_chain(dir: &Path, sector: u32, versions: u64) -> (Vec<PathBuf>, Vec<Vec<u8>>) {
    let size = chain_size(sector);
    let ss = u64::from(sector);
    let base = dir.join("base.vhdx");
    let opts = CreateOptions {
        logical_sector_size: sector,
        ..dynamic(size, 1 << 20)
    };
    create_vhdx(&base, &opts);
    let mut m = Model(vec![0u8; size as usize]);
    session(&base, |d| write_base(d, &mut m, ss));
    let mut files = vec![base];
    let mut models = vec![m.0.clone()];
    for k in 1..=versions {
        let child = dir.join(format!("v{k}.avhdx"));
        disk::version::new_version(files.last().unwrap(), &child).unwrap();
        session(&child, |d| write_version(d, &mut m, ss, k));
        files.push(child);
        models.push(m.0.clone());
    }
    (files, models)
}

/// The field `name` of vhdiinfo's output (`\tName\t\t: value`).
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim())
    })
}

fn check_chain(sector: u32, versions: u64) {
    if !require_all(&["vhdiinfo"]) || !require_vhdimount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (files, models) = build_chain(dir.path(), sector, versions);
    let size = chain_size(sector);

    // Ferry reads every layer as modelled.
    for (file, model) in files.iter().zip(&models) {
        let chain = open_ro(file);
        assert_device_eq_bytes(
            chain.top().as_ref(),
            model,
            &format!("model of {}", file.display()),
        );
    }

    // vhdiinfo: format, size, sector size, identity and parent link of every file.
    for (i, file) in files.iter().enumerate() {
        let info = vhdiinfo(file);
        let field =
            |name| info_field(&info, name).unwrap_or_else(|| panic!("no {name:?} in:\n{info}"));
        assert_eq!(field("Format"), "VHDX (version 2)", "{info}");
        assert_eq!(
            field("Media size"),
            format!("{} MiB ({size} bytes)", size >> 20),
            "{info}"
        );
        assert_eq!(
            field("Bytes per sector"),
            format!("{sector} bytes"),
            "{info}"
        );
        assert_eq!(
            field("Identifier"),
            vhdx_data_write_guid(file).to_string(),
            "{info}"
        );
        if i == 0 {
            assert_eq!(field("Disk type"), "Dynamic", "{info}");
            assert_eq!(info_field(&info, "Parent identifier"), None, "{info}");
        } else {
            let parent = &files[i - 1];
            assert_eq!(field("Disk type"), "Differential", "{info}");
            assert_eq!(
                field("Parent identifier"),
                vhdx_data_write_guid(parent).to_string(),
                "{info}"
            );
            let name = parent.file_name().unwrap().to_str().unwrap();
            let parent_filename = field("Parent filename");
            assert!(
                parent_filename.ends_with(&format!("\\{name}")),
                "{parent_filename:?} names {name}"
            );
        }
    }

    // vhdimount of the top: every layer, base first, equals Ferry's read and the model.
    let top = files.last().unwrap();
    let mount = VhdiMount::new(top);
    let layers = mount.layers();
    assert_eq!(
        layers.len(),
        files.len(),
        "vhdimount layers of {}",
        top.display()
    );
    for ((exposed, file), model) in layers.iter().zip(&files).zip(&models) {
        let what = format!("libvhdi's {} for {}", exposed.display(), file.display());
        assert_file_eq_bytes(exposed, model, &what);
        let chain = open_ro(file);
        assert_device_eq_file(chain.top().as_ref(), exposed);
    }
}

#[test]
fn chain_base_plus_one_512_byte_sectors() {
    check_chain(512, 1);
}

#[test]
fn chain_base_plus_three_512_byte_sectors() {
    check_chain(512, 3);
}

#[test]
fn chain_base_plus_one_4096_byte_sectors() {
    check_chain(4096, 1);
}

#[test]
fn chain_base_plus_three_4096_byte_sectors() {
    check_chain(4096, 3);
}

/// A base VHDX with 4 KiB logical sectors (qemu cannot open those): unaligned writes,
/// write_zeroes, a trimmed block and a partial last block read the same through libvhdi.
#[test]
fn base_with_4096_byte_sectors_reads_the_same() {
    if !require("vhdiinfo") || !require_vhdimount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base4k.vhdx");
    let size = 10 * MIB + 5 * 4096;
    let opts = CreateOptions {
        logical_sector_size: 4096,
        physical_sector_size: 4096,
        ..dynamic(size, 2 << 20)
    };
    create_vhdx(&path, &opts);
    let mut m = Model(vec![0u8; size as usize]);
    session(&path, |d| {
        m.write(d, 0, &pattern(3 * MIB as usize, 1));
        m.write(d, 2 * MIB - 100, &pattern(300, 2));
        m.write(d, 5 * MIB + 123, &pattern(9000, 3));
        m.zero(d, 512, 8192);
        // A whole 2 MiB block written then trimmed: Ferry documents trim as zeroing a
        // non-differencing image (the block becomes PAYLOAD_BLOCK_ZERO).
        m.write(d, 6 * MIB, &pattern(2 * MIB as usize, 4));
        d.trim(6 * MIB, 2 * MIB).unwrap();
        m.0[(6 * MIB) as usize..(8 * MIB) as usize].fill(0);
        m.write(d, size - 4096 - 10, &pattern(4106, 5));
    });
    let chain = open_ro(&path);
    assert_device_eq_bytes(chain.top().as_ref(), &m.0, "model");
    let info = vhdiinfo(&path);
    assert_eq!(
        info_field(&info, "Bytes per sector"),
        Some("4096 bytes"),
        "{info}"
    );
    assert_eq!(info_field(&info, "Disk type"), Some("Dynamic"), "{info}");
    let mount = VhdiMount::new(&path);
    assert_eq!(mount.layers().len(), 1);
    assert_file_eq_bytes(&mount.top(), &m.0, "libvhdi's view");
}

/// A whole block zeroed in a differencing child is PAYLOAD_BLOCK_ZERO, which reads as zeros
/// and does not fall through to the parent (MS-VHDX 2.5.1.1; notes A.6). Ferry does so.
/// libvhdi 20210425 reads such a block through the sector bitmap, i.e. from the parent (it
/// treats only state 6 as "whole block here"), so this cross-check fails on that version: a
/// libvhdi bug, not Ferry's. A partial write in the same chunk makes the sector bitmap block
/// present, so that only the ZERO block is at stake here.
#[test]
#[ignore = "libvhdi 20210425 bug: reads a PAYLOAD_BLOCK_ZERO block of a differencing VHDX from the parent"]
fn zeroed_block_in_child_reads_as_zeros_through_libvhdi() {
    if !require_vhdimount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.vhdx");
    let child = dir.path().join("child.avhdx");
    let size = 8 * MIB;
    create_vhdx(&base, &dynamic(size, 1 << 20));
    let mut m = Model(vec![0u8; size as usize]);
    session(&base, |d| m.write(d, 0, &pattern(4 * MIB as usize, 1)));
    disk::version::new_version(&base, &child).unwrap();
    session(&child, |d| {
        m.write(d, 512, &pattern(512, 2));
        m.zero(d, 2 * MIB, MIB);
    });
    assert_device_eq_bytes(open_ro(&child).top().as_ref(), &m.0, "model");
    let mount = VhdiMount::new(&child);
    assert_file_eq_bytes(&mount.top(), &m.0, "libvhdi's view");
}

/// A new, empty version must read exactly as its parent through libvhdi too. libvhdi 20210425
/// takes the bitmap of an absent SB block from FileOffsetMB 0 (the file identifier), so Ferry
/// gives every chunk of a differencing image a zero sector bitmap block at creation
/// (`disk::vhdx::create`); this test keeps that accommodation honest.
#[test]
fn empty_version_reads_as_its_parent_through_libvhdi() {
    if !require_vhdimount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.vhdx");
    let child = dir.path().join("child.avhdx");
    let size = 8 * MIB;
    create_vhdx(&base, &dynamic(size, 1 << 20));
    let mut m = Model(vec![0u8; size as usize]);
    session(&base, |d| m.write(d, 0, &pattern(4 * MIB as usize, 1)));
    disk::version::new_version(&base, &child).unwrap();
    assert_device_eq_bytes(open_ro(&child).top().as_ref(), &m.0, "model");
    let mount = VhdiMount::new(&child);
    assert_file_eq_bytes(&mount.top(), &m.0, "libvhdi's view");
}
