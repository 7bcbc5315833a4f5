//! The NBD transport: server side of the Network Block Device protocol
//! (fixed newstyle handshake, structured replies, `base:allocation` block status).
//!
//! What it is not: it does not know about stores, block caches or write caches. It asks an
//! [`ExportSource`] for a device by export name (telling it who asks: the [`Peer`], with its
//! address, whether it upgraded to TLS and its verified client certificate), serves that
//! device, and reports to an [`NbdMetrics`]. A second transport plugs in beside it against the
//! same two traits.
//!
//! # Layout
//!
//! ```text
//! lib.rs           declares the modules, re-exports the public items
//! listener.rs      Listener, run: TCP + unix accept loops, connection caps (a budget::Gate:
//!   │              listener and per-address caps, closed at once), shutdown broadcast, the
//!   │              handshake with its STARTTLS upgrade (plaintext halves reunited, TLS
//!   │              stream split again)
//!   ├─ transmission.rs one connection's request loop: reader ─► request tasks (disk calls on
//!   │    │             spawn_blocking under a global Semaphore) ─► mpsc ─► one writer task;
//!   │    │             the reader serves in-memory requests in batches and admits the rest
//!   │    ├─ execution.rs   requests on the device: in-memory fast paths (try_*), submitted
//!   │    │   │             futures (submit_*), disk calls on the blocking pool
//!   │    │   └─ block_status.rs  NBD_CMD_BLOCK_STATUS: extents ─► base:allocation
//!   │    ├─ valid.rs       Valid: a request checked once against its export; the layers
//!   │    │                 below assert the check instead of repeating it
//!   │    ├─ writer.rs      the writer task and the shared write half (Sink)
//!   │    └─ frame.rs       a request's result (Frame) and its encoding as a reply
//!   ├─ negotiate.rs    option haggling (greeting, OPT_GO/INFO/LIST/STARTTLS/..., meta
//!   │                  contexts, TlsMode::Required refusals)
//!   └─ tls.rs          Socket (split/reunite of TCP and unix streams), the rustls handshake
//! conn.rs          what a connection is handed: ConnCtx (shared), Shutdown (or revocation),
//!                  Export
//! limits.rs        connections per address, rate-limited logs, clipped client strings
//! refusals.rs      refused options: counted, logged per client (contract::refusal_log)
//! trim.rs          closed connections' freed memory back to the system (glibc malloc_trim)
//! errno.rs         disk::Error ─► NBD_E* (the one place errors are mapped)
//! source.rs        ExportSource, who asks (Peer) and what it hands out (ExportHandle,
//!                  ExportInfo, OpenError)
//! metrics.rs       NbdMetrics, NoMetrics
//! config.rs        ServerConfig and the fixed limits (MAX_PAYLOAD, ...)
//! ```
//!
//! A file uses only files listed below it.
//!
//! # Limits
//!
//! Everything a client controls is bounded: option payloads ([`nbd_proto::MAX_OPTION_LEN`]),
//! the handshake's duration and option count, request payloads ([`MAX_PAYLOAD`]), requests in
//! flight per connection and their bytes, disk calls in flight overall, block status reply
//! size, connections (overall and per address), how long a connection may idle
//! (`idle_timeout`, for anonymous remote clients) and how long a started request may take to
//! arrive (`request_timeout`), and log lines about refusals and protocol errors (a budget per
//! second, refused options a budget per client per interval with a summary of the rest,
//! client strings clipped to [`CLIENT_STRING_LOG_MAX`] bytes). A client that stops
//! reading replies blocks only its own writer, which stops its own reader once its in-flight
//! budget is used up.
//!
//! # TLS
//!
//! With [`ServerConfig::tls`], `NBD_OPT_STARTTLS` upgrades a connection (rustls); in
//! [`TlsMode::Required`] nothing else is served before it, in [`TlsMode::Optional`] the
//! export source decides per export ([`OpenError::TlsRequired`]). A handle's
//! [`ExportHandle::revoked`] token ends its connection like a shutdown.
#![warn(missing_docs)]

mod block_status;
mod config;
mod conn;
mod errno;
mod execution;
mod frame;
mod limits;
mod listener;
mod metrics;
mod negotiate;
mod refusals;
mod source;
mod tls;
mod transmission;
mod trim;
mod valid;
mod writer;

pub use config::{
    MAX_BLOCK_STATUS_EXTENTS, MAX_BLOCK_STATUS_QUERY, MAX_OPTIONS_PER_HANDSHAKE, MAX_PAYLOAD,
    MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, ServerConfig, TlsMode,
};
pub use errno::to_nbd_errno;
pub use limits::{CLIENT_STRING_LOG_MAX, Clipped, LOG_LINES_PER_WINDOW, LOG_WINDOW, clip};
pub use listener::{Listener, run};
pub use metrics::{NbdMetrics, NoMetrics};
pub use refusals::{RefusalTotals, totals as refusal_totals};
pub use source::{ExportHandle, ExportInfo, ExportSource, OpenError, Peer};
