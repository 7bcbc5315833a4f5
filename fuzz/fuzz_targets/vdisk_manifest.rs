//! Fuzzes the vDisk manifest codec (`manifest::Manifest::parse`), as a bucket or a local
//! store may hand it any bytes.
//!
//! Input: any bytes.
//!
//! Must hold: no panic and no allocation past the limits; a parsed manifest has exactly
//! the chunks its size implies, and encodes to text that parses back to the same manifest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use manifest::{Manifest, chunk_count};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse(data) {
        assert_eq!(m.chunks.len() as u64, chunk_count(m.size, m.chunk_size));
        let text = m.encode();
        assert_eq!(Manifest::parse(text.as_bytes()).as_ref(), Ok(&m));
    }
});
