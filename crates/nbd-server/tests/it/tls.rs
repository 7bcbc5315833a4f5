//! NBD_OPT_STARTTLS with a rustls client: the upgrade, the client certificate the export
//! source sees, TLS-required mode, selective TLS, and the protocol errors around STARTTLS.

use crate::common;

use std::sync::Arc;

use common::{Client, Pki, Server, Source, starttls, tcp, tls_config};
use nbd_proto::{
    ClientOption, InfoRequest, NBD_REP_ERR_INVALID, NBD_REP_ERR_POLICY, NBD_REP_ERR_TLS_REQD,
    NBD_REP_ERR_UNSUP,
};
use nbd_server::{ServerConfig, TlsMode};

#[test]
fn starttls_serves_over_tls_and_shows_the_client_certificate() {
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let c = Client::greet(tcp(srv.addr));
    let mut c = starttls(c, pki.client_config(true));
    c.go("mem").unwrap();
    let want = src.disk.0.lock().unwrap()[4096..8192].to_vec();
    assert_eq!(c.read_at(4096, 4096), want);
    let peer = src.last_peer();
    assert!(peer.tls);
    assert_eq!(peer.client_cert.as_deref(), Some(pki.client_der.as_ref()));
    assert_eq!(peer.addr.map(|a| a.ip()), Some(srv.addr.ip()));
}

#[test]
fn a_client_without_a_certificate_is_served_with_none_in_peer() {
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let mut c = starttls(Client::greet(tcp(srv.addr)), pki.client_config(false));
    c.go("secret").unwrap();
    let peer = src.last_peer();
    assert!(peer.tls);
    assert_eq!(peer.client_cert, None);
}

#[test]
fn required_mode_refuses_options_before_tls() {
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let mut c = Client::greet(tcp(srv.addr));
    assert_eq!(c.go("mem"), Err(NBD_REP_ERR_TLS_REQD));
    assert_eq!(c.ask(&ClientOption::List), Err(NBD_REP_ERR_TLS_REQD));
    assert_eq!(
        c.ask(&ClientOption::Info(InfoRequest {
            name: "mem".into(),
            requests: vec![]
        })),
        Err(NBD_REP_ERR_TLS_REQD)
    );
    assert_eq!(
        c.ask(&ClientOption::StructuredReply),
        Err(NBD_REP_ERR_TLS_REQD)
    );
    // The source was never asked.
    assert!(src.peers.lock().unwrap().is_empty());
    // Still upgradable on the same connection.
    let mut c = starttls(c, pki.client_config(true));
    c.go("mem").unwrap();
}

#[test]
fn required_mode_closes_on_export_name_before_tls() {
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let mut c = Client::greet(tcp(srv.addr));
    c.option(&ClientOption::ExportName("mem".into()));
    assert!(c.closed());
    assert!(src.peers.lock().unwrap().is_empty());
}

#[test]
fn optional_mode_lets_the_source_require_tls_per_export() {
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Optional));
    let mut c = Client::greet(tcp(srv.addr));
    assert_eq!(c.go("secret"), Err(NBD_REP_ERR_TLS_REQD));
    assert_eq!(c.go("denied"), Err(NBD_REP_ERR_POLICY));
    assert!(!src.last_peer().tls);
    // The same connection upgrades and then gets it.
    let mut c = starttls(c, pki.client_config(true));
    c.go("secret").unwrap();
    assert!(src.last_peer().tls);
    // And a plaintext client gets the other export.
    let mut p = Client::greet(tcp(srv.addr));
    p.go("mem").unwrap();
    assert_eq!(p.read_at(0, 16), src.disk.0.lock().unwrap()[..16].to_vec());
}

#[test]
fn a_second_starttls_is_invalid() {
    let pki = Pki::new();
    let srv = Server::start(Source::new(), tls_config(&pki, TlsMode::Required));
    let mut c = starttls(Client::greet(tcp(srv.addr)), pki.client_config(true));
    assert_eq!(c.ask(&ClientOption::StartTls), Err(NBD_REP_ERR_INVALID));
    c.go("mem").unwrap();
}

#[test]
fn starttls_without_tls_configured_is_unsupported() {
    let srv = Server::start(Source::new(), ServerConfig::default());
    let mut c = Client::greet(tcp(srv.addr));
    assert_eq!(c.ask(&ClientOption::StartTls), Err(NBD_REP_ERR_UNSUP));
    c.go("mem").unwrap();
}

#[test]
fn bytes_sent_before_the_starttls_reply_close_the_connection() {
    let pki = Pki::new();
    let srv = Server::start(Source::new(), tls_config(&pki, TlsMode::Required));
    let mut c = Client::greet(tcp(srv.addr));
    let mut v = Vec::new();
    ClientOption::StartTls.encode(&mut v);
    // Pretend to be a client that does not wait for the ACK.
    v.extend_from_slice(b"\x16\x03\x01 early");
    c.send(&v);
    let replies = c.option_replies();
    assert_eq!(replies, vec![nbd_proto::option::OptionReply::Ack]);
    assert!(c.closed());
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || { srv.metrics.protocol_errors().contains(&"data before tls") }
    ));
}

#[test]
fn a_failed_tls_handshake_is_a_protocol_error() {
    let pki = Pki::new();
    let other = Pki::new();
    let srv = Server::start(Source::new(), tls_config(&pki, TlsMode::Required));
    let c = Client::greet(tcp(srv.addr));
    let mut c = c;
    assert_eq!(c.ask(&ClientOption::StartTls), Ok(()));
    // A client that trusts another CA rejects the server's certificate.
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(other.client_config(false), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, c.s);
    let mut failed = false;
    while s.conn.is_handshaking() {
        if s.conn.complete_io(&mut s.sock).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed);
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || { srv.metrics.protocol_errors().contains(&"tls handshake") }
    ));
    drop(Arc::clone(&srv.metrics));
}
