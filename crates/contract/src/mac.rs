//! A device's MAC address, the key a target logs in with.
//!
//! ```text
//!   accepted   12 hex digits, either case, with no separators or with exactly five,
//!              each ':' or '-' (AA-BB-CC-DD-EE-FF, aa:bb:cc:dd:ee:ff, aabbccddeeff)
//!   printed    lowercase, ':'-separated: aa:bb:cc:dd:ee:ff (the farm's stored form, and
//!              the text the login proof signs)
//! ```
//!
//! Separators are not checked for position, only counted (`aabb:cc:dd:ee:f:f` is
//! accepted): that is what the farm and the agent have always accepted, and stored rows
//! and scripts may depend on it.

use std::fmt;
use std::str::FromStr;

/// What is wrong with a MAC address's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MacError {
    /// A character other than a hex digit, ':' or '-'.
    #[error("a mac address has only hex digits, ':' and '-'")]
    InvalidChar,
    /// Not 12 hex digits.
    #[error("a mac address has 12 hex digits")]
    InvalidLength,
    /// Separators, but not five.
    #[error("a mac address has five separators or none")]
    InvalidSeparators,
}

/// A MAC address (see the module docs for the accepted text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac([u8; 6]);

impl Mac {
    /// The address of `octets`.
    pub const fn new(octets: [u8; 6]) -> Mac {
        Mac(octets)
    }

    /// Its six bytes.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for Mac {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Mac, MacError> {
        let mut octets = [0u8; 6];
        let (mut digits, mut separators) = (0usize, 0usize);
        for c in s.chars() {
            if matches!(c, ':' | '-') {
                separators += 1;
                continue;
            }
            let nibble = c.to_digit(16).ok_or(MacError::InvalidChar)?;
            if digits >= 12 {
                return Err(MacError::InvalidLength);
            }
            let nibble = u8::try_from(nibble).expect("a hex digit is below 16");
            octets[digits / 2] |= nibble << (4 * (1 - digits % 2));
            digits += 1;
        }
        if digits != 12 {
            return Err(MacError::InvalidLength);
        }
        if separators != 0 && separators != 5 {
            return Err(MacError::InvalidSeparators);
        }
        Ok(Mac(octets))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn dashed_uppercase_normalizes_to_lowercase_colons() {
        let mac: Mac = "AA-BB-CC-00-11-22".parse().unwrap();
        assert_eq!(mac.to_string(), "aa:bb:cc:00:11:22");
    }

    #[test]
    fn bare_digits_normalize() {
        let mac: Mac = "aabbcc001122".parse().unwrap();
        assert_eq!(mac.octets(), [0xaa, 0xbb, 0xcc, 0x00, 0x11, 0x22]);
    }

    #[test]
    fn five_separators_anywhere_are_accepted() {
        assert!("aabb:cc:dd:e:e:ff".parse::<Mac>().is_ok());
    }

    #[test]
    fn malformed_macs_are_refused() {
        let cases = [
            ("", MacError::InvalidLength),
            ("aa:bb:cc:00:00", MacError::InvalidLength),
            ("aa:bb:cc:00:00:0g", MacError::InvalidChar),
            ("aa:bb:cc:00:00:01:02", MacError::InvalidLength),
            ("aa:bbcc:00:00:01", MacError::InvalidSeparators),
            ("a:ab:bc:cd:de:ef:f", MacError::InvalidSeparators),
            ("aa:bb:cc:dd:ee:ff ", MacError::InvalidChar),
        ];
        for (text, why) in cases {
            assert_eq!(text.parse::<Mac>(), Err(why), "{text:?}");
        }
    }

    /// The farm's and the agent's hand-written normalization before this type, kept as the
    /// reference the type must agree with on every input.
    fn reference(value: &str) -> Option<String> {
        let digits: String = value.chars().filter(|c| !matches!(c, ':' | '-')).collect();
        let separators = value.len() - digits.len();
        if digits.len() != 12 || !(separators == 0 || separators == 5) || value.len() > 17 {
            return None;
        }
        if !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let lower = digits.to_ascii_lowercase();
        let pairs: Vec<&str> = (0..6).map(|i| &lower[i * 2..i * 2 + 2]).collect();
        Some(pairs.join(":"))
    }

    proptest! {
        #[test]
        fn parse_agrees_with_the_old_normalization(s in "[0-9a-fA-Fg:\\- é]{0,20}") {
            let got = s.parse::<Mac>().ok().map(|m| m.to_string());
            prop_assert_eq!(got, reference(&s));
        }

        #[test]
        fn display_parses_back(octets in any::<[u8; 6]>()) {
            let mac = Mac::new(octets);
            prop_assert_eq!(mac.to_string().parse::<Mac>(), Ok(mac));
        }
    }
}
