//! Fuzzes `vhdx::metadata::Metadata::parse` (MS-VHDX 2.6): the metadata table (signature,
//! entry count, item placement and overlap, unknown required items) and the system items
//! (block size, sector sizes, virtual size, page 83, parent locator); the parent locator of
//! a differencing disk then goes through `ParentLocator::parse`.
//!
//! Input: inputs of 64 KiB or more are a metadata region as is. Shorter inputs are *compact*:
//! the table's first `32 + 32 * EntryCount` bytes, then the item bytes. The target zero-pads
//! the table to 64 KiB and appends the items, so items at region offset 65536 + k are input
//! byte `table_len + k`. Short inputs are also parsed as is (truncation).
//!
//! Must hold: no panic; metadata that parses encodes (into `encoded_len()` bytes) to bytes
//! that parse to the same metadata.
//!
//! Seed corpus (metadata region at 3 MiB in a qemu-img image; 5 entries = 192 table bytes,
//! items = 40 bytes at 64 KiB):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_metadata
//! qemu-img create -f vhdx /tmp/seed.vhdx 64M
//! dd if=/tmp/seed.vhdx of=fuzz/corpus/vhdx_metadata/full bs=64K skip=48 count=2
//! { dd if=/tmp/seed.vhdx bs=64K skip=48 count=1 | head -c 192
//!   dd if=/tmp/seed.vhdx bs=64K skip=49 count=1 | head -c 40; } > fuzz/corpus/vhdx_metadata/compact
//! ```
//!
//! (Check the region offset first: `qemu-img` puts the metadata region at 3 MiB today; the
//! region table at 192 KiB is authoritative.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::metadata::{Metadata, TABLE_LEN};
use vhdx::parent::ParentLocator;

fn check(b: &[u8]) {
    let Ok(m) = Metadata::parse(b) else { return };
    if let Some(loc) = &m.parent_locator {
        let _ = ParentLocator::parse(loc);
    }
    let mut out = vec![0u8; m.encoded_len()];
    m.encode(&mut out);
    assert_eq!(Metadata::parse(&out), Ok(m), "metadata round trip");
}

/// Expands a compact input: table bytes padded to 64 KiB, then the item bytes.
fn expand(data: &[u8]) -> Vec<u8> {
    let count = data
        .get(10..12)
        .map_or(0, |c| usize::from(u16::from_le_bytes([c[0], c[1]])));
    let table_len = (32 + 32 * count).min(data.len()).min(TABLE_LEN);
    let mut region = data[..table_len].to_vec();
    region.resize(TABLE_LEN, 0);
    region.extend_from_slice(&data[table_len..]);
    region
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() < TABLE_LEN {
        check(&expand(data));
    }
});
