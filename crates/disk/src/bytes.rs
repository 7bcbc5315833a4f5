//! Small helpers over byte buffers, shared by the copy pipeline, the server's caches and the
//! NBD transmission path.

/// True when every byte is zero; compares 16-byte words, 256 bytes per early-exit check.
pub fn is_zero(buf: &[u8]) -> bool {
    const STRIDE: usize = 256;
    let mut chunks = buf.chunks_exact(STRIDE);
    for c in &mut chunks {
        let mut acc = 0u128;
        for w in c.chunks_exact(16) {
            acc |= u128::from_ne_bytes(w.try_into().expect("chunks_exact yields 16 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_zero_finds_one_byte_past_the_last_whole_word() {
        // 1000 bytes = 3 strides of 256 plus a 232-byte remainder; the set byte is in it.
        let mut b = vec![0u8; 1000];
        assert!(is_zero(&b));
        b[999] = 1;
        assert!(!is_zero(&b));
    }

    #[test]
    fn is_zero_finds_one_byte_inside_a_whole_stride() {
        // Byte 300 is in the second 256-byte stride, checked by the 16-byte word path.
        let mut b = vec![0u8; 1000];
        b[300] = 0x80;
        assert!(!is_zero(&b));
    }
}
