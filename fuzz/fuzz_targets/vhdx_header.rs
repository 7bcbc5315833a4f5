//! Fuzzes `vhdx::header::Header::parse` and `vhdx::header::choose` (MS-VHDX 2.2.2): signature,
//! CRC-32C, versions and log placement of one 4 KiB header, and the choice between two copies.
//!
//! Input: `Header::parse` sees the input as is. `choose` sees two halves: with at least 8 KiB,
//! the first 4 KiB and the rest; otherwise the input split in the middle, each half padded
//! with zeros to 4 KiB (the checksum covers the padding, so short inputs can still be valid).
//!
//! Must hold: no panic; a header that parses encodes to bytes that parse to the same header;
//! the header `choose` returns is the parse of the slot it names.
//!
//! Seed corpus (header 1 at 64 KiB, header 2 at 128 KiB):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_header
//! qemu-img create -f vhdx /tmp/seed.vhdx 64M
//! dd if=/tmp/seed.vhdx of=fuzz/corpus/vhdx_header/h1 bs=4096 skip=16 count=1
//! dd if=/tmp/seed.vhdx of=fuzz/corpus/vhdx_header/h2 bs=4096 skip=32 count=1
//! cat fuzz/corpus/vhdx_header/h1 fuzz/corpus/vhdx_header/h2 > fuzz/corpus/vhdx_header/pair
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::header::{HEADER_LEN, Header, Slot, choose};

fn padded(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    v.resize(v.len().max(HEADER_LEN), 0);
    v
}

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::parse(data) {
        assert_eq!(Header::parse(&h.to_bytes()), Ok(h), "header round trip");
    }
    let (first, second) = if data.len() >= 2 * HEADER_LEN {
        (data[..HEADER_LEN].to_vec(), data[HEADER_LEN..].to_vec())
    } else {
        let (a, b) = data.split_at(data.len() / 2);
        (padded(a), padded(b))
    };
    if let Ok(current) = choose(&first, &second) {
        let chosen = match current.slot {
            Slot::First => &first,
            Slot::Second => &second,
        };
        assert_eq!(
            Header::parse(chosen),
            Ok(current.header),
            "choose names its slot"
        );
    }
});
