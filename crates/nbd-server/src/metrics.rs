//! What the NBD server reports: the [`NbdMetrics`] the server's metrics registry implements.

use std::time::Duration;

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
