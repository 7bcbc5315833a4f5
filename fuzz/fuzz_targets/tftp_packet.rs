//! Fuzzes the TFTP packet codec (`tftp::packet`, `tftp::options`): one datagram as a client
//! or server would send it, parsed by `Packet::parse`, then the server's option choice.
//!
//! Input: `u16 opcode | fields` (RRQ/WRQ: `filename NUL mode NUL [option NUL value NUL]...`;
//! DATA/ACK: `u16 block [data]`; ERROR: `u16 code message NUL`; OACK: options).
//!
//! Must hold: no panic; a parsed packet re-encodes to bytes that parse to the same packet;
//! a request stays within `MAX_REQUEST_LEN`; negotiation grants values within the bounds.
//!
//! Seed corpus: `tftp -m binary HOST -c get FILE` and `curl --tftp-blksize 1468 tftp://HOST/FILE`
//! against `ferry server --tftp-listen`, captured with tcpdump (UDP payloads).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tftp::packet::MAX_REQUEST_LEN;
use tftp::{Bounds, Packet, negotiate};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Packet::parse(data) else {
        return;
    };
    let mut again = Vec::new();
    p.encode(&mut again);
    assert_eq!(Packet::parse(&again).as_ref(), Ok(&p));
    if let Packet::Rrq(r) | Packet::Wrq(r) = &p {
        assert!(data.len() <= MAX_REQUEST_LEN);
        let b = Bounds {
            max_blksize: 1468,
            max_windowsize: 64,
            max_window_bytes: 1 << 20,
        };
        let n = negotiate(&r.options, data.len() as u64, &b);
        assert!((8..=1468).contains(&n.blksize));
        assert!(n.windowsize >= 1 && n.windowsize <= 64);
        assert!(usize::from(n.blksize) * usize::from(n.windowsize) <= (1 << 20).max(usize::from(n.blksize)));
    }
});
