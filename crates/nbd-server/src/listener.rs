//! Accepting connections: the `Listener` (TCP and unix socket), the connection caps, the
//! handshake (with its optional TLS upgrade), and graceful shutdown, in mini-redis's shape
//! (`Listener`/`Handler`, a `Semaphore` of connections, a `broadcast` to say "shut down",
//! and a drop-to-complete `mpsc` to learn that every connection has finished).
//!
//! The accept loop never waits for room: a connection past an address's cap, or past the
//! listener's `max_connections`, is closed at once by the listener's [`Gate`] (the budget
//! crate's, shared with every other listener of the process). So clients that connect and
//! sit can neither stop the server accepting nor take more open files than its share.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use budget::{Gate, GateConfig, Ticket};
use tokio::io::{BufReader, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_rustls::server::TlsStream;

use crate::config::{ServerConfig, TlsMode};
use crate::conn::{ConnCtx, Shutdown};
use crate::limits::{LogKind, LogLimiter};
use crate::metrics::NbdMetrics;
use crate::negotiate::{NegotiateError, Negotiated, Outcome, negotiate};
use crate::source::{ExportSource, Peer};
use crate::tls::{self, Socket};
use crate::transmission;
use crate::trim::{Closed, trim_after_closes};

/// Bytes of a connection's read buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// The TCP listener's accept queue. A boot storm connects every device at once (PVS lets 500
/// boot at once by default, and a server carries up to 4,095): with a short queue, connects
/// past it are dropped and retried by the client's SYN backoff (seconds each). The kernel
/// caps it at `net.core.somaxconn` (4096 on current kernels).
pub const ACCEPT_BACKLOG: u32 = 4096;

/// A TCP listener on `addr` with [`ACCEPT_BACKLOG`] (tokio's `bind` asks for 1024).
fn tcp_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// Binds the configured listeners and serves NBD until `shutdown` completes, then stops
/// accepting, lets every connection finish its in-flight requests, flushes writable devices,
/// runs each export's `release`, and returns.
///
/// # Errors
/// Binding a listener failed.
pub async fn run(
    config: ServerConfig,
    registry: Arc<dyn ExportSource>,
    metrics: Arc<dyn NbdMetrics>,
    shutdown: impl Future,
) -> std::io::Result<()> {
    let listener = Listener::bind(config).await?;
    listener.serve(registry, metrics, shutdown).await;
    Ok(())
}

/// Bound NBD listeners, ready to serve.
#[derive(Debug)]
pub struct Listener {
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
    config: ServerConfig,
    /// `max_connections`, `max_connections_per_address` (loopback exempt when trusted).
    gate: Arc<Gate>,
}

impl Listener {
    /// Binds `config.nbd_listen` and `config.nbd_socket` (a stale socket file at that path is
    /// replaced).
    ///
    /// # Errors
    /// Binding failed, or neither listener is configured.
    pub async fn bind(config: ServerConfig) -> std::io::Result<Listener> {
        let tcp = match config.nbd_listen {
            Some(addr) => Some(tcp_listener(addr)?),
            None => None,
        };
        let unix = match &config.nbd_socket {
            Some(path) => {
                remove_stale_socket(path)?;
                Some((UnixListener::bind(path)?, path.clone()))
            }
            None => None,
        };
        if config.tls_mode == TlsMode::Required && config.tls.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "tls_mode Required without a TLS configuration (tls)",
            ));
        }
        if tcp.is_none() && unix.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no NBD listener configured (nbd_listen or nbd_socket)",
            ));
        }
        let gate = Gate::new(GateConfig {
            name: "nbd",
            connections_max: config.max_connections,
            per_address_max: config.max_connections_per_address,
            loopback_exempt: config.trust_loopback,
            // A connection still in its handshake (half-open STARTTLS included) may be
            // closed for a newcomer; a negotiated one (a running device) never is.
            evict_for_newcomers: true,
        });
        Ok(Listener {
            tcp,
            unix,
            config,
            gate,
        })
    }

    /// The listeners' gate (its counters go on `/metrics`).
    pub fn gate(&self) -> Arc<Gate> {
        Arc::clone(&self.gate)
    }

    /// The bound TCP address (useful after binding port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops accepting and waits for every
    /// connection to finish its in-flight requests, flush and release its export.
    pub async fn serve(
        self,
        registry: Arc<dyn ExportSource>,
        metrics: Arc<dyn NbdMetrics>,
        shutdown: impl Future,
    ) {
        let Listener {
            tcp,
            unix,
            config,
            gate,
        } = self;
        let (notify_shutdown, _) = broadcast::channel::<()>(1);
        let (complete_tx, mut complete_rx) = mpsc::channel::<()>(1);
        let ctx = Arc::new(ConnCtx {
            registry,
            metrics,
            blocking: Arc::new(Semaphore::new(config.max_blocking.max(1))),
            config,
            logs: LogLimiter::default(),
        });
        let socket_path = unix.as_ref().map(|(_, p)| p.clone());
        let accept = Accept {
            tcp,
            unix: unix.map(|(l, _)| l),
            gate,
            ctx,
            notify_shutdown: notify_shutdown.clone(),
            complete_tx,
            closed: Arc::new(Closed::default()),
        };
        let closed = Arc::clone(&accept.closed);
        tokio::select! {
            () = accept.run() => {}
            () = trim_after_closes(&closed) => {}
            _ = shutdown => tracing::info!("NBD server shutting down"),
        }
        // Dropping the accept loop closes the listeners and drops its `complete_tx` and its
        // `notify_shutdown` clone; dropping ours tells every connection to shut down.
        drop(accept);
        drop(notify_shutdown);
        let _ = complete_rx.recv().await;
        if let Some(p) = socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(_) => Ok(()),
    }
}

/// The accept loop's state.
struct Accept {
    tcp: Option<TcpListener>,
    unix: Option<UnixListener>,
    /// Open connections, per listener and per address that is not local.
    gate: Arc<Gate>,
    ctx: Arc<ConnCtx>,
    /// Dropped (by `serve`) to tell connections to shut down.
    notify_shutdown: broadcast::Sender<()>,
    /// Cloned into each connection; `serve` waits until every clone is gone.
    complete_tx: mpsc::Sender<()>,
    /// Connections closed since the trimmer last gave freed memory back.
    closed: Arc<Closed>,
}

impl Accept {
    async fn run(&self) {
        let trust = self.ctx.config.trust_loopback;
        loop {
            tokio::select! {
                (s, addr, ticket) = accept_tcp(self.tcp.as_ref(), &self.gate) => {
                    let _ = s.set_nodelay(true);
                    self.spawn(s, Peer::new(Some(addr), trust), ticket);
                }
                r = accept_unix(self.unix.as_ref()) => match r {
                    Ok(s) => {
                        if let Ok(ticket) = self.gate.try_admit(None) {
                            self.spawn(s, Peer::new(None, trust), ticket);
                        }
                    }
                    Err(e) => {
                        self.gate.note_accept_error(&e);
                        tokio::time::sleep(budget::accept::ACCEPT_BACKOFF).await;
                    }
                },
            }
        }
    }

    /// Serves an admitted connection on its own task; its ticket is given back when it
    /// ends.
    fn spawn<S: Socket>(&self, sock: S, peer: Peer, mut ticket: Ticket) {
        let ctx = Arc::clone(&self.ctx);
        let shutdown = Shutdown::new(self.notify_shutdown.subscribe());
        let complete = self.complete_tx.clone();
        let closed = Arc::clone(&self.closed);
        tokio::spawn(async move {
            ctx.metrics.connection_opened();
            handle(sock, &ctx, shutdown, peer, &mut ticket).await;
            // The place is free before the close is counted: whoever sees the count may
            // connect again at once.
            drop(ticket);
            ctx.metrics.connection_closed();
            closed.note();
            drop(complete);
        });
    }
}

async fn accept_tcp(
    l: Option<&TcpListener>,
    gate: &Arc<Gate>,
) -> (tokio::net::TcpStream, SocketAddr, Ticket) {
    match l {
        Some(l) => budget::accept(l, gate).await,
        None => std::future::pending().await,
    }
}

async fn accept_unix(l: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// A connection ready for transmission, in plaintext or over TLS, or one whose client
/// aborted.
enum Ready<S: Socket> {
    Abort,
    Plain(BufReader<S::Read>, S::Write, Negotiated),
    Tls(
        BufReader<ReadHalf<TlsStream<S>>>,
        WriteHalf<TlsStream<S>>,
        Negotiated,
    ),
}

/// One connection: handshake (TLS included, all within `handshake_timeout`), then
/// transmission. During the handshake the gate may close it for a newcomer (`ticket`'s
/// eviction); once negotiated it is settled and never is.
async fn handle<S: Socket>(
    sock: S,
    ctx: &Arc<ConnCtx>,
    mut shutdown: Shutdown,
    mut peer: Peer,
    ticket: &mut Ticket,
) {
    let timeout = ctx.config.handshake_timeout;
    let hs = tokio::select! {
        () = shutdown.recv() => return,
        () = ticket.evicted() => {
            tracing::debug!(%peer, "closing a connection in its handshake for a newcomer");
            return;
        }
        r = tokio::time::timeout(timeout, handshake(sock, ctx, &mut peer)) => r,
    };
    let ready = match hs {
        Err(_) => {
            if ctx.logs.allow(LogKind::Protocol) {
                tracing::warn!(%peer, ?timeout, "closing connection: handshake timed out");
            }
            ctx.metrics.protocol_error("handshake timeout");
            return;
        }
        Ok(Err(e)) => {
            report(&e, ctx, &peer);
            return;
        }
        Ok(Ok(r)) => r,
    };
    if !ticket.settle() {
        return;
    }
    match ready {
        Ready::Abort => {}
        Ready::Plain(r, w, n) => transmission::serve(r, w, n, ctx, shutdown, &peer).await,
        Ready::Tls(r, w, n) => transmission::serve(r, w, n, ctx, shutdown, &peer).await,
    }
}

/// Logs (rate-limited) and counts why a handshake ended without transmission.
fn report(e: &NegotiateError, ctx: &ConnCtx, peer: &Peer) {
    match e {
        NegotiateError::Io(e) => {
            tracing::debug!(%peer, error = %e, "client left during handshake");
        }
        NegotiateError::Protocol { what, .. } => {
            if ctx.logs.allow(LogKind::Protocol) {
                tracing::warn!(%peer, error = %e, "closing connection");
            }
            ctx.metrics.protocol_error(what);
        }
        NegotiateError::Tls(err) => {
            if ctx.logs.allow(LogKind::Protocol) {
                tracing::warn!(%peer, error = %err, "closing connection: TLS handshake failed");
            }
            ctx.metrics.protocol_error("tls handshake");
        }
        NegotiateError::ExportName { .. } => {
            if ctx.logs.allow(LogKind::Refused) {
                tracing::info!(%peer, error = %e, "closing connection");
            }
        }
    }
}

/// Option haggling, upgraded to TLS when the client asks: returns the connection's halves
/// (plaintext or TLS) and what was negotiated. Sets `peer.tls` and `peer.client_cert` on an
/// upgrade.
async fn handshake<S: Socket>(
    sock: S,
    ctx: &ConnCtx,
    peer: &mut Peer,
) -> Result<Ready<S>, NegotiateError> {
    let (r, mut w) = sock.split_owned();
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let flags = match negotiate(&mut r, &mut w, ctx, peer, None).await? {
        Outcome::Abort => return Ok(Ready::Abort),
        Outcome::Transmit(n) => return Ok(Ready::Plain(r, w, n)),
        Outcome::StartTls(f) => f,
    };
    if !r.buffer().is_empty() {
        // The client may send nothing between STARTTLS and its ACK: those bytes would be
        // read as plaintext by no one, or (worse) as TLS records it did not mean.
        return Err(NegotiateError::Protocol {
            what: "data before tls",
            detail: format!(
                "{} bytes sent after NBD_OPT_STARTTLS before its reply",
                r.buffer().len()
            ),
        });
    }
    let Some(config) = ctx.config.tls.as_ref() else {
        // negotiate acknowledges STARTTLS only with a TLS configuration.
        return Err(NegotiateError::Protocol {
            what: "starttls",
            detail: "STARTTLS acknowledged without a TLS configuration".into(),
        });
    };
    let sock = S::reunite(r.into_inner(), w)?;
    let (stream, cert) = tls::accept(config, sock)
        .await
        .map_err(NegotiateError::Tls)?;
    peer.tls = true;
    peer.client_cert = cert;
    let (tr, mut tw) = tokio::io::split(stream);
    let mut tr = BufReader::with_capacity(READ_BUFFER_BYTES, tr);
    match negotiate(&mut tr, &mut tw, ctx, peer, Some(flags)).await? {
        Outcome::Abort => Ok(Ready::Abort),
        Outcome::Transmit(n) => Ok(Ready::Tls(tr, tw, n)),
        // A second STARTTLS is refused inside negotiate (peer.tls is set).
        Outcome::StartTls(_) => Err(NegotiateError::Protocol {
            what: "starttls",
            detail: "second STARTTLS".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ss` shows a listening socket's accept queue limit in its Send-Q column.
    #[tokio::test]
    async fn the_tcp_listener_asks_for_the_long_accept_queue() {
        let l = tcp_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        let Ok(out) = std::process::Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
        else {
            assert!(
                std::env::var("CI").is_err(),
                "ss (iproute2) is required under CI"
            );
            eprintln!("skipping: ss is not installed");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let send_q: u32 = text
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no listening socket in: {text}"));
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(ACCEPT_BACKLOG);
        assert_eq!(send_q, ACCEPT_BACKLOG.min(somaxconn), "{text}");
    }
}
