//! `ferry server`: serve the vDisks of a store over NBD, with metrics over HTTP.
//!
//! The settings come from an optional TOML file (`--config`, see docs/config.md) and the
//! flags, which override the file; `--store DIR` alone is enough. The command builds the
//! block cache, the export [`Registry`] and the [`Metrics`], binds the NBD listeners and the
//! metrics endpoint (so a bad address fails before anything is served), logs the exports,
//! and serves until SIGINT or SIGTERM. Then it stops accepting, lets every connection finish
//! and flush, releases write caches (discarding the non-persistent ones) and exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args as ClapArgs;
use contract::ErrorChain;
use nbd_server::{ExportSource, Listener, NbdMetrics, Peer};
use server::access::AccessPolicy;
use server::config::{FerryConfig, Resolved};
use server::exports::Registry;
use server::metrics::Metrics;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::Global;
use crate::size::parse_nonzero_size;

/// Exports named one by one in the startup log; the rest are counted.
const LOGGED_EXPORTS_MAX: usize = 50;
/// How long the runtime waits for disk calls still running after the server stopped.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `server`.
#[derive(Debug, ClapArgs)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// A farm server's drain, from any machine with the farm API (instead of serving).
    #[command(subcommand)]
    pub command: Option<crate::server_drain::DrainCommand>,
    /// TOML configuration file (see docs/config.md); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Store directory holding NAME.vhdx and its versions NAME.N.avhdx ([store] dir), or
    /// an S3-compatible bucket s3://BUCKET/PREFIX holding the same files with their
    /// manifests (see docs/s3.md and the --s3-* and --tier-dir flags).
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    pub store: Option<PathBuf>,
    #[command(flatten)]
    pub bucket: crate::server_bucket::BucketArgs,
    /// NBD TCP address ([nbd] listen; default 0.0.0.0:10809; "" turns TCP off).
    #[arg(long, value_name = "ADDR:PORT")]
    pub nbd_listen: Option<String>,
    /// NBD unix socket path ([nbd] socket).
    #[arg(long, value_name = "PATH")]
    pub nbd_socket: Option<PathBuf>,
    /// Metrics HTTP address for GET /metrics ([metrics] listen; default 127.0.0.1:9810;
    /// "" turns it off).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<String>,
    /// Block cache RAM budget, e.g. 4G ([cache] ram_bytes; default: a quarter of RAM).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub cache_ram: Option<u64>,
    /// Join the farm in DIR (made by `ferry farm init`): serve its REST API and web console,
    /// accept device logins' session exports, register this server and heartbeat. Without
    /// --store, the farm's first store is served.
    #[arg(long, value_name = "DIR")]
    pub farm: Option<PathBuf>,
    /// The farm's PostgreSQL database instead of DIR's SQLite file.
    #[arg(
        long,
        value_name = "URL",
        env = "FERRY_DB",
        hide_env_values = true,
        requires = "farm"
    )]
    pub db: Option<String>,
    /// Where the farm API and console listen (with --farm).
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:8080",
        requires = "farm"
    )]
    pub api_listen: SocketAddr,
    /// Serve the farm API and console over HTTPS with the certificates in DIR:
    /// server-cert.pem, server-key.pem and ca-cert.pem. Without it the API is plain HTTP,
    /// which only a loopback --api-listen allows.
    #[arg(long, value_name = "DIR", requires = "farm")]
    pub api_tls_dir: Option<PathBuf>,
    /// The site this server joins (default: the farm's first, or a new "default" site).
    #[arg(long, value_name = "ID", requires = "farm")]
    pub site: Option<i64>,
    /// This server's name in the farm (default: the host name).
    #[arg(long, value_name = "NAME", requires = "farm")]
    pub server_name: Option<String>,
    /// This server's own state in the farm: its identity (`server-id`, made at the first
    /// start, 0600) and a lock that one `ferry server` at a time holds (default:
    /// FARM-DIR/servers/NAME). A second server started with the same state is refused.
    #[arg(long, value_name = "DIR", requires = "farm")]
    pub state_dir: Option<PathBuf>,
    /// The NBD address devices are told to use (default: the NBD listen address).
    #[arg(long, value_name = "HOST:PORT", requires = "farm")]
    pub advertise: Option<String>,
    /// NBD over TLS with the certificates in DIR: ca-cert.pem, server-cert.pem,
    /// server-key.pem ([tls] dir; a farm server uses the farm's own).
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Refuse every NBD option before STARTTLS ([tls] required).
    #[arg(long)]
    pub tls_required: bool,
    /// Serve TFTP (read-only) on this UDP address, e.g. 0.0.0.0:69, so PXE firmware can
    /// fetch iPXE; off by default. Needs --tftp-root.
    #[arg(long, value_name = "ADDR:PORT", requires = "tftp_root")]
    pub tftp_listen: Option<SocketAddr>,
    /// The directory served over TFTP, e.g. /usr/lib/ipxe (Debian's ipxe package).
    #[arg(long, value_name = "DIR", requires = "tftp_listen")]
    pub tftp_root: Option<PathBuf>,
    /// ProxyDHCP (`--proxy-dhcp`), boxed as `member`.
    #[command(flatten)]
    pub proxy: Box<crate::server_boot::ProxyArgs>,
    /// Serve network boot for iPXE in plain HTTP here (with --farm): GET /boot/ipxe and
    /// per-MAC scripts, the versions' kernels and initramfs images; public boot data only,
    /// no API and no secret. The farm API is then HTTPS, also on a loopback --api-listen.
    #[arg(long, value_name = "ADDR:PORT", requires = "farm")]
    pub boot_listen: Option<SocketAddr>,
    /// The farm API URL(s) the boot scripts give the agent, comma-separated (default:
    /// https://ADVERTISED-HOST:API-PORT).
    #[arg(long, value_name = "URL", requires = "boot_listen")]
    pub boot_api_url: Option<String>,
    /// Boxed: eight durations would make `ferry server`'s arguments the one large variant.
    #[command(flatten)]
    pub member: Box<crate::server_farm::TimingArgs>,
    /// `[limits]` as hidden flags (boxed, as `member`).
    #[command(flatten)]
    pub listen: Box<crate::server_listen::ListenArgs>,
}

impl Args {
    /// The file's settings (or none) with the flags applied over them.
    fn config(&self) -> anyhow::Result<FerryConfig> {
        let mut c = match &self.config {
            Some(path) => FerryConfig::load(path)?,
            None => FerryConfig::default(),
        };
        if let Some(dir) = &self.store {
            c.store.dir = Some(dir.clone());
        }
        if let Some(listen) = &self.nbd_listen {
            c.nbd.listen = Some(listen.clone());
        }
        if let Some(socket) = &self.nbd_socket {
            c.nbd.socket = Some(socket.clone());
        }
        if let Some(listen) = &self.metrics_listen {
            c.metrics.listen = Some(listen.clone());
        }
        if let Some(bytes) = self.cache_ram {
            c.cache.ram_bytes = Some(bytes);
        }
        if let Some(dir) = &self.tls_dir {
            c.tls.dir = Some(dir.clone());
        }
        if self.tls_required {
            c.tls.required = Some(true);
        }
        self.listen.apply(&mut c.limits);
        Ok(c)
    }
}

/// Runs `ferry server` until SIGINT or SIGTERM.
///
/// # Errors
/// Configuration, store, bind and signal-handler errors.
pub fn run(a: &Args, _global: Global) -> anyhow::Result<ExitCode> {
    if let Some(c) = &a.command {
        return crate::server_drain::run(c);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferry-server")
        .build()
        .context("start async runtime")?;
    let mut config = a.config()?;
    let mut bucket = crate::server_bucket::open(a.store.as_deref(), &a.bucket)?;
    if let Some(b) = &bucket {
        config.store.dir = Some(b.dir().to_path_buf());
    }
    let proxy = crate::server_boot::proxy_from_flags(&a.proxy, a.boot_listen)?;
    let tftp = crate::server_boot::Tftp::from_flags(a.tftp_listen, a.tftp_root.as_deref(), proxy)?;
    // Before anything else: the API's own certificate, if given.
    let api_tls_given = match (&a.farm, &a.api_tls_dir) {
        (Some(_), Some(dir)) => Some(crate::server_farm::api_tls_from_dir(dir)?),
        _ => None,
    };
    let farm = match &a.farm {
        Some(dir) => {
            // The NBD address as configured (the store is not known yet: any will do).
            let mut probe = config.clone();
            probe.store.dir.get_or_insert_with(|| PathBuf::from("."));
            let nbd = probe.resolve().ok().and_then(|r| r.nbd.nbd_listen);
            let advertise = crate::server_farm::advertised(a.advertise.as_deref(), nbd);
            let name = a.server_name.clone().unwrap_or_else(host_name);
            farm::validate::name("--server-name", &name)?;
            let state = a
                .state_dir
                .clone()
                .unwrap_or_else(|| dir.join("servers").join(&name));
            let uid = crate::server_farm::identity(&state, &name)?;
            // Where devices reach this server's API, as its boot scripts name it: the
            // farm keeps it so that other servers' boot scripts name it too.
            let api_url = crate::server_boot_http::api_urls(
                a.boot_api_url.as_deref(),
                &advertise,
                a.api_listen,
            )?
            .into_iter()
            .next();
            if bucket.is_some() {
                anyhow::bail!(
                    "with --farm, a bucket store is configured in the farm \
                     (`ferry store add NAME --path DIR --bucket s3://BUCKET/PREFIX`), not given \
                     with --store"
                );
            }
            let (handle, store_dir, farm_bucket) = runtime.block_on(crate::server_farm::open(
                dir,
                a.db.clone(),
                config.store.dir.as_deref(),
                a.site,
                &crate::server_farm::Me {
                    name: &name,
                    uid: &uid,
                    advertise: &advertise,
                    api_url: api_url.as_deref(),
                },
            ))?;
            if let Some(url) = farm_bucket {
                let tier = crate::server_bucket::open_at(&url, &store_dir, &a.bucket)?;
                bucket = Some(tier);
            }
            config.store.dir = Some(store_dir);
            handle
                .farm
                .set_publisher(Arc::new(crate::server_bucket::FarmPublisher::new(
                    a.bucket.s3.config(),
                )));
            Some(handle)
        }
        None => None,
    };
    let mut resolved = config.resolve()?;
    let budgets = crate::server_listen::plan(
        &mut resolved,
        crate::server_listen::Listeners {
            api: farm.is_some(),
            boot: farm.is_some() && a.boot_listen.is_some(),
            tftp: tftp.is_some(),
        },
    );
    let farm_tls = match &farm {
        Some(f) => Some(runtime.block_on(crate::server_farm::tls_material(f))?),
        None => None,
    };
    let nbd_tls = crate::server_tls::apply(&mut resolved, farm_tls)?;
    // The API: the given certificate; else, off loopback, HTTPS with this server's
    // certificate from the farm; plain HTTP only on a loopback address.
    let api_tls = match (&farm, api_tls_given, &nbd_tls) {
        (None, _, _) => None,
        (Some(_), Some(t), _) => Some(t),
        (Some(_), None, Some(m)) if a.boot_listen.is_some() || !a.api_listen.ip().is_loopback() => {
            Some(crate::server_farm::api_tls(
                &m.ca_pem,
                &m.cert_pem,
                &m.key_pem,
            )?)
        }
        (Some(_), None, None) if a.boot_listen.is_some() => {
            anyhow::bail!("--boot-listen: the farm API must be HTTPS, and the farm has no CA")
        }
        (Some(_), None, _) => {
            api::tls::check_plain_listen(a.api_listen)?;
            None
        }
    };
    let cache = resolved.block_cache().context("build block cache")?;
    let registry = Registry::new(resolved.registry.clone(), cache)
        .with_context(|| format!("serve store {}", resolved.registry.store_dir.display()))?;
    let tier_stats = bucket.as_ref().map(|b| b.stats());
    if let Some(b) = bucket {
        registry.set_storage_opener(b);
    }
    let base = if farm.is_some() {
        AccessPolicy::FARM
    } else {
        AccessPolicy::STANDALONE
    };
    registry.set_access(resolved.access_policy(base));
    let member = farm.as_ref().map(|f| {
        registry.set_sessions(Arc::new(member::FarmSessions::new(
            f,
            runtime.handle().clone(),
            &resolved.registry.store_dir,
        )));
        registry
            .boot_sets()
            .set_mirror(Arc::new(member::FarmBootSets::new(
                f,
                runtime.handle().clone(),
            )));
        member::Runtime::new(
            Arc::clone(&f.farm),
            f.server_id,
            Arc::new(registry.clone()),
            a.member.timing(),
            rand::random(),
            f.farm.now_ms(),
        )
    });
    let boot = match (&farm, a.boot_listen, &a.farm) {
        (Some(f), Some(listen), Some(data)) => Some((
            Arc::clone(&f.farm),
            f.server_id,
            crate::server_boot_http::BootHttp {
                listen,
                api_urls: crate::server_boot_http::api_urls(
                    a.boot_api_url.as_deref(),
                    &f.advertise,
                    a.api_listen,
                )?,
                site_apis: a.boot_api_url.is_none(),
                cache_dir: data.join(crate::server_boot_http::BOOT_CACHE_DIR),
            },
        )),
        _ => None,
    };
    registry.warm_boot_sets();
    let boot_sets = registry.boot_sets().clone();
    let api = farm.map(|f| (f, a.api_listen, api_tls));
    let result = runtime.block_on(serve(
        resolved,
        registry,
        (Arc::new(Metrics::new()), tier_stats),
        (api, member),
        tftp,
        boot,
        budgets,
    ));
    // The last boots' recordings are merged and saved before the process goes, while the
    // runtime still runs: a farm server saves them through it (the database).
    boot_sets.wait_saved(RUNTIME_SHUTDOWN_TIMEOUT);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The host name, for a server's default name in its farm.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "ferry-server".into())
}

/// The farm API to serve: the farm, its address and its TLS.
type FarmApi = (
    crate::server_farm::FarmHandle,
    SocketAddr,
    Option<Arc<rustls::ServerConfig>>,
);

async fn serve(
    r: Resolved,
    registry: Registry,
    (metrics, tier_stats): (Arc<Metrics>, Option<Arc<bucket::tier::TierStats>>),
    (farm, member): (Option<FarmApi>, Option<member::Runtime>),
    tftp: Option<crate::server_boot::Tftp>,
    boot: Option<(Arc<farm::Farm>, i64, crate::server_boot_http::BootHttp)>,
    budgets: crate::server_listen::Budgets,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    watch_signals(stop_tx)?;
    let nbd = Listener::bind(r.nbd.clone())
        .await
        .context("bind NBD listener")?;
    // Every listener's gate, for /metrics.
    let mut gates = vec![nbd.gate()];
    // The farm-member runtime (heartbeat, session recheck, drain, rebalancing, promotion
    // prefetch) on the system clock, until the server stops.
    let member_task =
        member.map(|m| tokio::spawn(m.run(Arc::new(farm::SystemClock), stopped(stop_rx.clone()))));
    let (boot_task, boot_counters) = match boot {
        Some((farm, server_id, b)) => {
            let l = crate::server_boot_http::bind(&b).await?;
            let state = crate::server_boot_http::state(farm, server_id, b, &l)?;
            let counters = state.counters();
            let stop = stopped(stop_rx.clone());
            let listen = budgets.boot.clone();
            gates.push(Arc::clone(&listen.gate));
            let task = tokio::spawn(async move {
                let r = crate::server_boot_http::serve(state, l, listen, stop).await;
                if let Err(e) = r {
                    tracing::error!(error = %ErrorChain(e.as_ref()), "boot service stopped");
                }
            });
            (Some(task), Some(counters))
        }
        None => (None, None),
    };
    let farm_db = farm.as_ref().map(|f| Arc::clone(&f.0.farm));
    let api_task = match farm {
        Some((handle, addr, tls)) => {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("bind farm API {addr}"))?;
            let at = l.local_addr()?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            tracing::info!(
                api = %format!("{scheme}://{at}/api/v1"),
                console = %format!("{scheme}://{at}/"),
                server_id = handle.server_id,
                "serving the farm API and console"
            );
            let stop = stopped(stop_rx.clone());
            let listen = budgets.api.clone();
            gates.push(Arc::clone(&listen.gate));
            Some(tokio::spawn(async move {
                if let Err(e) = crate::server_farm::serve_api(&handle, l, tls, listen, stop).await {
                    tracing::error!(error = %ErrorChain(e.as_ref()), "farm API stopped");
                }
            }))
        }
        None => None,
    };
    let metrics_listener = match r.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("bind metrics endpoint {addr}"))?,
        ),
        None => None,
    };
    let tftp = match tftp {
        Some(t) => Some(t.start(stopped(stop_rx.clone())).await?),
        None => None,
    };
    log_startup(&r, &registry, &nbd, metrics_listener.as_ref()).await;
    if metrics_listener.is_some() {
        gates.push(Arc::clone(&budgets.metrics));
    }
    let metrics_task = metrics_listener.map(|l| {
        let (reg, m) = (registry.clone(), Arc::clone(&metrics));
        let tftp_counters = tftp.as_ref().map(|t| Arc::clone(&t.counters));
        let proxy_counters = tftp.as_ref().and_then(|t| t.proxy.clone());
        let farm_db = farm_db.clone();
        let render: server::http::Render = Arc::new(move || {
            let mut text = m.render(&reg.cache().stats(), &reg.stats());
            server::boot_sets::render_metrics(&reg.boot_sets().stats(), &mut text);
            if let Some(c) = &tftp_counters {
                crate::server_boot::render_metrics(c, &mut text);
            }
            if let Some(c) = &proxy_counters {
                crate::server_boot::render_proxy_metrics(c, &mut text);
            }
            if let Some(c) = &boot_counters {
                crate::server_boot::render_boot_metrics(c, &mut text);
            }
            if let Some(f) = &farm_db {
                crate::server_farm::render_database_metrics(f, &mut text);
            }
            if let Some(t) = &tier_stats {
                crate::server_bucket::render_metrics(t, &mut text);
            }
            let gates: Vec<&budget::Gate> = gates.iter().map(AsRef::as_ref).collect();
            budget::render_metrics(&gates, &mut text);
            text
        });
        tokio::spawn(server::http::serve_metrics_in(
            l,
            render,
            Arc::clone(&budgets.metrics),
            stopped(stop_rx.clone()),
        ))
    });
    let source: Arc<dyn ExportSource> = Arc::new(registry);
    let sink: Arc<dyn NbdMetrics> = metrics;
    nbd.serve(source, sink, stopped(stop_rx)).await;
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    if let Some(task) = api_task {
        let _ = task.await;
    }
    if let Some(task) = member_task {
        let _ = task.await;
    }
    if let Some(task) = boot_task {
        let _ = task.await;
    }
    if let Some(t) = tftp {
        t.join().await;
    }
    tracing::info!("server stopped");
    Ok(())
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Turns the first SIGINT or SIGTERM into `stop = true`.
fn watch_signals(stop: watch::Sender<bool>) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down: finishing open connections");
        let _ = stop.send(true);
    });
    Ok(())
}

async fn log_startup(
    r: &Resolved,
    registry: &Registry,
    nbd: &Listener,
    metrics: Option<&TcpListener>,
) {
    let store = r.registry.store_dir.display().to_string();
    let reg = registry.clone();
    let exports = tokio::task::spawn_blocking(move || reg.list(&Peer::new(None, true)))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    tracing::info!(
        %store,
        write_cache = %r.registry.write_cache_dir.display(),
        cache_ram_bytes = r.cache.budget_bytes,
        cache_block_bytes = r.cache.block_bytes,
        exports = exports.len(),
        "serving store"
    );
    for e in exports.iter().take(LOGGED_EXPORTS_MAX) {
        tracing::info!(export = %e.name, size_bytes = e.size, "export");
    }
    if exports.len() > LOGGED_EXPORTS_MAX {
        tracing::info!(more = exports.len() - LOGGED_EXPORTS_MAX, "more exports");
    }
    if exports.is_empty() {
        tracing::warn!(%store, "no vDisks in the store (expected NAME.vhdx, NAME.N.avhdx)");
    }
    if let Some(addr) = nbd.local_addr() {
        tracing::info!(%addr, "NBD listening on TCP (nbd://{addr}/NAME)");
    }
    if let Some(path) = &r.nbd.nbd_socket {
        tracing::info!(path = %path.display(), "NBD listening on unix socket");
    }
    if let Some(addr) = metrics.and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
}
