//! `disk::vhd::VhdImage` against the real VHD files in `shared/vectors` (see its README for
//! where each file comes from and what it must contain), plus damaged copies of them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use disk::device::{LayerRun, Source};
use disk::vhd::VhdImage;
use disk::{BlockDevice, ErrorKind, FileStorage, Storage};
use sha2::{Digest, Sha256};
use testkit::SimDisk;
use vhdx::Guid;
use vhdx::vhd::footer::{FEATURE_RESERVED, FILE_FORMAT_VERSION, FIXED_DATA_OFFSET};
use vhdx::vhd::{DiskType, Footer};

const MIB: u64 = 1 << 20;

fn vector(name: &str) -> PathBuf {
    testkit::vectors_dir().join(name)
}

/// Decompresses `name.bz2` from the vectors into `dir` with `bzip2 -dc`.
fn decompress(name: &str, dir: &Path) -> PathBuf {
    let out_path = dir.join(name);
    let out = File::create(&out_path).unwrap();
    let status = Command::new("bzip2")
        .arg("-dc")
        .arg(vector(&format!("{name}.bz2")))
        .stdout(out)
        .status()
        .expect("bzip2 must be installed to expand the qemu sample images");
    assert!(status.success(), "bzip2 -dc {name}.bz2 failed");
    out_path
}

fn open(path: &Path) -> VhdImage {
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(File::open(path).unwrap()));
    VhdImage::open(storage, Some(path)).unwrap()
}

fn open_bytes(bytes: Vec<u8>) -> disk::Result<VhdImage> {
    VhdImage::open(Arc::new(SimDisk::from_bytes(bytes)), None)
}

fn sha256_hex(dev: &dyn BlockDevice) -> String {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    let mut pos = 0;
    while pos < dev.size() {
        let n = (dev.size() - pos).min(MIB) as usize;
        dev.read_at(&mut buf[..n], pos).unwrap();
        hasher.update(&buf[..n]);
        pos += n as u64;
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> disk::Result<Vec<u8>> {
    let mut buf = vec![0xAAu8; len];
    dev.read_at(&mut buf, offset)?;
    Ok(buf)
}

fn guid(s: &str) -> Guid {
    s.parse().unwrap()
}

// ---- Hyper-V, Virtual PC and Disk2VHD dynamic disks (qemu iotest 146) ----

#[test]
fn hyper_v_dynamic_is_sized_by_current_size_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    let img = open(&decompress("qemu-hyperv2012r2-dynamic.vhd", dir.path()));
    let size = 136_365_211_648;
    assert_eq!(
        (img.size(), img.format(), img.geometry().block_size),
        (size, "vhd", 2 << 20)
    );
    assert_eq!(
        img.map_layer(0, size).unwrap(),
        vec![LayerRun {
            len: size,
            source: Source::Zero
        }]
    );
    assert_eq!(read(&img, 0, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(read(&img, size / 2 + 512, 1024).unwrap(), vec![0; 1024]);
    assert_eq!(read(&img, size - 512, 512).unwrap(), vec![0; 512]);
    // CHS 65278/16/255 would give 136363130880: the warning names the rule that was used.
    assert!(
        img.warnings()
            .iter()
            .any(|w| w.contains("taken from currentsize"))
    );
    assert_eq!(img.parent_ref(), None);
    assert_eq!(
        img.linkage_id(),
        Some(guid("6d2d5fc8-eeba-de4c-8cee-de3a12db7c98"))
    );
}

#[test]
fn virtual_pc_dynamic_is_sized_by_chs_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    let img = open(&decompress("qemu-virtualpc-dynamic.vhd", dir.path()));
    let size = 136_363_130_880;
    assert_eq!(img.size(), size);
    assert_eq!(
        img.map_layer(0, size).unwrap(),
        vec![LayerRun {
            len: size,
            source: Source::Zero
        }]
    );
    assert_eq!(read(&img, size - 4096, 4096).unwrap(), vec![0; 4096]);
    assert!(
        img.warnings()
            .iter()
            .any(|w| w.contains("taken from the chs geometry 65278/16/255"))
    );
    assert_eq!(img.footer().current_size, 136_365_211_648);
}

#[test]
fn disk2vhd_ignores_maximum_chs_and_reads_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let img = open(&decompress("qemu-d2v-zerofilled.vhd", dir.path()));
    let size = 263_454_720;
    assert_eq!(img.size(), size);
    // All 126 blocks are allocated, so the whole disk is data (the runs are merged).
    assert_eq!(
        img.map_layer(0, size).unwrap(),
        vec![LayerRun {
            len: size,
            source: Source::Data
        }]
    );
    assert_eq!(
        sha256_hex(&img),
        "1ba076be94a8a64541c25aae8d5a5f8b0da758c3797af597e03acb431ff8d143"
    );
    assert!(img.warnings().is_empty(), "{:?}", img.warnings());
}

// ---- dfvfs files made by qemu 0.x and Windows 10 ----

#[test]
fn ext2_dynamic_content_matches() {
    let img = open(&vector("dfvfs-ext2.vhd"));
    assert_eq!(img.size(), 4_212_736);
    assert_eq!(
        sha256_hex(&img),
        "870be7ae16c1fa8faab05c6eb9205dc9a7ae35c5f552c5cf8a267c0bc6a5cb99"
    );
    let expected = vec![
        LayerRun {
            len: 2 * MIB,
            source: Source::Data,
        },
        LayerRun {
            len: 4_212_736 - 2 * MIB,
            source: Source::Zero,
        },
    ];
    assert_eq!(img.map_layer(0, 4_212_736).unwrap(), expected);
}

/// The child names its parent `image.vhd` and has no locators, so both go in one directory.
fn image_chain(dir: &Path) -> (VhdImage, Arc<VhdImage>) {
    std::fs::copy(vector("dfvfs-image.vhd"), dir.join("image.vhd")).unwrap();
    std::fs::copy(
        vector("dfvfs-image-differential.vhd"),
        dir.join("child.vhd"),
    )
    .unwrap();
    (
        open(&dir.join("child.vhd")),
        Arc::new(open(&dir.join("image.vhd"))),
    )
}

#[test]
fn image_differential_reads_through_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let (child, parent) = image_chain(dir.path());
    let parent_id = guid("d49c5c80-350a-4a89-898a-5ad6d10f6578");
    let parent_ref = child.parent_ref().unwrap();
    assert_eq!(parent_ref.linkage, vec![parent_id]);
    assert_eq!(parent_ref.paths, vec![dir.path().join("image.vhd")]);
    assert_eq!(parent.linkage_id(), Some(parent_id));
    child.attach_parent(parent.clone()).unwrap();
    let sha = "c6db12a7db548e193c29420c1b4533e4708b20c5033db5cc29ef075d48316d25";
    assert_eq!((child.size(), sha256_hex(&child).as_str()), (104_448, sha));
    assert_eq!(sha256_hex(parent.as_ref()), sha);
}

#[test]
fn image_files_with_bad_checksums_open_with_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let (child, parent) = image_chain(dir.path());
    // image.vhd: both footer copies stored 0xFFFFF683, computed 0xFFFFEF25.
    let parent_warnings = parent.warnings().join("\n");
    assert!(
        parent_warnings.contains("stored 0xfffff683, computed 0xffffef25"),
        "{parent_warnings}"
    );
    assert!(
        child
            .warnings()
            .iter()
            .any(|w| w.starts_with("dynamic header checksum mismatch"))
    );
}

#[test]
fn fat_differential_names_its_parent_relative_first() {
    let img = open(&vector("dfvfs-fat-differential.vhd"));
    let parent_ref = img.parent_ref().unwrap();
    assert_eq!(
        parent_ref.linkage,
        vec![guid("5fa21a55-f394-aa4d-9958-1951a67d5540")]
    );
    let expected = vec![
        testkit::vectors_dir().join("fat-parent.vhd"),
        PathBuf::from("/Projects/dfvfs/test_data/fat-parent.vhd"),
    ];
    assert_eq!(parent_ref.paths, expected);
    assert_eq!(
        img.linkage_id(),
        Some(guid("f84f1636-cd9e-9041-a69e-dcc2380e416a"))
    );
    // CurrentSize, not CHS 120/4/17 (4177920).
    assert_eq!(img.size(), 4_194_304);
}

#[test]
fn fat_differential_map_follows_the_msb_first_bitmap() {
    let img = open(&vector("dfvfs-fat-differential.vhd"));
    // The README's sectors present in the child (block 0; block 1 is unallocated).
    let present = [
        134, 143, 152, 153, 154, 155, 156, 157, 158, 159, 184, 185, 188, 190, 191, 192, 194, 196,
    ];
    let mut expected: Vec<LayerRun> = Vec::new();
    for sector in 0..8192u64 {
        let source = if present.contains(&sector) {
            Source::Data
        } else {
            Source::Parent
        };
        match expected.last_mut() {
            Some(last) if last.source == source => last.len += 512,
            _ => expected.push(LayerRun { len: 512, source }),
        }
    }
    assert_eq!(img.map_layer(0, img.size()).unwrap(), expected);
}

#[test]
fn fat_differential_without_parent_fails_only_on_parent_sectors() {
    let img = open(&vector("dfvfs-fat-differential.vhd"));
    // Sectors 152-159 are the child's own; sector 0 and the unallocated block 1 are not.
    assert!(read(&img, 152 * 512, 8 * 512).is_ok());
    let err = read(&img, 0, 512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ChainBroken);
    assert!(err.to_string().contains("parent not attached"), "{err}");
    let err = read(&img, 3 * MIB, 512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ChainBroken);
}

// ---- Damaged and synthetic files ----

fn ext2_bytes() -> Vec<u8> {
    std::fs::read(vector("dfvfs-ext2.vhd")).unwrap()
}

#[test]
fn file_shorter_than_a_footer_is_invalid() {
    let err = open_bytes(vec![0; 300]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidFormat);
}

#[test]
fn truncated_dynamic_opens_from_footer_copy_and_fails_past_the_end() {
    let mut bytes = ext2_bytes();
    bytes.truncate(MIB as usize);
    let img = open_bytes(bytes).unwrap();
    assert!(
        img.warnings()
            .iter()
            .any(|w| w.contains("using the copy at offset 0"))
    );
    // Block 0's data starts at 0xA00: [0, 512 KiB) is in the file, 1.5 MiB is not.
    assert!(read(&img, 0, 512 << 10).is_ok());
    let err = read(&img, 3 * MIB / 2, 512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(
        err.to_string().contains("past the end of the file"),
        "{err}"
    );
}

#[test]
fn bad_cookie_in_both_footers_is_invalid() {
    let mut bytes = ext2_bytes();
    let end = bytes.len() - 512;
    bytes[0] = b'X';
    bytes[end] = b'X';
    let err = open_bytes(bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidFormat);
    assert!(err.to_string().contains("no valid vhd footer"), "{err}");
}

#[test]
fn bad_cookie_at_the_end_falls_back_to_the_copy_at_zero() {
    let mut bytes = ext2_bytes();
    let end = bytes.len() - 512;
    bytes[end] = b'X';
    let img = open_bytes(bytes).unwrap();
    assert_eq!(img.size(), 4_212_736);
    assert!(
        img.warnings().iter().any(|w| w.contains("invalid")),
        "{:?}",
        img.warnings()
    );
}

#[test]
fn non_power_of_two_block_size_is_corrupt() {
    let mut bytes = ext2_bytes();
    // BlockSize is at offset 32 of the dynamic header (at 512).
    bytes[544..548].copy_from_slice(&(3u32 << 20).to_be_bytes());
    let err = open_bytes(bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("bad block size 3145728"), "{source}");
}

#[test]
fn bat_entry_past_eof_fails_the_read_not_the_process() {
    let mut bytes = ext2_bytes();
    // The BAT is at 0x600; point block 0 at sector 0x0100_0000 (8 GiB), far past the 2 MiB file.
    bytes[0x600..0x604].copy_from_slice(&0x0100_0000u32.to_be_bytes());
    let img = open_bytes(bytes).unwrap();
    let err = read(&img, 4096, 512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(
        err.to_string().contains("data of block 0 at 0x200001200"),
        "{err}"
    );
}

#[test]
fn parent_with_wrong_unique_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (child, _) = image_chain(dir.path());
    let wrong = Arc::new(open(&vector("dfvfs-ext2.vhd")));
    let err = child.attach_parent(wrong).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ChainBroken);
    let msg = err.to_string();
    assert!(
        msg.contains("b61f53ca-a786-4528-90e2-55ba791a1c4c"),
        "{msg}"
    );
    assert!(
        msg.contains("d49c5c80-350a-4a89-898a-5ad6d10f6578"),
        "{msg}"
    );
    assert!(child.parent().is_none());
}

#[test]
fn dynamic_disk_refuses_a_parent() {
    let img = open(&vector("dfvfs-ext2.vhd"));
    let other = Arc::new(open(&vector("dfvfs-image.vhd")));
    assert_eq!(
        img.attach_parent(other).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

fn fixed_footer(size: u64) -> Footer {
    Footer {
        features: FEATURE_RESERVED,
        file_format_version: FILE_FORMAT_VERSION,
        data_offset: FIXED_DATA_OFFSET,
        timestamp: 0,
        creator_app: *b"win ",
        creator_version: 0x000A_0000,
        creator_host_os: *b"Wi2k",
        original_size: size,
        current_size: size,
        geometry: vhdx::vhd::footer::chs_for_size(size),
        disk_type: DiskType::Fixed,
        unique_id: Guid([0x42; 16]),
        saved_state: 0,
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn fixed_disk_reads_the_bytes_before_the_footer() {
    let data = pattern(MIB as usize);
    let mut bytes = data.clone();
    bytes.extend_from_slice(&fixed_footer(MIB).to_bytes());
    let img = open_bytes(bytes).unwrap();
    assert_eq!((img.size(), img.geometry().block_size), (MIB, 2 << 20));
    assert_eq!(read(&img, 0, MIB as usize).unwrap(), data);
    assert_eq!(
        read(&img, MIB - 1, 2).unwrap_err().kind(),
        ErrorKind::OutOfBounds
    );
}

#[test]
fn fixed_disk_with_old_511_byte_footer_opens() {
    let data = pattern(MIB as usize);
    let mut bytes = data.clone();
    bytes.extend_from_slice(&fixed_footer(MIB).to_bytes()[..511]);
    let img = open_bytes(bytes).unwrap();
    assert_eq!(
        read(&img, MIB - 512, 512).unwrap(),
        data[(MIB - 512) as usize..]
    );
    let warning = "old 511-byte footer at the end of the file".to_string();
    assert!(img.warnings().contains(&warning), "{:?}", img.warnings());
}

#[test]
fn fixed_disk_larger_than_its_file_is_corrupt() {
    let mut bytes = pattern(4096);
    bytes.extend_from_slice(&fixed_footer(MIB).to_bytes());
    assert_eq!(open_bytes(bytes).unwrap_err().kind(), ErrorKind::Corrupt);
}

#[test]
fn fat_differential_mixes_its_sectors_with_an_attached_parent() {
    let child = open(&vector("dfvfs-fat-differential.vhd"));
    let size = 4 * MIB;
    let parent_data = pattern(size as usize);
    let mut parent_bytes = parent_data.clone();
    let parent_footer = Footer {
        unique_id: guid("5fa21a55-f394-aa4d-9958-1951a67d5540"),
        ..fixed_footer(size)
    };
    parent_bytes.extend_from_slice(&parent_footer.to_bytes());
    child
        .attach_parent(Arc::new(open_bytes(parent_bytes).unwrap()))
        .unwrap();
    // Sectors 133..=135: parent, child (its block 0 data starts at sector 160 of the file), parent.
    let file = std::fs::read(vector("dfvfs-fat-differential.vhd")).unwrap();
    let mut expected = parent_data[133 * 512..136 * 512].to_vec();
    expected[512..1024].copy_from_slice(&file[(160 + 134) * 512..(160 + 135) * 512]);
    assert_eq!(read(&child, 133 * 512, 3 * 512).unwrap(), expected);
    assert_eq!(
        read(&child, 3 * MIB, 512).unwrap(),
        parent_data[3 << 20..(3 << 20) + 512]
    );
}
