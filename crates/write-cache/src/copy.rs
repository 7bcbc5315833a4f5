//! Copies into RAM slots.
//!
//! A 4 KiB write lands in a slot chosen by the workload, mostly one not touched for a long
//! time (a 1 GiB cache does not fit in any CPU cache). An ordinary copy first reads each of
//! the slot's 64 cache lines from memory (read-for-ownership) only to overwrite them, and the
//! slot lock's release then waits for all 64. Non-temporal stores write whole lines without
//! reading them: measured in docs/target.md.

// SSE2 streaming stores: std has no safe API for them.
#![allow(unsafe_code)]

/// Smallest copy made with non-temporal stores (below this the line reads are few and the
/// bytes are likely read again soon).
const STREAM_MIN_BYTES: usize = 1024;

/// Copies `src` into `dst` (same length), with streaming stores when the copy is large and
/// `dst` is 16-byte aligned.
pub(crate) fn copy_into_slot(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_into_slot: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= STREAM_MIN_BYTES && (dst.as_ptr() as usize).is_multiple_of(16) {
        stream_copy(dst, src);
        return;
    }
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
fn stream_copy(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let whole = dst.len() / 16 * 16;
    let (head, tail) = dst.split_at_mut(whole);
    for (d, s) in head.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        // SAFETY: SSE2 is part of x86_64. `s` is 16 readable bytes (unaligned load allowed);
        // `d` is 16 writable bytes at a 16-byte aligned address (`dst` is aligned and every
        // chunk starts a multiple of 16 bytes into it), as the streaming store requires.
        unsafe {
            let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
        }
    }
    tail.copy_from_slice(&src[whole..]);
    // SAFETY: SSE2 is part of x86_64. The fence orders the streaming stores before any later
    // store (the slot lock's release), so a reader that takes the lock sees the bytes.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 15, 16, 1023, 1024, 1040, 4095, 4096, 8191] {
            for off in [0, 1, 16] {
                let mut dst = vec![0u8; len + 32];
                copy_into_slot(&mut dst[off..off + len], &src[off..off + len]);
                assert_eq!(
                    &dst[off..off + len],
                    &src[off..off + len],
                    "len {len} off {off}"
                );
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
