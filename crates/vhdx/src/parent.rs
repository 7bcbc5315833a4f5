//! The VHDX parent locator (MS-VHDX 2.6.2.6): key/value pairs naming a differencing
//! disk's parent.

use crate::guid::g;
use crate::{Guid, le_u16, le_u32, put_u16, put_u32};

/// LocatorType of a VHDX parent locator.
pub const LOCATOR_TYPE_VHDX: Guid = g("B04AEFB7-D19E-4A81-B789-25B8E9445913");
/// Cap on key/value pairs (a parser limit; real files hold about five).
pub const MAX_PAIRS: u16 = 256;

/// Errors decoding a parent locator.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A key appears twice.
    #[error("parent locator key {0:?} appears twice")]
    DuplicateKey(String),
    /// A key or value lies outside the item.
    #[error("parent locator entry {index} points outside the item")]
    EntryOutOfBounds {
        /// Which pair.
        index: usize,
    },
    /// Not UTF-16LE text.
    #[error("parent locator entry {index} is not valid utf-16")]
    InvalidText {
        /// Which pair.
        index: usize,
    },
    /// `parent_linkage` is absent or not a GUID.
    #[error("parent locator has no valid parent_linkage")]
    MissingLinkage,
    /// Too many pairs.
    #[error("parent locator has {0} pairs, more than {MAX_PAIRS}")]
    TooManyPairs(u16),
    /// Shorter than its header and entries.
    #[error("parent locator truncated: {0} bytes")]
    Truncated(usize),
    /// Not the VHDX locator type.
    #[error("unknown parent locator type {0}")]
    UnknownType(Guid),
}

/// A decoded parent locator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLocator {
    /// The pairs in file order.
    pub pairs: Vec<(String, String)>,
}

fn utf16(b: &[u8], index: usize) -> Result<String, Error> {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    String::from_utf16(&units).map_err(|_| Error::InvalidText { index })
}

impl ParentLocator {
    /// Parses the item.
    ///
    /// # Errors
    /// Type, counts, bounds, text, duplicates, and a missing or malformed `parent_linkage`.
    pub fn parse(b: &[u8]) -> Result<ParentLocator, Error> {
        if b.len() < 20 {
            return Err(Error::Truncated(b.len()));
        }
        let ty = Guid::read(b, 0);
        if ty != LOCATOR_TYPE_VHDX {
            return Err(Error::UnknownType(ty));
        }
        let count = le_u16(b, 18);
        if count > MAX_PAIRS {
            return Err(Error::TooManyPairs(count));
        }
        if b.len() < 20 + 12 * usize::from(count) {
            return Err(Error::Truncated(b.len()));
        }
        let mut pairs: Vec<(String, String)> = Vec::new();
        for index in 0..usize::from(count) {
            let e = 20 + 12 * index;
            let (ko, vo) = (le_u32(b, e) as usize, le_u32(b, e + 4) as usize);
            let (kl, vl) = (
                usize::from(le_u16(b, e + 8)),
                usize::from(le_u16(b, e + 10)),
            );
            let slice = |o: usize, l: usize| {
                o.checked_add(l)
                    .filter(|&end| end <= b.len() && l.is_multiple_of(2))
                    .map(|end| &b[o..end])
            };
            let (Some(k), Some(v)) = (slice(ko, kl), slice(vo, vl)) else {
                return Err(Error::EntryOutOfBounds { index });
            };
            let (k, v) = (utf16(k, index)?, utf16(v, index)?);
            if pairs.iter().any(|(pk, _)| *pk == k) {
                return Err(Error::DuplicateKey(k));
            }
            pairs.push((k, v));
        }
        let loc = ParentLocator { pairs };
        loc.linkage().ok_or(Error::MissingLinkage)?;
        Ok(loc)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `parent_linkage` as a GUID.
    pub fn linkage(&self) -> Option<Guid> {
        self.get("parent_linkage")?.parse().ok()
    }

    /// `parent_linkage2` as a GUID.
    pub fn linkage2(&self) -> Option<Guid> {
        self.get("parent_linkage2")?.parse().ok()
    }

    /// A locator with `parent_linkage` and the given path keys.
    pub fn new(linkage: Guid, paths: &[(&str, &str)]) -> ParentLocator {
        let mut pairs = vec![("parent_linkage".to_string(), linkage.braced())];
        pairs.extend(paths.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        ParentLocator { pairs }
    }

    /// Encodes the item.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.pairs.len();
        let mut out = vec![0u8; 20 + 12 * n];
        LOCATOR_TYPE_VHDX.write(&mut out, 0);
        put_u16(&mut out, 18, n as u16);
        for (i, (k, v)) in self.pairs.iter().enumerate() {
            let e = 20 + 12 * i;
            let put = |s: &str, off_field: usize, len_field: usize, out: &mut Vec<u8>| {
                let at = out.len();
                out.extend(s.encode_utf16().flat_map(|u| u.to_le_bytes()));
                let len = out.len() - at;
                put_u32(out, off_field, at as u32);
                put_u16(out, len_field, len as u16);
            };
            put(k, e, e + 8, &mut out);
            put(v, e + 4, e + 10, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let loc = ParentLocator::new(Guid([5; 16]), &[("relative_path", "..\\base.vhdx")]);
        let parsed = ParentLocator::parse(&loc.to_bytes()).unwrap();
        assert_eq!(parsed, loc);
        assert_eq!(parsed.linkage(), Some(Guid([5; 16])));
    }

    #[test]
    fn libvhdi_header_sample_has_vhdx_type() {
        let b = include_bytes!("../testdata/parent_locator_header.1");
        assert_eq!(Guid::read(b, 0), LOCATOR_TYPE_VHDX);
        assert_eq!(le_u16(b, 18), 5);
    }

    #[test]
    fn entry_past_end_is_refused() {
        let mut b = ParentLocator::new(Guid([5; 16]), &[]).to_bytes();
        put_u32(&mut b, 24, 10_000);
        assert_eq!(
            ParentLocator::parse(&b),
            Err(Error::EntryOutOfBounds { index: 0 })
        );
    }

    #[test]
    fn missing_linkage_is_refused() {
        let loc = ParentLocator {
            pairs: vec![("relative_path".into(), "a.vhdx".into())],
        };
        assert_eq!(
            ParentLocator::parse(&loc.to_bytes()),
            Err(Error::MissingLinkage)
        );
    }
}
