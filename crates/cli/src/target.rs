//! `ferry target`: the target device agent (attach a vDisk from servers, keep this
//! machine's writes in a write cache, export the disk on a unix socket), and
//! `ferry target status` / `ferry target mark-booted`, which talk to a running agent over
//! its control socket (`EXPORT.ctl`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ::agent::boot::{BOOT_QUIET, BootEnd};
use ::agent::login::{self, LoginError, LoginGrant};
use ::agent::{AgentConfig, CacheMode, Status};
use anyhow::{Context, anyhow, bail};
use clap::{Args as ClapArgs, Subcommand};
use disk::ops::info::human_size;
use tokio::signal::unix::{SignalKind, signal};

use crate::Global;
use crate::size::{parse_block_size, parse_nonzero_size, parse_size};

/// The export socket when `--export` is not given.
const DEFAULT_EXPORT: &str = "unix:/run/ferry/target.sock";
/// The cache mode when neither --cache nor a farm sets one.
const DEFAULT_MODE: CacheMode = CacheMode::RamOverflow;
/// The RAM budget when neither --ram nor a farm sets one.
const DEFAULT_RAM_BYTES: u64 = 1 << 30;
/// The environment variable that may hold the farm key (hex) for device login.
const FARM_KEY_ENV: &str = "FERRY_FARM_KEY";
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

/// Arguments of the agent itself.
#[derive(Debug, Clone, ClapArgs)]
pub struct RunArgs {
    /// With --vdisk: NBD servers in failover order, HOST[:PORT][,HOST2[:PORT]...] (port 10809
    /// by default). With --device MAC alone: the farm's API, http://HOST:PORT[,...] (tried in
    /// order for the login; the farm then names the NBD servers).
    #[arg(
        long,
        value_name = "HOST[:PORT],...|URL,...",
        value_delimiter = ',',
        required = true
    )]
    pub server: Vec<String>,
    /// The vDisk to attach (without it, --device MAC logs in to the farm).
    #[arg(long, value_name = "NAME", required_unless_present = "device")]
    pub vdisk: Option<String>,
    /// Write-cache mode: ram, ram-overflow, disk, server, server-persistent, private
    /// (default ram-overflow; after device login the farm decides).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub cache: Option<CacheMode>,
    /// RAM budget of the ram and ram-overflow caches (default 1G; after device login the
    /// farm decides).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub ram: Option<u64>,
    /// Directory of the overflow file (ram-overflow, disk); the file is unlinked from the start.
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub overflow: PathBuf,
    /// Most bytes the overflow file may hold (the filesystem may fill first).
    #[arg(long, value_name = "SIZE", default_value = "1T", value_parser = parse_nonzero_size)]
    pub overflow_max: u64,
    /// With --vdisk: this device's name, for the server cache modes (default: the host
    /// name). Without --vdisk: this device's MAC, which logs in to the farm at --server.
    #[arg(long, value_name = "NAME|MAC")]
    pub device: Option<String>,
    /// Device login: the file holding the farm key (DATA/secrets/farm.key of `ferry farm
    /// init`); else the key's hex text from FERRY_FARM_KEY. Needed only to enrol (the first
    /// login); later logins prove with the device secret in --state-dir.
    #[arg(long, value_name = "FILE", conflicts_with = "vdisk")]
    pub farm_key: Option<PathBuf>,
    /// Device login: where the device secret is kept (0700; the file 0600), written at
    /// enrolment (default: ferry-state under --overflow).
    #[arg(long, value_name = "DIR", conflicts_with = "vdisk")]
    pub state_dir: Option<PathBuf>,
    /// Device login: the farm's CA certificate (DATA/secrets/ca-cert.pem), which an
    /// https:// farm API's certificate must chain to (http:// only to loopback).
    #[arg(long, value_name = "FILE", conflicts_with = "vdisk")]
    pub farm_ca: Option<PathBuf>,
    /// Where to export the disk: unix:PATH.
    #[arg(long, value_name = "unix:PATH", default_value = DEFAULT_EXPORT)]
    pub export: String,
    /// The control socket (default: EXPORT.ctl).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Cache block size (a power of two, 512..1M).
    #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = parse_block_size)]
    pub cache_block: u32,
    /// The boot ends after this many bytes were read (or earlier: see --boot-quiet and
    /// `ferry target mark-booted`).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub boot_bytes: Option<u64>,
    /// The boot ends at the last read of its first read burst (256 reads or more) once no
    /// read came for this many seconds; 0: only mark-booted and --boot-bytes end it.
    #[arg(long, value_name = "SECONDS", default_value_t = BOOT_QUIET.as_secs())]
    pub boot_quiet: u64,
    /// Seconds a server may take to answer one request before the target fails over.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = parse_seconds)]
    pub timeout: u64,
    /// Seconds one failover may look for a server before the request fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = parse_seconds)]
    pub failover_timeout: u64,
    /// Server modes: most bytes of writes kept to replay after a failover (server-persistent
    /// and private flush past it; in `server` mode a failover past it fails I/O).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub replay_max: u64,
    /// NBD over TLS with the certificates in DIR: ca-cert.pem (the farm's CA, which the
    /// servers' certificates must chain to) and this device's client-cert.pem and
    /// client-key.pem (without them the connection is encrypted but anonymous). A server
    /// that does not offer TLS is then refused.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
}

/// A timeout in whole seconds, at least 1 (0 would fail every request at once).
fn parse_seconds(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err(format!("{s:?}: a timeout must be at least 1 second")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number of seconds")),
    }
}

/// A cache mode in either spelling (`ram-overflow` or the farm's `ram_overflow`).
fn parse_mode(s: &str) -> Result<CacheMode, String> {
    s.parse().map_err(|_| {
        let names: Vec<_> = CacheMode::ALL.iter().map(|m| m.cli_name()).collect();
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
            reporter = Some((api, grant.export_name.to_string()));
            let mut cfg = config_from_grant(&grant, export_socket.clone())?;
            cfg.relogin = Some(relogin(a, &grant));
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
    if let Some((api, export)) = reporter {
        let ca = match &a.farm_ca {
            Some(f) => std::fs::read_to_string(f).ok(),
            None => None,
        };
        start_reporter(&api, ca, export, cfg.control_socket.clone());
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

/// The NBD client's TLS from a certificate directory (`--tls-dir`, the layout of
/// `pki::CertDir`, which qemu, libnbd and nbdkit read too).
fn nbd_tls_from_dir(dir: &Path) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("--tls-dir: read {}", p.display()))
    };
    let ca = read(pki::CA_CERT)?;
    let (cert, key) = (dir.join(pki::CLIENT_CERT), dir.join(pki::CLIENT_KEY));
    let client = match (cert.exists(), key.exists()) {
        (true, true) => Some((read(pki::CLIENT_CERT)?, read(pki::CLIENT_KEY)?)),
        (false, false) => None,
        _ => bail!(
            "--tls-dir {}: {} and {} go together (give both or neither)",
            dir.display(),
            pki::CLIENT_CERT,
            pki::CLIENT_KEY
        ),
    };
    pki::client_config(&ca, client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())))
        .with_context(|| format!("--tls-dir {}", dir.display()))
}

/// How often a logged-in target reports its counters to the farm (the console's live status).
const REPORT_EVERY: Duration = Duration::from_secs(2);

/// Reports this device's counters to the farm API every [`REPORT_EVERY`] for the console's
/// live status: bytes read and written, retries and the write cache's use, read from the
/// agent's own control socket and posted to `/api/v1/status/report` with the session export
/// as the credential, with the address of the server in use (the console's Server column). Failures are logged, never fatal: status is not the data path.
fn start_reporter(api: &str, ca: Option<String>, export_name: String, control: PathBuf) {
    let url = match login::parse_api_url(api).and_then(|u| {
        u.join("api/v1/status/report")
            .map_err(|e| LoginError::BadUrl {
                url: api.to_string(),
                reason: e.to_string(),
            })
    }) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "no status reports to the farm");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("ferry-target-report".into())
        .spawn(move || {
            let client = match login::api_client(&url, ca.as_deref())
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(b.timeout(Duration::from_secs(5)).build()?))
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no status reports to the farm");
                    return;
                }
            };
            let mut failures = 0u64;
            loop {
                std::thread::sleep(REPORT_EVERY);
                let Ok(v) = ::agent::control::request(&control, "status") else {
                    continue;
                };
                let body = report_body(&export_name, &v);
                let ok = client
                    .post(url.clone())
                    .json(&body)
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if !ok {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(failures, %url, "status report to the farm failed");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no status reports to the farm");
    }
}

/// The body of a status report (`POST /api/v1/status/report`) from the agent's status `v`:
/// the counters, and the NBD server it streams from now (its address, as login gave it;
/// the farm names the server registered there).
fn report_body(export_name: &str, v: &serde_json::Value) -> serde_json::Value {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    serde_json::json!({
        "export_name": export_name,
        "server_address": v["server"].as_str(),
        "bytes_read": n("bytes_read"),
        "bytes_written": n("bytes_written"),
        "retries": n("retries"),
        "cache_used_bytes": n("ram_bytes") + n("overflow_bytes"),
    })
}

/// The directory of the device secret under --overflow unless --state-dir.
const STATE_DIR_NAME: &str = "ferry-state";

/// Logs in at the first reachable farm API of `--server` with the device secret in the
/// state directory, or (to enrol) the farm key from `--farm-key` or [`FARM_KEY_ENV`].
fn device_login(a: &RunArgs, mac: &str) -> anyhow::Result<(LoginGrant, String)> {
    let state = login::DeviceState::new(
        &a.state_dir
            .clone()
            .unwrap_or_else(|| a.overflow.join(STATE_DIR_NAME)),
    );
    let enrolled = state.secret(login::parse_mac(mac)?)?.is_some();
    let key = if enrolled {
        None
    } else {
        let key_text = match &a.farm_key {
            Some(f) => std::fs::read_to_string(f)
                .with_context(|| format!("read the farm key {}", f.display()))?,
            None => std::env::var(FARM_KEY_ENV).map_err(|_| {
                anyhow!(
                    "device login needs the farm key to enrol (no device secret in {}): \
                     --farm-key FILE (DATA/secrets/farm.key of ferry farm init) or \
                     {FARM_KEY_ENV}=HEX",
                    state.path().display()
                )
            })?,
        };
        Some(login::parse_farm_key(&key_text)?)
    };
    let ca = match &a.farm_ca {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("read the farm CA {}", f.display()))?,
        ),
        None => None,
    };
    let mut unreachable = None;
    for url in &a.server {
        match login::login_device(url, mac, key.as_deref(), &state, ca.as_deref()) {
            Ok(g) => {
                tracing::info!(api = %url, mac = %g.mac, device = %g.device_name,
                    vdisk = %g.vdisk, version = g.version, cache = %g.cache_mode.cli_name(),
                    ram_bytes = g.ram_bytes, export = %g.export_name,
                    servers = %g.servers.join(","), "logged in to the farm");
                if let Some(tls) = &g.tls {
                    tracing::info!(
                        not_after_ms = tls.not_after_ms,
                        "the farm issued this device's client certificate"
                    );
                }
                if g.servers_defaulted {
                    tracing::warn!(server = %g.servers[0],
                        "the farm lists no NBD server for this device's site; using the API's \
                         host on the default NBD port");
                }
                return Ok((g, url.clone()));
            }
            Err(e @ LoginError::Unreachable { .. }) => {
                tracing::warn!(error = %e, "farm API unreachable");
                unreachable = Some(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(unreachable
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow!("--server names no farm API")))
}

/// The agent's configuration after device login: the grant's servers, vDisk, cache mode
/// and RAM, and its session export (opened instead of the vDisk, on failover too).
fn config_from_grant(g: &LoginGrant, export_socket: PathBuf) -> anyhow::Result<AgentConfig> {
    let mut cfg = AgentConfig::new(g.servers.clone(), &g.vdisk, g.cache_mode, export_socket);
    cfg.device = g.device_name.clone();
    cfg.export_name = Some(g.export_name.clone());
    cfg.mac = Some(g.mac);
    cfg.ram_bytes = g.ram_bytes;
    cfg.tls = grant_tls(g)?;
    Ok(cfg)
}

/// TLS with the client certificate the farm issued at login (and its CA), if it issued one.
fn grant_tls(g: &LoginGrant) -> anyhow::Result<Option<std::sync::Arc<rustls::ClientConfig>>> {
    g.tls
        .as_ref()
        .map(|t| pki::client_config(&t.ca_pem, Some((&t.cert_pem, &t.key_pem))))
        .transpose()
        .context("the login grant's TLS certificate")
}

/// Device login again, for a failover whose servers all refuse the session (a farm that
/// lost or ended it): accepted only for the vDisk, version and cache mode attached now.
fn relogin(a: &RunArgs, first: &LoginGrant) -> ::agent::remote::Relogin {
    let a = a.clone();
    let mac = first.mac.to_string();
    let want = (first.vdisk.clone(), first.version, first.cache_mode);
    ::agent::remote::Relogin(std::sync::Arc::new(move || {
        let (a, mac, want) = (a.clone(), mac.clone(), want.clone());
        // Its own thread: the blocking HTTP client must not run inside the runtime.
        let login = std::thread::spawn(move || -> Result<::agent::remote::Session, String> {
            let (g, _) = device_login(&a, &mac).map_err(|e| format!("{e:#}"))?;
            let got = (g.vdisk.clone(), g.version, g.cache_mode);
            if got != want {
                return Err(format!(
                    "the farm now grants {} version {} ({}); this device keeps {} version {} until it restarts",
                    got.0,
                    got.1,
                    got.2.cli_name(),
                    want.0,
                    want.1
                ));
            }
            Ok(::agent::remote::Session {
                export: g.export_name.to_string(),
                tls: grant_tls(&g).map_err(|e| format!("{e:#}"))?,
            })
        });
        login
            .join()
            .map_err(|_| "login thread panicked".to_string())?
    }))
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
    if let Some(t) = s.boot_time_s {
        out.push_str(&format!(
            "# HELP ferry_target_boot_seconds seconds from attach to boot end\n\
             # TYPE ferry_target_boot_seconds gauge\nferry_target_boot_seconds{{{labels}}} {t}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn mark_booted_after_the_burst_says_it_had_ended() {
        assert_eq!(
            booted_line(12.0, Some(BootEnd::ReadBurstOver)),
            "booted after 12.0 s (already ended: read burst over)"
        );
    }
}
