//! What a connection is handed: the context every connection shares, the shutdown signal,
//! and the export one connection serves. The listener makes the first two, negotiation the
//! third; transmission uses all three.

use std::sync::Arc;

use disk::BlockDevice;
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::limits::LogLimiter;
use crate::metrics::NbdMetrics;
use crate::source::ExportSource;

/// What every connection shares.
pub(crate) struct ConnCtx {
    /// Where exports come from.
    pub registry: Arc<dyn ExportSource>,
    /// Where counters go.
    pub metrics: Arc<dyn NbdMetrics>,
    /// Disk calls in flight across all connections (`max_blocking` permits).
    pub blocking: Arc<Semaphore>,
    /// Limits.
    pub config: ServerConfig,
    /// Rate limits of refusal and protocol log lines.
    pub logs: LogLimiter,
}

impl std::fmt::Debug for ConnCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnCtx")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Listens for shutdown: the listener drops the broadcast sender (or sends) to signal; once
/// the connection has an export, the export's revocation token too.
#[derive(Debug)]
pub(crate) struct Shutdown {
    is_shutdown: bool,
    notify: broadcast::Receiver<()>,
    revoked: Option<CancellationToken>,
}

impl Shutdown {
    /// Listens on `notify`, a subscription to the listener's broadcast.
    pub(crate) fn new(notify: broadcast::Receiver<()>) -> Shutdown {
        Shutdown {
            is_shutdown: false,
            notify,
            revoked: None,
        }
    }

    /// Also signals when `token` is cancelled (the export's handle was revoked).
    pub(crate) fn or_revoked(&mut self, token: Option<CancellationToken>) {
        self.revoked = token;
    }

    /// Waits for the signal; returns at once once it was seen.
    pub(crate) async fn recv(&mut self) {
        if self.is_shutdown {
            return;
        }
        match &self.revoked {
            Some(t) => tokio::select! {
                _ = self.notify.recv() => {}
                () = t.cancelled() => {}
            },
            None => {
                let _ = self.notify.recv().await;
            }
        }
        self.is_shutdown = true;
    }
}

/// What one connection serves.
#[derive(Debug, Clone)]
pub(crate) struct Export {
    /// The device requests run on.
    pub device: Arc<dyn BlockDevice>,
    /// Its size in bytes, as told to the client.
    pub size: u64,
    /// Whether the client may write.
    pub writable: bool,
    /// Whether the client negotiated structured replies.
    pub structured: bool,
    /// The id of `base:allocation`, if the client selected it.
    pub meta_context: Option<u32>,
}
