//! Fuzzes the partition table codec (`bootfiles::partition`): the MBR, the GPT header and the
//! GPT entries array, composed the way `bootfiles::volume::volumes` reads a disk.
//!
//! Input: a whole (small) disk image. It is parsed with 512- and 4096-byte sectors. The
//! parsers must never panic, and every partition they accept must lie inside the disk with a
//! non-zero length; GPT partitions must not overlap.
//!
//! Seed corpus (the first 64 KiB of disks that sfdisk made):
//!
//! ```sh
//! mkdir -p fuzz/corpus/partition_table
//! for l in dos gpt; do
//!     truncate -s 64M /tmp/seed-$l.img
//!     printf 'label: %s\nstart=2048, size=4096\nstart=8192, size=8192\n' $l | sfdisk -q /tmp/seed-$l.img
//!     head -c 65536 /tmp/seed-$l.img > fuzz/corpus/partition_table/sfdisk-$l
//! done
//! ```
//!
//! Run: `cargo fuzz run partition_table fuzz/corpus/partition_table -- -max_len=65536`.
#![no_main]

use bootfiles::partition::{Partition, Sector0, parse_gpt_entries, parse_gpt_header, parse_mbr};
use libfuzzer_sys::fuzz_target;

fn check(parts: &[Partition], disk: u64) {
    for p in parts {
        assert!(p.len > 0, "empty partition {}", p.number);
        assert!(
            p.start.checked_add(p.len).is_some_and(|e| e <= disk),
            "partition past the end"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let disk = data.len() as u64;
    for ss in [512u32, 4096] {
        let s = ss as usize;
        let Some(sector0) = data.get(..s.max(512)) else {
            continue;
        };
        match parse_mbr(sector0, ss, disk) {
            Ok(Sector0::Mbr { partitions, .. }) => check(&partitions, disk),
            Ok(Sector0::Protective) => {
                let Some(lba1) = data.get(s..2 * s) else {
                    continue;
                };
                let Ok(header) = parse_gpt_header(lba1, ss, disk) else {
                    continue;
                };
                let (offset, len) = header.entries_span(ss);
                let start = offset as usize;
                let Some(array) = data.get(start..start + len) else {
                    continue;
                };
                if let Ok(parts) = parse_gpt_entries(&header, array, ss) {
                    check(&parts, disk);
                    for (i, a) in parts.iter().enumerate() {
                        for b in &parts[i + 1..] {
                            assert!(
                                a.start + a.len <= b.start || b.start + b.len <= a.start,
                                "partitions {} and {} overlap",
                                a.number,
                                b.number
                            );
                        }
                    }
                }
            }
            _ => {}
        }
    }
});
