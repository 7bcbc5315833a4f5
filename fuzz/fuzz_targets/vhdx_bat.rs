//! Fuzzes the BAT (MS-VHDX 2.5): `vhdx::bat::Layout` geometry, `vhdx::bat::parse` over a BAT
//! region (states, the payload/sector-bitmap interleave, offsets over the headers,
//! PARTIALLY_PRESENT without a parent), and `vhdx::bitmap::runs` over sector bitmap bytes.
//!
//! Input: a 14-byte prefix, then the BAT region bytes.
//!
//! ```text
//! byte 0       block size = 1 MiB << (byte % 9)           (1 MiB ..= 256 MiB)
//! byte 1       bit 0: logical sector 4096 (else 512); bit 1: has_parent
//! bytes 2..10  virtual size, u64 LE (any value; Layout::new refuses 0 and > 64 TiB)
//! bytes 10..14 start, count (u16 LE each) of a bitmap::runs call over the region bytes,
//!              clamped to the bits present (runs indexes the caller's bitmap)
//! ```
//!
//! Must hold: no panic, no overflow; a parsed BAT has exactly `total_entries()` entries; the
//! last payload index (and, with a parent, the last bitmap index) is inside the BAT; runs
//! cover `count` bits, alternate, and agree with `bitmap::get`.
//!
//! Seed corpus (a 64 MiB qemu-img image has 8 MiB blocks, 512-byte sectors, BAT at 2 MiB):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_bat
//! qemu-img create -f vhdx /tmp/seed.vhdx 64M
//! qemu-io -c 'write -P 0xab 0 4M' /tmp/seed.vhdx
//! { printf '\003\000\000\000\000\004\000\000\000\000\000\000\100\000'
//!   dd if=/tmp/seed.vhdx bs=4K skip=512 count=1; } > fuzz/corpus/vhdx_bat/qemu
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::bat::{self, Layout};
use vhdx::bitmap;

const PREFIX_LEN: usize = 14;

fn check_bat(layout: &Layout, region: &[u8]) {
    let Ok(entries) = bat::parse(layout, region) else {
        return;
    };
    assert_eq!(
        entries.len() as u64,
        layout.total_entries(),
        "one entry per needed index"
    );
    let blocks = layout.data_blocks();
    if blocks > 0 {
        assert!(
            layout.payload_index(blocks - 1) < layout.total_entries(),
            "last payload index"
        );
    }
    if layout.has_parent && layout.bitmap_blocks() > 0 {
        let last = layout.bitmap_index(layout.bitmap_blocks() - 1);
        assert!(last < layout.total_entries(), "last bitmap index");
        assert!(bat::is_bitmap_index(layout, last));
    }
}

fn check_runs(bits: &[u8], start: u64, count: u64) {
    let total_bits = bits.len() as u64 * 8;
    let start = start.min(total_bits);
    let count = count.min(total_bits - start);
    let runs = bitmap::runs(bits, start, count);
    assert_eq!(
        runs.iter().map(|r| r.0).sum::<u64>(),
        count,
        "runs cover the range"
    );
    assert!(
        runs.windows(2).all(|w| w[0].1 != w[1].1),
        "adjacent runs differ"
    );
    let mut s = start;
    for (len, bit) in runs {
        assert!(len > 0);
        assert!(bitmap::get(bits, s) == bit && bitmap::get(bits, s + len - 1) == bit);
        s += len;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((prefix, region)) = data.split_first_chunk::<PREFIX_LEN>() else {
        return;
    };
    let block_size = 1u32 << (20 + u32::from(prefix[0]) % 9);
    let sector_size = if prefix[1] & 1 != 0 { 4096 } else { 512 };
    let has_parent = prefix[1] & 2 != 0;
    let virtual_size = u64::from_le_bytes(prefix[2..10].try_into().expect("8 bytes"));
    // Block and sector sizes from the prefix are always valid; the virtual size is refused
    // when zero or above 64 TiB, which must be an error, never a panic.
    match Layout::new(block_size, sector_size, virtual_size, has_parent) {
        Ok(layout) => check_bat(&layout, region),
        Err(_) => assert!(virtual_size == 0 || virtual_size > vhdx::MAX_VIRTUAL_SIZE),
    }
    let start = u64::from(u16::from_le_bytes([prefix[10], prefix[11]]));
    let count = u64::from(u16::from_le_bytes([prefix[12], prefix[13]]));
    check_runs(region, start, count);
});
