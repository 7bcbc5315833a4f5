//! The NBD server's fixed limits and its configuration.

use std::sync::Arc;
use std::time::Duration;

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

/// Whether a client must upgrade to TLS (`NBD_OPT_STARTTLS`) before it may do anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Selective TLS: plaintext and TLS clients are both served; the [`ExportSource`] decides
    /// per export and answers [`OpenError::TlsRequired`] for those that need TLS
    /// (`NBD_REP_ERR_TLS_REQD`).
    ///
    /// [`ExportSource`]: crate::ExportSource
    /// [`OpenError::TlsRequired`]: crate::OpenError::TlsRequired
    #[default]
    Optional,
    /// Every option but `NBD_OPT_ABORT` and `NBD_OPT_STARTTLS` sent before TLS is refused
    /// with `NBD_REP_ERR_TLS_REQD`; `NBD_OPT_EXPORT_NAME` before TLS closes the connection.
    Required,
}

/// Configuration of the NBD listeners.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// TCP address to listen on; `None` disables TCP.
    pub nbd_listen: Option<std::net::SocketAddr>,
    /// Unix socket path to listen on; `None` disables it.
    pub nbd_socket: Option<std::path::PathBuf>,
    /// Most connections served at once. A client accepted while all are taken is closed at
    /// once (it neither waits nor holds an open file): the accept loop never blocks on it.
    /// `ferry server` sets it from its share of the process's open files
    /// (`budget::files::plan`).
    pub max_connections: usize,
    /// Most connections served at once from one IP address that is not local (see
    /// [`Peer::is_local`](crate::Peer::is_local)); further ones are closed at once.
    pub max_connections_per_address: usize,
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
    /// How long a connection may sit in transmission with no request in flight and none
    /// arriving before it is closed; `None` never closes one. Applies only to connections
    /// that are not local and presented no client certificate: a kernel or qemu client on
    /// the machine itself may idle for hours between guest I/O and costs nothing to trust,
    /// and a device that authenticated with a certificate is accountable (the session that
    /// admitted it can be ended, which revokes its handle), whereas an anonymous remote
    /// connection that sends nothing only holds a connection slot.
    pub idle_timeout: Option<Duration>,
    /// Once a request header has started arriving, how long the header and its payload may
    /// take to arrive in full (time spent waiting for the connection's own in-flight budget
    /// not counted); past it the connection is closed as a protocol error.
    pub request_timeout: Duration,
    /// Whether a loopback address counts as local ([`Peer::is_local`](crate::Peer::is_local)),
    /// exempt from the idle timeout and the per-address cap. Tests set it false to exercise
    /// those limits over 127.0.0.1.
    pub trust_loopback: bool,
    /// The TLS configuration `NBD_OPT_STARTTLS` upgrades to; `None` answers STARTTLS with
    /// `NBD_REP_ERR_UNSUP`. It may ask for client certificates; the verified one is handed
    /// to the [`ExportSource`](crate::ExportSource) in [`Peer::client_cert`](crate::Peer).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Whether TLS is required before anything else (only with `tls`).
    pub tls_mode: TlsMode,
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
            idle_timeout: Some(Duration::from_secs(600)),
            request_timeout: Duration::from_secs(30),
            max_connections_per_address: 64,
            trust_loopback: true,
            tls: None,
            tls_mode: TlsMode::Optional,
        }
    }
}
