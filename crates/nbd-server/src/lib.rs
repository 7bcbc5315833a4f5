//! The NBD transport: server side of the Network Block Device protocol
//! (fixed newstyle handshake, structured replies, `base:allocation` block status).
//!
//! What it is not: it does not know about stores, block caches or write caches. It asks an
//! [`ExportSource`] for a device by export name, serves that device, and reports to an
//! [`NbdMetrics`]. A second transport plugs in beside it against the same two traits.
//!
//! # Layout
//!
//! ```text
//! listener.rs      Listener: TCP + unix accept loops, connection Semaphore, shutdown broadcast
//!   └─ negotiate.rs    option haggling (greeting, OPT_GO/INFO/LIST/..., meta contexts)
//!   └─ transmission.rs one connection's request loop: reader ─► request tasks (disk calls on
//!                      spawn_blocking under a global Semaphore) ─► mpsc ─► one writer task
//! errno.rs         disk::Error ─► NBD_E* (the one place errors are mapped)
//! ```
//!
//! # Limits
//!
//! Everything a client controls is bounded: option payloads ([`nbd_proto::MAX_OPTION_LEN`]),
//! the handshake's duration and option count, request payloads ([`MAX_PAYLOAD`]), requests in
//! flight per connection and their bytes, disk calls in flight overall, block status reply
//! size, and connections. A client that stops reading replies blocks only its own writer,
//! which stops its own reader once its in-flight budget is used up.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod errno;
mod listener;
mod negotiate;
mod transmission;

pub use errno::to_nbd_errno;
pub use listener::Listener;

/// One export, as listed by `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export name a client asks for.
    pub name: String,
    /// A human-readable description (`NBD_INFO_DESCRIPTION`); may be empty.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
}

/// An opened export, owned by one connection.
pub struct ExportHandle {
    /// The device to serve.
    pub device: Arc<dyn disk::BlockDevice>,
    /// Whether the client may write (the device must then also `can_write`).
    pub writable: bool,
    /// Runs once when the connection ends, after in-flight requests finished and a writable
    /// device was flushed (discard a non-persistent write cache, unlock a private image).
    pub release: Option<Box<dyn FnOnce() + Send>>,
}

impl fmt::Debug for ExportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportHandle")
            .field("device", &self.device)
            .field("writable", &self.writable)
            .field("release", &self.release.is_some())
            .finish()
    }
}

/// Dropping a handle runs its `release` if the server has not already run it (the server
/// runs it explicitly, on the blocking pool, after the final flush).
impl Drop for ExportHandle {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Why an export could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No export of that name (`NBD_REP_ERR_UNKNOWN`).
    #[error("no export named {0:?}")]
    NotFound(String),
    /// The export exists but cannot be opened now, e.g. a private image already has its one
    /// writer (`NBD_REP_ERR_POLICY`).
    #[error("export busy: {0}")]
    Busy(String),
    /// Anything else (`NBD_REP_ERR_UNKNOWN` with a message... logged on the server).
    #[error("cannot open export: {0}")]
    Other(String),
}

/// Where the NBD server finds its exports. Implemented by the server's store/registry.
///
/// Both methods are called on tokio's blocking pool, so they may do file I/O (open a chain,
/// scan a store directory). `open` is called once per `NBD_OPT_INFO`, `NBD_OPT_GO` and
/// `NBD_OPT_EXPORT_NAME`; the handle of an `NBD_OPT_INFO` is released right after its reply.
pub trait ExportSource: Send + Sync {
    /// Every export a client may list.
    fn list(&self) -> Vec<ExportInfo>;

    /// Opens `name` ("" is the default export) for one connection.
    ///
    /// # Errors
    /// [`OpenError`].
    fn open(&self, name: &str) -> Result<ExportHandle, OpenError>;
}

/// Counters the NBD server reports. Implemented by the server's metrics registry.
pub trait NbdMetrics: Send + Sync {
    /// A connection was accepted (before the handshake).
    fn connection_opened(&self);
    /// A connection ended, for any reason.
    fn connection_closed(&self);
    /// One transmission request completed. `kind` is "read", "write", "flush", "trim",
    /// "write_zeroes", "block_status"; `bytes` the payload length.
    fn request(&self, kind: &'static str, bytes: u64, latency: Duration, ok: bool);
    /// A client broke the protocol (bad magic, oversized option, ...); the connection closes.
    fn protocol_error(&self, what: &'static str);
}

/// Metrics that go nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMetrics;

impl NbdMetrics for NoMetrics {
    fn connection_opened(&self) {}
    fn connection_closed(&self) {}
    fn request(&self, _kind: &'static str, _bytes: u64, _latency: Duration, _ok: bool) {}
    fn protocol_error(&self, _what: &'static str) {}
}

/// The largest read or write payload served, in bytes (2^25, the spec's default).
pub const MAX_PAYLOAD: u32 = nbd_proto::DEFAULT_MAX_PAYLOAD;
/// The preferred block size advertised in `NBD_INFO_BLOCK_SIZE`.
pub const PREFERRED_BLOCK_SIZE: u32 = nbd_proto::DEFAULT_PREFERRED_BLOCK_SIZE;
/// The minimum block size advertised in `NBD_INFO_BLOCK_SIZE` (any byte is addressable).
pub const MIN_BLOCK_SIZE: u32 = nbd_proto::DEFAULT_MIN_BLOCK_SIZE;
/// The most options one handshake may send before the server drops it.
pub const MAX_OPTIONS_PER_HANDSHAKE: usize = 1024;
/// The most descriptors in one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (the spec allows 2^20;
/// fewer keeps one reply at 512 KiB).
pub const MAX_BLOCK_STATUS_EXTENTS: usize = 1 << 16;
/// The longest range one `NBD_CMD_BLOCK_STATUS` looks up; clients ask again for the rest.
pub const MAX_BLOCK_STATUS_QUERY: u32 = 1 << 30;

/// Configuration of the NBD listeners.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// TCP address to listen on; `None` disables TCP.
    pub nbd_listen: Option<std::net::SocketAddr>,
    /// Unix socket path to listen on; `None` disables it.
    pub nbd_socket: Option<std::path::PathBuf>,
    /// Most connections served at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// Most requests in flight on one connection (the reader stops reading past it).
    pub max_in_flight: usize,
    /// Most payload bytes (write data and read replies) in flight on one connection; raised
    /// to [`MAX_PAYLOAD`] if smaller.
    pub max_in_flight_bytes: usize,
    /// Most disk calls running at once across all connections (the blocking pool's bound).
    pub max_blocking: usize,
    /// How long a client may take from connecting to entering transmission.
    pub handshake_timeout: Duration,
    /// How long a closing connection waits for its client to read the last replies.
    pub drain_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            nbd_listen: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 10809))),
            nbd_socket: None,
            max_connections: 1024,
            max_in_flight: 16,
            max_in_flight_bytes: 64 << 20,
            max_blocking: 64,
            handshake_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
        }
    }
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
    shutdown: impl std::future::Future,
) -> std::io::Result<()> {
    let listener = Listener::bind(config).await?;
    listener.serve(registry, metrics, shutdown).await;
    Ok(())
}
