//! Big-endian field access over a byte slice, with bounds checked on every read, and the
//! protocol's strings (UTF-8, no NUL, at most 4096 bytes), shared by options, meta context
//! queries and replies.

use crate::consts::MAX_STRING_LEN;

/// The slice ended before a field (`need` more bytes at `at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short {
    pub at: usize,
    pub need: usize,
}

/// A cursor over untrusted bytes; every read checks the remaining length.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        debug_assert!(self.pos <= self.buf.len(), "a reader never passes its end");
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.remaining() < n {
            return Err(Short {
                at: self.pos,
                need: n - self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Short> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}

/// Appends a length-prefixed (u32) string. The caller has checked the length fits.
pub(crate) fn put_str32(out: &mut Vec<u8>, s: &str) {
    debug_assert!(
        u32::try_from(s.len()).is_ok(),
        "a string of {} bytes has no u32 length",
        s.len()
    );
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Checks a protocol string: UTF-8, no NUL, at most 4096 bytes.
pub(crate) fn parse_string(bytes: &[u8]) -> Option<String> {
    if bytes.len() > MAX_STRING_LEN || bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes.to_vec()).ok()
}

/// `s` cut to at most 4096 bytes at a character boundary.
pub(crate) fn clamp(s: &str) -> &str {
    if s.len() <= MAX_STRING_LEN {
        return s;
    }
    let mut end = MAX_STRING_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    // A UTF-8 character is at most 4 bytes: the cut loses at most 3.
    debug_assert!(end + 3 >= MAX_STRING_LEN, "clamp cut {end} bytes");
    &s[..end]
}
