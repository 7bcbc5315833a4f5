//! Fuzzes the legacy VHD dynamic disk header parser (`vhdx::vhd::DynamicHeader::parse`), its
//! table sizing, the parent locator text decoder and the BAT/bitmap helpers.
//!
//! Input: any bytes. The first 1024 are the header; the rest is used as locator data, as a
//! BAT and as a sector bitmap. Nothing may panic.
//!
//! Seed corpus (the dynamic header is the 1024 bytes at offset 512 of a dynamic VHD; qemu
//! writes no parent locators, so add libvhdi's sample, which has four):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhd_dynamic_header
//! for size in 1M 64M 3G; do
//!     qemu-img create -f vpc -o subformat=dynamic /tmp/seed-$size.vhd $size
//!     dd if=/tmp/seed-$size.vhd bs=512 skip=1 count=3 \
//!         of=fuzz/corpus/vhd_dynamic_header/qemu-$size    # header + first BAT sector
//! done
//! cp crates/vhdx/testdata/dynamic_disk_header.1 fuzz/corpus/vhd_dynamic_header/libvhdi
//! ```
//!
//! Run: `cargo fuzz run vhd_dynamic_header fuzz/corpus/vhd_dynamic_header`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::vhd::bat::{bitmap_runs, bitmap_size, sector_present};
use vhdx::vhd::dynamic::DYNAMIC_HEADER_LEN;
use vhdx::vhd::{Bat, DynamicHeader};

fuzz_target!(|data: &[u8]| {
    let rest = data.get(DYNAMIC_HEADER_LEN..).unwrap_or_default();
    let Ok(parsed) = DynamicHeader::parse(data) else {
        return;
    };
    let header = parsed.value;
    for locator in &header.locators {
        let _ = locator.data_space_bytes();
        let _ = locator.platform_code.decode_path(rest);
    }
    // Size the table for a disk as large as the table can describe, and one byte larger.
    let covered = u64::from(header.max_table_entries) * u64::from(header.block_size);
    let _ = header.entries_for_size(covered.saturating_add(1));
    if let Ok(entries) = header.entries_for_size(covered) {
        let _ = Bat::parse(rest, entries);
    }
    let bitmap_len = usize::try_from(bitmap_size(header.block_size)).unwrap_or(usize::MAX);
    let bitmap = &rest[..rest.len().min(bitmap_len)];
    let runs = bitmap_runs(
        bitmap,
        u64::from(header.parent_timestamp),
        u64::from(header.block_size),
    );
    let total: u64 = runs.iter().map(|r| r.len_bytes).sum();
    assert_eq!(total, u64::from(header.block_size), "runs cover the range");
    let _ = sector_present(bitmap, u64::from(header.max_table_entries));
});
