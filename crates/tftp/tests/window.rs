//! Windowed transfers (RFC 7440) and transfer IDs (RFC 1350 §4) with a raw UDP client built
//! from the crate's codec: the OACK's values, a lost block restarting the window after the
//! last block received, retransmission of an unacknowledged window after the timeout (and of
//! the OACK when the client repeats its request), a silent client given up, block
//! number rollover with windows, and packets from a wrong transfer ID answered with ERROR 5
//! without disturbing the transfer.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Raw, TestServer, pattern, rrq};
use tftp::{Config, ErrorCode, Options, Packet};

/// A DATA packet's block number and payload.
fn data(b: &[u8]) -> (u16, Vec<u8>) {
    match Packet::parse(b) {
        Ok(Packet::Data { block, data }) => (block, data.to_vec()),
        other => panic!("expected DATA, got {other:?}"),
    }
}

fn ack(c: &Raw, block: u16, to: SocketAddr) {
    c.send_packet(&Packet::Ack { block }, to);
}

/// Sends the RRQ and takes the OACK: the transfer's address and the accepted options.
fn start(c: &Raw, server: SocketAddr, name: &str, opts: Options) -> (SocketAddr, Options) {
    c.send(&rrq(name, opts), server);
    let (b, tid) = c.recv();
    assert_ne!(tid, server, "the transfer must come from a new port");
    match Packet::parse(&b) {
        Ok(Packet::Oack(o)) => (tid, o),
        other => panic!("expected an OACK, got {other:?}"),
    }
}

/// Receives the rest of a transfer whose OACK was acknowledged, acknowledging each full
/// window; `next` is the next absolute block expected, `got` what arrived so far.
fn finish(c: &Raw, tid: SocketAddr, o: Options, mut next: u64, got: &mut Vec<u8>) {
    let bs = usize::from(o.blksize.unwrap_or(512));
    let window = u64::from(o.windowsize.unwrap_or(1));
    let mut in_window = 0;
    loop {
        let (b, from) = c.recv();
        assert_eq!(from, tid);
        let (block, d) = data(&b);
        if block != tftp::sender::wire_block(next) {
            continue; // a retransmitted block already held
        }
        got.extend_from_slice(&d);
        in_window += 1;
        if d.len() < bs {
            ack(c, block, tid);
            return;
        }
        if in_window == window {
            ack(c, block, tid);
            in_window = 0;
        }
        next += 1;
    }
}

fn file(dir: &std::path::Path, name: &str, len: usize, seed: u64) -> Vec<u8> {
    let v = pattern(len, seed);
    std::fs::write(dir.join(name), &v).unwrap();
    v
}

#[test]
fn window_of_eight_with_a_lost_block() {
    let t = tempfile::tempdir().unwrap();
    let want = file(t.path(), "w.bin", 40 * 1024 + 100, 1);
    let server = TestServer::dir(t.path(), Config::default());
    let c = Raw::new();
    let (tid, o) = start(
        &c,
        server.addr,
        "w.bin",
        Options {
            blksize: Some(1024),
            timeout: Some(5),
            tsize: Some(0),
            windowsize: Some(8),
        },
    );
    assert_eq!(
        o,
        Options {
            blksize: Some(1024),
            timeout: Some(5),
            tsize: Some(want.len() as u64),
            windowsize: Some(8),
        }
    );
    ack(&c, 0, tid);
    let mut got = Vec::new();
    let first: Vec<(u16, Vec<u8>)> = (0..8).map(|_| data(&c.recv().0)).collect();
    assert_eq!(
        first.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<u16>>()
    );
    // Blocks 6..=8 "lost": acknowledge 5; the next window starts at 6.
    for (_, d) in &first[..5] {
        got.extend_from_slice(d);
    }
    ack(&c, 5, tid);
    let (block, d6) = data(&c.recv().0);
    assert_eq!(block, 6);
    got.extend_from_slice(&d6);
    let rest: Vec<(u16, Vec<u8>)> = (0..7).map(|_| data(&c.recv().0)).collect();
    assert_eq!(
        rest.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        (7..=13).collect::<Vec<u16>>()
    );
    for (_, d) in &rest {
        got.extend_from_slice(d);
    }
    ack(&c, 13, tid);
    finish(&c, tid, o, 14, &mut got);
    assert!(got == want, "content differs");
    let s = server.wait_for("the transfer completes", |s| s.transfers_completed == 1);
    assert!(s.retransmits >= 3, "blocks 6..=8 went out twice: {s:?}");
}

#[test]
fn an_unacknowledged_window_is_sent_again_after_the_timeout() {
    let t = tempfile::tempdir().unwrap();
    let want = file(t.path(), "r.bin", 10 * 512, 2);
    let server = TestServer::dir(t.path(), Config::default());
    let c = Raw::new();
    let opts = Options {
        timeout: Some(1),
        windowsize: Some(4),
        ..Options::default()
    };
    let (tid, o) = start(&c, server.addr, "r.bin", opts);
    // The OACK "lost": the client repeats its request and the OACK comes again (the server
    // resends a first packet only when asked, see `unacknowledged.rs`).
    c.send(&rrq("r.bin", opts), server.addr);
    let (b, from) = c.recv();
    assert_eq!(from, tid);
    assert!(matches!(Packet::parse(&b), Ok(Packet::Oack(_))));
    ack(&c, 0, tid);
    let blocks: Vec<u16> = (0..4).map(|_| data(&c.recv().0).0).collect();
    assert_eq!(blocks, [1, 2, 3, 4]);
    // No ACK: the same window again.
    let again: Vec<u16> = (0..4).map(|_| data(&c.recv().0).0).collect();
    assert_eq!(again, [1, 2, 3, 4]);
    ack(&c, 4, tid);
    let mut got = want[..4 * 512].to_vec();
    finish(&c, tid, o, 5, &mut got);
    assert!(got == want);
    let s = server.wait_for("the transfer completes", |s| s.transfers_completed == 1);
    assert!(s.retransmits >= 5, "{s:?}");
}

#[test]
fn a_silent_client_is_given_up_after_the_retries() {
    let t = tempfile::tempdir().unwrap();
    file(t.path(), "s.bin", 5000, 3);
    let config = Config {
        max_retries: 2,
        ..Config::default()
    };
    let server = TestServer::dir(t.path(), config);
    let c = Raw::new();
    let (tid, _) = start(
        &c,
        server.addr,
        "s.bin",
        Options {
            timeout: Some(1),
            ..Options::default()
        },
    );
    // The OACK is acknowledged, then the client goes silent: block 1 goes out three times.
    ack(&c, 0, tid);
    let s = server.wait_for("the transfer fails", |s| s.transfers_failed == 1);
    assert_eq!(s.transfers_completed, 0);
    assert_eq!(s.retransmits, 2);
    assert_eq!(s.transfers_active, 0);
    // Its slot is free again: the same client address and port may ask again.
    let opts = Options {
        tsize: Some(0),
        ..Options::default()
    };
    c.send(&rrq("s.bin", opts), server.addr);
    let (b, tid2) = loop {
        // Skip the first transfer's OACKs still queued at the client.
        let (b, from) = c.recv();
        if from != tid {
            break (b, from);
        }
    };
    assert!(matches!(Packet::parse(&b), Ok(Packet::Oack(o)) if o.tsize == Some(5000)));
    assert_ne!(tid2, tid);
}

#[test]
fn windows_roll_over_past_65535_blocks() {
    let t = tempfile::tempdir().unwrap();
    let want = file(t.path(), "big.bin", 65_536 * 8 + 5, 4);
    let server = TestServer::dir(t.path(), Config::default());
    let c = Raw::new();
    let (tid, o) = start(
        &c,
        server.addr,
        "big.bin",
        Options {
            blksize: Some(8),
            windowsize: Some(64),
            ..Options::default()
        },
    );
    ack(&c, 0, tid);
    let mut got = Vec::new();
    finish(&c, tid, o, 1, &mut got);
    assert_eq!(got.len(), want.len());
    assert!(got == want);
    server.wait_for("the transfer completes", |s| s.transfers_completed == 1);
}

#[test]
fn a_wrong_transfer_id_gets_error_5_and_the_transfer_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let want = file(t.path(), "t.bin", 3000, 5);
    let server = TestServer::dir(t.path(), Config::default());
    let c = Raw::new();
    let (tid, o) = start(
        &c,
        server.addr,
        "t.bin",
        Options {
            blksize: Some(1000),
            // Long enough that no retransmitted OACK arrives while the intruder is answered.
            timeout: Some(30),
            ..Options::default()
        },
    );
    let intruder = Raw::new();
    ack(&intruder, 0, tid);
    assert_eq!(intruder.expect_error(), ErrorCode::UnknownTid.to_u16());
    intruder.send(&[0, 3, 0, 1, 9, 9, 9], tid);
    assert_eq!(intruder.expect_error(), 5);
    // The intruder's ACK 0 did not start the data.
    assert!(c.try_recv(Duration::from_millis(200)).is_none());
    ack(&c, 0, tid);
    let mut got = Vec::new();
    finish(&c, tid, o, 1, &mut got);
    assert!(got == want);
    let s = server.wait_for("the transfer completes", |s| s.transfers_completed == 1);
    assert_eq!(s.rejected(tftp::Rejected::WrongTid), 2);
}
