//! Login and text key=value lists (RFC 7143 §6.1): `key=value` items, each ended by a NUL,
//! in a data segment (a login or text request may continue over several PDUs; the caller
//! joins their segments first, up to [`TEXT_BYTES_MAX`]).
//!
//! Keys are at most [`KEY_BYTES_MAX`] bytes of letters, digits, `.`, `-`, `+`, `@`, `_`
//! (§6.1); a value at most [`VALUE_BYTES_MAX`] bytes of UTF-8 without NUL. A key may appear
//! once per list (§6.2: a repeated key is a protocol error).

/// The most bytes of one list (joined over continued PDUs).
pub const TEXT_BYTES_MAX: usize = 64 * 1024;
/// The longest key.
pub const KEY_BYTES_MAX: usize = 63;
/// The longest value (§6.1: 255 for most keys; 8192 for a few, e.g. CHAP's binary values).
pub const VALUE_BYTES_MAX: usize = 8192;
/// The most pairs in one list.
pub const PAIRS_MAX: usize = 256;

/// Why a list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Longer than [`TEXT_BYTES_MAX`].
    #[error("text of {0} bytes: longer than {TEXT_BYTES_MAX}")]
    Long(usize),
    /// An item without `=`.
    #[error("an item without '='")]
    NoEquals,
    /// A key that is empty, too long, or of other characters.
    #[error("key {0:?} is not a valid key")]
    Key(String),
    /// A value that is too long or not UTF-8.
    #[error("the value of {0} is not valid")]
    Value(String),
    /// A key twice.
    #[error("key {0} given twice")]
    Repeated(String),
    /// More than [`PAIRS_MAX`] pairs.
    #[error("more than {PAIRS_MAX} keys")]
    TooMany,
    /// The last item has no NUL after it.
    #[error("the last item is not ended by a NUL")]
    Unterminated,
}

fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= KEY_BYTES_MAX
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+@_".contains(&c))
}

/// Parses a list (see the module documentation). Empty items (NUL NUL) are skipped: some
/// initiators pad with NULs.
///
/// # Errors
/// [`TextError`] naming what is wrong.
pub fn parse_pairs(b: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    if b.len() > TEXT_BYTES_MAX {
        return Err(TextError::Long(b.len()));
    }
    if !b.is_empty() && b[b.len() - 1] != 0 {
        return Err(TextError::Unterminated);
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for item in b.split(|&c| c == 0).filter(|i| !i.is_empty()) {
        let eq = item
            .iter()
            .position(|&c| c == b'=')
            .ok_or(TextError::NoEquals)?;
        let key = std::str::from_utf8(&item[..eq])
            .map_err(|_| TextError::Key(String::from_utf8_lossy(&item[..eq]).into_owned()))?;
        if !key_ok(key) {
            return Err(TextError::Key(key.to_owned()));
        }
        let value = &item[eq + 1..];
        if value.len() > VALUE_BYTES_MAX {
            return Err(TextError::Value(key.to_owned()));
        }
        let value = std::str::from_utf8(value).map_err(|_| TextError::Value(key.to_owned()))?;
        if out.iter().any(|(k, _)| k == key) {
            return Err(TextError::Repeated(key.to_owned()));
        }
        if out.len() >= PAIRS_MAX {
            return Err(TextError::TooMany);
        }
        out.push((key.to_owned(), value.to_owned()));
    }
    Ok(out)
}

/// Encodes `pairs` as a list: `key=value` and a NUL each.
pub fn encode_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, v) in pairs {
        b.extend_from_slice(k.as_ref().as_bytes());
        b.push(b'=');
        b.extend_from_slice(v.as_ref().as_bytes());
        b.push(0);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_login_list_round_trips() {
        let pairs = [
            ("InitiatorName", "iqn.1993-08.org.debian:01:abcdef"),
            ("SessionType", "Normal"),
            ("TargetName", "iqn.2026-11.org.ferry:debian.v1"),
            ("AuthMethod", "CHAP,None"),
        ];
        let b = encode_pairs(&pairs);
        let got = parse_pairs(&b).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[3], ("AuthMethod".to_owned(), "CHAP,None".to_owned()));
        assert_eq!(parse_pairs(b"").unwrap(), vec![]);
        assert_eq!(parse_pairs(b"A=1\0\0\0").unwrap().len(), 1);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        assert_eq!(parse_pairs(b"A=1"), Err(TextError::Unterminated));
        assert_eq!(parse_pairs(b"A\0"), Err(TextError::NoEquals));
        assert_eq!(parse_pairs(b"=1\0"), Err(TextError::Key(String::new())));
        assert_eq!(parse_pairs(b"A B=1\0"), Err(TextError::Key("A B".into())));
        assert_eq!(
            parse_pairs(b"A=1\0A=2\0"),
            Err(TextError::Repeated("A".into()))
        );
        assert_eq!(parse_pairs(b"A=\xff\0"), Err(TextError::Value("A".into())));
        let long = vec![b'a'; TEXT_BYTES_MAX + 1];
        assert_eq!(parse_pairs(&long), Err(TextError::Long(TEXT_BYTES_MAX + 1)));
        let many: Vec<u8> = (0..=PAIRS_MAX)
            .flat_map(|i| format!("K{i}=v\0").into_bytes())
            .collect();
        assert_eq!(parse_pairs(&many), Err(TextError::TooMany));
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_pairs(&b);
        }
    }
}
