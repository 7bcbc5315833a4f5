//! The agent: builds the stack (remote vDisk, write cache, counters), serves it on the
//! export socket with `nbd_server`, answers the control socket, and stops on `shutdown`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use contract::{ExportName, ExportNameError, Mac};
use disk::BlockDevice;
use host_cache::HostCache;
use nbd_server::{
    ExportHandle, ExportInfo, ExportSource, NoMetrics, OpenError, Peer, ServerConfig,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use write_cache::{FileStore, OverflowStore, WriteCache};

use crate::CacheMode;
use crate::boot::Booted;
use crate::client::ClientError;
use crate::control::REQUEST_BYTES_MAX;
use crate::host_read::HostCached;
use crate::prefetch::{BootSetSource, Prefetch, PrefetchConfig};
use crate::remote::{Remote, RemoteConfig, RemoteCounters, Replay};
use crate::stats::{Boot, IoCounted, IoCounters, Sampler, Status};

/// Most connections to the local export at once.
const EXPORT_CONNECTIONS_MAX: usize = 64;
/// How often the IOPS sampler runs.
const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Everything `ferry target` is told.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Servers, `host[:port]`, in failover order.
    pub servers: Vec<String>,
    /// The vDisk name.
    pub vdisk: String,
    /// This device's name (server cache modes).
    pub device: String,
    /// The export to open on the servers instead of the one `mode` derives from `vdisk`
    /// and `device`: the session's `ferry-s-…` name after device login. Failover opens the
    /// same name on the next server.
    pub export_name: Option<ExportName>,
    /// The device's MAC, when it logged in (shown by status).
    pub mac: Option<Mac>,
    /// Cache mode.
    pub mode: CacheMode,
    /// RAM budget of `ram` and `ram-overflow`.
    pub ram_bytes: u64,
    /// Directory of the overflow file (`ram-overflow`, `disk`).
    pub overflow_dir: Option<PathBuf>,
    /// Most bytes of the overflow file.
    pub overflow_bytes_max: u64,
    /// Cache block in bytes.
    pub block_bytes: u32,
    /// The unix socket of the local export.
    pub export_socket: PathBuf,
    /// The unix socket of the control protocol.
    pub control_socket: PathBuf,
    /// Boot ends after this many bytes read, if set (else at `mark-booted`).
    pub boot_bytes: Option<u64>,
    /// Boot ends at the last read of the first read burst once no read came for this long
    /// (`None`: only `mark-booted` and `boot_bytes` end it). See [`crate::boot`].
    pub boot_quiet: Option<Duration>,
    /// Timeout of one connect and handshake.
    pub connect_timeout: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// How long a failover may look for a server.
    pub failover_timeout: Duration,
    /// Most bytes of writes kept for replay after a failover (server modes).
    pub replay_bytes_max: u64,
    /// TLS on the connections to the servers: the farm's CA and this device's certificate
    /// (from its login grant, or `ferry target --tls-dir`); `None` for plain NBD.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Device login again when the servers refuse the session (see
    /// [`crate::remote::Relogin`]).
    pub relogin: Option<crate::remote::Relogin>,
    /// Newer server lists from the farm, taken at the next failover (see
    /// [`crate::remote::ServerRefresh`]); the status reporter offers them.
    pub refresh: Option<Arc<crate::remote::ServerRefresh>>,
    /// Where [`run`] makes this agent's status readable in-process, for the status
    /// reporter ([`crate::report::StatusFeed`]).
    pub status_feed: Option<Arc<crate::report::StatusFeed>>,
    /// The host read cache shared with the other agents of this host (local cache modes
    /// only); `None`: none (a prefetch then uses a private one).
    pub host_cache: Option<HostCacheConfig>,
    /// What identifies the attached version's bytes (after device login: the grant's
    /// vDisk, version and vDisk id); `None`: taken from `vdisk` (`NAME@N`) or the server's
    /// description of `NAME` (its newest version).
    pub version_identity: Option<VersionIdentity>,
    /// The boot set to prefetch ahead of the machine's reads (local cache modes only).
    pub boot_set: Option<Arc<dyn BootSetSource>>,
    /// The prefetch's window.
    pub prefetch: PrefetchConfig,
    /// The private read cache a prefetch fills when there is no host cache (anonymous
    /// memory, touched only as the set fills it; it stays resident once touched, so a
    /// machine with little RAM, the boot agent's, names a smaller one).
    pub prefetch_cache_bytes: u64,
}

/// Where and how large the host read cache is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCacheConfig {
    /// The directory of the cache file (`/dev/shm`: RAM).
    pub dir: PathBuf,
    /// The cache's size when this agent creates it.
    pub bytes: u64,
    /// Its block when this agent creates it.
    pub block_bytes: u64,
}

/// The attached version's identity (see [`host_cache::VersionIdentity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionIdentity {
    /// The vDisk.
    pub vdisk: String,
    /// The version.
    pub version: u64,
    /// More that changes with the bytes (the farm's vDisk id).
    pub extra: Vec<u8>,
}

/// The default private cache of a prefetch without a host cache (anonymous memory, touched
/// only as the boot set fills it; see [`AgentConfig::prefetch_cache_bytes`]).
pub const PREFETCH_PRIVATE_BYTES: u64 = 1 << 30;

impl AgentConfig {
    /// A configuration with the documented defaults.
    pub fn new(servers: Vec<String>, vdisk: &str, mode: CacheMode, export_socket: PathBuf) -> Self {
        let control_socket = control_path_for(&export_socket);
        AgentConfig {
            servers,
            vdisk: vdisk.to_string(),
            device: "target".to_string(),
            export_name: None,
            mac: None,
            mode,
            ram_bytes: 1 << 30,
            overflow_dir: None,
            overflow_bytes_max: 1 << 40,
            block_bytes: write_cache::DEFAULT_BLOCK_BYTES,
            export_socket,
            control_socket,
            boot_bytes: None,
            boot_quiet: Some(crate::boot::BOOT_QUIET),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            failover_timeout: Duration::from_secs(60),
            replay_bytes_max: 256 << 20,
            tls: None,
            relogin: None,
            refresh: None,
            status_feed: None,
            host_cache: None,
            version_identity: None,
            boot_set: None,
            prefetch: PrefetchConfig::default(),
            prefetch_cache_bytes: PREFETCH_PRIVATE_BYTES,
        }
    }
}

/// The control socket of an export socket: `PATH.ctl`.
pub fn control_path_for(export_socket: &Path) -> PathBuf {
    let mut s = export_socket.as_os_str().to_owned();
    s.push(".ctl");
    PathBuf::from(s)
}

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No server attached the export.
    #[error("cannot attach the vDisk")]
    Attach(#[source] ClientError),
    /// The cache configuration is invalid.
    #[error("invalid write cache")]
    Cache(#[source] write_cache::ConfigError),
    /// The mode needs `--overflow DIR`.
    #[error("cache mode {0} needs an overflow directory")]
    NoOverflowDir(&'static str),
    /// The overflow file could not be created.
    #[error("cannot create the overflow file in {}", dir.display())]
    Overflow {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The vDisk is not `NAME` or `NAME@N`.
    #[error("vDisk {0:?} is not NAME or NAME@N")]
    InvalidVdisk(String),
    /// The vDisk and device do not make an export name in this mode.
    #[error("no export name for vDisk {vdisk:?} and device {device:?}")]
    ExportName {
        /// The vDisk.
        vdisk: String,
        /// The device.
        device: String,
        /// What is wrong.
        #[source]
        source: ExportNameError,
    },
    /// The server refused writes on a server-cache export.
    #[error("the server attached {0:?} read-only")]
    NotWritable(String),
    /// The host read cache did not open (another user's, open to others, …).
    #[error("cannot use the host read cache")]
    HostCache(#[source] host_cache::OpenError),
    /// A socket could not be bound.
    #[error("cannot listen on {}", path.display())]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The running stack, shared by the export and the control socket.
#[derive(Debug)]
pub struct Agent {
    cfg: AgentConfig,
    remote: Arc<Remote>,
    remote_counters: Arc<RemoteCounters>,
    cache: Option<Arc<WriteCache>>,
    host: Option<Arc<HostCached>>,
    prefetch: Option<Arc<Prefetch>>,
    device: Arc<dyn BlockDevice>,
    io: Arc<IoCounters>,
    boot: Arc<Boot>,
    sampler: Sampler,
}

impl Agent {
    /// Attaches the vDisk and builds the stack (blocking: connects to servers).
    ///
    /// # Errors
    /// [`AgentError`].
    pub fn build(cfg: AgentConfig) -> Result<Agent, AgentError> {
        let export = match &cfg.export_name {
            Some(name) => name.to_string(),
            None => export_for(&cfg)?.to_string(),
        };
        let replay = match cfg.mode {
            CacheMode::Server => Replay::All,
            CacheMode::ServerPersistent | CacheMode::Private => Replay::UntilFlush,
            _ => Replay::None,
        };
        let remote = Remote::connect(RemoteConfig {
            servers: cfg.servers.clone(),
            export: export.clone(),
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            failover_timeout: cfg.failover_timeout,
            replay,
            replay_bytes_max: cfg.replay_bytes_max,
            tls: cfg.tls.clone(),
            relogin: cfg.relogin.clone(),
            refresh: cfg.refresh.clone(),
        })
        .map_err(AgentError::Attach)?;
        let host = match crate::local_mode(cfg.mode) {
            Some(_) => host_layer(&cfg, &remote)?,
            None => None,
        };
        let below: Arc<dyn BlockDevice> = match &host {
            Some(h) => Arc::clone(h) as Arc<dyn BlockDevice>,
            None => Arc::clone(&remote) as Arc<dyn BlockDevice>,
        };
        let cache = match crate::local_mode(cfg.mode) {
            Some(mode) => Some(Arc::new(make_cache(&cfg, mode, below)?)),
            None if !remote.can_write() => return Err(AgentError::NotWritable(export)),
            None => None,
        };
        let top: Arc<dyn BlockDevice> = match &cache {
            Some(c) => Arc::clone(c) as Arc<dyn BlockDevice>,
            None => Arc::clone(&remote) as Arc<dyn BlockDevice>,
        };
        let io = Arc::new(IoCounters::default());
        let boot = Arc::new(Boot::new(cfg.boot_bytes, cfg.boot_quiet));
        let device = Arc::new(IoCounted::new(top, Arc::clone(&io), Arc::clone(&boot)));
        let prefetch = match (&host, &cfg.boot_set) {
            (Some(h), Some(set)) => Some(Prefetch::start(h, Arc::clone(set), cfg.prefetch, {
                let boot = Arc::clone(&boot);
                Arc::new(move || boot.booted().is_some())
            })),
            _ => None,
        };
        Ok(Agent {
            host,
            prefetch,
            sampler: Sampler::new(&io),
            remote_counters: remote.counters(),
            remote,
            cache,
            device,
            io,
            boot,
            cfg,
        })
    }

    /// The status report.
    pub fn status(&self) -> Status {
        let u = self.cache.as_ref().map(|c| c.usage()).unwrap_or_default();
        let r = self.sampler.rates();
        let io = &self.io;
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let booted = self.boot.booted();
        Status {
            server: self.remote.server(),
            servers: self
                .remote
                .servers()
                .unwrap_or_else(|| self.cfg.servers.clone()),
            vdisk: self.cfg.vdisk.clone(),
            export: self.remote.export(),
            mac: self.cfg.mac.map(|m| m.to_string()),
            version: self.remote.description().to_string(),
            size_bytes: self.device.size(),
            cache_mode: self.cfg.mode.cli_name().to_string(),
            cache_block_bytes: u.block_bytes,
            ram_bytes: u.ram_bytes,
            ram_bytes_max: u.ram_bytes_max,
            overflow_bytes: u.overflow_bytes,
            overflow_bytes_max: u.overflow_bytes_max,
            evictions: u.evictions,
            enospc: u.enospc,
            bytes_read: ld(&io.bytes_read),
            bytes_written: ld(&io.bytes_written),
            reads: ld(&io.reads),
            writes: ld(&io.writes),
            read_iops: r.read_iops,
            write_iops: r.write_iops,
            errors: ld(&io.errors),
            retries: ld(&self.remote_counters.retries),
            failovers: ld(&self.remote_counters.failovers),
            uptime_s: self.boot.uptime().as_secs_f64(),
            boot_time_s: booted.map(|b| b.time.as_secs_f64()),
            boot_ended_by: booted.map(|b| b.by),
            host_cache: self.host.as_ref().map(|h| h.status()),
            prefetch: self.prefetch.as_ref().map(|p| p.status()),
            reports_failed: self.cfg.status_feed.as_ref().map(|f| f.failures()),
        }
    }

    /// Ends the boot clock (`ferry target mark-booted`), unless it already ended; returns
    /// the end.
    pub fn mark_booted(&self) -> Booted {
        self.boot.mark()
    }
}

/// The export `cfg.mode` attaches for `cfg.vdisk` (`NAME` or `NAME@N`) and `cfg.device`.
fn export_for(cfg: &AgentConfig) -> Result<ExportName, AgentError> {
    let invalid = || AgentError::InvalidVdisk(cfg.vdisk.clone());
    let ExportName::ReadOnly { vdisk, version } = cfg.vdisk.parse().map_err(|_| invalid())? else {
        return Err(invalid());
    };
    ExportName::for_cache_mode(cfg.mode, vdisk, version, &cfg.device).map_err(|source| {
        AgentError::ExportName {
            vdisk: cfg.vdisk.clone(),
            device: cfg.device.clone(),
            source,
        }
    })
}

/// The host read cache layer over `remote`, when configured (or wanted by a prefetch) and
/// the attached version is known.
fn host_layer(
    cfg: &AgentConfig,
    remote: &Arc<Remote>,
) -> Result<Option<Arc<HostCached>>, AgentError> {
    if cfg.host_cache.is_none() && cfg.boot_set.is_none() {
        return Ok(None);
    }
    let Some(id) = version_of(cfg, remote) else {
        tracing::warn!(vdisk = %cfg.vdisk, description = %remote.description(),
            "the attached version is not known: no host read cache and no prefetch");
        return Ok(None);
    };
    let key = host_cache::VersionKey::new(&host_cache::VersionIdentity {
        vdisk: &id.vdisk,
        version: id.version,
        size_bytes: remote.size(),
        extra: &id.extra,
    });
    let cache = match &cfg.host_cache {
        Some(h) => HostCache::open(&h.dir, h.bytes, h.block_bytes),
        None => HostCache::private(cfg.prefetch_cache_bytes, host_cache::BLOCK_BYTES_DEFAULT),
    }
    .map_err(AgentError::HostCache)?;
    tracing::info!(path = ?cache.path(), key = %key.hex(), vdisk = %id.vdisk,
        version = id.version, "reading through the host cache");
    let below = Arc::clone(remote) as Arc<dyn BlockDevice>;
    Ok(Some(Arc::new(HostCached::new(below, Arc::new(cache), key))))
}

/// The attached version: the configured identity, `NAME@N`, or the newest version the
/// server's description of `NAME` names.
fn version_of(cfg: &AgentConfig, remote: &Remote) -> Option<VersionIdentity> {
    if let Some(v) = &cfg.version_identity {
        return Some(v.clone());
    }
    let ExportName::ReadOnly { vdisk, version } = cfg.vdisk.parse().ok()? else {
        return None;
    };
    let version = match version {
        Some(n) => u64::from(n),
        None => newest_in_description(remote.description())?,
    };
    Some(VersionIdentity {
        vdisk: vdisk.to_string(),
        version,
        extra: Vec::new(),
    })
}

/// N of the server's `vDisk NAME (newest: version N)`.
fn newest_in_description(d: &str) -> Option<u64> {
    d.split("(newest: version ")
        .nth(1)?
        .strip_suffix(')')?
        .parse()
        .ok()
}

fn make_cache(
    cfg: &AgentConfig,
    mode: write_cache::Mode,
    next: Arc<dyn BlockDevice>,
) -> Result<WriteCache, AgentError> {
    let mut overflow_bytes_max = cfg.overflow_bytes_max;
    let store: Option<Arc<dyn OverflowStore>> = match mode {
        write_cache::Mode::Ram => None,
        _ => {
            let dir = cfg
                .overflow_dir
                .as_ref()
                .ok_or(AgentError::NoOverflowDir(cfg.mode.cli_name()))?;
            let fail = |source| AgentError::Overflow {
                dir: dir.clone(),
                source,
            };
            if write_cache::store::is_block_device(dir) {
                let (store, bytes) = FileStore::on_device(dir).map_err(fail)?;
                overflow_bytes_max = overflow_bytes_max.min(bytes);
                Some(Arc::new(store))
            } else {
                Some(Arc::new(FileStore::create_in(dir).map_err(fail)?))
            }
        }
    };
    let config = write_cache::Config {
        mode,
        block_bytes: cfg.block_bytes,
        ram_bytes_max: cfg.ram_bytes,
        overflow_bytes_max,
    };
    WriteCache::new(next, config, store).map_err(AgentError::Cache)
}

/// The one export of the agent: any name ("" or the vDisk's) opens the stack.
struct TargetSource {
    agent: Arc<Agent>,
}

impl ExportSource for TargetSource {
    fn list(&self, _peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        Ok(vec![ExportInfo {
            name: self.agent.cfg.vdisk.clone(),
            description: format!(
                "{} with a {} write cache",
                self.agent.cfg.vdisk,
                self.agent.cfg.mode.cli_name()
            ),
            size: self.agent.device.size(),
        }])
    }

    fn open(&self, name: &str, _peer: &Peer) -> Result<ExportHandle, OpenError> {
        if !name.is_empty() && name != self.agent.cfg.vdisk {
            return Err(OpenError::NotFound(name.to_string()));
        }
        Ok(ExportHandle {
            device: Arc::clone(&self.agent.device),
            writable: true,
            release: None,
            revoked: None,
        })
    }
}

/// Attaches, serves the export and the control socket until `shutdown` completes.
///
/// # Errors
/// [`AgentError`].
pub async fn run(cfg: AgentConfig, shutdown: impl Future) -> Result<(), AgentError> {
    let agent = tokio::task::spawn_blocking(move || Agent::build(cfg))
        .await
        .expect("building the agent does not panic")?;
    let agent = Arc::new(agent);
    if let Some(feed) = &agent.cfg.status_feed {
        // A weak handle: the feed lives in the agent's own configuration.
        let weak = Arc::downgrade(&agent);
        feed.set(Box::new(move || {
            weak.upgrade()
                .map(|a| serde_json::to_value(a.status()).unwrap_or_default())
        }));
    }
    let control_path = agent.cfg.control_socket.clone();
    let _ = std::fs::remove_file(&control_path);
    let control = UnixListener::bind(&control_path).map_err(|source| AgentError::Listen {
        path: control_path.clone(),
        source,
    })?;
    let control_task = tokio::spawn(serve_control(control, Arc::clone(&agent)));
    let sampler_agent = Arc::clone(&agent);
    let sampler_task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_PERIOD);
        loop {
            tick.tick().await;
            let now = Instant::now();
            sampler_agent.sampler.sample(&sampler_agent.io, now);
            let reads = sampler_agent.io.reads.load(Ordering::Relaxed);
            sampler_agent.boot.tick(now, reads);
        }
    });
    let config = ServerConfig {
        nbd_listen: None,
        nbd_socket: Some(agent.cfg.export_socket.clone()),
        max_connections: EXPORT_CONNECTIONS_MAX,
        ..ServerConfig::default()
    };
    let source = Arc::new(TargetSource {
        agent: Arc::clone(&agent),
    });
    tracing::info!(export = %agent.cfg.export_socket.display(), mode = agent.cfg.mode.cli_name(),
        server = %agent.remote.server(), "serving the vDisk");
    let r = nbd_server::run(config, source, Arc::new(NoMetrics), shutdown).await;
    control_task.abort();
    sampler_task.abort();
    let _ = std::fs::remove_file(&control_path);
    r.map_err(|source| AgentError::Listen {
        path: agent.cfg.export_socket.clone(),
        source,
    })
}

async fn serve_control(listener: UnixListener, agent: Arc<Agent>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream, Arc::clone(&agent)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(stream: UnixStream, agent: Arc<Agent>) {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut r = BufReader::new(r.take(REQUEST_BYTES_MAX as u64));
    if r.read_line(&mut line).await.is_err() {
        return;
    }
    let reply = match line.trim() {
        "status" => serde_json::to_value(agent.status()).unwrap_or_default(),
        "mark-booted" => {
            let b = agent.mark_booted();
            tracing::info!(boot_time = ?b.time, ended_by = ?b.by, "marked booted");
            serde_json::json!({ "boot_time_s": b.time.as_secs_f64(), "boot_ended_by": b.by })
        }
        other => serde_json::json!({ "error": format!("unknown command {other:?}") }),
    };
    let mut text = reply.to_string();
    text.push('\n');
    let _ = w.write_all(text.as_bytes()).await;
}
