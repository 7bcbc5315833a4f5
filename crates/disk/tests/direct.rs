//! `Storage::direct_reads` on a real file: aligned reads go through `O_DIRECT`, everything
//! else (unaligned buffers, offsets or lengths, the file's tail) reads the same bytes
//! buffered.

use std::fs::File;
use std::io::Write;

use disk::{DIRECT_ALIGN, FileStorage, Storage};

const LEN: usize = (1 << 20) + 1000;

fn pattern(at: usize) -> u8 {
    (at % 251) as u8 ^ (at >> 12) as u8
}

/// A buffer of `len` bytes at an address `skew` bytes past a multiple of DIRECT_ALIGN.
fn buffer(backing: &mut Vec<u8>, len: usize, skew: usize) -> &mut [u8] {
    backing.clear();
    backing.resize(len + 2 * DIRECT_ALIGN, 0xEE);
    let start = backing.as_ptr().align_offset(DIRECT_ALIGN) + skew;
    &mut backing[start..start + len]
}

#[test]
fn direct_reads_return_the_file_bytes_aligned_or_not() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("data");
    let bytes: Vec<u8> = (0..LEN).map(pattern).collect();
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    let s = FileStorage::new(File::open(&path).unwrap());
    assert!(
        s.direct_reads().unwrap(),
        "the target directory's file system supports O_DIRECT"
    );
    let mut backing = Vec::new();
    // (offset, length, buffer skew): aligned, unaligned buffer, offset, length, the tail.
    let cases = [
        (4096usize, 65536usize, 0usize),
        (0, 4096, 0),
        (4096, 65536, 1),
        (4097, 8192, 0),
        (8192, 5000, 0),
        (1 << 20, 4096, 0),
        (LEN - 10, 4096, 0),
        (LEN, 8192, 0),
    ];
    for (offset, len, skew) in cases {
        let buf = buffer(&mut backing, len, skew);
        s.read_at(buf, offset as u64).unwrap();
        for (i, &b) in buf.iter().enumerate() {
            let at = offset + i;
            let want = if at < LEN { pattern(at) } else { 0 };
            assert_eq!(
                b, want,
                "byte {at} of a {len}-byte read at {offset} (skew {skew})"
            );
        }
    }
}
