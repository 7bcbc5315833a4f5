//! The NBD server's fixed limits and its configuration.

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
