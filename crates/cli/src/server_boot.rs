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

/// TFTP settings checked at startup, with ProxyDHCP's when it is on.
#[derive(Debug)]
pub struct Tftp {
    addr: SocketAddr,
    source: Arc<DirSource>,
    proxy: Option<proxydhcp::Config>,
}

/// A running TFTP server (and ProxyDHCP).
#[derive(Debug)]
pub struct Running {
    /// Its counters, for `/metrics`.
    pub counters: Arc<Counters>,
    /// ProxyDHCP's counters, when it runs.
    pub proxy: Option<Arc<proxydhcp::Counters>>,
    task: JoinHandle<()>,
    proxy_task: Option<JoinHandle<()>>,
}

/// `ferry server`'s ProxyDHCP flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Answer PXE clients with boot information only, no address (ProxyDHCP on UDP 67 and
    /// 4011), for a network whose DHCP server cannot be changed; IPV4 is this server's
    /// address on that network. Off by default; needs --tftp-listen and --boot-listen.
    #[arg(long, value_name = "IPV4", requires_all = ["tftp_listen", "boot_listen"])]
    pub proxy_dhcp: Option<std::net::Ipv4Addr>,
    /// The boot program ProxyDHCP names to BIOS clients, in --tftp-root.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "undionly.kpxe",
        requires = "proxy_dhcp"
    )]
    pub proxy_dhcp_bios_file: String,
    /// The boot program ProxyDHCP names to x86-64 UEFI clients, in --tftp-root.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "snponly.efi",
        requires = "proxy_dhcp"
    )]
    pub proxy_dhcp_efi_file: String,
}

/// ProxyDHCP's settings from `ferry server`'s flags (`--proxy-dhcp`): the boot programs by
/// name and the boot script on the boot port, at the address given; `None` when off.
///
/// # Errors
/// A boot program name that is not a plain file name.
pub fn proxy_from_flags(
    p: &ProxyArgs,
    boot_listen: Option<SocketAddr>,
) -> anyhow::Result<Option<proxydhcp::Config>> {
    let (Some(server), Some(boot)) = (p.proxy_dhcp, boot_listen) else {
        return Ok(None);
    };
    for (flag, f) in [
        ("--proxy-dhcp-bios-file", &p.proxy_dhcp_bios_file),
        ("--proxy-dhcp-efi-file", &p.proxy_dhcp_efi_file),
    ] {
        let plain = !f.is_empty()
            && f.len() <= 127
            && !f.contains(['/', '\\'])
            && f.chars().all(|c| c.is_ascii_graphic());
        if !plain {
            anyhow::bail!(
                "{flag} {f:?}: a file name of --tftp-root (printable ASCII, no '/', at most 127 bytes)"
            );
        }
    }
    Ok(Some(proxydhcp::Config::new(proxydhcp::BootInfo {
        server,
        bios_file: p.proxy_dhcp_bios_file.clone(),
        efi_x64_file: p.proxy_dhcp_efi_file.clone(),
        script_url: format!("http://{server}:{}/boot/ipxe", boot.port()),
    })))
}

impl Tftp {
    /// The settings from the flags (clap makes them come together); `None` when off.
    ///
    /// # Errors
    /// The root directory cannot be opened.
    pub fn from_flags(
        listen: Option<SocketAddr>,
        root: Option<&Path>,
        proxy: Option<proxydhcp::Config>,
    ) -> anyhow::Result<Option<Tftp>> {
        let (Some(addr), Some(root)) = (listen, root) else {
            return Ok(None);
        };
        let source =
            DirSource::new(root).with_context(|| format!("open --tftp-root {}", root.display()))?;
        Ok(Some(Tftp {
            addr,
            source: Arc::new(source),
            proxy,
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
        let (stop_tftp, stop_proxy) = {
            let (tx, rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                stop.await;
                let _ = tx.send(true);
            });
            let rx2 = rx.clone();
            (wait_true(rx), wait_true(rx2))
        };
        let (proxy, proxy_task) = match self.proxy {
            Some(cfg) => {
                let info = cfg.info.clone();
                let p = proxydhcp::Server::bind(cfg).context("start ProxyDHCP")?;
                tracing::info!(server = %info.server, bios = %info.bios_file,
                    efi = %info.efi_x64_file, script = %info.script_url,
                    "ProxyDHCP answering PXE clients on UDP 67 and 4011 (boot information, no addresses)");
                let c = p.counters();
                (Some(c), Some(tokio::spawn(p.run(stop_proxy))))
            }
            None => (None, None),
        };
        let task = tokio::spawn(server.run(stop_tftp));
        Ok(Running {
            counters,
            proxy,
            task,
            proxy_task,
        })
    }
}

impl Running {
    /// Waits for the server to stop.
    pub async fn join(self) {
        let _ = self.task.await;
        if let Some(t) = self.proxy_task {
            let _ = t.await;
        }
    }
}

async fn wait_true(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Appends ProxyDHCP's counters to a Prometheus text exposition.
pub fn render_proxy_metrics(c: &proxydhcp::Counters, out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP ferry_proxydhcp_total ProxyDHCP packets by what was done (offers, acks, ipxe: of those naming the boot script; the rest: not answered, by reason)."
    );
    let _ = writeln!(out, "# TYPE ferry_proxydhcp_total counter");
    for (what, v) in c.snapshot() {
        let _ = writeln!(out, "ferry_proxydhcp_total{{what=\"{what}\"}} {v}");
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
    fn proxydhcp_takes_plain_boot_program_names_and_names_the_script_on_the_boot_port() {
        let args = |bios: &str| ProxyArgs {
            proxy_dhcp: Some(std::net::Ipv4Addr::new(10, 0, 0, 5)),
            proxy_dhcp_bios_file: bios.into(),
            proxy_dhcp_efi_file: "snponly.efi".into(),
        };
        let boot = Some("0.0.0.0:8067".parse().unwrap());
        let cfg = proxy_from_flags(&args("undionly.kpxe"), boot)
            .unwrap()
            .unwrap();
        assert_eq!(cfg.info.script_url, "http://10.0.0.5:8067/boot/ipxe");
        for bad in ["../etc/passwd", "", "a b"] {
            let e = proxy_from_flags(&args(bad), boot).unwrap_err().to_string();
            assert!(e.contains("--proxy-dhcp-bios-file"), "{bad:?}: {e}");
        }
        assert!(proxy_from_flags(&args("x"), None).unwrap().is_none());
    }

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
