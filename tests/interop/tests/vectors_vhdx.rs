//! Every Hyper-V VHDX sample in shared/vectors (the dynamic image and the dirty-log image)
//! reads as its README documents: geometry, structure, content
//! patterns, and the sha256 of the whole virtual content (streamed with 1 MiB reads) wherever
//! the README gives one. qemu and libvhdi confirm where the README cites them.
//!
//! (crates/disk/tests/check.rs and ops.rs read some of them from the library's side.)

use std::path::Path;

use disk::open::{self, Image};
use interop::*;
use vhdx::Guid;
use vhdx::bat::{self, Entry};

fn guid(s: &str) -> Guid {
    s.parse().unwrap()
}

fn vhdx_image(chain: &open::Chain) -> &disk::vhdx::VhdxImage {
    match &chain.layers[0].image {
        Image::Vhdx(i) => i,
        other => panic!("expected vhdx, got {other:?}"),
    }
}

/// Raw BAT entry `index` read from the file itself (not through Ferry).
fn file_bat_entry(path: &Path, bat_offset: u64, index: u64) -> Entry {
    let b = read_file_at(path, bat_offset + 8 * index, 8);
    Entry(u64::from_le_bytes(b.try_into().unwrap()))
}

// ---- VHDX ----------------------------------------------------------------------------------

/// Hyper-V (WS2012) 1 GiB dynamic image of qemu iotest 064.
#[test]
fn hyperv_dynamic_1g_structure_and_content() {
    if !require("bzip2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = unpack_bz2("qemu-iotest-dynamic-1G.vhdx", dir.path());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 104_857_600);
    assert_eq!(
        sha256_file(&path),
        "a4fb24fa51fb4852d5a6bdc2b390a91b0a4e19b47696edc5a00c816067257402"
    );

    let chain = open_ro(&path);
    let dev = chain.top();
    let img = vhdx_image(&chain);
    let g = dev.geometry();
    assert_eq!(
        (
            g.size,
            g.block_size,
            g.logical_sector_size,
            g.physical_sector_size
        ),
        (1 << 30, 32 << 20, 512, 4096)
    );
    assert!(dev.warnings().is_empty(), "{:?}", dev.warnings());
    let d = img.details().unwrap();
    assert_eq!(d.creator, "Microsoft Windows 6.2.9200.16384");
    assert_eq!(
        (d.log, d.metadata_region.0, d.bat_region.0),
        ((MIB, MIB as u32), 2 * MIB, 3 * MIB)
    );
    assert!(!d.fixed && !d.has_parent);
    let h = img.header();
    assert_eq!(h.sequence_number, 15, "header 2 (seq 15) is current");
    let seq_at = |at| {
        vhdx::header::Header::parse(&read_file_at(&path, at, 4096))
            .unwrap()
            .sequence_number
    };
    assert_eq!(
        (seq_at(vhdx::HEADER1_OFFSET), seq_at(vhdx::HEADER2_OFFSET)),
        (14, 15)
    );
    assert!(h.log_guid.is_zero(), "clean log");
    let regions = img.regions();
    assert!(regions.bat.required && regions.metadata.required);

    let layout = img.layout();
    assert_eq!(layout.chunk_ratio(), 128);
    let entries = img.bat();
    for (block, at) in [(0u64, 4 * MIB), (1, 36 * MIB), (2, 68 * MIB)] {
        let e = entries[layout.payload_index(block) as usize];
        assert_eq!(
            (e.state(), e.file_offset()),
            (bat::PAYLOAD_BLOCK_FULLY_PRESENT, at),
            "block {block}"
        );
    }
    for block in 3..32 {
        let e = entries[layout.payload_index(block) as usize];
        assert_eq!(e.state(), bat::PAYLOAD_BLOCK_ZERO, "block {block}");
    }
    // The SB entry of chunk 0 (index 128) lies past the 32 entries the disk needs; in the
    // file it is NOT_PRESENT.
    assert_eq!(
        file_bat_entry(&path, 3 * MIB, 128).state(),
        bat::SB_BLOCK_NOT_PRESENT
    );

    assert!(device_all(dev.as_ref(), 0, 33 * MIB, 0xa5));
    assert!(device_all(dev.as_ref(), 33 * MIB, 33 * MIB, 0x96));
    assert!(device_all(dev.as_ref(), 66 * MIB, (1 << 30) - 66 * MIB, 0));
    assert_eq!(
        sha256_device(dev.as_ref()),
        "d3d112d8dab7fd360609f7d5a7b769904b7a2a7d7b6b8c535f65a23293c05478"
    );
}

/// iotest 064's write: 0xC3 at [99 MiB, 157 MiB), crossing the 96 and 128 MiB block
/// boundaries into ZERO-state blocks, changes nothing else; qemu agrees afterwards.
#[test]
fn hyperv_dynamic_1g_iotest_064_write() {
    if !require_all(&["bzip2", "qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = unpack_bz2("qemu-iotest-dynamic-1G.vhdx", dir.path());
    session(&path, |d| {
        d.write_at(&vec![0xc3; 58 << 20], 99 * MIB).unwrap()
    });
    let chain = open_ro(&path);
    let dev = chain.top();
    let expect = [
        (0, 33, 0xa5u8),
        (33, 66, 0x96),
        (66, 99, 0),
        (99, 157, 0xc3),
        (157, 1024, 0),
    ];
    for (from, to, byte) in expect {
        assert!(
            device_all(dev.as_ref(), from * MIB, (to - from) * MIB, byte),
            "[{from}M, {to}M) != {byte:#x}"
        );
    }
    drop(chain);
    assert_qemu_check_clean(&path);
    let cmds: Vec<String> = expect
        .iter()
        .map(|(f, t, b)| format!("read -P {b:#x} {f}M {}M", t - f))
        .collect();
    let out = qemu_io("vhdx", &path, &cmds);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

const DIRTY_LOG_GUID: &str = "c82755bc-427f-1245-b72c-da70aaabe031";
const DIRTY_FILE_SHA: &str = "511daba998dba208ffc57a7814194d5dd3afb7c314731b904ff1682e3fb4951a";

/// The unreplayed file as the README describes it, read without Ferry: 17 FULLY_PRESENT
/// blocks in the BAT at 2 MiB, block 17 absent.
fn assert_dirty_file_bat(path: &Path) {
    for block in 0..17 {
        assert_eq!(
            file_bat_entry(path, 2 * MIB, block).state(),
            bat::PAYLOAD_BLOCK_FULLY_PRESENT,
            "block {block}"
        );
    }
    assert_ne!(
        file_bat_entry(path, 2 * MIB, 17).state(),
        bat::PAYLOAD_BLOCK_FULLY_PRESENT
    );
}

/// qemu's dirty-log image (iotest 070), opened read-only: the log is replayed in memory only,
/// the disk reads 18 MiB of 0xA5 and zeros after, and the file is left byte-identical.
#[test]
fn dirty_log_read_only_replays_in_memory() {
    if !require("bzip2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = unpack_bz2("qemu-iotest-dirtylog-10G-4M.vhdx", dir.path());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 31_457_280);
    assert_eq!(sha256_file(&path), DIRTY_FILE_SHA);
    assert_dirty_file_bat(&path);

    let chain = open_ro(&path);
    let dev = chain.top();
    let img = vhdx_image(&chain);
    let g = dev.geometry();
    assert_eq!(
        (
            g.size,
            g.block_size,
            g.logical_sector_size,
            g.physical_sector_size
        ),
        (10 << 30, 1 << 20, 512, 512)
    );
    assert_eq!(img.header().log_guid, guid(DIRTY_LOG_GUID));
    assert_eq!(img.header().sequence_number, 932_638_741);
    assert_eq!(
        (img.regions().bat.offset, img.regions().metadata.offset),
        (2 * MIB, 3 * MIB)
    );
    assert!(
        dev.warnings()
            .iter()
            .any(|w| w.contains("replayed in memory")),
        "{:?}",
        dev.warnings()
    );
    let e = img.bat()[17];
    assert_eq!(
        (e.state(), e.file_offset()),
        (bat::PAYLOAD_BLOCK_FULLY_PRESENT, 0x1D0_0000),
        "block 17 after replay"
    );
    assert!(device_all(dev.as_ref(), 0, 18 * MIB, 0xa5));
    assert!(device_all(dev.as_ref(), 18 * MIB, (10 << 30) - 18 * MIB, 0));
    drop(chain);
    assert_eq!(
        sha256_file(&path),
        DIRTY_FILE_SHA,
        "a read-only open must not modify the file"
    );
}

/// Opened writable, the log is replayed into the file: LogGuid becomes zero, block 17 is in the
/// file's BAT, Ferry reads the same content without a warning, and qemu-img check is clean
/// (iotest 070 (c) needed `-r all` before the replay) and reads 18 MiB of 0xA5 read-only (d).
#[test]
fn dirty_log_writable_open_replays_into_the_file() {
    if !require_all(&["bzip2", "qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = unpack_bz2("qemu-iotest-dirtylog-10G-4M.vhdx", dir.path());
    // Precondition, as qemu sees it: the file needs a replay (iotest 070 (a)).
    let qemu_ro = qemu_img_output(&[
        "check".as_ref(),
        "-f".as_ref(),
        "vhdx".as_ref(),
        path.as_os_str(),
    ]);
    assert!(
        !qemu_ro.status.success(),
        "qemu-img check (read-only) must refuse the dirty file"
    );

    let chain = open_rw(&path);
    assert!(device_all(chain.top().as_ref(), 0, 18 * MIB, 0xa5));
    chain.close().unwrap();
    drop(chain);

    let e = file_bat_entry(&path, 2 * MIB, 17);
    assert_eq!(
        (e.state(), e.file_offset()),
        (bat::PAYLOAD_BLOCK_FULLY_PRESENT, 0x1D0_0000),
        "block 17 in the file"
    );
    let chain = open_ro(&path);
    let dev = chain.top();
    assert!(
        vhdx_image(&chain).header().log_guid.is_zero(),
        "clean after replay"
    );
    assert!(dev.warnings().is_empty(), "{:?}", dev.warnings());
    assert!(device_all(dev.as_ref(), 0, 18 * MIB, 0xa5));
    assert!(device_all(dev.as_ref(), 18 * MIB, (10 << 30) - 18 * MIB, 0));
    drop(chain);

    assert_qemu_check_clean(&path);
    let out = run_ok(
        std::process::Command::new("qemu-io")
            .args([
                "-r",
                "-f",
                "vhdx",
                "-c",
                "read -P 0xa5 0 18M",
                "-c",
                "read -P 0 18M 2M",
            ])
            .arg(&path),
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
}
