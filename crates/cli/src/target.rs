//! `ferry target`: the target device agent (attach a vDisk from servers, keep this
//! machine's writes in a write cache, export the disk on a unix socket), and
//! `ferry target status` / `ferry target mark-booted`, which talk to a running agent over
//! its control socket (`EXPORT.ctl`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ::agent::boot::BootEnd;
use ::agent::{AgentConfig, CacheMode, Status};
use anyhow::{Context, bail};
use clap::{Args as ClapArgs, Subcommand};
use disk::ops::info::human_size;
use tokio::signal::unix::{SignalKind, signal};

use crate::Global;
use crate::target_args::DEFAULT_EXPORT;
pub use crate::target_args::RunArgs;
use crate::target_farm::{
    config_from_grant, device_login, nbd_tls_from_dir, relogin, start_reporter,
};

/// The cache mode when neither --cache nor a farm sets one.
const DEFAULT_MODE: CacheMode = CacheMode::RamOverflow;
/// The RAM budget when neither --ram nor a farm sets one.
const DEFAULT_RAM_BYTES: u64 = 1 << 30;
/// How long the runtime waits for disk calls still running after the export stopped.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `target`.
#[derive(Debug, ClapArgs)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands of `target`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the running agent's server, vDisk, cache use, I/O and boot time.
    #[command(after_help = "Examples:\n  ferry target status\n  \
                            ferry target status --export unix:/tmp/t.sock --json")]
    Status {
        /// The agent's export socket (its control socket is EXPORT.ctl).
        #[arg(long, value_name = "unix:PATH", default_value = DEFAULT_EXPORT)]
        export: String,
        /// The control socket, if not next to the export.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
        /// JSON on stdout.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Prometheus text exposition on stdout (for node_exporter's textfile collector).
        #[arg(long)]
        prometheus: bool,
    },
    /// Install Ferry's boot agent and initramfs-tools hook into an image's root, so that
    /// the image boots diskless from a farm (boot=ferry).
    #[command(after_help = "Examples:\n  \
        ferry target install-initramfs --farm-ca ca-cert.pem --update\n  \
        ferry target install-initramfs --root /mnt/golden --agent ferry-boot \\\n    \
        --farm-ca /var/lib/ferry/secrets/ca-cert.pem --overflow /dev/vdb --update")]
    InstallInitramfs(crate::target_initramfs::InstallArgs),
    /// Tell the running agent the machine has booted (stops the boot clock, unless the
    /// end of the boot's read burst or --boot-bytes stopped it first).
    #[command(
        after_help = "Example:\n  ferry target mark-booted   # e.g. from a systemd unit \
                            after multi-user.target"
    )]
    MarkBooted {
        /// The agent's export socket (its control socket is EXPORT.ctl).
        #[arg(long, value_name = "unix:PATH", default_value = DEFAULT_EXPORT)]
        export: String,
        /// The control socket, if not next to the export.
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
    },
}

fn socket_path(export: &str) -> anyhow::Result<PathBuf> {
    match export.strip_prefix("unix:") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => bail!("--export must be unix:PATH, not {export:?}"),
    }
}

fn control_path(export: &str, control: Option<&Path>) -> anyhow::Result<PathBuf> {
    match control {
        Some(c) => Ok(c.to_path_buf()),
        None => Ok(::agent::daemon::control_path_for(&socket_path(export)?)),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "target".to_string())
}

/// Runs `ferry target ...`.
///
/// # Errors
/// Attach, bind, control socket and signal errors.
pub fn run(a: &Args, global: Global) -> anyhow::Result<ExitCode> {
    match &a.command {
        Some(Command::Status {
            export,
            control,
            json,
            prometheus,
        }) => {
            let path = control_path(export, control.as_deref())?;
            status(&path, *json, *prometheus, global)
        }
        Some(Command::MarkBooted { export, control }) => {
            let path = control_path(export, control.as_deref())?;
            let v = ::agent::control::request(&path, "mark-booted")?;
            let t = v["boot_time_s"]
                .as_f64()
                .context("agent did not report a boot time")?;
            let by = serde_json::from_value::<BootEnd>(v["boot_ended_by"].clone()).ok();
            outln!("{}", booted_line(t, by));
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::InstallInitramfs(i)) => crate::target_initramfs::run(i),
        None => agent(&a.run),
    }
}

fn agent(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let export_socket = socket_path(&a.export)?;
    let mut reporter = None;
    let mut cfg = match &a.vdisk {
        Some(vdisk) => {
            let mode = a.cache.unwrap_or(DEFAULT_MODE);
            let mut cfg = AgentConfig::new(a.server.clone(), vdisk, mode, export_socket.clone());
            cfg.device = a.device.clone().unwrap_or_else(hostname);
            cfg.ram_bytes = a.ram.unwrap_or(DEFAULT_RAM_BYTES);
            cfg
        }
        None => {
            let mac = a
                .device
                .as_deref()
                .context("give --vdisk NAME, or --device MAC to log in to a farm")?;
            if a.cache.is_some() || a.ram.is_some() {
                bail!(
                    "--cache and --ram come from the farm after device login; set them on the \
                     device (ferry device set --cache-mode/--ram-bytes) or on its vDisk"
                );
            }
            let (grant, api) = device_login(a, mac)?;
            let ca = farm_ca_pem(a);
            // Reports go to the API login used, then to the others in --server's order.
            let apis: Vec<String> = std::iter::once(api.clone())
                .chain(a.server.iter().filter(|u| **u != api).cloned())
                .collect();
            reporter = Some((apis, grant.export_name.to_string(), ca.clone()));
            let mut cfg = config_from_grant(&grant, export_socket.clone())?;
            cfg.relogin = Some(relogin(a, &grant));
            // The version's boot set, read ahead of the machine into the host read cache
            // (local cache modes with --host-cache: without one, no read cache is kept).
            if cfg.mode.is_local() && !a.no_prefetch && a.host_cache.is_some() {
                cfg.boot_set = Some(Arc::new(agent::boot_set_fetch::FarmBootSet::for_grant(
                    api.clone(),
                    ca,
                    &grant,
                )));
            }
            cfg
        }
    };
    cfg.overflow_dir = Some(a.overflow.clone());
    cfg.overflow_bytes_max = a.overflow_max;
    cfg.block_bytes = a.cache_block;
    cfg.boot_bytes = a.boot_bytes;
    cfg.boot_quiet = (a.boot_quiet > 0).then(|| Duration::from_secs(a.boot_quiet));
    cfg.request_timeout = Duration::from_secs(a.timeout.max(1));
    cfg.failover_timeout = Duration::from_secs(a.failover_timeout.max(1));
    cfg.replay_bytes_max = a.replay_max;
    if let Some(dir) = &a.tls_dir {
        cfg.tls = Some(nbd_tls_from_dir(dir)?);
    }
    if let Some(c) = &a.control {
        cfg.control_socket = c.clone();
    }
    if let Some(dir) = &a.host_cache {
        if cfg.mode.is_local() {
            cfg.host_cache = Some(::agent::HostCacheConfig {
                dir: dir.clone(),
                bytes: a.host_cache_size,
                block_bytes: host_cache::BLOCK_BYTES_DEFAULT,
            });
        } else {
            tracing::warn!(
                mode = cfg.mode.cli_name(),
                "--host-cache is for the local cache modes (this export carries the device's writes); not used"
            );
        }
    }
    if let Some((apis, export, ca)) = reporter {
        let refresh = Arc::new(agent::remote::ServerRefresh::default());
        cfg.refresh = Some(Arc::clone(&refresh));
        let feed = Arc::new(agent::report::StatusFeed::default());
        cfg.status_feed = Some(Arc::clone(&feed));
        start_reporter(&apis, ca, export, feed, Some(refresh));
    }
    if let Some(dir) = export_socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferry-target")
        .build()
        .context("start async runtime")?;
    let result = runtime.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("shutting down: finishing open connections");
        };
        ::agent::run(cfg, stop).await.map_err(anyhow::Error::from)
    });
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    result?;
    Ok(ExitCode::SUCCESS)
}

fn status(
    control: &Path,
    json: bool,
    prometheus: bool,
    _global: Global,
) -> anyhow::Result<ExitCode> {
    let v = ::agent::control::request(control, "status")?;
    let s: Status = serde_json::from_value(v).context("status reply")?;
    if json {
        crate::print_json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    if prometheus {
        crate::print_text(&prometheus_text(&s));
        return Ok(ExitCode::SUCCESS);
    }
    crate::print_text(&render_status(&s));
    Ok(ExitCode::SUCCESS)
}

/// What `ferry target mark-booted` prints: the boot time, and what ended the boot when it
/// was not this call.
fn booted_line(time_s: f64, by: Option<BootEnd>) -> String {
    match by {
        None | Some(BootEnd::Marked) => format!("booted after {time_s:.1} s"),
        Some(by) => format!(
            "booted after {time_s:.1} s (already ended: {})",
            by.describe()
        ),
    }
}

/// The status as text, one `name: value` line each; sizes in the largest binary unit they
/// reach ([`human_size`]).
fn render_status(s: &Status) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| {
        out.push_str(&format!("{:<13}{value}\n", format!("{name}:")));
    };
    line(
        "server",
        format!("{} (of {})", s.server, s.servers.join(", ")),
    );
    line(
        "vDisk",
        match s.version.trim() {
            "" => s.vdisk.clone(),
            v => format!("{} ({v})", s.vdisk),
        },
    );
    line("export", s.export.clone());
    if let Some(mac) = &s.mac {
        line(
            "device",
            format!("{mac} (device login; session export above)"),
        );
    }
    line("cache mode", s.cache_mode.clone());
    line(
        "RAM",
        format!(
            "{} of {}",
            human_size(s.ram_bytes),
            human_size(s.ram_bytes_max)
        ),
    );
    line(
        "overflow",
        format!(
            "{} of {} ({} evictions, {} refused writes)",
            human_size(s.overflow_bytes),
            human_size(s.overflow_bytes_max),
            s.evictions,
            s.enospc
        ),
    );
    line(
        "read",
        format!(
            "{} in {} requests, {:.0} IOPS now",
            human_size(s.bytes_read),
            s.reads,
            s.read_iops
        ),
    );
    line(
        "written",
        format!(
            "{} in {} requests, {:.0} IOPS now",
            human_size(s.bytes_written),
            s.writes,
            s.write_iops
        ),
    );
    line(
        "retries",
        format!(
            "{}  failovers: {}  errors: {}",
            s.retries, s.failovers, s.errors
        ),
    );
    if let Some(h) = &s.host_cache {
        line(
            "host cache",
            format!(
                "{} at {}: {} hits ({}), {} misses, {} waits; {} from servers by this agent, \
                 {} by the host",
                human_size(h.bytes_max),
                h.path,
                h.hits,
                human_size(h.hit_bytes),
                h.misses,
                h.waits,
                human_size(h.server_bytes),
                human_size(h.host_fill_bytes),
            ),
        );
    }
    if let Some(p) = &s.prefetch {
        line(
            "prefetch",
            format!(
                "{:?}: {} of a {} boot set fetched, at block {} of {}",
                p.state,
                human_size(p.fetched_bytes),
                human_size(p.set_bytes),
                p.position_blocks,
                p.set_blocks
            )
            .to_lowercase(),
        );
    }
    line(
        "boot time",
        match (s.boot_time_s, s.boot_ended_by) {
            (Some(t), Some(by)) => format!("{t:.1} s ({})", by.describe()),
            (Some(t), None) => format!("{t:.1} s"),
            (None, _) => format!("booting ({:.1} s so far)", s.uptime_s),
        },
    );
    out
}

/// The status as Prometheus text exposition (`ferry_target_*`).
fn prometheus_text(s: &Status) -> String {
    let labels = format!(
        "vdisk=\"{}\",cache_mode=\"{}\",server=\"{}\"",
        s.vdisk, s.cache_mode, s.server
    );
    let rows: [(&str, &str, &str, f64); 15] = [
        (
            "ram_bytes",
            "gauge",
            "RAM used by the write cache",
            s.ram_bytes as f64,
        ),
        (
            "ram_bytes_max",
            "gauge",
            "RAM budget of the write cache",
            s.ram_bytes_max as f64,
        ),
        (
            "overflow_bytes",
            "gauge",
            "overflow file bytes in use",
            s.overflow_bytes as f64,
        ),
        (
            "evictions_total",
            "counter",
            "blocks moved from RAM to the overflow file",
            s.evictions as f64,
        ),
        (
            "enospc_total",
            "counter",
            "writes refused for lack of cache space",
            s.enospc as f64,
        ),
        (
            "read_bytes_total",
            "counter",
            "bytes read from the exported disk",
            s.bytes_read as f64,
        ),
        (
            "written_bytes_total",
            "counter",
            "bytes written to the exported disk",
            s.bytes_written as f64,
        ),
        ("reads_total", "counter", "read requests", s.reads as f64),
        ("writes_total", "counter", "write requests", s.writes as f64),
        (
            "read_iops",
            "gauge",
            "reads per second, last second",
            s.read_iops,
        ),
        (
            "write_iops",
            "gauge",
            "writes per second, last second",
            s.write_iops,
        ),
        (
            "errors_total",
            "counter",
            "requests that failed",
            s.errors as f64,
        ),
        (
            "retries_total",
            "counter",
            "requests retried after a server was lost",
            s.retries as f64,
        ),
        (
            "failovers_total",
            "counter",
            "moves to another server",
            s.failovers as f64,
        ),
        (
            "uptime_seconds",
            "gauge",
            "seconds since attach",
            s.uptime_s,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, v) in rows {
        out.push_str(&format!(
            "# HELP ferry_target_{name} {help}\n# TYPE ferry_target_{name} {kind}\n\
             ferry_target_{name}{{{labels}}} {v}\n"
        ));
    }
    if let Some(h) = &s.host_cache {
        let rows: [(&str, &str, &str, u64); 5] = [
            (
                "host_cache_hits_total",
                "counter",
                "block reads answered by the host read cache",
                h.hits,
            ),
            (
                "host_cache_misses_total",
                "counter",
                "block reads the host read cache did not hold",
                h.misses,
            ),
            (
                "host_cache_waits_total",
                "counter",
                "reads that waited for another agent's fetch",
                h.waits,
            ),
            (
                "host_cache_server_bytes_total",
                "counter",
                "bytes this agent read from servers below the host cache",
                h.server_bytes,
            ),
            (
                "host_cache_host_fill_bytes_total",
                "counter",
                "bytes every agent of the host fetched into the host cache",
                h.host_fill_bytes,
            ),
        ];
        for (name, kind, help, v) in rows {
            out.push_str(&format!(
                "# HELP ferry_target_{name} {help}\n# TYPE ferry_target_{name} {kind}\n\
                 ferry_target_{name}{{{labels}}} {v}\n"
            ));
        }
    }
    if let Some(t) = s.boot_time_s {
        out.push_str(&format!(
            "# HELP ferry_target_boot_seconds seconds from attach to boot end\n\
             # TYPE ferry_target_boot_seconds gauge\nferry_target_boot_seconds{{{labels}}} {t}\n"
        ));
    }
    out
}

/// The farm CA's certificate (PEM) from `--farm-ca`, when given and readable.
fn farm_ca_pem(a: &RunArgs) -> Option<String> {
    a.farm_ca
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::agent::report::report_body;

    /// A status as an agent in `ram-overflow` mode reports it just after device login: an
    /// empty server description, nothing cached, the default 1 TiB overflow budget.
    fn status() -> Status {
        Status {
            server: "127.0.0.1:10809".into(),
            servers: vec!["127.0.0.1:10809".into()],
            vdisk: "demo".into(),
            export: "ferry-s-0123".into(),
            mac: None,
            version: String::new(),
            size_bytes: 1 << 30,
            cache_mode: "ram-overflow".into(),
            cache_block_bytes: 4096,
            ram_bytes: 0,
            ram_bytes_max: 256 << 20,
            overflow_bytes: 0,
            overflow_bytes_max: 1 << 40,
            evictions: 0,
            enospc: 0,
            bytes_read: 3 << 29,
            bytes_written: 0,
            reads: 10,
            writes: 0,
            read_iops: 0.0,
            write_iops: 0.0,
            errors: 0,
            retries: 0,
            failovers: 0,
            uptime_s: 4.0,
            boot_time_s: None,
            boot_ended_by: None,
            host_cache: None,
            prefetch: None,
            reports_failed: None,
        }
    }

    /// The line of `text` that starts with `name:`.
    fn line<'a>(text: &'a str, name: &str) -> &'a str {
        let prefix = format!("{name}:");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
    }

    #[test]
    fn status_with_an_empty_description_shows_no_parentheses() {
        let text = render_status(&status());
        assert_eq!(line(&text, "vDisk"), "vDisk:       demo");
    }

    #[test]
    fn status_with_a_description_shows_it_in_parentheses() {
        let s = Status {
            version: "demo version 1".into(),
            ..status()
        };
        let text = render_status(&s);
        assert_eq!(line(&text, "vDisk"), "vDisk:       demo (demo version 1)");
    }

    #[test]
    fn status_sizes_use_the_largest_binary_unit() {
        let text = render_status(&status());
        assert_eq!(
            line(&text, "overflow"),
            "overflow:    0 B of 1 TiB (0 evictions, 0 refused writes)"
        );
        assert_eq!(line(&text, "RAM"), "RAM:         0 B of 256 MiB");
        // 3 << 29 bytes is one and a half GiB.
        assert_eq!(
            line(&text, "read"),
            "read:        1.5 GiB in 10 requests, 0 IOPS now"
        );
    }

    #[test]
    fn status_while_booting_shows_the_time_so_far() {
        let text = render_status(&status());
        assert_eq!(
            line(&text, "boot time"),
            "boot time:   booting (4.0 s so far)"
        );
    }

    #[test]
    fn status_after_the_read_burst_shows_the_time_and_how_it_ended() {
        let s = Status {
            boot_time_s: Some(12.0),
            boot_ended_by: Some(BootEnd::ReadBurstOver),
            ..status()
        };
        let text = render_status(&s);
        assert_eq!(
            line(&text, "boot time"),
            "boot time:   12.0 s (read burst over)"
        );
    }

    #[test]
    fn status_after_mark_booted_says_marked() {
        let s = Status {
            boot_time_s: Some(7.5),
            boot_ended_by: Some(BootEnd::Marked),
            ..status()
        };
        let text = render_status(&s);
        assert_eq!(
            line(&text, "boot time"),
            "boot time:   7.5 s (marked booted)"
        );
    }

    #[test]
    fn status_json_names_what_ended_the_boot() {
        let s = Status {
            boot_time_s: Some(12.0),
            boot_ended_by: Some(BootEnd::ReadBurstOver),
            ..status()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["boot_ended_by"], "read_burst_over");
    }

    #[test]
    fn report_names_the_server_in_use_by_its_address() {
        let v = serde_json::to_value(status()).unwrap();
        let body = report_body("ferry-s-0123", &v);
        assert_eq!(body["server_address"], "127.0.0.1:10809");
    }

    #[test]
    fn status_with_a_host_cache_shows_its_hits_and_server_bytes() {
        let s = Status {
            host_cache: Some(::agent::host_read::HostCacheStatus {
                path: "/dev/shm/ferry-host-cache-0".into(),
                bytes_max: 2 << 30,
                hits: 3,
                hit_bytes: 3 << 16,
                misses: 1,
                server_bytes: 1 << 16,
                host_fill_bytes: 1 << 16,
                ..Default::default()
            }),
            ..status()
        };
        let text = render_status(&s);
        assert_eq!(
            line(&text, "host cache"),
            "host cache:  2 GiB at /dev/shm/ferry-host-cache-0: 3 hits (192 KiB), 1 misses, \
             0 waits; 64 KiB from servers by this agent, 64 KiB by the host"
        );
        assert!(prometheus_text(&s).contains("ferry_target_host_cache_hits_total{"));
    }

    #[test]
    fn mark_booted_after_the_burst_says_it_had_ended() {
        assert_eq!(
            booted_line(12.0, Some(BootEnd::ReadBurstOver)),
            "booted after 12.0 s (already ended: read burst over)"
        );
    }
}
