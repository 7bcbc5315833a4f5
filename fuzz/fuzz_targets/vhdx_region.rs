//! Fuzzes `vhdx::region::RegionTable::parse` (MS-VHDX 2.2.3): signature, CRC-32C over the
//! 64 KiB slot, entry count cap, alignment, overflow, overlap, duplicates, required regions.
//!
//! Input: parsed as is (short inputs exercise truncation), then zero-padded to 64 KiB and
//! parsed again (the checksum covers the padding, so a few hundred bytes can form a valid
//! table).
//!
//! Must hold: no panic; a table that parses encodes to bytes that parse to the same table.
//!
//! Seed corpus (region table 1 at 192 KiB; the entries are in its first 80 bytes):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_region
//! qemu-img create -f vhdx /tmp/seed.vhdx 64M
//! dd if=/tmp/seed.vhdx of=fuzz/corpus/vhdx_region/qemu bs=64K skip=3 count=1
//! cat crates/vhdx/testdata/region_table.1 > fuzz/corpus/vhdx_region/libvhdi
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::region::{REGION_TABLE_LEN, RegionTable};

fn check(b: &[u8]) {
    if let Ok(t) = RegionTable::parse(b) {
        assert_eq!(
            RegionTable::parse(&t.to_bytes()),
            Ok(t),
            "region table round trip"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() < REGION_TABLE_LEN {
        let mut padded = data.to_vec();
        padded.resize(REGION_TABLE_LEN, 0);
        check(&padded);
    }
});
