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
//! lib.rs           declares the modules, re-exports the public items
//! listener.rs      Listener, run: TCP + unix accept loops, connection Semaphore, shutdown
//!   │              broadcast
//!   ├─ transmission.rs one connection's request loop: reader ─► request tasks (disk calls on
//!   │    │             spawn_blocking under a global Semaphore) ─► mpsc ─► one writer task;
//!   │    │             the reader serves in-memory requests in batches and admits the rest
//!   │    ├─ execution.rs   requests on the device: in-memory fast paths (try_*), submitted
//!   │    │   │             futures (submit_*), disk calls on the blocking pool
//!   │    │   └─ block_status.rs  NBD_CMD_BLOCK_STATUS: extents ─► base:allocation
//!   │    ├─ writer.rs      the writer task and the shared write half (Sink)
//!   │    └─ frame.rs       a request's result (Frame) and its encoding as a reply
//!   └─ negotiate.rs    option haggling (greeting, OPT_GO/INFO/LIST/..., meta contexts)
//! conn.rs          what a connection is handed: ConnCtx (shared), Shutdown, Export
//! errno.rs         disk::Error ─► NBD_E* (the one place errors are mapped)
//! source.rs        ExportSource and what it hands out (ExportHandle, ExportInfo, OpenError)
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
//! size, and connections. A client that stops reading replies blocks only its own writer,
//! which stops its own reader once its in-flight budget is used up.
#![warn(missing_docs)]

mod block_status;
mod config;
mod conn;
mod errno;
mod execution;
mod frame;
mod listener;
mod metrics;
mod negotiate;
mod source;
mod transmission;
mod writer;

pub use config::{
    MAX_BLOCK_STATUS_EXTENTS, MAX_BLOCK_STATUS_QUERY, MAX_OPTIONS_PER_HANDSHAKE, MAX_PAYLOAD,
    MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, ServerConfig,
};
pub use errno::to_nbd_errno;
pub use listener::{Listener, run};
pub use metrics::{NbdMetrics, NoMetrics};
pub use source::{ExportHandle, ExportInfo, ExportSource, OpenError};
