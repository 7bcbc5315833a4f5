//! Budgets of the server's listeners: one process, several doors (NBD, the farm API, the
//! HTTP boot port, metrics, TFTP), and no door may starve another.
//!
//! # Layout
//!
//! ```text
//! files.rs     RLIMIT_NOFILE raised to the hard limit; plan(): each listener's share
//! gate.rs      Gate: one listener's connection cap and per-address cap, never waiting;
//!              Ticket (a connection's place); refusal counters and their /metrics text
//! accept.rs    accept(): the accept loop every TCP listener shares
//! io.rs        Stalled: a stream whose stalled reads and writes time out
//! http.rs      (feature "http") serve(): an axum Router behind a gate, with TLS
//!              handshake, request-head and stall timeouts
//! throttle.rs  one log line per second for what a client can trigger
//! ```
//!
//! The NBD listener (`nbd-server`) uses the gate and the accept loop; the API, the boot
//! port (`api`) and the metrics endpoint (`server`) use `http::serve` or the accept loop.
//! `ferry server` plans the shares at start ([`files::plan`]) and logs them in one line.

#![warn(missing_docs)]

pub mod accept;
pub mod files;
pub mod gate;
#[cfg(feature = "http")]
pub mod http;
pub mod io;
mod throttle;

pub use accept::accept;
pub use gate::{
    API_PER_ADDRESS_MAX, BOOT_PER_ADDRESS_MAX, EVICTIONS_PENDING_MAX, Gate, GateConfig, GateStats,
    METRICS_PER_ADDRESS_MAX, Refusal, Ticket, render_metrics,
};
pub use throttle::LOG_WINDOW;
