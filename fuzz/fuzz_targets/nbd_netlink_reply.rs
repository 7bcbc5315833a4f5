//! Fuzzes the reader of the Linux NBD driver's netlink replies (`nbd_proto::netlink`): the
//! datagrams the kernel answers the boot agent's `CTRL_CMD_GETFAMILY` and `NBD_CMD_CONNECT`.
//!
//! Input: `seq u32 (little-endian) | datagram`: one or more `nlmsghdr` messages (length,
//! type, flags, sequence, port) with their bodies.
//!
//! Must hold: no panic; an answer is only ever read from a message of the asked sequence
//! that lies within the datagram (a truncated one is an error, not a read past its end); a
//! refusal is a positive errno; the connect request the agent builds from the input's
//! numbers carries its own length in its header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd_proto::netlink::{Reply, connect_request, family_request, read_reply};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let seq = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let datagram = &data[4..];
    if let Ok(Reply::Refused(errno)) = read_reply(datagram, seq) {
        assert!(errno != 0, "a refusal names an errno");
    }
    let n = |i: usize| u64::from(datagram.get(i).copied().unwrap_or(0));
    for m in [
        family_request(seq),
        connect_request(
            u16::try_from(n(0) << 8 | n(1)).unwrap_or(0),
            seq,
            u32::try_from(n(2)).unwrap_or(0),
            u32::try_from(n(3)).unwrap_or(0),
            n(4) << 30,
            512,
            n(5),
        ),
    ] {
        let said = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]);
        assert_eq!(said as usize, m.len(), "a request's length field is its length");
    }
});
