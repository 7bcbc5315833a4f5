//! Parsing the sizes people type: `4096`, `512M`, `10G`, `1T`, `32MiB`, `10GB`.
//!
//! The convention is GNU coreutils' (`truncate -s`, `dd`), which qemu-img's single letters
//! also follow:
//!
//! | written            | means        |
//! |--------------------|--------------|
//! | `N`, `NB`          | N bytes      |
//! | `NK`, `NKiB`       | N × 1024     |
//! | `NKB`              | N × 1000     |
//! | `M G T P E`        | powers of 1024, with or without `iB` |
//! | `MB GB TB PB EB`   | powers of 1000 |
//!
//! Units are case-insensitive (`10gb` and `10GB` are both decimal gigabytes) and may follow
//! a space. Only whole numbers are accepted, and a value that does not fit in 64 bits is
//! refused rather than wrapped.

/// Parses a size in bytes.
///
/// # Errors
/// A message naming the bad input: empty, not a number, a fraction, an unknown unit, or an
/// overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = t.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "{s:?} is not a size: it must start with a number, like 10G or 4096"
        ));
    }
    let unit = unit.trim();
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "{s:?}: use a whole number with a smaller unit (1536M, not 1.5G)"
        ));
    }
    let n: u64 = number.parse().map_err(|_| format!("{s:?} is too large"))?;
    let multiplier = unit_multiplier(unit).ok_or_else(|| {
        format!("{s:?}: unknown unit {unit:?} (use K, M, G, T, P, E, KiB..EiB, or KB..EB)")
    })?;
    n.checked_mul(multiplier)
        .ok_or_else(|| format!("{s:?} is too large (over 16 EiB)"))
}

/// Parses a size that must also fit in 32 bits and be non-zero (block sizes).
///
/// # Errors
/// As [`parse_size`], plus zero and values of 4 GiB or more.
pub fn parse_block_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if n == 0 {
        return Err(format!("{s:?}: a block size cannot be zero"));
    }
    u32::try_from(n).map_err(|_| format!("{s:?}: a block size must be below 4 GiB"))
}

/// Parses a non-zero size (virtual disk sizes).
///
/// # Errors
/// As [`parse_size`], plus zero.
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?}: the size cannot be zero")),
        n => Ok(n),
    }
}

/// Parses a sector size: 512 or 4096 (also written `4K`).
///
/// # Errors
/// Anything else.
pub fn parse_sector_size(s: &str) -> Result<u32, String> {
    match parse_size(s)? {
        512 => Ok(512),
        4096 => Ok(4096),
        n => Err(format!("{n}: a sector size must be 512 or 4096")),
    }
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    if u.is_empty() || u == "b" {
        return Some(1);
    }
    let (letter, rest) = u.split_at(1);
    let exp = match letter {
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        "e" => 6,
        _ => return None,
    };
    match rest {
        "" | "ib" => Some(1u64 << (10 * exp)),
        "b" => Some(1000u64.pow(exp)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_number_is_bytes() {
        assert_eq!(parse_size("4096"), Ok(4096));
    }

    #[test]
    fn single_letter_is_binary() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
    }

    #[test]
    fn iec_suffix_is_binary() {
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
    }

    #[test]
    fn lowercase_letter_is_accepted() {
        assert_eq!(parse_size("10g"), Ok(10 << 30));
    }

    #[test]
    fn terabyte_letter_is_binary() {
        assert_eq!(parse_size("1T"), Ok(1 << 40));
    }

    #[test]
    fn si_suffix_is_decimal() {
        // 10 GB in the SI sense is ten billion bytes.
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
    }

    #[test]
    fn space_before_unit_is_accepted() {
        assert_eq!(parse_size("32 MiB"), Ok(32 << 20));
    }

    #[test]
    fn unknown_unit_is_refused() {
        assert!(parse_size("10X").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn fraction_is_refused() {
        assert!(parse_size("1.5G").unwrap_err().contains("whole number"));
    }

    #[test]
    fn missing_number_is_refused() {
        assert!(parse_size("G").unwrap_err().contains("start with a number"));
    }

    #[test]
    fn negative_is_refused() {
        assert!(parse_size("-5").is_err());
    }

    #[test]
    fn overflow_is_refused() {
        // 2^24 TiB is 2^64 bytes, one past u64::MAX.
        assert!(parse_size("16777216T").unwrap_err().contains("too large"));
    }

    #[test]
    fn block_size_of_4_gib_is_refused() {
        assert!(parse_block_size("4G").is_err());
    }

    #[test]
    fn zero_virtual_size_is_refused() {
        assert!(parse_nonzero_size("0").is_err());
    }

    #[test]
    fn sector_size_4k_is_accepted() {
        assert_eq!(parse_sector_size("4K"), Ok(4096));
    }

    #[test]
    fn sector_size_1024_is_refused() {
        assert!(parse_sector_size("1024").is_err());
    }
}
