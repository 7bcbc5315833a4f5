//! The harness of the NBD benchmarks: their settings, the servers (Ferry in a child
//! process, `ferry-bench serve-internal`, so its CPU time and storage I/O can be read from
//! `/proc/PID/{stat,io}`; nbdkit's file plugin and qemu-nbd as peers), the data sets they
//! serve, and what is measured of them. The benchmarks (`seq`, `iops`, `bootstorm`) use it;
//! it uses none of them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::{Config, copy, data, note};

/// The sequential-read disk (full run) and the boot-storm disk.
pub const SEQ_BYTES_DEFAULT: u64 = 2 << 30;
pub const SEQ_BYTES_QUICK: u64 = 256 << 20;
pub const BOOT_DISK_BYTES_DEFAULT: u64 = 4 << 30;
pub const BOOT_DISK_BYTES_QUICK: u64 = 256 << 20;

/// Goal from the issue: Ferry at least as fast as each peer.
pub const GOAL_VS_PEERS: f64 = 1.0;

/// What the NBD sections need beyond [`Config`].
#[derive(Debug, Clone)]
pub struct NbdConfig {
    pub seq_bytes: u64,
    pub boot_disk_bytes: u64,
    /// Scale of the boot trace relative to the published 600 MB / 70,000 reads.
    pub boot_scale: f64,
    pub boot_clients: Vec<usize>,
    pub iops_seconds: u64,
    /// `--quick`: a smoke run (sections that carry their own conditions say so).
    pub quick: bool,
}

// ---------------------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ferry,
    Nbdkit,
    QemuNbd,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ferry => "ferry",
            Kind::Nbdkit => "nbdkit",
            Kind::QemuNbd => "qemu-nbd",
        }
    }
}

/// The files one data set is served from.
#[derive(Debug, Clone)]
pub struct DataSet {
    /// Ferry's store directory (holds `NAME.vhdx`).
    pub store: PathBuf,
    pub name: &'static str,
    pub vhdx: PathBuf,
    pub raw: PathBuf,
    pub size: u64,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    kind: Kind,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
    pub port: u16,
    /// The certificate directory when the server requires TLS (clients use `nbds://`).
    tls: Option<PathBuf>,
}

/// What a server used, read just before it was stopped.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub cpu_secs: f64,
    /// `/proc/PID/io` read_bytes: storage reads (not page-cache hits).
    pub disk_read_bytes: u64,
    /// Ferry only: `ferry_store_read_bytes_total` from the server's metrics.
    pub store_read_bytes: Option<u64>,
    /// Ferry only: block cache hits and misses (blocks).
    pub cache_hits: Option<u64>,
    pub cache_misses: Option<u64>,
    /// Ferry only: blocks filled by read-ahead.
    pub read_ahead_blocks: Option<u64>,
    /// Ferry only: store reads, blocks a scan's window let go, group fills into reused
    /// buffers, and bytes cached at the end.
    pub store_reads: Option<u64>,
    pub scan_evictions: Option<u64>,
    pub buffers_reused: Option<u64>,
    pub cached_bytes: Option<u64>,
    /// Ferry only: bytes sent in read replies (`ferry_nbd_bytes_total{type="read"}`).
    pub nbd_read_bytes: Option<u64>,
    /// Ferry with boot sets: bytes the boot-set prefetch read, boots recorded.
    pub prefetch_bytes: Option<u64>,
    pub boots_recorded: Option<u64>,
}

/// A free loopback TCP port (bound and released: a race a benchmark can afford).
pub(crate) fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits (up to 20 s) until `child` listens on loopback `port`; fails naming `what` when
/// it exits first or never listens.
pub(crate) fn wait_listening(port: u16, child: &mut Child, what: &str) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited before listening ({st})");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// Starts `kind` serving `ds` on a fresh loopback port.
    pub fn start(kind: Kind, ds: &DataSet) -> Result<Server> {
        Server::start_with(kind, ds, None)
    }

    /// Starts `kind` serving `ds` on a fresh loopback port; with `tls` (a [`pki::CertDir`]
    /// made by [`make_cert_dir`]) the server requires TLS and its URI is `nbds://`.
    pub fn start_with(kind: Kind, ds: &DataSet, tls: Option<&Path>) -> Result<Server> {
        Server::start_opts(kind, ds, tls, false)
    }

    /// Starts Ferry serving `ds` with boot sets on (recorded, kept beside the version and
    /// prefetched when a boot begins: `server::boot_sets`).
    pub fn start_boot_sets(ds: &DataSet) -> Result<Server> {
        Server::start_opts(Kind::Ferry, ds, None, true)
    }

    fn start_opts(kind: Kind, ds: &DataSet, tls: Option<&Path>, boot_sets: bool) -> Result<Server> {
        let tls_buf = tls.map(Path::to_path_buf);
        match kind {
            Kind::Ferry => {
                let exe = std::env::current_exe()?;
                let mut cmd = Command::new(exe);
                cmd.arg("serve-internal")
                    .arg("--store")
                    .arg(&ds.store)
                    .args(["--port", "0"]);
                if boot_sets {
                    cmd.arg("--boot-sets");
                }
                if let Some(dir) = tls {
                    cmd.arg("--tls-certificates").arg(dir);
                }
                let mut child = cmd
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .context("start ferry-bench serve-internal")?;
                let stdin = child.stdin.take();
                let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
                let mut line = String::new();
                stdout.read_line(&mut line)?;
                let port: u16 = line
                    .trim()
                    .strip_prefix("listening ")
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| anyhow!("serve-internal said {line:?}"))?;
                Ok(Server {
                    kind,
                    child,
                    stdin,
                    stdout: Some(stdout),
                    port,
                    tls: tls_buf,
                })
            }
            Kind::Nbdkit | Kind::QemuNbd => {
                let port = free_port()?;
                let p = port.to_string();
                if tls.is_some() && kind == Kind::QemuNbd {
                    bail!("the harness serves TLS from ferry and nbdkit only");
                }
                let mut cmd = if kind == Kind::Nbdkit {
                    let mut c = Command::new("nbdkit");
                    c.args([
                        "-f",
                        "-r",
                        "--exit-with-parent",
                        "-i",
                        "127.0.0.1",
                        "-p",
                        &p,
                    ]);
                    if let Some(dir) = tls {
                        c.arg("--tls=require")
                            .arg(format!("--tls-certificates={}", dir.display()));
                    }
                    c.arg("file").arg(&ds.raw);
                    c
                } else {
                    let mut c = Command::new("qemu-nbd");
                    c.args([
                        "-r",
                        "-f",
                        "vhdx",
                        "-t",
                        "-e",
                        "256",
                        "-b",
                        "127.0.0.1",
                        "-p",
                        &p,
                    ])
                    .args(["-x", ds.name])
                    .arg(&ds.vhdx);
                    c
                };
                let mut child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .with_context(|| format!("start {}", kind.name()))?;
                wait_listening(port, &mut child, kind.name())?;
                Ok(Server {
                    kind,
                    child,
                    stdin: None,
                    stdout: None,
                    port,
                    tls: tls_buf,
                })
            }
        }
    }

    /// The client URI: `nbd://127.0.0.1:PORT/NAME`, or with TLS
    /// `nbds://127.0.0.1:PORT/NAME?tls-certificates=DIR` (libnbd then presents the directory's
    /// client certificate).
    pub fn uri(&self, ds: &DataSet) -> String {
        match &self.tls {
            None => format!("nbd://127.0.0.1:{}/{}", self.port, ds.name),
            Some(dir) => format!(
                "nbds://127.0.0.1:{}/{}?tls-certificates={}",
                self.port,
                ds.name,
                dir.display()
            ),
        }
    }

    /// CPU seconds and storage reads so far.
    pub fn usage(&self) -> Usage {
        let pid = self.child.id();
        Usage {
            cpu_secs: proc_cpu_secs(pid),
            disk_read_bytes: proc_read_bytes(pid),
            ..Usage::default()
        }
    }

    /// Reads the usage, stops the server, and for Ferry adds its final metrics.
    pub fn stop(mut self) -> Result<Usage> {
        let mut u = self.usage();
        if self.kind == Kind::Ferry {
            drop(self.stdin.take()); // EOF: graceful shutdown, then metrics on stdout
            let mut text = String::new();
            if let Some(mut out) = self.stdout.take() {
                out.read_to_string(&mut text)?;
            }
            self.child.wait()?;
            u.store_read_bytes = metric(&text, "ferry_store_read_bytes_total");
            u.cache_hits = metric(&text, "ferry_cache_hits_total");
            u.cache_misses = metric(&text, "ferry_cache_misses_total");
            u.read_ahead_blocks = metric(&text, "ferry_cache_read_ahead_blocks_total");
            u.store_reads = metric(&text, "ferry_store_reads_total");
            u.scan_evictions = metric(&text, "ferry_cache_scan_evictions_total");
            u.buffers_reused = metric(&text, "ferry_cache_buffers_reused_total");
            u.cached_bytes = metric(&text, "ferry_cache_bytes");
            u.nbd_read_bytes = metric(&text, "ferry_nbd_bytes_total{type=\"read\"}");
            u.prefetch_bytes = metric(&text, "ferry_bootset_prefetch_bytes_total");
            u.boots_recorded = metric(&text, "ferry_bootset_recorded_total");
        } else {
            let _ = self.child.kill();
            self.child.wait()?;
        }
        Ok(u)
    }
}

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<f64>().ok())?
        })
        .map(|v| v as u64)
}

fn clock_ticks() -> f64 {
    static T: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        crate::sys::run("getconf", &["CLK_TCK"])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// cutime + cstime of the harness in seconds (`/proc/self/stat`): the CPU time of the
/// children it has waited for, so a difference around one client run is that client's.
pub fn waited_children_cpu_secs() -> f64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let Some((_, rest)) = text.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // After ')': index 0 is field 3; cutime is field 16, cstime field 17.
    (get(13) + get(14)) / clock_ticks()
}

/// utime + stime of `pid` in seconds, from `/proc/PID/stat`.
fn proc_cpu_secs(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = text.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // After ')': index 0 is field 3 (state); utime is field 14, stime field 15.
    (get(11) + get(12)) / clock_ticks()
}

fn proc_read_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// The in-process server (child side)
// ---------------------------------------------------------------------------------------

/// `ferry-bench serve-internal --store DIR [--port P] [--tls-certificates CERTS]`: serves
/// the store read-only through a block cache (default budget: a quarter of RAM, 64 KiB
/// granule) on 127.0.0.1:P, prints `listening PORT`, and on EOF of stdin shuts down
/// gracefully and prints its Prometheus metrics. With CERTS (a [`pki::CertDir`]) it requires
/// TLS (`TlsMode::Required`) with the directory's server certificate and CA.
///
/// # Errors
/// Bad arguments, store or bind failures.
pub fn serve_internal(args: &[String]) -> Result<()> {
    let mut store = None;
    let mut port: u16 = 0;
    let mut certs = None;
    let mut boot_sets = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--boot-sets" => boot_sets = true,
            "--store" => store = it.next().map(PathBuf::from),
            "--port" => port = it.next().context("--port P")?.parse()?,
            "--tls-certificates" => certs = it.next().map(PathBuf::from),
            other => bail!("serve-internal: unknown argument {other:?}"),
        }
    }
    let store = store.context("serve-internal needs --store DIR")?;
    let tls = match certs {
        Some(dir) => {
            let read = |name: &str| {
                let p = dir.join(name);
                std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))
            };
            let (ca, cert, key) = (
                read(pki::CA_CERT)?,
                read(pki::SERVER_CERT)?,
                read(pki::SERVER_KEY)?,
            );
            Some(pki::server_config(&ca, &cert, &key)?)
        }
        None => None,
    };
    // Diagnostics: FERRY_BENCH_READ_AHEAD_BLOCKS overrides the cache's read-ahead window
    // (0 turns it off); the report's runs never set it.
    let mut cache_cfg = block_cache::CacheConfig {
        budget_bytes: block_cache::default_budget_bytes(),
        ..block_cache::CacheConfig::default()
    };
    if let Some(n) = std::env::var("FERRY_BENCH_READ_AHEAD_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cache_cfg.read_ahead_blocks_max = n;
    }
    // FERRY_BENCH_SCAN_WINDOW_BYTES overrides the scan window (0 turns scans off).
    if let Some(n) = std::env::var("FERRY_BENCH_SCAN_WINDOW_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cache_cfg.scan_window_bytes = n;
    }
    let cache = block_cache::BlockCache::with_config(cache_cfg)?;
    let wc = store.with_extension("write-caches");
    let registry = server::exports::Registry::new(
        server::exports::RegistryConfig {
            store_dir: store.clone(),
            write_cache_dir: wc,
        },
        cache,
    )?;
    // Boot sets are off unless asked for, so that the other benchmarks' rows (copies,
    // random reads) are neither recorded nor prefetched. They are not prefetched at start
    // either: a boot's open starts the prefetch, as on a server that just came up.
    registry.boot_sets().set_enabled(boot_sets);
    let metrics = Arc::new(server::metrics::Metrics::new());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let reg = registry.clone();
    let m = Arc::clone(&metrics);
    rt.block_on(async move {
        let cfg = nbd_server::ServerConfig {
            nbd_listen: Some(SocketAddr::from(([127, 0, 0, 1], port))),
            tls_mode: if tls.is_some() {
                nbd_server::TlsMode::Required
            } else {
                nbd_server::TlsMode::Optional
            },
            tls,
            ..nbd_server::ServerConfig::default()
        };
        let listener = nbd_server::Listener::bind(cfg).await?;
        let port = listener.local_addr().map_or(0, |a| a.port());
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening {port}")?;
            out.flush()?;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = tx.send(());
        });
        listener.serve(Arc::new(reg), m, rx).await;
        anyhow::Ok(())
    })?;
    registry.boot_sets().wait_saved(Duration::from_secs(30));
    let mut text = metrics.render(&registry.cache().stats(), &registry.stats());
    server::boot_sets::render_metrics(&registry.boot_sets().stats(), &mut text);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------

/// How long the harness's client certificate is valid (one run).
const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// Makes a throwaway farm CA, a server certificate for 127.0.0.1 and an administrator's
/// client certificate, and writes them to `dir` in the [`pki::CertDir`] layout, which
/// Ferry's serve-internal, nbdkit (`--tls-certificates=DIR`) and libnbd
/// (`?tls-certificates=DIR`) all read. Returns `dir`.
///
/// # Errors
/// Certificate generation or writing failing.
pub fn make_cert_dir(dir: &Path) -> Result<PathBuf> {
    let now = std::time::SystemTime::now();
    let ca = pki::Authority::create("bench", now)?;
    let server = ca.issue_server("bench", &["127.0.0.1".into(), "localhost".into()], now)?;
    let client = ca.issue_client(&pki::Identity::admin("bench")?, now, CLIENT_CERT_VALIDITY)?;
    let certs = pki::CertDir::create(dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, pem) in [
        (pki::CA_CERT, ca.cert_pem()),
        (pki::SERVER_CERT, server.cert_pem.as_str()),
        (pki::SERVER_KEY, server.key_pem.as_str()),
        (pki::CLIENT_CERT, client.cert_pem.as_str()),
        (pki::CLIENT_KEY, client.key_pem.as_str()),
    ] {
        certs
            .write(name, pem)
            .with_context(|| format!("write {name} in {}", dir.display()))?;
    }
    Ok(dir.to_path_buf())
}

// ---------------------------------------------------------------------------------------
// Data sets
// ---------------------------------------------------------------------------------------

/// Writes `size` random bytes to `DIR/NAME.raw` and captures them into `DIR/nbd-store-NAME/NAME.vhdx`
/// (fully allocated: random data has no zero blocks).
pub fn make_data_set(cfg: &Config, name: &'static str, size: u64, seed: u64) -> Result<DataSet> {
    let raw = cfg.dir.join(format!("{name}.raw"));
    let store = cfg.dir.join(format!("nbd-store-{name}"));
    std::fs::create_dir_all(&store)?;
    let vhdx = store.join(format!("{name}.vhdx"));
    note(&format!(
        "nbd: writing {} MiB of random data to {} and capturing it (untimed)",
        size >> 20,
        raw.display()
    ));
    data::random_file(&raw, size, seed)?;
    copy::make_base(&raw, &vhdx)?;
    Ok(DataSet {
        store,
        name,
        vhdx,
        raw,
        size,
    })
}

/// Removes a data set's files, unless `--keep` asked to keep the work files.
pub fn remove_data_set(cfg: &Config, ds: &DataSet) {
    if cfg.keep {
        return;
    }
    let _ = std::fs::remove_file(&ds.raw);
    let _ = std::fs::remove_dir_all(&ds.store);
    let _ = std::fs::remove_dir_all(ds.store.with_extension("write-caches"));
}

// ---------------------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------------------

/// The median (of an even count, the upper of the middle two).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Nearest-rank percentile.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

/// The servers every sequential and random-read run compares.
pub const PEERS3: [Kind; 3] = [Kind::Ferry, Kind::Nbdkit, Kind::QemuNbd];

/// fio's nbd engine reading random 4 KiB blocks at queue depth 16 for `seconds`, as
/// nbd-iops and nbd-tls run it.
pub fn fio_iops_args(uri: &str, seconds: u64) -> Vec<String> {
    vec![
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randread".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        format!("--runtime={seconds}"),
        "--time_based".into(),
        "--name=ferry-bench-nbd".into(),
        "--output-format=json".into(),
    ]
}

/// Reads the whole export at `uri` once, every 256 KiB of it once in random order, so a
/// following run finds it cached (Ferry's block cache, the peers' page cache) without the
/// front-to-back scan Ferry's cache lets go.
///
/// # Errors
/// fio failing.
pub fn warm_up(uri: &str) -> Result<()> {
    let args = warm_up_args(uri);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    crate::sys::run("fio", &args)?;
    Ok(())
}

/// fio's arguments for [`warm_up`].
pub fn warm_up_args(uri: &str) -> Vec<String> {
    vec![
        "--name=warm".into(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randread".into(),
        "--bs=256k".into(),
        "--iodepth=16".into(),
        "--output-format=json".into(),
    ]
}

/// fio's `--output-format=json` report, skipping anything fio printed before it.
pub fn fio_json(out: &str) -> Result<serde_json::Value> {
    let at = out
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no json: {out}"))?;
    serde_json::from_str(&out[at..]).context("parse fio json")
}

/// How a goal reads in the report.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 50.0), 50.0);
    }
}
