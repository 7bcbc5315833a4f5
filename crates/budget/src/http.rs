//! An axum `Router` served behind a [`Gate`], in plain HTTP/1.1 or over TLS, with every
//! wait of a connection bounded:
//!
//! ```text
//!   accept ─► gate (listener cap, per-address cap: refused = closed at once)
//!          ─► TLS handshake, within handshake_timeout (its own task: no shared slots)
//!          ─► hyper HTTP/1.1: request head within header_timeout (which also bounds the
//!             wait for the next request of a kept-alive connection)
//!          ─► body reads and response writes: Stalled, failing after stall_timeout
//!             without a byte moved
//! ```
//!
//! Handlers see the client's address as `axum::extract::ConnectInfo<SocketAddr>`. At
//! shutdown the listener closes, every connection finishes the request it is serving
//! (for at most [`SHUTDOWN_DRAIN`]) and [`serve`] returns once all have ended.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::Layer as _;

use crate::gate::{Gate, Ticket};
use crate::io::Stalled;

/// Default of [`HttpLimits::header_timeout`].
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`HttpLimits::stall_timeout`].
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`HttpLimits::handshake_timeout`].
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`HttpLimits::buffer_bytes_max`]: a request head (request line and headers)
/// must fit in it, else hyper answers 431.
pub const BUFFER_BYTES_MAX: usize = 64 << 10;
/// How long a connection open at shutdown may take to finish its request.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

/// The timeouts and buffer of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a client may take to send a request head, counted from the connection's
    /// start or the end of its previous response (so also the keep-alive idle time).
    pub header_timeout: Duration,
    /// How long a body read or a response write may wait without a byte moving.
    pub stall_timeout: Duration,
    /// How long a client may take over its TLS handshake.
    pub handshake_timeout: Duration,
    /// hyper's read buffer, the longest request head (at least 8 KiB).
    pub buffer_bytes_max: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: HEADER_TIMEOUT,
            stall_timeout: STALL_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            buffer_bytes_max: BUFFER_BYTES_MAX,
        }
    }
}

/// Serves `app` on `listener` behind `gate` (TLS with `tls`, else plain HTTP) until
/// `shutdown` completes, then lets open connections finish (see the module docs).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    gate: Arc<Gate>,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let stop = CancellationToken::new();
    // Each connection holds a clone; `recv` returns `None` once all are dropped.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let accepting = async {
        loop {
            let (tcp, peer, ticket) = crate::accept(&listener, &gate).await;
            let c = Conn {
                peer,
                ticket,
                app: app.clone(),
                limits,
                stop: stop.clone(),
                _done: done_tx.clone(),
            };
            tokio::spawn(c.run(tcp, acceptor.clone()));
        }
    };
    tokio::select! {
        _ = accepting => {}
        () = shutdown => {}
    }
    drop(listener);
    stop.cancel();
    drop(done_tx);
    let _ = done_rx.recv().await;
}

/// One admitted connection.
struct Conn {
    peer: SocketAddr,
    /// Its place in the gate, given back when the connection ends.
    ticket: Ticket,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
    /// Dropped when the connection ends (see [`serve`]).
    _done: mpsc::Sender<()>,
}

impl Conn {
    async fn run(self, tcp: TcpStream, tls: Option<TlsAcceptor>) {
        let _ = tcp.set_nodelay(true);
        let Some(acceptor) = tls else {
            self.http(tcp).await;
            return;
        };
        let hs = tokio::select! {
            () = self.stop.cancelled() => return,
            () = self.ticket.evicted() => return,
            r = tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp)) => r,
        };
        match hs {
            Ok(Ok(stream)) => self.http(stream).await,
            Ok(Err(e)) => tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed"),
            Err(_) => {
                self.ticket.gate().note_timeout();
                tracing::debug!(peer = %self.peer, "TLS handshake timed out");
            }
        }
    }

    async fn http<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let svc = TowerToHyperService::new(
            axum::Extension(ConnectInfo(self.peer)).layer(self.app.clone()),
        );
        let io = TokioIo::new(Stalled::new(stream, self.limits.stall_timeout));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(self.limits.buffer_bytes_max.max(8 << 10))
            // hyper then reads only for a head or a body: a handler working without the
            // socket is not timed by `Stalled`.
            .half_close(true);
        let conn = builder.serve_connection(io, svc);
        tokio::pin!(conn);
        let r = tokio::select! {
            r = conn.as_mut() => r,
            // The gate made room with this connection for another address's (its
            // address holds the most): closed at once, mid-request or not.
            () = self.ticket.evicted() => {
                tracing::debug!(peer = %self.peer, "HTTP connection closed for a newcomer");
                return;
            }
            () = self.stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                match tokio::time::timeout(SHUTDOWN_DRAIN, conn.as_mut()).await {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
        };
        if let Err(e) = r {
            if timed_out(&e) {
                self.ticket.gate().note_timeout();
            }
            tracing::debug!(peer = %self.peer, error = %e, "HTTP connection ended");
        }
    }
}

/// Whether hyper ended a connection over a timeout: its own (the request head) or a
/// `Stalled` read or write.
fn timed_out(e: &hyper::Error) -> bool {
    if e.is_timeout() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::TimedOut;
        }
        source = s.source();
    }
    false
}
