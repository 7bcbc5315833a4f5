//! Malformed and hostile clients over a raw TCP stream: each must get the spec's error (or a
//! closed connection), be counted by `NbdMetrics::protocol_error` where it broke the
//! protocol, and leave the server serving others with bounded memory.

use crate::common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Chain, Raw, Reply, SIZE, Server, req};
use interop::{MIB, pattern};
use nbd_proto::option::OptionReply;
use nbd_proto::reply::{ChunkPayload, Descriptor};
use nbd_proto::{
    ClientOption, Command, CommandFlags, IHAVEOPT, InfoRequest, MetaQuery, NBD_EINVAL, NBD_ENOSPC,
    NBD_EOVERFLOW, NBD_EPERM, NBD_OPT_GO, NBD_REP_ERR_INVALID, NBD_REP_ERR_TOO_BIG,
    NBD_REP_ERR_UNKNOWN, NBD_REP_ERR_UNSUP, NBD_STATE_ZERO, OptionHeader, Request,
};
use nbd_server::ServerConfig;

fn error_chunk(r: &Reply) -> Option<u32> {
    match r {
        Reply::Chunk(c) => match &c.payload {
            ChunkPayload::Error { error, .. } => Some(*error),
            _ => None,
        },
        Reply::Simple { error, .. } => Some(*error),
    }
}

/// The server still completes a whole handshake and a read for a well-behaved client.
fn assert_serves(srv: &Server) {
    let mut c = Raw::go(srv.addr, "golden", false);
    c.request(&req(Command::Read, 1, 0, 4096));
    let (r, data) = c.reply(4096);
    assert_eq!(
        r,
        Reply::Simple {
            error: 0,
            cookie: 1
        }
    );
    assert_eq!(data, pattern(4096, 1));
}

/// Waits (bounded) until every connection the server accepted has been closed.
fn wait_all_closed(srv: &Server) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.metrics.closed.load(Ordering::SeqCst) < srv.metrics.opened.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "connections not closed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_client_flags_close_the_connection() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.send(&0xdead_beefu32.to_be_bytes());
    assert!(c.closed());
    wait_all_closed(&srv);
    assert_eq!(protocol_errors_soon(&srv, 1), ["client flags"]);
    assert_serves(&srv);
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    let mut h = Vec::new();
    OptionHeader {
        option: NBD_OPT_GO,
        len: 0,
    }
    .encode(&mut h);
    h[0] ^= 0xff;
    c.send(&h);
    assert!(c.closed());
    wait_all_closed(&srv);
    assert_eq!(protocol_errors_soon(&srv, 1), ["option magic"]);
    assert_serves(&srv);
}

#[test]
fn unknown_option_gets_err_unsup_and_negotiation_continues() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    let mut v = Vec::new();
    OptionHeader {
        option: 0x4242,
        len: 5,
    }
    .encode(&mut v);
    v.extend_from_slice(b"hello");
    c.send(&v);
    let (opt, r) = c.option_reply();
    assert_eq!(opt, 0x4242);
    assert!(
        matches!(
            r,
            OptionReply::Error {
                code: NBD_REP_ERR_UNSUP,
                ..
            }
        ),
        "{r:?}"
    );
    // An invalid known option gets NBD_REP_ERR_INVALID, an unknown export ERR_UNKNOWN.
    c.send(&{
        let mut v = Vec::new();
        OptionHeader {
            option: NBD_OPT_GO,
            len: 2,
        }
        .encode(&mut v);
        v.extend_from_slice(&[0, 0]);
        v
    });
    let (_, r) = c.option_reply();
    assert!(
        matches!(
            r,
            OptionReply::Error {
                code: NBD_REP_ERR_INVALID,
                ..
            }
        ),
        "{r:?}"
    );
    c.option(&ClientOption::Go(InfoRequest {
        name: "nope".into(),
        requests: vec![],
    }));
    let (_, r) = c.option_reply();
    assert!(
        matches!(
            r,
            OptionReply::Error {
                code: NBD_REP_ERR_UNKNOWN,
                ..
            }
        ),
        "{r:?}"
    );
    // Still negotiating: GO on a real export works on the same connection.
    c.option(&ClientOption::Go(InfoRequest {
        name: "golden".into(),
        requests: vec![],
    }));
    assert_eq!(c.option_replies().last(), Some(&OptionReply::Ack));
    assert!(srv.metrics.protocol_errors().is_empty());
}

/// The protocol errors counted once `n` are (the connection's task counts after it closed
/// the socket, so a client may see the close first), or what is counted after 10 s.
fn protocol_errors_soon(srv: &Server, n: usize) -> Vec<&'static str> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = srv.metrics.protocol_errors();
        if got.len() >= n || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn one_gib_option_length_gets_too_big_and_close_without_reading() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    let mut h = Vec::new();
    OptionHeader {
        option: NBD_OPT_GO,
        len: 1 << 30,
    }
    .encode(&mut h);
    c.send(&h);
    // The server answers and closes at once, without waiting for (or allocating) the 1 GiB
    // it was promised: had it tried to read the payload, this would time out instead.
    let (opt, r) = c.option_reply();
    assert_eq!(opt, NBD_OPT_GO);
    assert!(
        matches!(
            r,
            OptionReply::Error {
                code: NBD_REP_ERR_TOO_BIG,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(c.closed());
    assert_eq!(protocol_errors_soon(&srv, 1), ["option too long"]);
    assert_serves(&srv);
}

#[test]
fn reads_past_the_end_get_einval() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    // Simple replies.
    let mut c = Raw::go(srv.addr, "golden", false);
    c.request(&req(Command::Read, 7, SIZE - 512, 1024));
    assert_eq!(
        c.reply(1024).0,
        Reply::Simple {
            error: NBD_EINVAL,
            cookie: 7
        }
    );
    c.request(&req(Command::Read, 8, u64::MAX - 10, 512)); // offset + len overflows
    assert_eq!(
        c.reply(512).0,
        Reply::Simple {
            error: NBD_EINVAL,
            cookie: 8
        }
    );
    // Structured replies: an error chunk, then the connection still works.
    let mut c = Raw::go(srv.addr, "golden", true);
    c.request(&req(Command::Read, 9, SIZE, 1));
    let (r, _) = c.reply(0);
    assert_eq!(error_chunk(&r), Some(NBD_EINVAL), "{r:?}");
    // The chain's last data ends at 62 MiB; the tail reads as zeros and comes as a hole.
    let data_end = 62 * MIB;
    c.request(&req(Command::Read, 10, data_end - 4096, 4096));
    let (r, _) = c.reply(0);
    let Reply::Chunk(ch) = r else {
        panic!("simple reply to a structured read")
    };
    assert!(ch.done);
    assert!(
        matches!(ch.payload, ChunkPayload::OffsetData { offset, ref data }
            if offset == data_end - 4096 && data.len() == 4096),
        "{ch:?}"
    );
    c.request(&req(Command::Read, 11, SIZE - 4096, 4096));
    let (r, _) = c.reply(0);
    let Reply::Chunk(ch) = r else {
        panic!("simple reply to a structured read")
    };
    assert_eq!(
        ch.payload,
        ChunkPayload::OffsetHole {
            offset: SIZE - 4096,
            len: 4096
        }
    );
    assert!(srv.metrics.protocol_errors().is_empty());
}

#[test]
fn read_of_64_mib_gets_an_error_reply_and_the_connection_survives() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::go(srv.addr, "golden", false);
    c.request(&req(Command::Read, 1, 0, 64 << 20));
    assert_eq!(
        c.reply(0).0,
        Reply::Simple {
            error: NBD_EOVERFLOW,
            cookie: 1
        }
    );
    // A write over the limit: its payload is skipped, not buffered, and refused.
    let mut c2 = Raw::go(srv.addr, "device", false);
    let big = 33 << 20;
    c2.request(&req(Command::Write, 2, 0, big));
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..33 {
        c2.send(&zeros);
    }
    assert_eq!(
        c2.reply(0).0,
        Reply::Simple {
            error: NBD_EOVERFLOW,
            cookie: 2
        }
    );
    // Both connections are still in sync.
    c.request(&req(Command::Read, 3, 0, 512));
    assert_eq!(
        c.reply(512).0,
        Reply::Simple {
            error: 0,
            cookie: 3
        }
    );
    c2.request(&req(Command::Read, 4, 0, 512));
    assert_eq!(
        c2.reply(512).0,
        Reply::Simple {
            error: 0,
            cookie: 4
        }
    );
}

#[test]
fn writes_get_eperm_on_read_only_and_enospc_past_the_end() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::go(srv.addr, "golden", false);
    c.request(&req(Command::Write, 1, 0, 512));
    c.send(&[0x55; 512]);
    assert_eq!(
        c.reply(0).0,
        Reply::Simple {
            error: NBD_EPERM,
            cookie: 1
        }
    );
    c.request(&req(Command::Trim, 2, 0, 512));
    assert_eq!(
        c.reply(0).0,
        Reply::Simple {
            error: NBD_EPERM,
            cookie: 2
        }
    );
    let mut w = Raw::go(srv.addr, "device", false);
    w.request(&req(Command::Write, 3, SIZE - 256, 512));
    w.send(&[0x55; 512]);
    assert_eq!(
        w.reply(0).0,
        Reply::Simple {
            error: NBD_ENOSPC,
            cookie: 3
        }
    );
    // An unknown command and an undocumented flag are EINVAL.
    w.request(&req(Command::Unknown(99), 4, 0, 0));
    assert_eq!(
        w.reply(0).0,
        Reply::Simple {
            error: NBD_EINVAL,
            cookie: 4
        }
    );
    w.request(&Request {
        flags: CommandFlags(nbd_proto::NBD_CMD_FLAG_REQ_ONE),
        ..req(Command::Read, 5, 0, 512)
    });
    assert_eq!(
        w.reply(0).0,
        Reply::Simple {
            error: NBD_EINVAL,
            cookie: 5
        }
    );
    // Block status without a negotiated context is EINVAL.
    w.request(&req(Command::BlockStatus, 6, 0, 512));
    assert_eq!(
        w.reply(0).0,
        Reply::Simple {
            error: NBD_EINVAL,
            cookie: 6
        }
    );
}

#[test]
fn block_status_req_one_returns_one_extent_within_the_request() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::go(srv.addr, "golden", true);
    c.request(&Request {
        flags: CommandFlags(nbd_proto::NBD_CMD_FLAG_REQ_ONE),
        ..req(Command::BlockStatus, 1, 5 * MIB, 4096)
    });
    let (r, _) = c.reply(0);
    let Reply::Chunk(ch) = r else { panic!("{r:?}") };
    // [3 MiB, 10 MiB) of the chain reads as zeros (unallocated in every layer).
    assert_eq!(
        ch.payload,
        ChunkPayload::BlockStatus {
            context_id: 1,
            descriptors: vec![Descriptor {
                len: 4096,
                flags: NBD_STATE_ZERO
            }],
        }
    );
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::go(srv.addr, "golden", false);
    c.send(&[0xAA; 28]);
    assert!(c.closed());
    wait_all_closed(&srv);
    assert_eq!(protocol_errors_soon(&srv, 1), ["request magic"]);
    assert_serves(&srv);
}

#[test]
fn set_meta_context_before_structured_reply_is_invalid() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    c.option(&ClientOption::SetMetaContext(MetaQuery {
        export: "golden".into(),
        queries: vec!["base:allocation".into()],
    }));
    let r = c.option_replies();
    assert!(
        matches!(
            r[..],
            [OptionReply::Error {
                code: NBD_REP_ERR_INVALID,
                ..
            }]
        ),
        "{r:?}"
    );
}

#[test]
fn five_hundred_rapid_connections_leave_the_server_serving() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    for i in 0..500u32 {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        match i % 4 {
            0 => {}                                          // connect and leave
            1 => drop(s.write_all(&[0xff; 64])),             // garbage
            2 => drop(s.write_all(&0u32.to_be_bytes())),     // flags, then leave mid-handshake
            _ => drop(s.write_all(&IHAVEOPT.to_be_bytes())), // half an option header
        }
    }
    assert_serves(&srv);
    wait_all_closed(&srv);
    assert!(srv.metrics.opened.load(Ordering::SeqCst) >= 501);
}

#[test]
fn handshake_that_never_finishes_times_out() {
    let chain = Chain::new();
    let cfg = ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let srv = Server::start_with(chain.source(), cfg);
    let mut c = Raw::connect(srv.addr);
    assert!(c.closed());
    assert_eq!(protocol_errors_soon(&srv, 1), ["handshake timeout"]);
}

/// Resident memory of this process (server included), in bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn client_that_never_reads_replies_is_bounded_and_others_are_served() {
    let chain = Chain::new();
    let cfg = ServerConfig {
        drain_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let mut srv = Server::start_with(chain.source(), cfg);
    let before = rss();
    let stalled = Raw::go(srv.addr, "golden", false);
    let mut s = stalled.s.try_clone().unwrap();
    // 2000 reads of 32 MiB = 64 GiB of replies, never read. The sender blocks once the server
    // stops reading requests; it runs on its own thread and gives up when the socket closes.
    let flood = std::thread::spawn(move || {
        let mut v = Vec::new();
        for i in 0..2000u64 {
            req(Command::Read, i, 0, 32 << 20).encode(&mut v);
        }
        let _ = s.write_all(&v);
    });
    std::thread::sleep(Duration::from_secs(2));
    // Another client is served promptly meanwhile.
    let t = Instant::now();
    assert_serves(&srv);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let grown = rss().saturating_sub(before);
    // The stalled connection holds at most its in-flight budget (64 MiB of payload) plus
    // socket buffers; unbounded queuing would reach gigabytes.
    assert!(
        grown < 256 * MIB,
        "server memory grew by {} MiB",
        grown >> 20
    );
    // Shutdown completes: the stalled client's last replies are dropped after drain_timeout.
    let t = Instant::now();
    srv.stop();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    drop(stalled);
    flood.join().unwrap();
}

#[test]
fn graceful_shutdown_flushes_and_releases_a_connected_writer() {
    let chain = Chain::new();
    let src = chain.source();
    let mut srv = Server::start(src.clone());
    let mut c = Raw::go(srv.addr, "device", false);
    c.request(&req(Command::Write, 1, 2 * MIB, 4096));
    c.send(&[0x5a; 4096]);
    assert_eq!(
        c.reply(0).0,
        Reply::Simple {
            error: 0,
            cookie: 1
        }
    );
    // Stop while the client is still connected: no NBD_CMD_FLUSH was ever sent.
    srv.stop();
    assert!(c.closed());
    assert_eq!(src.released.load(Ordering::SeqCst), 1);
    let dev = interop::open_ro(&chain.rw).top();
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, 2 * MIB).unwrap();
    assert_eq!(buf, vec![0x5a; 4096]);
}

#[test]
fn info_answers_name_description_and_block_size_then_export_name_enters_transmission() {
    use nbd_proto::{Info, NBD_INFO_DESCRIPTION, NBD_INFO_NAME};
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    c.option(&ClientOption::Info(InfoRequest {
        name: "golden@0".into(),
        requests: vec![NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
    }));
    let r = c.option_replies();
    let infos: Vec<&Info> = r
        .iter()
        .filter_map(|x| match x {
            OptionReply::Info(i) => Some(i),
            _ => None,
        })
        .collect();
    assert!(
        infos
            .iter()
            .any(|i| matches!(i, Info::Export { size: SIZE, .. })),
        "{r:?}"
    );
    assert!(infos.contains(&&Info::Name("golden@0".into())), "{r:?}");
    assert!(
        infos
            .iter()
            .any(|i| matches!(i, Info::Description(d) if d.contains("golden.vhdx")))
    );
    assert!(infos.contains(&&Info::BlockSize {
        min: 1,
        preferred: 4096,
        max: 32 << 20
    }));
    assert_eq!(r.last(), Some(&OptionReply::Ack));
    // The old way in: NBD_OPT_EXPORT_NAME, answered by size + flags (no zeroes negotiated).
    c.option(&ClientOption::ExportName("golden@0".into()));
    let head = c.read_n(10);
    let e = nbd_proto::ExportNameReply::parse(&head).unwrap();
    assert_eq!(e.size, SIZE);
    assert_ne!(e.transmission_flags & nbd_proto::NBD_FLAG_READ_ONLY, 0);
    c.request(&req(Command::Read, 1, 10 * MIB + 4096, 8192));
    let (r, data) = c.reply(8192);
    assert_eq!(
        r,
        Reply::Simple {
            error: 0,
            cookie: 1
        }
    );
    assert_eq!(data, pattern(8192, 2));
    c.request(&req(Command::Disc, 2, 0, 0));
    assert!(c.closed());
}

#[test]
fn export_name_for_an_unknown_export_closes_the_connection() {
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let mut c = Raw::connect(srv.addr);
    c.flags();
    c.option(&ClientOption::ExportName("nope".into()));
    assert!(c.closed());
}

#[test]
fn shutdown_does_not_wait_for_clients_stalled_mid_message() {
    let chain = Chain::new();
    let src = chain.source();
    let mut srv = Server::start(src.clone());
    let mut w = Raw::go(srv.addr, "device", false);
    w.request(&req(Command::Write, 1, 0, 1 << 20));
    w.send(&[1; 100]); // then nothing more of the 1 MiB payload
    let mut h = Raw::connect(srv.addr);
    h.flags();
    h.send(&IHAVEOPT.to_be_bytes()); // half an option header
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    srv.stop();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(w.closed() && h.closed());
    assert_eq!(src.released.load(Ordering::SeqCst), 1);
}
