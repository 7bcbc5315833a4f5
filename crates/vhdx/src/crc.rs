//! CRC-32C (Castagnoli) as VHDX uses it: computed over a structure with its checksum field
//! taken as zero (MS-VHDX 2.2.2, 2.2.3, 2.3.1.1).

/// CRC-32C of `buf` with the 4 bytes at `field` treated as zero.
pub fn crc32c_with_hole(buf: &[u8], field: usize) -> u32 {
    let crc = crc32c::crc32c(&buf[..field]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &buf[field + 4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_matches_the_standard() {
        // The standard CRC-32C check value for "123456789".
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn hole_is_zeroed() {
        let mut buf = *b"abcdXXXXefgh";
        let with_hole = crc32c_with_hole(&buf, 4);
        buf[4..8].fill(0);
        assert_eq!(with_hole, crc32c::crc32c(&buf));
    }
}
