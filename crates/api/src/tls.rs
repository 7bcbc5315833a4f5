//! HTTPS for the API and the console: a listener that hands axum TLS streams.
//!
//! One task accepts TCP connections and starts a TLS handshake task for each, at most
//! [`HANDSHAKES_MAX`] at once and each within [`HANDSHAKE_TIMEOUT`], so a client that
//! stalls its handshake holds up no one else; finished handshakes queue for
//! `axum::serve`. Dropping the listener (when serving ends) stops the accepting task and
//! closes the socket.
//!
//! Plain HTTP is only for a loopback address ([`check_plain_listen`]): anything else
//! would carry API tokens and the farm key's logins in the clear.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Most TLS handshakes in progress at once; more connections wait to be accepted.
pub const HANDSHAKES_MAX: usize = 64;
/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

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

/// TCP connections through a TLS handshake, as an `axum::serve` listener.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener` (on the current runtime) with `config`.
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn new(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(HANDSHAKES_MAX);
        let accepting = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx));
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "API accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "API TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "API TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
