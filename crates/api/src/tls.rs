//! Plain HTTP for the API and the console is only for a loopback address
//! ([`check_plain_listen`]): anything else would carry API tokens and the farm key's
//! logins in the clear.
//!
//! HTTPS, and the bounds of every API connection (TLS handshakes each on its own task
//! within a timeout, connections per listener and per address, request-head and stall
//! timeouts), are `budget::http::serve`'s: the old handshake listener here held at most
//! 64 handshakes at once, so 64 idle TCP connections stopped every login (issue 30).

use std::net::SocketAddr;

/// A plain-HTTP listen address that is not loopback.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve the farm API in plain HTTP on {0}, which is not a loopback address: \
     give it TLS (--api-tls-dir DIR with server-cert.pem, server-key.pem and ca-cert.pem) \
     or listen on 127.0.0.1"
)]
pub struct PlainHttpRefused(pub SocketAddr);

impl From<PlainHttpRefused> for std::io::Error {
    fn from(e: PlainHttpRefused) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string())
    }
}

/// Plain HTTP is allowed on `addr` only if it is a loopback address.
///
/// # Errors
/// [`PlainHttpRefused`].
pub fn check_plain_listen(addr: SocketAddr) -> Result<(), PlainHttpRefused> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(PlainHttpRefused(addr))
    }
}
