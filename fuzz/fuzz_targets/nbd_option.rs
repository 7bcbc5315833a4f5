//! Fuzzes NBD option haggling input (`nbd_proto::option`, `nbd_proto::meta`): the 16-byte
//! option header with its length cap, then the option's payload as the server would decode
//! it, plus the option-reply and client-flags parsers over the same bytes.
//!
//! Input: the bytes a client sends after the greeting: `IHAVEOPT | u32 option | u32 length |
//! data`. When the magic is wrong the header parser must refuse it; otherwise the first 16
//! bytes are a header and the rest (up to `length`) its payload.
//!
//! Must hold: no panic; a header is accepted only with `length <= MAX_OPTION_LEN`; a decoded
//! option re-encodes to a message that decodes to the same option.
//!
//! Seed corpus: capture a real negotiation, e.g.
//! `nbdkit -f memory 1M & tcpdump -w opt.pcap -i lo port 10809 & nbdinfo --map nbd://localhost`
//! and keep the client's bytes after its 4-byte flags, one option per file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd_proto::option::OptionReply;
use nbd_proto::{ClientFlags, ClientOption, MAX_OPTION_LEN, MetaQuery, OptionHeader};

fuzz_target!(|data: &[u8]| {
    let _ = ClientFlags::parse(data, 3);
    let _ = OptionReply::parse(data);
    let _ = MetaQuery::parse(data);
    let Ok(h) = OptionHeader::parse(data) else {
        return;
    };
    assert!(h.len <= MAX_OPTION_LEN);
    let rest = &data[16..];
    let payload = &rest[..rest.len().min(h.payload_len())];
    let h = OptionHeader {
        len: payload.len() as u32,
        ..h
    };
    if let Ok(opt) = ClientOption::parse(h, payload) {
        let mut again = Vec::new();
        opt.encode(&mut again);
        let h2 = OptionHeader::parse(&again).expect("re-encoded header parses");
        let back = ClientOption::parse(h2, &again[16..]).expect("re-encoded option parses");
        // ABORT ignores its data and an unknown option keeps only its code.
        assert_eq!(back.code(), opt.code());
    }
});
