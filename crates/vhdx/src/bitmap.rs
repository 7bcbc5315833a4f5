//! Sector bitmaps (MS-VHDX 2.5.1.2): one bit per logical sector, least significant bit first.
//! A set bit means the sector is stored in this file; a clear bit, in the parent.

/// The bit of `sector` (relative to the bitmap's first sector).
pub fn get(bitmap: &[u8], sector: u64) -> bool {
    bitmap[(sector / 8) as usize] & (1 << (sector % 8)) != 0
}

/// Sets or clears `count` bits from `start`.
pub fn set_range(bitmap: &mut [u8], start: u64, count: u64, value: bool) {
    let mut s = start;
    let end = start + count;
    while s < end {
        if s.is_multiple_of(8) && end - s >= 8 {
            let bytes = ((end - s) / 8) as usize;
            let i = (s / 8) as usize;
            bitmap[i..i + bytes].fill(if value { 0xff } else { 0 });
            s += bytes as u64 * 8;
            continue;
        }
        let byte = &mut bitmap[(s / 8) as usize];
        if value {
            *byte |= 1 << (s % 8);
        } else {
            *byte &= !(1 << (s % 8));
        }
        s += 1;
    }
}

/// Splits `[start, start+count)` into runs of equal bits: `(length, bit)`.
pub fn runs(bitmap: &[u8], start: u64, count: u64) -> Vec<(u64, bool)> {
    let mut out: Vec<(u64, bool)> = Vec::new();
    let end = start + count;
    let mut s = start;
    while s < end {
        let (len, bit) = if s.is_multiple_of(8)
            && end - s >= 8
            && matches!(bitmap[(s / 8) as usize], 0 | 0xff)
        {
            (8, bitmap[(s / 8) as usize] == 0xff)
        } else {
            (1, get(bitmap, s))
        };
        match out.last_mut() {
            Some((l, b)) if *b == bit => *l += len,
            _ => out.push((len, bit)),
        }
        s += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lsb_first() {
        let b = [0b0000_0001u8, 0];
        assert!(get(&b, 0));
        assert!(!get(&b, 7));
    }

    #[test]
    fn runs_merge_equal_bits() {
        let mut b = vec![0u8; 4];
        set_range(&mut b, 3, 10, true);
        assert_eq!(runs(&b, 0, 32), vec![(3, false), (10, true), (19, false)]);
    }

    proptest! {
        #[test]
        fn set_range_matches_naive(start in 0u64..200, count in 0u64..200, value: bool,
                                   init in proptest::collection::vec(any::<u8>(), 50)) {
            let mut fast = init.clone();
            set_range(&mut fast, start, count, value);
            let mut naive = init;
            for s in start..start + count {
                let byte = &mut naive[(s / 8) as usize];
                if value { *byte |= 1 << (s % 8) } else { *byte &= !(1 << (s % 8)) }
            }
            prop_assert_eq!(&fast, &naive);
            let total: u64 = runs(&fast, 0, 400).iter().map(|r| r.0).sum();
            prop_assert_eq!(total, 400);
            let mut s = 0;
            for (len, bit) in runs(&fast, 0, 400) {
                for k in s..s + len { prop_assert_eq!(get(&fast, k), bit); }
                s += len;
            }
        }
    }
}
