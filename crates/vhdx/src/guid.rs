//! GUIDs in the Microsoft mixed-endian layout used by VHDX (and by VHD's UniqueId, which
//! real files store in big-endian UUID order: see [`Guid::from_be_bytes`]).

use std::fmt;
use std::str::FromStr;

/// A GUID held as its canonical 16-byte big-endian UUID value (the order of the text form).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Guid(pub [u8; 16]);

/// The error for a GUID string that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid guid string {0:?}")]
pub struct InvalidGuid(pub String);

impl Guid {
    /// The all-zero GUID ("no log", "no parent").
    pub const ZERO: Guid = Guid([0; 16]);

    /// Decodes the on-disk mixed-endian form (Data1 u32 LE, Data2 u16 LE, Data3 u16 LE, Data4).
    pub fn from_le_bytes(b: &[u8; 16]) -> Guid {
        let mut g = *b;
        g[0..4].reverse();
        g[4..6].reverse();
        g[6..8].reverse();
        Guid(g)
    }

    /// Encodes into the on-disk mixed-endian form.
    pub fn to_le_bytes(self) -> [u8; 16] {
        let mut g = self.0;
        g[0..4].reverse();
        g[4..6].reverse();
        g[6..8].reverse();
        g
    }

    /// Decodes from a slice of at least 16 bytes in mixed-endian form.
    pub(crate) fn read(b: &[u8], off: usize) -> Guid {
        Guid::from_le_bytes(b[off..off + 16].try_into().expect("16-byte slice"))
    }

    /// Writes in mixed-endian form at `off`.
    pub(crate) fn write(self, b: &mut [u8], off: usize) {
        b[off..off + 16].copy_from_slice(&self.to_le_bytes());
    }

    /// Builds a GUID from 16 big-endian bytes (UUID order), as VHD stores UniqueId.
    pub fn from_be_bytes(b: [u8; 16]) -> Guid {
        Guid(b)
    }

    /// True for the all-zero GUID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// Builds a version-4 GUID from 16 random bytes supplied by the caller (codecs own no RNG).
    pub fn from_random(mut b: [u8; 16]) -> Guid {
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        Guid(b)
    }

    /// The braced upper-case form VHDX parent locators use: `{XXXXXXXX-...}`.
    pub fn braced(&self) -> String {
        format!("{{{self}}}")
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-\
             {:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[0],
            b[1],
            b[2],
            b[3],
            b[4],
            b[5],
            b[6],
            b[7],
            b[8],
            b[9],
            b[10],
            b[11],
            b[12],
            b[13],
            b[14],
            b[15]
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

impl FromStr for Guid {
    type Err = InvalidGuid;

    /// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, with or without braces, any case.
    fn from_str(s: &str) -> Result<Guid, InvalidGuid> {
        let bad = || InvalidGuid(s.to_string());
        let t = s.trim();
        let t = t
            .strip_prefix('{')
            .map_or(t, |x| x.strip_suffix('}').unwrap_or(x));
        if t.len() != 36 {
            return Err(bad());
        }
        let hex: String = t
            .char_indices()
            .filter_map(|(i, c)| {
                if [8, 13, 18, 23].contains(&i) {
                    (c != '-').then_some('!')
                } else {
                    Some(c)
                }
            })
            .collect();
        if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Guid(out))
    }
}

/// Writes a GUID constant from its text form at compile time.
pub(crate) const fn g(s: &str) -> Guid {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    let mut j = 0;
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[j] = hex(b[i]) * 16 + hex(b[i + 1]);
        j += 1;
        i += 2;
    }
    Guid(out)
}

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("bad hex digit in guid constant"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_endian_round_trip() {
        let guid = g("2DC27766-F623-4200-9D64-115E9BFD4A08");
        let le = guid.to_le_bytes();
        assert_eq!(le[0..4], [0x66, 0x77, 0xc2, 0x2d]);
        assert_eq!(Guid::from_le_bytes(&le), guid);
    }

    #[test]
    fn text_round_trip_with_braces() {
        let guid: Guid = "{B04AEFB7-D19E-4A81-B789-25B8E9445913}".parse().unwrap();
        assert_eq!(guid.to_string(), "b04aefb7-d19e-4a81-b789-25b8e9445913");
        assert_eq!(guid.braced().parse::<Guid>().unwrap(), guid);
    }

    #[test]
    fn bad_text_is_refused() {
        assert!(
            "b04aefb7-d19e-4a81-b789-25b8e944591"
                .parse::<Guid>()
                .is_err()
        );
        assert!(
            "b04aefb7xd19e-4a81-b789-25b8e9445913"
                .parse::<Guid>()
                .is_err()
        );
    }
}
