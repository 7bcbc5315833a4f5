//! Fuzzes the legacy VHD footer parser (`vhdx::vhd::Footer::parse`) and the size rule.
//!
//! Input: any bytes, parsed as a footer (512 bytes, or the old 511-byte variant). The parser
//! must never panic; a footer that parses must re-encode to bytes that parse to the same value
//! with a good checksum.
//!
//! Seed corpus (the footer is the last 512 bytes of every VHD; the copy at offset 0 of a
//! dynamic disk is the same structure):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhd_footer
//! for t in fixed dynamic; do
//!     qemu-img create -f vpc -o subformat=$t /tmp/seed-$t.vhd 64M
//!     tail -c 512 /tmp/seed-$t.vhd > fuzz/corpus/vhd_footer/qemu-$t
//! done
//! qemu-img create -f vpc -o subformat=fixed,force_size=on /tmp/seed-fs.vhd 100M
//! tail -c 512 /tmp/seed-fs.vhd > fuzz/corpus/vhd_footer/qemu-force-size
//! cp crates/vhdx/testdata/file_footer.1 fuzz/corpus/vhd_footer/libvhdi
//! ```
//!
//! Run: `cargo fuzz run vhd_footer fuzz/corpus/vhd_footer`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::vhd::Footer;
use vhdx::vhd::footer::{chs_for_size, size_rule, virtual_size};

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = Footer::parse(data) else {
        return;
    };
    let footer = parsed.value;
    let _ = (
        size_rule(&footer),
        virtual_size(&footer),
        chs_for_size(footer.current_size),
    );
    let again = Footer::parse(&footer.to_bytes()).expect("an encoded footer parses");
    assert!(again.checksum.is_ok(), "encode writes a good checksum");
    assert_eq!(again.value, footer, "encode/parse round trip");
});
