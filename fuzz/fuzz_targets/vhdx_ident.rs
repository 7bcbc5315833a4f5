//! Fuzzes `vhdx::ident::Ident::parse`: the file type identifier at offset 0 ("vhdxfile" and
//! the UTF-16LE creator string). The input is the first bytes of a file, as is.
//!
//! Must hold: no panic on any input; an identifier that parses encodes and parses again.
//!
//! Seed corpus (the identifier is the first 520 bytes; take the first 4 KiB):
//!
//! ```sh
//! mkdir -p fuzz/corpus/vhdx_ident
//! qemu-img create -f vhdx /tmp/seed.vhdx 64M
//! dd if=/tmp/seed.vhdx of=fuzz/corpus/vhdx_ident/qemu bs=4096 count=1
//! cat crates/vhdx/testdata/file_identifier.1 > fuzz/corpus/vhdx_ident/libvhdi
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhdx::ident::{IDENT_LEN, Ident};

fuzz_target!(|data: &[u8]| {
    let Ok(ident) = Ident::parse(data) else {
        return;
    };
    let mut out = vec![0u8; IDENT_LEN];
    ident.encode(&mut out);
    Ident::parse(&out).expect("an encoded identifier parses");
});
