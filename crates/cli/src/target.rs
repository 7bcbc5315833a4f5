//! `ferry target`: the target device agent (attach a vDisk from servers, keep this
//! machine's writes in a write cache, export the disk on a unix socket), and
//! `ferry target status` / `ferry target mark-booted`, which talk to a running agent over
//! its control socket (`EXPORT.ctl`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ::target::{AgentConfig, CacheMode, Status};
use anyhow::{Context, bail};
use clap::{Args as ClapArgs, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

use crate::Global;
use crate::size::{parse_block_size, parse_size};

/// The export socket when `--export` is not given.
const DEFAULT_EXPORT: &str = "unix:/run/ferry/target.sock";
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
        #[arg(long)]
        json: bool,
    },
    /// Tell the running agent the machine has booted (stops the boot clock).
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

/// Arguments of the agent itself.
#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    /// Servers in failover order: HOST[:PORT][,HOST2[:PORT]...] (port 10809 by default).
    #[arg(
        long,
        value_name = "HOST[:PORT],...",
        value_delimiter = ',',
        required = true
    )]
    pub server: Vec<String>,
    /// The vDisk to attach.
    #[arg(long, value_name = "NAME", required = true)]
    pub vdisk: Option<String>,
    /// Write-cache mode: ram, ram-overflow, disk, server, server-persistent, private.
    #[arg(long, value_name = "MODE", default_value = "ram-overflow", value_parser = parse_mode)]
    pub cache: CacheMode,
    /// RAM budget of the ram and ram-overflow caches.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub ram: u64,
    /// Directory of the overflow file (ram-overflow, disk); the file is unlinked from the start.
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub overflow: PathBuf,
    /// Most bytes the overflow file may hold (the filesystem may fill first).
    #[arg(long, value_name = "SIZE", default_value = "1T", value_parser = parse_size)]
    pub overflow_max: u64,
    /// This device's name, for the server cache modes (default: the host name).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Where to export the disk: unix:PATH.
    #[arg(long, value_name = "unix:PATH", default_value = DEFAULT_EXPORT)]
    pub export: String,
    /// The control socket (default: EXPORT.ctl).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Cache block size (a power of two, 512..1M).
    #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = parse_block_size)]
    pub cache_block: u32,
    /// The boot ends after this many bytes were read (else at `ferry target mark-booted`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub boot_bytes: Option<u64>,
    /// Seconds a server may take to answer one request before the target fails over.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub timeout: u64,
}

fn parse_mode(s: &str) -> Result<CacheMode, String> {
    CacheMode::parse(s).ok_or_else(|| {
        let names: Vec<_> = CacheMode::ALL.iter().map(|m| m.name()).collect();
        format!("unknown cache mode {s:?} (one of {})", names.join(", "))
    })
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
        None => Ok(::target::agent::control_path_for(&socket_path(export)?)),
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
        }) => status(&control_path(export, control.as_deref())?, *json, global),
        Some(Command::MarkBooted { export, control }) => {
            let path = control_path(export, control.as_deref())?;
            let v = ::target::control::request(&path, "mark-booted")?;
            let t = v["boot_time_s"]
                .as_f64()
                .context("agent did not report a boot time")?;
            outln!("booted after {t:.1} s");
            Ok(ExitCode::SUCCESS)
        }
        None => agent(&a.run),
    }
}

fn agent(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let export_socket = socket_path(&a.export)?;
    let vdisk = a.vdisk.clone().context("--vdisk is required")?;
    let mut cfg = AgentConfig::new(a.server.clone(), &vdisk, a.cache, export_socket.clone());
    cfg.device = a.device.clone().unwrap_or_else(hostname);
    cfg.ram_bytes = a.ram;
    cfg.overflow_dir = Some(a.overflow.clone());
    cfg.overflow_bytes_max = a.overflow_max;
    cfg.block_bytes = a.cache_block;
    cfg.boot_bytes = a.boot_bytes;
    cfg.request_timeout = Duration::from_secs(a.timeout.max(1));
    if let Some(c) = &a.control {
        cfg.control_socket = c.clone();
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
        ::target::run(cfg, stop).await.map_err(anyhow::Error::from)
    });
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    result?;
    Ok(ExitCode::SUCCESS)
}

fn status(control: &Path, json: bool, _global: Global) -> anyhow::Result<ExitCode> {
    let v = ::target::control::request(control, "status")?;
    let s: Status = serde_json::from_value(v).context("status reply")?;
    if json {
        crate::print_json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    outln!("server:      {} (of {})", s.server, s.servers.join(", "));
    outln!("vDisk:       {} ({})", s.vdisk, s.version);
    outln!("export:      {}", s.export);
    outln!("cache mode:  {}", s.cache_mode);
    outln!(
        "RAM:         {:.1} MiB of {:.1} MiB",
        mib(s.ram_bytes),
        mib(s.ram_bytes_max)
    );
    outln!(
        "overflow:    {:.1} MiB of {:.1} MiB ({} evictions, {} refused writes)",
        mib(s.overflow_bytes),
        mib(s.overflow_bytes_max),
        s.evictions,
        s.enospc
    );
    outln!(
        "read:        {:.1} MiB in {} requests, {:.0} IOPS now",
        mib(s.bytes_read),
        s.reads,
        s.read_iops
    );
    outln!(
        "written:     {:.1} MiB in {} requests, {:.0} IOPS now",
        mib(s.bytes_written),
        s.writes,
        s.write_iops
    );
    outln!(
        "retries:     {}  failovers: {}  errors: {}",
        s.retries,
        s.failovers,
        s.errors
    );
    match s.boot_time_s {
        Some(t) => outln!("boot time:   {t:.1} s"),
        None => outln!("boot time:   booting ({:.1} s so far)", s.uptime_s),
    }
    Ok(ExitCode::SUCCESS)
}
