//! `NBD_OPT_STARTTLS`: the sockets a connection can be upgraded from ([`Socket`]: split for
//! plaintext option haggling and transmission, reunited for the TLS handshake) and the
//! handshake itself ([`accept`]), on rustls.
//!
//! After the server's ACK to STARTTLS the next bytes on the socket are the client's TLS
//! ClientHello; any byte the client sent before that ACK would sit in the plaintext read
//! buffer, so the caller checks the buffer is empty before reuniting the halves.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream, tcp, unix};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A socket a connection can run on in plaintext (split into halves with no lock between
/// them) and be upgraded from (the halves reunited).
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static {
    /// The read half.
    type Read: AsyncRead + Unpin + Send + 'static;
    /// The write half.
    type Write: AsyncWrite + Unpin + Send + 'static;

    /// Splits the socket.
    fn split_owned(self) -> (Self::Read, Self::Write);

    /// Joins the halves of one socket again.
    ///
    /// # Errors
    /// The halves are of different sockets (a bug).
    fn reunite(r: Self::Read, w: Self::Write) -> io::Result<Self>;
}

impl Socket for TcpStream {
    type Read = tcp::OwnedReadHalf;
    type Write = tcp::OwnedWriteHalf;

    fn split_owned(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }

    fn reunite(r: Self::Read, w: Self::Write) -> io::Result<Self> {
        r.reunite(w).map_err(|e| io::Error::other(e.to_string()))
    }
}

impl Socket for UnixStream {
    type Read = unix::OwnedReadHalf;
    type Write = unix::OwnedWriteHalf;

    fn split_owned(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }

    fn reunite(r: Self::Read, w: Self::Write) -> io::Result<Self> {
        r.reunite(w).map_err(|e| io::Error::other(e.to_string()))
    }
}

/// Runs the server side of the TLS handshake on `sock`; returns the stream and the DER of
/// the client's end-entity certificate, if it presented one (the configuration's client
/// verifier has checked it).
///
/// # Errors
/// The handshake failed (the client's certificate was refused, no common cipher, the client
/// left).
pub(crate) async fn accept<S: Socket>(
    config: &Arc<rustls::ServerConfig>,
    sock: S,
) -> io::Result<(TlsStream<S>, Option<Vec<u8>>)> {
    let tls = TlsAcceptor::from(Arc::clone(config)).accept(sock).await?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(<[_]>::first)
        .map(|c| c.as_ref().to_vec());
    Ok((tls, cert))
}
