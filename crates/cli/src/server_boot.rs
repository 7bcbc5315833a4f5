//! The boot part of `ferry server`: the TFTP server (`--tftp-listen`, `--tftp-root`) that
//! lets plain PXE firmware fetch iPXE (issue 19), and its counters on `/metrics`.
//!
//! The root is opened when the command starts (a missing directory fails before anything is
//! served), the UDP socket is bound before the server reports ready, and the server stops
//! with the others on SIGINT or SIGTERM.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tftp::{Counters, DirSource};
use tokio::task::JoinHandle;

/// TFTP settings checked at startup.
#[derive(Debug)]
pub struct Tftp {
    addr: SocketAddr,
    source: Arc<DirSource>,
}

/// A running TFTP server.
#[derive(Debug)]
pub struct Running {
    /// Its counters, for `/metrics`.
    pub counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl Tftp {
    /// The settings from the flags (clap makes them come together); `None` when off.
    ///
    /// # Errors
    /// The root directory cannot be opened.
    pub fn from_flags(
        listen: Option<SocketAddr>,
        root: Option<&Path>,
    ) -> anyhow::Result<Option<Tftp>> {
        let (Some(addr), Some(root)) = (listen, root) else {
            return Ok(None);
        };
        let source =
            DirSource::new(root).with_context(|| format!("open --tftp-root {}", root.display()))?;
        Ok(Some(Tftp {
            addr,
            source: Arc::new(source),
        }))
    }

    /// Binds the socket and serves until `stop` completes.
    ///
    /// # Errors
    /// The bind fails (e.g. port 69 without `CAP_NET_BIND_SERVICE`).
    pub async fn start(self, stop: impl Future + Send + 'static) -> anyhow::Result<Running> {
        let root = self.source.root().display().to_string();
        let server = tftp::Server::bind(self.addr, self.source, tftp::Config::default())
            .await
            .with_context(|| format!("bind TFTP {}", self.addr))?;
        let addr = server.local_addr()?;
        tracing::info!(%addr, %root, "TFTP listening (tftp://{addr}/FILE)");
        let counters = server.counters();
        let task = tokio::spawn(server.run(stop));
        Ok(Running { counters, task })
    }
}

impl Running {
    /// Waits for the server to stop.
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

/// Appends the TFTP counters to a Prometheus text exposition (format 0.0.4).
pub fn render_metrics(c: &Counters, out: &mut String) {
    let s = c.snapshot();
    let counters: [(&str, &str, u64); 11] = [
        (
            "datagrams",
            "Datagrams received on the TFTP port",
            s.datagrams,
        ),
        ("requests", "Well-formed TFTP read requests", s.requests),
        (
            "transfers_started",
            "TFTP transfers started",
            s.transfers_started,
        ),
        (
            "transfers_completed",
            "TFTP transfers whose last block was acknowledged",
            s.transfers_completed,
        ),
        (
            "transfers_failed",
            "TFTP transfers ended early",
            s.transfers_failed,
        ),
        (
            "first_ack_timeouts",
            "TFTP transfers ended because their first packet was never acknowledged",
            s.first_ack_timeouts,
        ),
        (
            "bytes_sent",
            "File bytes sent in TFTP DATA packets, retransmissions included",
            s.bytes_sent,
        ),
        ("retransmits", "TFTP packets sent again", s.retransmits),
        ("errors_sent", "TFTP ERROR packets sent", s.errors_sent),
        (
            "errors_suppressed",
            "TFTP ERROR replies left out by the rate limit",
            s.errors_suppressed,
        ),
        (
            "logs_suppressed",
            "TFTP refusal log lines left out by the per-client log limit",
            s.logs_suppressed,
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(out, "# HELP ferry_tftp_{name}_total {help}.");
        let _ = writeln!(out, "# TYPE ferry_tftp_{name}_total counter");
        let _ = writeln!(out, "ferry_tftp_{name}_total {v}");
    }
    let _ = writeln!(
        out,
        "# HELP ferry_tftp_transfers_active TFTP transfers running now."
    );
    let _ = writeln!(out, "# TYPE ferry_tftp_transfers_active gauge");
    let _ = writeln!(out, "ferry_tftp_transfers_active {}", s.transfers_active);
    let _ = writeln!(
        out,
        "# HELP ferry_tftp_rejected_total TFTP datagrams that did not start or continue a transfer, by reason."
    );
    let _ = writeln!(out, "# TYPE ferry_tftp_rejected_total counter");
    for (reason, v) in s.rejected_by_reason() {
        let _ = writeln!(out, "ferry_tftp_rejected_total{{reason=\"{reason}\"}} {v}");
    }
}

/// Appends the HTTP boot service's counters (`api::boot::BootCounters`) to a Prometheus
/// text exposition.
pub fn render_boot_metrics(c: &api::boot::BootCounters, out: &mut String) {
    for (name, v) in c.snapshot() {
        let help = match name {
            "scripts" => "iPXE scripts served that boot a version",
            "refusals" => "iPXE scripts served that refuse a boot and say why",
            "files" => "Boot files (kernels, initramfs images) served",
            "file_bytes" => "Bytes of boot files served",
            "not_found" => "Boot requests answered 404",
            "busy" => "Boot requests answered 503 (too many at once)",
            "fills" => "Boot files read from a version's file system into the boot cache",
            "searches" => "Boot file searches of a version's chain (one per version file state)",
            _ => "Boot service counter",
        };
        let _ = writeln!(out, "# HELP ferry_boot_{name}_total {help}.");
        let _ = writeln!(out, "# TYPE ferry_boot_{name}_total counter");
        let _ = writeln!(out, "ferry_boot_{name}_total {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_boot_counter_once() {
        let c = api::boot::BootCounters::default();
        c.scripts.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        let mut out = String::new();
        render_boot_metrics(&c, &mut out);
        assert!(out.contains("ferry_boot_scripts_total 3\n"), "{out}");
        assert!(out.contains("ferry_boot_file_bytes_total 0\n"));
        assert_eq!(out.matches("# TYPE").count(), c.snapshot().len());
        assert!(
            !out.contains("Boot service counter"),
            "every counter has its help"
        );
    }

    #[test]
    fn renders_every_counter_once() {
        let c = Counters::default();
        let mut out = String::new();
        render_metrics(&c, &mut out);
        assert!(out.contains("ferry_tftp_requests_total 0\n"));
        assert!(out.contains("ferry_tftp_rejected_total{reason=\"limit\"} 0\n"));
        assert!(out.contains("ferry_tftp_transfers_active 0\n"));
        assert!(out.contains("ferry_tftp_first_ack_timeouts_total 0\n"));
        assert!(out.contains("ferry_tftp_logs_suppressed_total 0\n"));
        assert_eq!(out.matches("# TYPE").count(), 13);
    }
}
