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

/// `read_vectored_at` returns what `read_at` of the buffers' concatenation would: one
/// direct `preadv` when every piece is aligned, piece by piece otherwise, zeros past the
/// end, and a read that the end of the file cuts short finished piece by piece.
#[test]
fn vectored_reads_return_the_file_bytes_aligned_or_not() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("data");
    let bytes: Vec<u8> = (0..LEN).map(pattern).collect();
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    for direct in [true, false] {
        let s = FileStorage::new(File::open(&path).unwrap());
        if direct {
            assert!(s.direct_reads().unwrap());
        }
        // (offset, piece lengths, skew of the second piece's buffer)
        let cases: [(usize, &[usize], usize); 6] = [
            (0, &[65536, 65536, 4096], 0),
            (8192, &[4096; 8], 0),
            (4096, &[65536, 65536], 3),
            (4097, &[8192, 8192], 0),
            (LEN - LEN % 4096 - 8192, &[8192, 8192, 8192], 0),
            (LEN + 4096, &[4096, 4096], 0),
        ];
        for (offset, lens, skew) in cases {
            let mut backings: Vec<Vec<u8>> = lens.iter().map(|_| Vec::new()).collect();
            let mut bufs: Vec<&mut [u8]> = backings
                .iter_mut()
                .zip(lens)
                .enumerate()
                .map(|(i, (b, &len))| buffer(b, len, if i == 1 { skew } else { 0 }))
                .collect();
            s.read_vectored_at(&mut bufs, offset as u64).unwrap();
            let mut at = offset;
            for (i, b) in bufs.iter().enumerate() {
                for &got in b.iter() {
                    let want = if at < LEN { pattern(at) } else { 0 };
                    assert_eq!(
                        got, want,
                        "byte {at} (piece {i}) of a vectored read at {offset} (direct {direct})"
                    );
                    at += 1;
                }
            }
        }
    }
}
