//! Fuzzes the VHDX log (MS-VHDX 2.3): `vhdx::log::parse_entry` (entry header, CRC-32C over the
//! whole entry, descriptors, data sectors, wrap-around) and `vhdx::log::find_active` (the
//! search for the active sequence that replay applies).
//!
//! Input: bytes 0..16 are the log GUID in on-disk (mixed-endian) form; the rest, rounded down
//! to a multiple of 4 KiB, is the log. Bytes 16..20 (u32 LE, before rounding) are also the
//! log offset handed to `parse_entry`. Inputs need at least 4 KiB + 16 bytes to reach the
//! parsers, so run with `-max_len=65552` (docs/fuzzing.md; scripts/fuzz-smoke.sh does).
//!
//! Must hold: no panic, no overflow; an active sequence is non-empty, has consecutive
//! sequence numbers, and its head's tail points at its first entry; `Replay::check_extent`
//! against a file length taken from bytes 20..24 (in 4 KiB units) never lets the file grow
//! past that length plus `LOG_GROWTH_MAX` (rounded up to 1 MiB), and its accepted length
//! covers every write and LastFileOffset. Shapes worth seeding by hand: a LastFileOffset of
//! 1 TiB over a 4 MiB file, and a data descriptor at 1 TiB (both refused).
//!
//! Seed corpus (qemu writes BAT updates through the log; the log is at 1 MiB and its first
//! entry carries the GUID at byte 32):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_log
//! qemu-img create -f vhdx -o log_size=1M /tmp/seed.vhdx 64M
//! qemu-io -c 'write -P 0xab 0 4M' /tmp/seed.vhdx
//! { dd if=/tmp/seed.vhdx bs=1 skip=$((1048576 + 32)) count=16
//!   dd if=/tmp/seed.vhdx bs=4K skip=256 count=4; } > fuzz/corpus/vhdx_log/qemu
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::Guid;
use vhdx::log::{self, SECTOR};

fuzz_target!(|data: &[u8]| {
    let Some((guid, rest)) = data.split_first_chunk::<16>() else {
        return;
    };
    let guid = Guid::from_le_bytes(guid);
    let log = &rest[..rest.len() / SECTOR * SECTOR];
    if let Some(off) = rest.first_chunk::<4>() {
        let _ = log::parse_entry(log, u32::from_le_bytes(*off) as usize, guid);
    }
    let Ok(Some(replay)) = log::find_active(log, guid) else {
        return;
    };
    let entries = &replay.entries;
    assert!(!entries.is_empty(), "an active sequence has a head");
    assert!(
        entries
            .windows(2)
            .all(|w| w[0].sequence_number.checked_add(1) == Some(w[1].sequence_number)),
        "sequence numbers are consecutive"
    );
    let file_len = rest.get(4..8).map_or(0, |b| {
        u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))) << 12
    });
    if let Ok(len) = replay.check_extent(file_len) {
        let bound = (file_len + log::LOG_GROWTH_MAX).next_multiple_of(vhdx::MIB);
        assert!(
            len >= file_len && len <= bound,
            "replay grows the file too far"
        );
        for e in entries {
            assert!(
                e.last_file_offset <= len,
                "LastFileOffset beyond the accepted length"
            );
        }
    }
    let head = entries.last().expect("non-empty");
    assert_eq!(
        u64::from(head.tail),
        entries[0].log_offset,
        "the run starts at the head's tail"
    );
});
