//! Accepting connections: the `Listener` (TCP and unix socket), the connection cap, and
//! graceful shutdown, in mini-redis's shape (`Listener`/`Handler`, a `Semaphore` of
//! connections, a `broadcast` to say "shut down", and a drop-to-complete `mpsc` to learn that
//! every connection has finished).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};

use crate::config::ServerConfig;
use crate::conn::{ConnCtx, Shutdown};
use crate::metrics::NbdMetrics;
use crate::negotiate::{NegotiateError, negotiate};
use crate::source::ExportSource;
use crate::transmission;

/// Bytes of a connection's read buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Pause after a failed `accept` (out of file descriptors, ...), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
}

impl Listener {
    /// Binds `config.nbd_listen` and `config.nbd_socket` (a stale socket file at that path is
    /// replaced).
    ///
    /// # Errors
    /// Binding failed, or neither listener is configured.
    pub async fn bind(config: ServerConfig) -> std::io::Result<Listener> {
        let tcp = match config.nbd_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let unix = match &config.nbd_socket {
            Some(path) => {
                remove_stale_socket(path)?;
                Some((UnixListener::bind(path)?, path.clone()))
            }
            None => None,
        };
        if tcp.is_none() && unix.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no NBD listener configured (nbd_listen or nbd_socket)",
            ));
        }
        Ok(Listener { tcp, unix, config })
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
        let Listener { tcp, unix, config } = self;
        let (notify_shutdown, _) = broadcast::channel::<()>(1);
        let (complete_tx, mut complete_rx) = mpsc::channel::<()>(1);
        let ctx = Arc::new(ConnCtx {
            registry,
            metrics,
            blocking: Arc::new(Semaphore::new(config.max_blocking.max(1))),
            config,
        });
        let socket_path = unix.as_ref().map(|(_, p)| p.clone());
        let accept = Accept {
            tcp,
            unix: unix.map(|(l, _)| l),
            limit: Arc::new(Semaphore::new(ctx.config.max_connections.max(1))),
            ctx,
            notify_shutdown: notify_shutdown.clone(),
            complete_tx,
        };
        tokio::select! {
            () = accept.run() => {}
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
    /// One permit per open connection (`max_connections`).
    limit: Arc<Semaphore>,
    ctx: Arc<ConnCtx>,
    /// Dropped (by `serve`) to tell connections to shut down.
    notify_shutdown: broadcast::Sender<()>,
    /// Cloned into each connection; `serve` waits until every clone is gone.
    complete_tx: mpsc::Sender<()>,
}

impl Accept {
    async fn run(&self) {
        loop {
            let Ok(permit) = Arc::clone(&self.limit).acquire_owned().await else {
                return;
            };
            tokio::select! {
                r = accept_tcp(self.tcp.as_ref()) => match r {
                    Ok((s, addr)) => {
                        let _ = s.set_nodelay(true);
                        let (r, w) = s.into_split();
                        self.spawn(r, w, addr.to_string(), permit);
                    }
                    Err(e) => backoff(e).await,
                },
                r = accept_unix(self.unix.as_ref()) => match r {
                    Ok(s) => {
                        let (r, w) = s.into_split();
                        self.spawn(r, w, "unix".to_string(), permit);
                    }
                    Err(e) => backoff(e).await,
                },
            }
        }
    }

    fn spawn<R, W>(&self, r: R, w: W, peer: String, permit: OwnedSemaphorePermit)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let ctx = Arc::clone(&self.ctx);
        let shutdown = Shutdown::new(self.notify_shutdown.subscribe());
        let complete = self.complete_tx.clone();
        tokio::spawn(async move {
            ctx.metrics.connection_opened();
            handle(r, w, &ctx, shutdown, &peer).await;
            ctx.metrics.connection_closed();
            drop(permit);
            drop(complete);
        });
    }
}

async fn backoff(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

async fn accept_tcp(
    l: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_unix(l: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// One connection: handshake, then transmission.
async fn handle<R, W>(r: R, mut w: W, ctx: &Arc<ConnCtx>, mut shutdown: Shutdown, peer: &str)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut r = BufReader::with_capacity(READ_BUFFER_BYTES, r);
    let timeout = ctx.config.handshake_timeout;
    let neg = tokio::select! {
        () = shutdown.recv() => return,
        n = tokio::time::timeout(timeout, negotiate(&mut r, &mut w, &ctx.registry)) => n,
    };
    let neg = match neg {
        Err(_) => {
            tracing::warn!(%peer, ?timeout, "closing connection: handshake timed out");
            ctx.metrics.protocol_error("handshake timeout");
            return;
        }
        Ok(Err(NegotiateError::Io(e))) => {
            tracing::debug!(%peer, error = %e, "client left during handshake");
            return;
        }
        Ok(Err(e @ NegotiateError::Protocol { what, .. })) => {
            tracing::warn!(%peer, error = %e, "closing connection");
            ctx.metrics.protocol_error(what);
            return;
        }
        Ok(Err(e @ NegotiateError::ExportName { .. })) => {
            tracing::info!(%peer, error = %e, "closing connection");
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(n))) => n,
    };
    transmission::serve(r, w, neg, ctx, shutdown, peer).await;
}
