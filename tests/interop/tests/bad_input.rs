//! Damaged and hostile inputs are refused with a clear error (the right ErrorKind, and a
//! message naming the structure or offset at fault), and never panic.
//!
//! Every edited image is closed cleanly first (no dirty log), so that the edit is what the
//! opener sees. BAT edits find the BAT through the region table at 192 KiB.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use disk::open::{self, Format, OpenOptions};
use disk::vhdx::{OpenOptions as VhdxOpenOptions, VhdxImage};
use disk::{BlockDevice, ErrorKind};
use interop::*;
use vhdx::bat::{self, Entry};
use vhdx::metadata::FILE_PARAMETERS;
use vhdx::region::{REGION_TABLE_LEN, RegionTable};

const SIZE: u64 = 16 * MIB;

/// A closed 16 MiB dynamic image with 1 MiB blocks: blocks 0-2 and 9 written. Returns the
/// path and the expected content.
fn good_image(dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
    let path = dir.join(name);
    create_vhdx(&path, &dynamic(SIZE, 1 << 20));
    let mut model = vec![0u8; SIZE as usize];
    session(&path, |d| {
        for (off, len, seed) in [(0, 3 * MIB, 1), (9 * MIB + 512, 4096, 2)] {
            let data = pattern(len as usize, seed);
            d.write_at(&data, off).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
    });
    (path, model)
}

fn region_table(path: &Path) -> RegionTable {
    RegionTable::parse(&read_file_at(path, vhdx::REGION1_OFFSET, REGION_TABLE_LEN)).unwrap()
}

fn bat_entry(path: &Path, index: u64) -> Entry {
    let at = region_table(path).bat.offset + 8 * index;
    Entry(u64::from_le_bytes(
        read_file_at(path, at, 8).try_into().unwrap(),
    ))
}

fn set_bat_entry(path: &Path, index: u64, e: Entry) {
    let at = region_table(path).bat.offset + 8 * index;
    patch_file(path, at, &e.0.to_le_bytes());
}

/// Reads the whole device; returns the first error.
fn read_all(dev: &dyn BlockDevice) -> disk::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0;
    while pos < dev.size() {
        let n = (dev.size() - pos).min(CHUNK as u64) as usize;
        dev.read_at(&mut buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

// ---- truncation ----------------------------------------------------------------------------

#[test]
fn vhdx_cut_at_100_kib_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "cut.vhdx");
    truncate_file(&path, 100 << 10);
    assert_error(
        &open_err(&path),
        ErrorKind::InvalidFormat,
        &["102400", "too short"],
    );
}

/// Cut inside the BAT region, after the entries: the entries point at blocks past the end.
#[test]
fn vhdx_cut_inside_the_bat_region_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "cut.vhdx");
    let bat_at = region_table(&path).bat.offset;
    let first = bat_entry(&path, 0).file_offset();
    truncate_file(&path, bat_at + 4096);
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::Corrupt,
        &["bat entry 0", &format!("{first:#x}"), "past the end"],
    );
}

/// Cut at the start of the BAT region: the whole BAT (and every block) is gone, yet the
/// file's metadata still describes a 16 MiB disk with a BAT at 3 MiB. Ferry opens it as an
/// empty disk (the missing BAT reads as zeros, i.e. NOT_PRESENT), silently losing the data.
/// Expected: refused, naming the BAT region that lies past the end of the file.
#[test]
fn vhdx_cut_at_the_bat_region_start_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "cut.vhdx");
    let bat_at = region_table(&path).bat.offset;
    truncate_file(&path, bat_at);
    assert_error(
        &open_err(&path),
        ErrorKind::Corrupt,
        &["bat", &format!("{bat_at:#x}")],
    );
}

/// Cut exactly where the last block starts: its BAT entry points at the end of the file.
#[test]
fn vhdx_cut_before_a_blocks_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "cut.vhdx");
    let last = bat_entry(&path, 9).file_offset();
    assert_eq!(
        bat_entry(&path, 9).state(),
        bat::PAYLOAD_BLOCK_FULLY_PRESENT
    );
    truncate_file(&path, last);
    assert_error(
        &open_err(&path),
        ErrorKind::Corrupt,
        &["bat entry 9", &format!("{last:#x}"), "past the end"],
    );
}

/// Cut in the middle of a block's data (the block starts inside the file, ends past it).
/// qemu refuses such files ("points after end of file ... probably been truncated"). Ferry
/// checks only where a block starts: it opens the file and serves the missing half as zeros.
/// Expected: the open is refused (or the read of the missing half fails), never zeros.
#[test]
fn vhdx_cut_inside_a_blocks_data_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "cut.vhdx");
    let last = bat_entry(&path, 9).file_offset();
    truncate_file(&path, last + MIB / 2);
    match open::open(&path, OpenOptions::default()) {
        Err(e) => assert_error(&e, ErrorKind::Corrupt, &["bat entry 9"]),
        Ok(chain) => {
            let mut buf = vec![0u8; 4096];
            let r = chain.top().read_at(&mut buf, 9 * MIB + MIB / 2 + 4096);
            assert!(
                r.is_err(),
                "read of the truncated half of block 9 returned {:?}",
                &buf[..8]
            );
        }
    }
}

/// Truncation anywhere never panics: every 64 KiB cut point, open and read everything.
#[test]
fn vhdx_truncated_anywhere_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "good.vhdx");
    let bytes = std::fs::read(&path).unwrap();
    let mut refused = 0;
    for cut in (0..bytes.len()).step_by(64 << 10) {
        let storage = Arc::new(MemStorage::new(bytes[..cut].to_vec()));
        match VhdxImage::open(storage, VhdxOpenOptions::default()) {
            Ok(img) => {
                let _ = read_all(&img);
            }
            Err(e) => {
                assert!(!message(&e).is_empty());
                refused += 1;
            }
        }
    }
    assert!(
        refused >= 5,
        "at least the cuts below 320 KiB are refused ({refused})"
    );
}

/// A truncated dynamic VHD (the footer at the end is lost; the copy at offset 0 is used):
/// reading a block whose data lies past the end fails with Corrupt, not zeros.
#[test]
fn vhd_cut_before_a_blocks_data_errors_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ext2.vhd");
    std::fs::copy(vector("dfvfs-ext2.vhd"), &path).unwrap();
    truncate_file(&path, MIB);
    let chain = open_ro(&path);
    let dev = chain.top();
    assert!(
        dev.warnings()
            .iter()
            .any(|w| w.contains("copy at offset 0")),
        "{:?}",
        dev.warnings()
    );
    let mut buf = vec![0u8; 4096];
    let e = dev.read_at(&mut buf, MIB).unwrap_err();
    assert_error(&e, ErrorKind::Corrupt, &["data of block 0", "past the end"]);
}

// ---- headers and region tables -------------------------------------------------------------

fn current_header_offset(path: &Path) -> u64 {
    let h1 = vhdx::header::Header::parse(&read_file_at(path, vhdx::HEADER1_OFFSET, 4096)).unwrap();
    let h2 = vhdx::header::Header::parse(&read_file_at(path, vhdx::HEADER2_OFFSET, 4096)).unwrap();
    if h1.sequence_number > h2.sequence_number {
        vhdx::HEADER1_OFFSET
    } else {
        vhdx::HEADER2_OFFSET
    }
}

/// A flipped byte in the current header: the other copy is used, with a warning, and the
/// content is intact; the same holds when the older copy is the damaged one.
#[test]
fn one_bad_header_checksum_opens_from_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let (path, model) = good_image(dir.path(), "h.vhdx");
    let current = current_header_offset(&path);
    let seq = vhdx_header(&path).sequence_number;
    for (which, at) in [
        ("current", current),
        (
            "older",
            vhdx::HEADER1_OFFSET + vhdx::HEADER2_OFFSET - current,
        ),
    ] {
        let copy = dir.path().join(format!("{which}.vhdx"));
        std::fs::copy(&path, &copy).unwrap();
        let b = read_file_at(&copy, at + 100, 1)[0];
        patch_file(&copy, at + 100, &[b ^ 0x40]);
        let chain = open_ro(&copy);
        let dev = chain.top();
        let warnings = dev.warnings().join("\n");
        assert!(
            warnings.contains("one header copy is invalid"),
            "{which}: {warnings}"
        );
        let used = vhdx_header(&copy).sequence_number;
        assert_eq!(
            used,
            if which == "current" { seq - 1 } else { seq },
            "{which}"
        );
        assert_device_eq_bytes(dev.as_ref(), &model, which);
        if require("qemu-img") {
            assert_qemu_check_clean(&copy);
        }
    }
}

#[test]
fn both_bad_header_checksums_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "h.vhdx");
    for at in [vhdx::HEADER1_OFFSET, vhdx::HEADER2_OFFSET] {
        let b = read_file_at(&path, at + 100, 1)[0];
        patch_file(&path, at + 100, &[b ^ 0x40]);
    }
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::InvalidFormat,
        &[
            "headers at 0x10000/0x20000",
            "checksum",
            "header 1",
            "header 2",
        ],
    );
}

#[test]
fn one_bad_region_table_opens_from_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let (path, model) = good_image(dir.path(), "r.vhdx");
    patch_file(&path, vhdx::REGION1_OFFSET + 40, &[0xee]);
    let chain = open_ro(&path);
    let warnings = chain.top().warnings().join("\n");
    assert!(
        warnings.contains("region table 1 invalid") && warnings.contains("checksum"),
        "{warnings}"
    );
    assert_device_eq_bytes(chain.top().as_ref(), &model, "content");
}

#[test]
fn both_bad_region_table_checksums_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "r.vhdx");
    patch_file(&path, vhdx::REGION1_OFFSET + 40, &[0xee]);
    patch_file(&path, vhdx::REGION2_OFFSET + 40, &[0xee]);
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::InvalidFormat,
        &[
            "both region tables invalid",
            "0x30000",
            "0x40000",
            "checksum",
        ],
    );
}

// ---- chains --------------------------------------------------------------------------------

/// A differencing image whose locator resolves to itself: C (child of P) copied over P.
#[test]
fn parent_locator_pointing_at_itself_is_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = good_image(dir.path(), "p.vhdx");
    let c = dir.path().join("c.avhdx");
    disk::version::new_version(&p, &c).unwrap();
    std::fs::copy(&c, &p).unwrap();
    let e = open_err(&p);
    assert_error(&e, ErrorKind::ChainBroken, &["cycle", "p.vhdx"]);
}

/// Replaces every UTF-16LE occurrence of `from` by `to` (same length) in the metadata region
/// (no checksum covers it).
fn patch_locator_text(path: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let meta = region_table(path).metadata;
    let mut b = read_file_at(path, meta.offset, meta.length as usize);
    let utf16 = |s: &str| -> Vec<u8> { s.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    let (f, t) = (utf16(from), utf16(to));
    let mut hits = 0;
    let mut i = 0;
    while i + f.len() <= b.len() {
        if b[i..i + f.len()] == f[..] {
            b[i..i + f.len()].copy_from_slice(&t);
            hits += 1;
            i += f.len();
        } else {
            i += 1;
        }
    }
    assert_eq!(hits, 2, "relative_path and absolute_win32_path name {from}");
    patch_file(path, meta.offset, &b);
}

/// A two-image cycle: B's parent is A (identity correct), and A's locator is edited to name B.
#[test]
fn two_image_parent_cycle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = good_image(dir.path(), "base.vhdx");
    let a = dir.path().join("aaaa.vhdx");
    let b = dir.path().join("bbbb.vhdx");
    disk::version::new_version(&base, &a).unwrap();
    disk::version::new_version(&a, &b).unwrap();
    patch_locator_text(&a, "base.vhdx", "bbbb.vhdx");
    let e = open_err(&b);
    assert_error(
        &e,
        ErrorKind::ChainBroken,
        &["cycle", "aaaa.vhdx", "bbbb.vhdx"],
    );
}

/// base + 63 versions (64 layers, the limit) open and read through every layer; one more
/// version makes the chain too deep.
#[test]
fn chain_deeper_than_the_limit_is_refused() {
    assert_eq!(open::MAX_CHAIN_DEPTH, 64);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("v0.vhdx");
    create_vhdx(&base, &dynamic(4 * MIB, 1 << 20));
    let mut files = vec![base];
    for k in 1..=64u64 {
        let child = dir.path().join(format!("v{k}.avhdx"));
        disk::version::new_version(files.last().unwrap(), &child).unwrap();
        if k < 64 {
            // The 65th layer cannot be opened (that is the point), so it stays empty.
            session(&child, |d| d.write_at(&[k as u8; 512], k * 512).unwrap());
        }
        files.push(child);
    }
    let at_limit = open_ro(&files[63]);
    assert_eq!(at_limit.layers.len(), 64);
    let sectors = read_dev(at_limit.top().as_ref(), 0, 65 * 512);
    for k in 0..65usize {
        let want = if (1..=63).contains(&k) { k as u8 } else { 0 };
        assert!(
            sectors[k * 512..(k + 1) * 512].iter().all(|&x| x == want),
            "sector {k}"
        );
    }
    let e = open_err(&files[64]);
    assert_error(
        &e,
        ErrorKind::ChainBroken,
        &["deeper than the limit of 64", "v64.avhdx"],
    );
}

/// Writing to a parent after a child was made changes the parent's DataWriteGuid; the child
/// no longer matches and the error names both GUIDs.
#[test]
fn parent_with_a_new_data_write_guid_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = good_image(dir.path(), "p.vhdx");
    let c = dir.path().join("c.avhdx");
    disk::version::new_version(&p, &c).unwrap();
    let linked = vhdx_header(&p).data_write_guid;
    session(&p, |d| d.write_at(&[1; 512], 0).unwrap());
    let now = vhdx_header(&p).data_write_guid;
    assert_ne!(linked, now);
    let e = open_err(&c);
    assert_error(
        &e,
        ErrorKind::ChainBroken,
        &[
            "identity mismatch",
            &now.to_string(),
            &linked.to_string(),
            "p.vhdx",
        ],
    );
}

// ---- metadata and BAT ----------------------------------------------------------------------

/// The File Parameters item rewritten with a 3 MiB block size (not a power of two).
#[test]
fn block_size_not_a_power_of_two_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bs.vhdx");
    let meta = region_table(&path).metadata;
    let table = read_file_at(&path, meta.offset, 64 << 10);
    let count = u16::from_le_bytes([table[10], table[11]]) as usize;
    let item_offset = (0..count)
        .map(|i| 32 + 32 * i)
        .find(|&e| table[e..e + 16] == FILE_PARAMETERS.to_le_bytes())
        .map(|e| u32::from_le_bytes(table[e + 16..e + 20].try_into().unwrap()))
        .expect("a File Parameters entry");
    let at = meta.offset + u64::from(item_offset);
    assert_eq!(
        read_file_at(&path, at, 4),
        (1u32 << 20).to_le_bytes(),
        "the item holds the block size"
    );
    patch_file(&path, at, &(3u32 << 20).to_le_bytes());
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::InvalidFormat,
        &["metadata region at 0x200000", "block size 3145728"],
    );
}

#[test]
fn bat_entry_past_the_end_of_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bat.vhdx");
    let past = std::fs::metadata(&path).unwrap().len().div_ceil(MIB) * MIB + 100 * MIB;
    set_bat_entry(&path, 5, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, past));
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::Corrupt,
        &["bat entry 5", &format!("{past:#x}"), "past the end"],
    );
}

/// A FULLY_PRESENT entry at offset 0 (over the file header area) is refused, naming the entry.
#[test]
fn bat_entry_over_the_headers_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bat.vhdx");
    set_bat_entry(&path, 5, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, 0));
    let e = open_err(&path);
    let msg = message(&e);
    assert!(
        matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::InvalidFormat),
        "{msg}"
    );
    for needle in ["bat entry 5", "0x0", "headers"] {
        assert!(msg.contains(needle), "{msg:?} does not mention {needle:?}");
    }
}

/// The same, for its ErrorKind: the ErrorKind docs put bad pointers under `Corrupt` (as Ferry
/// does for an entry past the end or an overlap), but an entry over the headers comes out of
/// the BAT codec as `InvalidFormat`.
#[test]
fn bat_entry_over_the_headers_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bat.vhdx");
    set_bat_entry(&path, 5, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, 0));
    assert_error(&open_err(&path), ErrorKind::Corrupt, &["bat entry 5"]);
}

#[test]
fn two_bat_entries_on_one_block_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bat.vhdx");
    let at = bat_entry(&path, 1).file_offset();
    set_bat_entry(&path, 5, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, at));
    let e = open_err(&path);
    assert_error(
        &e,
        ErrorKind::Corrupt,
        &[
            "overlaps",
            "bat entry 1",
            "bat entry 5",
            &format!("{at:#x}"),
        ],
    );
}

/// Blocks over the log, the metadata region and the BAT region itself.
#[test]
fn bat_entries_over_the_log_or_regions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "bat.vhdx");
    let rt = region_table(&path);
    let log = vhdx_header(&path).log_offset;
    for (at, name) in [
        (log, "log"),
        (rt.metadata.offset, "metadata region"),
        (rt.bat.offset, "bat region"),
    ] {
        let copy = dir.path().join("edit.vhdx");
        std::fs::copy(&path, &copy).unwrap();
        set_bat_entry(&copy, 5, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, at));
        let e = open_err(&copy);
        assert_error(&e, ErrorKind::Corrupt, &["overlaps", "bat entry 5", name]);
        std::fs::remove_file(&copy).unwrap();
    }
}

// ---- garbage -------------------------------------------------------------------------------

#[test]
fn random_bytes_named_vhdx_or_vhd_are_invalid_format() {
    let dir = tempfile::tempdir().unwrap();
    for (i, name) in ["junk.vhdx", "junk.vhd", "junk.avhdx"].iter().enumerate() {
        let path = dir.path().join(name);
        write_random_file(&path, 1 << 20, i as u64);
        assert_error(
            &open_err(&path),
            ErrorKind::InvalidFormat,
            &["not a vhdx or vhd image", name],
        );
    }
    for len in [0usize, 7, 511, 4096] {
        let path = dir.path().join(format!("short{len}.vhdx"));
        write_random_file(&path, len, 99);
        assert_error(
            &open_err(&path),
            ErrorKind::InvalidFormat,
            &["not a vhdx or vhd image"],
        );
    }
}

/// Random bytes opened with a forced format get that format's own refusal.
#[test]
fn random_bytes_with_a_forced_format_are_invalid_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.bin");
    write_random_file(&path, 1 << 20, 5);
    let forced = |f| {
        open::open(
            &path,
            OpenOptions {
                writable: false,
                format: Some(f),
            },
        )
        .unwrap_err()
    };
    assert_error(
        &forced(Format::Vhdx),
        ErrorKind::InvalidFormat,
        &["file identifier at offset 0"],
    );
    assert_error(
        &forced(Format::Vhd),
        ErrorKind::InvalidFormat,
        &["no valid vhd footer"],
    );
}

/// The "vhdxfile" signature followed by random bytes: no valid header.
#[test]
fn vhdx_signature_with_random_body_is_invalid_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sig.vhdx");
    write_random_file(&path, 2 << 20, 6);
    patch_file(&path, 0, b"vhdxfile");
    assert_error(
        &open_err(&path),
        ErrorKind::InvalidFormat,
        &["headers at 0x10000/0x20000"],
    );
}

/// A "conectix" footer magic with random fields at the end of random bytes never panics.
#[test]
fn vhd_cookie_with_random_body_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 0..50u64 {
        let path = dir.path().join(format!("c{seed}.vhd"));
        write_random_file(&path, 64 << 10, seed);
        patch_file(&path, (64 << 10) - 512, b"conectix");
        if let Ok(chain) = open::open(&path, OpenOptions::default()) {
            let _ = read_all(chain.top().as_ref());
        }
    }
}

/// Seeded byte mutations of the structures of a good image (identifier, headers, region
/// tables, metadata, BAT) never panic: each either opens (and then reads the whole disk,
/// errors allowed) or is refused with a message.
#[test]
fn mutated_structures_never_panic() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = good_image(dir.path(), "m.vhdx");
    let good = std::fs::read(&path).unwrap();
    let rt = region_table(&path);
    let areas = [
        (0u64, 4096u64),
        (vhdx::HEADER1_OFFSET, 4096),
        (vhdx::HEADER2_OFFSET, 4096),
        (vhdx::REGION1_OFFSET, 4096),
        (rt.metadata.offset, (64 << 10) + 4096),
        (rt.bat.offset, 4096),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..300 {
        let mut b = good.clone();
        for _ in 0..rng.gen_range(1..=4) {
            let (start, len) = areas[rng.gen_range(0..areas.len())];
            let at = (start + rng.gen_range(0..len)) as usize;
            b[at] = rng.r#gen();
        }
        match VhdxImage::open(Arc::new(MemStorage::new(b)), VhdxOpenOptions::default()) {
            Ok(img) => {
                opened += 1;
                let _ = read_all(&img);
            }
            Err(e) => {
                refused += 1;
                assert!(!message(&e).is_empty());
            }
        }
    }
    assert!(
        opened > 0 && refused > 0,
        "opened {opened}, refused {refused}"
    );
}
