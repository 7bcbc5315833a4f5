//! Fuzzes the boot set codec (`bootset::BootSet::decode`), as a store file or the farm
//! database may hand it any bytes.
//!
//! Input: any bytes. Seed corpus: run `ferry server` on a store, boot a version once
//! (or replay a trace with `ferry-bench bootstorm`) and copy `NAME.N.avhdx.bootset`.
//!
//! Must hold: no panic and no allocation past the limits; a decoded set encodes to the
//! same bytes, and its extents are disjoint and inside the version's virtual size.
#![no_main]

use bootset::BootSet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = BootSet::decode(data) {
        assert_eq!(s.encode(), data);
        for e in &s.extents {
            assert!(e.end() <= s.identity.size_bytes);
        }
    }
});
