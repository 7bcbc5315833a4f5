//! Hostile requests whose first packet is never acknowledged (issue 30: their source may be
//! forged): they must neither hold the transfer slots (finding H2: 160 requests with
//! `timeout=255` from 20 addresses held all 128 slots for 25 minutes) nor draw more than a
//! packet or two (finding M: one 16-byte request drew 3,096 bytes, x194), and no window of
//! blocks goes out before the OACK is acknowledged (RFC 7440). Loopback addresses
//! 127.0.0.2.. stand for distinct hosts. The first-ACK deadline is short here so the tests
//! are fast; nothing asserts a duration.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Raw, TestServer, pattern, require, rrq};
use tftp::config::FIRST_PACKET_SENDS_MAX;
use tftp::{Config, Options, Packet, Snapshot};

/// The boot file; its 7-byte name makes a plain octet request 16 bytes long, as in the
/// finding.
const FILE: &str = "pxe.bin";
/// Its size: several blocks of 512.
const FILE_LEN: usize = 3000;
/// A plain request's size: opcode, name, NUL, "octet", NUL.
const PLAIN_REQUEST_LEN: usize = 2 + FILE.len() + 1 + 5 + 1;
/// Most bytes an address that acknowledged nothing may draw per byte it sent (one 516-byte
/// block per 16-byte request is 32x).
const AMPLIFICATION_MAX: usize = 50;
/// The first-ACK deadline of these tests.
const FIRST_ACK: Duration = Duration::from_millis(400);
/// How long a drain waits for one more queued packet (they are sent before the server
/// counts the transfer as ended, so they are already queued at the client).
const DRAIN_WAIT: Duration = Duration::from_millis(100);

fn config() -> Config {
    Config {
        first_ack_timeout: FIRST_ACK,
        ..Config::default()
    }
}

fn root() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join(FILE), pattern(FILE_LEN, 3)).unwrap();
    t
}

/// The count of rejections for `reason`, by its metric label.
fn rejected(s: &Snapshot, reason: &str) -> u64 {
    s.rejected_by_reason()
        .find(|(l, _)| *l == reason)
        .map_or(0, |(_, n)| n)
}

/// Every datagram queued at `c`: (bytes, sender).
fn drain(c: &Raw) -> Vec<(Vec<u8>, SocketAddr)> {
    std::iter::from_fn(|| c.try_recv(DRAIN_WAIT)).collect()
}

/// Fetches `FILE` with a raw RFC 1350 client; returns the content.
fn fetch(c: &Raw, server: SocketAddr) -> Vec<u8> {
    c.send(&rrq(FILE, Options::default()), server);
    let mut got = Vec::new();
    let mut next: u16 = 1;
    loop {
        let (b, tid) = c.recv();
        match Packet::parse(&b) {
            Ok(Packet::Data { block, data }) if block == next => {
                got.extend_from_slice(data);
                c.send_packet(&Packet::Ack { block }, tid);
                if data.len() < 512 {
                    return got;
                }
                next = next.wrapping_add(1);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Fetches `FILE` with tftp-hpa's client, if installed (the tool rule).
fn fetch_with_tftp_hpa(server: &TestServer, dir: &std::path::Path) {
    if !require("tftp") {
        return;
    }
    let dest = dir.join("got.bin");
    let out = Command::new("tftp")
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &server.port(),
            "-c",
            "get",
            FILE,
        ])
        .arg(&dest)
        .stdin(Stdio::null())
        .output()
        .expect("run tftp");
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read(&dest).unwrap() == pattern(FILE_LEN, 3));
}

#[test]
fn never_acknowledged_requests_with_timeout_255_from_20_addresses_leave_slots_for_others() {
    let t = root();
    let server = TestServer::dir(t.path(), config());
    // Finding H2: 8 requests from each of 20 addresses, each from its own port, asking for
    // the longest timeout; none is ever acknowledged.
    const ADDRESSES: u8 = 20;
    const PER_ADDRESS: usize = 8;
    let flood: Vec<Raw> = (0..ADDRESSES)
        .flat_map(|a| (0..PER_ADDRESS).map(move |_| Raw::bound(&format!("127.0.0.{}:0", a + 2))))
        .collect();
    let req = rrq(
        FILE,
        Options {
            timeout: Some(255),
            tsize: Some(0),
            ..Options::default()
        },
    );
    for c in &flood {
        c.send(&req, server.addr);
    }
    let total = flood.len() as u64;
    let s = server.wait_for("the flood is read", |s| s.requests == total);
    // Each address got at most one transfer at a time; nobody was told "server busy".
    assert_eq!(rejected(&s, "limit"), 0, "{s:?}");
    assert!(rejected(&s, "unacknowledged") > 0, "{s:?}");
    // A device on another address is served at once, by a raw client and by tftp-hpa.
    let device = Raw::new();
    assert!(fetch(&device, server.addr) == pattern(FILE_LEN, 3));
    fetch_with_tftp_hpa(&server, t.path());
    // Every flood transfer ends at the first-ACK deadline, not after 255 s x retries.
    let freed = Instant::now();
    let s = server.wait_for("every slot is free", |s| s.transfers_active == 0);
    eprintln!(
        "flood slots freed {:?} after the device's fetches",
        freed.elapsed()
    );
    assert_eq!(
        rejected(&s, "unacknowledged")
            + rejected(&s, "unexpected")
            + rejected(&s, "limit")
            + s.transfers_started,
        s.requests,
        "{s:?}"
    );
    assert_eq!(
        s.transfers_failed,
        s.transfers_started - s.transfers_completed
    );
}

#[test]
fn one_never_acknowledged_request_draws_one_packet() {
    let t = root();
    let server = TestServer::dir(t.path(), config());
    let c = Raw::new();
    let req = rrq(FILE, Options::default());
    assert_eq!(req.len(), PLAIN_REQUEST_LEN);
    assert_eq!(PLAIN_REQUEST_LEN, 16);
    c.send(&req, server.addr);
    server.wait_for("the transfer ends", |s| s.transfers_failed == 1);
    let got = drain(&c);
    let bytes: usize = got.iter().map(|(b, _)| b.len()).sum();
    eprintln!(
        "a {PLAIN_REQUEST_LEN}-byte request never acknowledged drew {} packets, {bytes} bytes",
        got.len()
    );
    // Block 1 (4 + 512 bytes), once.
    let sizes: Vec<usize> = got.iter().map(|(b, _)| b.len()).collect();
    assert_eq!(got.len(), 1, "packets of {sizes:?} bytes");
    assert!(
        bytes <= AMPLIFICATION_MAX * PLAIN_REQUEST_LEN,
        "{bytes} bytes"
    );
    assert!(matches!(
        Packet::parse(&got[0].0),
        Ok(Packet::Data { block: 1, .. })
    ));
}

#[test]
fn repeated_requests_from_one_port_draw_at_most_two_packets() {
    let t = root();
    let server = TestServer::dir(t.path(), config());
    let c = Raw::new();
    let req = rrq(FILE, Options::default());
    const REPEATS: u64 = 10;
    for _ in 0..REPEATS {
        c.send(&req, server.addr);
    }
    server.wait_for("the transfer ends", |s| {
        s.requests == REPEATS && s.transfers_failed == 1
    });
    let got = drain(&c);
    let bytes: usize = got.iter().map(|(b, _)| b.len()).sum();
    eprintln!(
        "{REPEATS} requests never acknowledged drew {} packets, {bytes} bytes",
        got.len()
    );
    assert!(
        got.len() <= FIRST_PACKET_SENDS_MAX as usize,
        "{} packets",
        got.len()
    );
    // Never more than one block per request sent: at most 50 times what the address sent.
    let sent = REPEATS as usize * PLAIN_REQUEST_LEN;
    assert!(
        bytes <= AMPLIFICATION_MAX * sent,
        "{bytes} bytes for {sent}"
    );
    // All from one transfer, all block 1.
    for (b, from) in &got {
        assert_eq!(*from, got[0].1);
        assert!(matches!(
            Packet::parse(b),
            Ok(Packet::Data { block: 1, .. })
        ));
    }
}

#[test]
fn no_window_goes_out_before_the_oack_is_acknowledged() {
    let t = root();
    let server = TestServer::dir(t.path(), config());
    let c = Raw::new();
    let opts = Options {
        blksize: Some(512),
        timeout: Some(1),
        windowsize: Some(8),
        ..Options::default()
    };
    c.send(&rrq(FILE, opts), server.addr);
    let (oack, tid) = c.recv();
    assert!(matches!(Packet::parse(&oack), Ok(Packet::Oack(o)) if o.windowsize == Some(8)));
    // ACKs of blocks never sent are not the OACK's acknowledgement.
    for block in [1, 8] {
        c.send_packet(&Packet::Ack { block }, tid);
    }
    let s = server.wait_for("the transfer ends", |s| s.transfers_failed == 1);
    let more = drain(&c);
    let sizes: Vec<usize> = more.iter().map(|(b, _)| b.len()).collect();
    assert!(
        more.is_empty(),
        "after the OACK, packets of {sizes:?} bytes"
    );
    assert_eq!(s.bytes_sent, 0);
    assert_eq!(s.retransmits, 0);
}

#[test]
fn a_second_request_from_an_unproven_address_gets_nothing_until_it_acknowledges() {
    let t = root();
    let server = TestServer::dir(t.path(), Config::default());
    let first = Raw::bound("127.0.0.2:0");
    let second = Raw::bound("127.0.0.2:0");
    let req = rrq(FILE, Options::default());
    first.send(&req, server.addr);
    let (b, tid) = first.recv();
    assert!(matches!(
        Packet::parse(&b),
        Ok(Packet::Data { block: 1, .. })
    ));
    // The address has a transfer whose first block is unacknowledged: no second one, and
    // no reply that a forged source could aim.
    second.send(&req, server.addr);
    server.wait_for("the second request refused", |s| {
        rejected(s, "unacknowledged") == 1
    });
    assert!(second.try_recv(DRAIN_WAIT).is_none());
    // Once block 1 is acknowledged the address is proven: its next request is served.
    first.send_packet(&Packet::Ack { block: 1 }, tid);
    let (b, from) = first.recv();
    assert_eq!(from, tid);
    assert!(matches!(
        Packet::parse(&b),
        Ok(Packet::Data { block: 2, .. })
    ));
    assert!(fetch(&second, server.addr) == pattern(FILE_LEN, 3));
}
