//! Resource bounds: revocation, the idle and request timeouts, the per-address cap, and the
//! global cap that closes late clients rather than blocking the accept loop.

use crate::common;

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Client, Server, Source, tcp, wait_until};
use nbd_proto::Command;
use nbd_server::ServerConfig;

/// Generous bound for something the server does on its own (a test fails past it rather
/// than hang; passing never depends on it).
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn revoking_a_handle_closes_its_connection_and_releases_the_export() {
    let src = Source::new();
    let srv = Server::start(src.clone(), ServerConfig::default());
    let mut c = Client::greet(tcp(srv.addr));
    c.go("mem").unwrap();
    assert_eq!(c.read_at(0, 512).len(), 512);
    assert_eq!(src.released.load(Ordering::SeqCst), 0);
    src.revoke.cancel();
    assert!(c.closed());
    assert!(wait_until(PATIENCE, || src.released.load(Ordering::SeqCst) == 1));
}

fn idle_config(trust_loopback: bool) -> ServerConfig {
    ServerConfig {
        idle_timeout: Some(Duration::from_millis(200)),
        trust_loopback,
        ..ServerConfig::default()
    }
}

#[test]
fn an_idle_remote_connection_is_closed() {
    let src = Source::new();
    let srv = Server::start(src.clone(), idle_config(false));
    let mut c = Client::greet(tcp(srv.addr));
    c.go("mem").unwrap();
    assert_eq!(c.read_at(0, 512).len(), 512);
    // Nothing more: the server closes it, and releases the export.
    assert!(c.closed());
    assert!(wait_until(PATIENCE, || src.released.load(Ordering::SeqCst) == 1));
    assert!(!src.last_peer().is_local());
}

#[test]
fn an_idle_local_connection_stays() {
    let src = Source::new();
    let srv = Server::start(src.clone(), idle_config(true));
    let mut c = Client::greet(tcp(srv.addr));
    c.go("mem").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(c.read_at(0, 512).len(), 512);
    assert_eq!(src.released.load(Ordering::SeqCst), 0);
    assert!(src.last_peer().is_local());
}

#[test]
fn a_half_sent_request_is_closed_after_the_request_timeout() {
    let src = Source::new();
    let cfg = ServerConfig {
        request_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let srv = Server::start(src.clone(), cfg);
    // Half a header.
    let mut c = Client::greet(tcp(srv.addr));
    c.go("mem").unwrap();
    c.send(&[0x25, 0x60, 0x95, 0x13, 0, 0, 0, 1, 0, 0]);
    assert!(c.closed());
    // A whole write header and part of its payload.
    let mut c = Client::greet(tcp(srv.addr));
    c.go("mem").unwrap();
    c.request(Command::Write, 1, 0, 4096);
    c.send(&[7u8; 100]);
    assert!(c.closed());
    assert!(wait_until(PATIENCE, || {
        srv.metrics.protocol_errors() == ["request timeout", "request timeout"]
    }));
    // The write never happened.
    assert_ne!(src.disk.0.lock().unwrap()[..100], [7u8; 100]);
}

#[test]
fn connections_past_an_address_cap_are_closed_at_once() {
    let cfg = ServerConfig {
        max_connections_per_address: 2,
        trust_loopback: false,
        ..ServerConfig::default()
    };
    let srv = Server::start(Source::new(), cfg);
    let a = Client::greet(tcp(srv.addr));
    let b = Client::greet(tcp(srv.addr));
    let mut third = tcp(srv.addr);
    assert!(eof(&mut third));
    // One leaves: room for another.
    drop(a);
    assert!(wait_until(PATIENCE, || {
        let mut s = tcp(srv.addr);
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        !eof(&mut s)
    }));
    drop(b);
}

#[test]
fn a_local_address_has_no_cap() {
    let cfg = ServerConfig {
        max_connections_per_address: 1,
        ..ServerConfig::default()
    };
    let srv = Server::start(Source::new(), cfg);
    let _a = Client::greet(tcp(srv.addr));
    let mut b = Client::greet(tcp(srv.addr));
    b.go("mem").unwrap();
}

/// True when the server closed `s` before sending anything (EOF or reset); false when it
/// sent the greeting or nothing came in the read timeout.
fn eof(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn a_full_server_closes_late_clients_instead_of_queueing_them() {
    let cfg = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let srv = Server::start(Source::new(), cfg);
    let a = Client::greet(tcp(srv.addr));
    let _b = Client::greet(tcp(srv.addr));
    // Full: the third waits a little, then is closed (the old accept loop left it queued
    // until a connection ended).
    let mut third = tcp(srv.addr);
    assert!(eof(&mut third));
    drop(a);
    assert!(wait_until(PATIENCE, || {
        let mut s = tcp(srv.addr);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        !eof(&mut s)
    }));
}

#[test]
fn eleven_hundred_idle_connections_do_not_lock_out_a_new_client() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let cfg = ServerConfig {
        max_connections: 16,
        max_connections_per_address: 8,
        trust_loopback: false,
        nbd_socket: Some(sock.clone()),
        ..ServerConfig::default()
    };
    let src = Source::new();
    let srv = Server::start(src.clone(), cfg);
    // 1,100 clients from one address that connect and send nothing.
    let idle: Vec<TcpStream> = (0..1100).map(|_| tcp(srv.addr)).collect();
    // Another client (here: on the unix socket) still gets in and is served.
    let u = UnixStream::connect(&sock).unwrap();
    u.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut c = Client::greet(u);
    c.go("mem").unwrap();
    assert_eq!(c.read_at(4096, 512), src.disk.0.lock().unwrap()[4096..4608]);
    // The address kept at most its cap: only that many were served (sent the greeting);
    // every other idle client was closed (or, on a loaded machine, not yet: a timeout is
    // not a greeting). Every socket stays open until all are counted: closing a greeted one
    // would free its slot for a client the server has not accepted yet.
    let mut greeted = 0;
    let mut idle = idle;
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Ok(n) if n > 0) {
            greeted += 1;
        }
    }
    assert!(greeted <= 8, "{greeted} idle connections held");
}
