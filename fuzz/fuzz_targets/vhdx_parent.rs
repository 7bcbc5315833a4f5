//! Fuzzes `vhdx::parent::ParentLocator::parse` (MS-VHDX 2.6.2.6): locator type, pair count
//! cap, key/value bounds, UTF-16LE text, duplicate keys, and `parent_linkage` as a GUID.
//!
//! Input: the parent locator metadata item, as is.
//!
//! Must hold: no panic; a locator that parses encodes to bytes that parse to the same locator.
//!
//! Seed corpus: qemu-img cannot create differencing VHDX, so build one with Hyper-V
//! (`New-VHD -Differencing`) and cut the item out (its offset and length are in the metadata
//! table entry with GUID A8D35F2D-B30B-454D-ABF7-D3D84834AB0C), or write one by hand:
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_parent
//! python3 - > fuzz/corpus/vhdx_parent/handmade <<'PY'
//! import struct, sys, uuid
//! pairs = [("parent_linkage", "{83e4b5a7-3bd6-4a6f-8e8e-0c9e6b1f0a11}"),
//!          ("relative_path", "..\\base.vhdx"), ("absolute_win32_path", "C:\\vm\\base.vhdx")]
//! head = uuid.UUID("B04AEFB7-D19E-4A81-B789-25B8E9445913").bytes_le + struct.pack("<HH", 0, len(pairs))
//! body, table, at = b"", b"", 20 + 12 * len(pairs)
//! for k, v in pairs:
//!     kb, vb = k.encode("utf-16-le"), v.encode("utf-16-le")
//!     table += struct.pack("<IIHH", at, at + len(kb), len(kb), len(vb))
//!     body += kb + vb
//!     at += len(kb) + len(vb)
//! sys.stdout.buffer.write(head + table + body)
//! PY
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::parent::ParentLocator;

fuzz_target!(|data: &[u8]| {
    let Ok(loc) = ParentLocator::parse(data) else {
        return;
    };
    assert!(loc.linkage().is_some(), "parse checks parent_linkage");
    let _ = loc.linkage2();
    assert_eq!(
        ParentLocator::parse(&loc.to_bytes()),
        Ok(loc),
        "parent locator round trip"
    );
});
