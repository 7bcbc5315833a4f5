//! Fuzzes what an NBD client parses from a server (`nbd_proto::client`): reply headers
//! (simple and structured), chunk payloads of every type, and option reply headers.
//!
//! Input: bytes as a server would send them in transmission: a reply header, then payload.
//!
//! Must hold: no panic; an accepted non-data chunk header has a length within
//! `MAX_CHUNK_META_LEN`; an accepted option reply header within `MAX_OPTION_REPLY_LEN`.
//!
//! Seed corpus: `nbdkit -f memory 1M & tcpdump -w r.pcap -i lo port 10809 &
//! nbdcopy nbd://localhost null:` and keep the server's bytes after the handshake.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd_proto::client::{
    MAX_CHUNK_META_LEN, MAX_OPTION_REPLY_LEN, OptionReplyHeader, ReplyHeader, parse_chunk_payload,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = OptionReplyHeader::parse(data) {
        assert!(h.len <= MAX_OPTION_REPLY_LEN);
    }
    let Ok((h, n)) = ReplyHeader::parse(data) else {
        return;
    };
    if let ReplyHeader::Chunk { kind, len, .. } = h {
        if kind != nbd_proto::NBD_REPLY_TYPE_OFFSET_DATA {
            assert!(len <= MAX_CHUNK_META_LEN);
        }
        let rest = &data[n..];
        let payload = &rest[..rest.len().min(len as usize)];
        let _ = parse_chunk_payload(kind, payload);
    }
});
