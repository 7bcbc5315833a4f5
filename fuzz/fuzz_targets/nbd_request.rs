//! Fuzzes NBD transmission framing (`nbd_proto::request`, `nbd_proto::reply`): a byte
//! stream of requests split by `Request::check`, each header decoded by `Request::parse`,
//! and the reply-chunk parser over the same bytes.
//!
//! Input: what a client sends in transmission, `NBD_REQUEST_MAGIC | u16 flags | u16 type |
//! u64 cookie | u64 offset | u32 length | [write data]`, repeated.
//!
//! Must hold: no panic; `check` only ever advances by 28 bytes plus a write payload of at most
//! `MAX_PAYLOAD` bytes, and a checked request re-encodes to the same 28 bytes.
//!
//! Seed corpus: `nbdsh -u nbd://localhost -c 'h.pread(512, 0); h.pwrite(b"x"*512, 0)'`
//! against `nbdkit memory 1M`, captured with tcpdump, client bytes after `NBD_OPT_GO`.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use nbd_proto::reply::{Chunk, SimpleReply};
use nbd_proto::request::MAX_PAYLOAD;
use nbd_proto::{REQUEST_LEN, Request};

fuzz_target!(|data: &[u8]| {
    let _ = Chunk::parse(data);
    let _ = SimpleReply::parse(data);
    let mut cur = Cursor::new(data);
    loop {
        let start = cur.position();
        let Ok(req) = Request::check(&mut cur) else {
            break;
        };
        let used = cur.position() - start;
        assert!(req.payload_len() <= MAX_PAYLOAD);
        assert_eq!(used, REQUEST_LEN as u64 + u64::from(req.payload_len()));
        let s = start as usize;
        let mut again = Vec::new();
        req.encode(&mut again);
        assert_eq!(&again[..], &data[s..s + REQUEST_LEN]);
    }
});
