//! NBD serving: Ferry's server (started in a child process, `ferry-bench serve-internal`,
//! so its CPU time and storage I/O can be read from `/proc/PID/{stat,io}`) against nbdkit's
//! file plugin and qemu-nbd, serving the same data in the same run.
//!
//! ```text
//!   nbd-seq    nbdcopy nbd://127.0.0.1:P/NAME null:            sequential MB/s
//!   nbd-iops   fio --ioengine=nbd randread 4k iodepth 16      IOPS
//!   bootstorm  N × fio --ioengine=nbd --read_iolog=TRACE      per-client completion, CPU,
//!              (a synthesized boot trace, queue depth 1)     store bytes ÷ unique bytes
//! ```
//!
//! Every server is started fresh for every timed run (so Ferry's block cache starts empty,
//! like the peers' page cache after the drop), and stopped after it.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::{Config, copy, data, note};

/// The sequential-read disk (full run) and the boot-storm disk.
pub const SEQ_BYTES_DEFAULT: u64 = 2 << 30;
pub const SEQ_BYTES_QUICK: u64 = 256 << 20;
pub const BOOT_DISK_BYTES_DEFAULT: u64 = 4 << 30;
pub const BOOT_DISK_BYTES_QUICK: u64 = 256 << 20;
/// The published boot shape: ~600 MB in ~70,000 reads.
pub const BOOT_TRACE_BYTES: u64 = 600_000_000;
pub const BOOT_TRACE_READS: u64 = 70_000;

/// Goals from the issue.
const GOAL_VS_PEERS: f64 = 1.0;
const GOAL_STORE_OVER_UNIQUE: f64 = 1.05;
/// PVS's published figure per server: 500 boots in 5 minutes.
const PVS_BOOTS_PER_MIN: f64 = 100.0;

const SEQ_NAME: &str = "seq";
const BOOT_NAME: &str = "boot";

/// What the NBD sections need beyond [`Config`].
#[derive(Debug, Clone)]
pub struct NbdConfig {
    pub seq_bytes: u64,
    pub boot_disk_bytes: u64,
    /// Scale of the boot trace relative to the published 600 MB / 70,000 reads.
    pub boot_scale: f64,
    pub boot_clients: Vec<usize>,
    pub iops_seconds: u64,
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
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn wait_listening(port: u16, child: &mut Child, what: &str) -> Result<()> {
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
        match kind {
            Kind::Ferry => {
                let exe = std::env::current_exe()?;
                let mut child = Command::new(exe)
                    .arg("serve-internal")
                    .arg("--store")
                    .arg(&ds.store)
                    .args(["--port", "0"])
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
                })
            }
            Kind::Nbdkit | Kind::QemuNbd => {
                let port = free_port()?;
                let p = port.to_string();
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
                    ])
                    .arg("file")
                    .arg(&ds.raw);
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
                })
            }
        }
    }

    pub fn uri(&self, ds: &DataSet) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.port, ds.name)
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

/// `ferry-bench serve-internal --store DIR [--port P]`: serves the store read-only through
/// a block cache (default budget: a quarter of RAM, 64 KiB granule) on 127.0.0.1:P, prints
/// `listening PORT`, and on EOF of stdin shuts down gracefully and prints its Prometheus
/// metrics.
///
/// # Errors
/// Bad arguments, store or bind failures.
pub fn serve_internal(args: &[String]) -> Result<()> {
    let mut store = None;
    let mut port: u16 = 0;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--store" => store = it.next().map(PathBuf::from),
            "--port" => port = it.next().context("--port P")?.parse()?,
            other => bail!("serve-internal: unknown argument {other:?}"),
        }
    }
    let store = store.context("serve-internal needs --store DIR")?;
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
    let metrics = Arc::new(server::metrics::Metrics::new());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let reg = registry.clone();
    let m = Arc::clone(&metrics);
    rt.block_on(async move {
        let cfg = nbd_server::ServerConfig {
            nbd_listen: Some(SocketAddr::from(([127, 0, 0, 1], port))),
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
    let text = metrics.render(&registry.cache().stats(), &registry.stats());
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
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

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Nearest-rank percentile.
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

const PEERS3: [Kind; 3] = [Kind::Ferry, Kind::Nbdkit, Kind::QemuNbd];

fn served_as(kind: Kind) -> &'static str {
    match kind {
        Kind::Ferry => "the VHDX, from the store, through the block cache",
        Kind::Nbdkit => "the raw twin (file plugin)",
        Kind::QemuNbd => "the VHDX (`-f vhdx`)",
    }
}

// ---------------------------------------------------------------------------------------
// nbd-seq
// ---------------------------------------------------------------------------------------

/// Sequential read results.
#[derive(Debug, Clone)]
pub struct SeqRow {
    pub kind: Kind,
    pub secs: Vec<f64>,
    pub cpu: Vec<f64>,
}

/// The whole export with `nbdcopy URI null:`, each server `runs` times (cold cache, fresh
/// server each run), interleaved.
///
/// # Errors
/// A server or nbdcopy failing.
pub fn seq_bench(cfg: &Config, ds: &DataSet) -> Result<String> {
    let mut rows: Vec<SeqRow> = PEERS3
        .iter()
        .map(|&kind| SeqRow {
            kind,
            secs: vec![],
            cpu: vec![],
        })
        .collect();
    let mut disk = Vec::new();
    let mut disk_buffered = Vec::new();
    // Ferry's last run's cache figures.
    let mut ferry_usage = Usage::default();
    for run in 0..cfg.runs {
        for (secs, how, out) in [
            (
                disk_seq_secs as fn(&DataSet) -> Result<f64>,
                "fio O_DIRECT",
                &mut disk,
            ),
            (
                disk_seq_secs_buffered,
                "fio through the page cache",
                &mut disk_buffered,
            ),
        ] {
            cfg.cache.drop_now();
            let d = secs(ds)?;
            note(&format!(
                "nbd-seq run {}: disk ({how}) {:.0} MB/s",
                run + 1,
                ds.size as f64 / 1e6 / d
            ));
            out.push(d);
        }
        for row in &mut rows {
            let srv = Server::start(row.kind, ds)?;
            cfg.cache.drop_now();
            cfg.loads.sample();
            let uri = srv.uri(ds);
            let start = Instant::now();
            crate::sys::run("nbdcopy", &[&uri, "null:"])?;
            let secs = start.elapsed().as_secs_f64();
            let u = srv.stop()?;
            note(&format!(
                "nbd-seq run {}: {} {:.0} MB/s, server CPU {:.2} s",
                run + 1,
                row.kind.name(),
                ds.size as f64 / 1e6 / secs,
                u.cpu_secs
            ));
            row.secs.push(secs);
            row.cpu.push(u.cpu_secs);
            if row.kind == Kind::Ferry {
                ferry_usage = u;
            }
        }
    }
    let mbs = |r: &SeqRow| ds.size as f64 / 1e6 / median(&r.secs);
    let ferry = mbs(&rows[0]);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## NBD sequential read (nbd-seq)\n\n\
         A {} MiB vDisk of random bytes (every block allocated), captured by the library into \
         a VHDX, and its raw twin. Each server reads from disk: the page cache is dropped and \
         the server started fresh (Ferry's block cache empty) before every run. `nbdcopy \
         nbd://127.0.0.1:PORT/{SEQ_NAME} null:` reads the whole export over loopback \
         (nbdcopy's defaults: multi-conn where offered, 256 KiB requests, 64 in flight per \
         connection). {} runs per server, interleaved; median shown. Server CPU is the \
         server process's utime + stime (`/proc/PID/stat`). Ferry reads its store with \
         `O_DIRECT` into its cache's buffers (the peers through the page cache, with the \
         kernel's read-ahead). The export is larger than a quarter of the cache budget, so \
         each connection's stream becomes a *scan* once it has read 8 MiB: a scan's miss \
         reads 2 MiB at once into one buffer of transparent huge pages (so the device gets \
         one 2 MiB request, where a read into 4 KiB pages is cut into requests of about \
         1 MiB, the most segments a request takes), the cache keeps only the last 64 MiB of \
         what scans filled unless something reads it again, and later fills reuse the \
         buffers so let go instead of faulting in new memory (on this KVM guest, faulting in \
         2 GiB of fresh pages alone cost about 1 CPU-s). The two *disk* rows read the raw \
         twin without NBD: with `O_DIRECT` into fio's 4 KiB-page buffers (requests of at \
         most 1 MiB), and through the page cache (the kernel's read-ahead into large folios, \
         requests of a few MiB, which is what the peers get).\n",
        ds.size >> 20,
        cfg.runs,
    );
    out.push_str(
        "| server | serves | seconds (median, min–max) | MB/s | server CPU s | ferry ÷ server |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let lo = r.secs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.secs.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} ({lo:.2}–{hi:.2}) | {:.0} | {:.2} | {:.2} |",
            r.kind.name(),
            served_as(r.kind),
            median(&r.secs),
            mbs(r),
            median(&r.cpu),
            ferry / mbs(r),
        );
    }
    let disk_mbs = ds.size as f64 / 1e6 / median(&disk);
    let _ = writeln!(
        out,
        "| disk | the raw twin, `fio --rw=read --bs=256k --iodepth=16 --ioengine=io_uring \
         --direct=1` (no NBD, no server) | {:.2} | {disk_mbs:.0} | – | {:.2} |",
        median(&disk),
        ferry / disk_mbs,
    );
    let buffered_mbs = ds.size as f64 / 1e6 / median(&disk_buffered);
    let limit_mbs = disk_mbs.max(buffered_mbs);
    let _ = writeln!(
        out,
        "| disk, page cache | the raw twin, `fio --rw=read --bs=256k --ioengine=psync \
         --direct=0` after a drop of the page cache (the kernel's read-ahead: large folios, \
         requests of a few MiB; what the peers' reads get) | {:.2} | {buffered_mbs:.0} | – | {:.2} |",
        median(&disk_buffered),
        ferry / buffered_mbs,
    );
    out.push('\n');
    for r in &rows[1..] {
        let q = ferry / mbs(r);
        let _ = writeln!(
            out,
            "- ferry ÷ {} = **{q:.2}** (goal ≥ {GOAL_VS_PEERS:.1}: {})",
            r.kind.name(),
            verdict(q >= GOAL_VS_PEERS)
        );
    }
    if let (Some(reads), Some(bytes)) = (ferry_usage.store_reads, ferry_usage.store_read_bytes) {
        let _ = writeln!(
            out,
            "- Ferry's last run: {reads} store reads of {:.0} KiB on average; {} blocks let go \
             by the scan window, {} group fills into reused buffers; {:.0} MiB cached at the end \
             of a {} MiB export",
            bytes as f64 / reads.max(1) as f64 / 1024.0,
            ferry_usage.scan_evictions.unwrap_or(0),
            ferry_usage.buffers_reused.unwrap_or(0),
            ferry_usage.cached_bytes.unwrap_or(0) as f64 / f64::from(1 << 20),
            ds.size >> 20,
        );
    }
    let _ = writeln!(
        out,
        "- of the disk's own sequential read (the faster disk row, {limit_mbs:.0} MB/s): \
         ferry {:.2}, {}",
        ferry / limit_mbs,
        rows[1..]
            .iter()
            .map(|r| format!("{} {:.2}", r.kind.name(), mbs(r) / limit_mbs))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let best = rows.iter().map(mbs).fold(0.0, f64::max);
    if best < 0.8 * limit_mbs {
        let _ = writeln!(
            out,
            "- every server ran below 0.8 of the disk's own speed: here the limit is the CPUs \
             the server shares with nbdcopy (server CPU above), not the disk"
        );
    }
    out.push('\n');
    Ok(out)
}

/// Seconds for fio to read the raw twin front to back through the page cache, one 256 KiB
/// read at a time: the kernel's read-ahead decides the device's requests, as for the peers.
fn disk_seq_secs_buffered(ds: &DataSet) -> Result<f64> {
    fio_read_secs(
        ds,
        &[
            "--name=disk-buffered",
            "--ioengine=psync",
            "--direct=0",
            "--invalidate=1",
        ],
    )
}

/// Seconds for fio to read the raw twin front to back with `O_DIRECT` at queue depth 16:
/// what the disk itself delivers, with no NBD and no server.
fn disk_seq_secs(ds: &DataSet) -> Result<f64> {
    fio_read_secs(
        ds,
        &[
            "--name=disk",
            "--iodepth=16",
            "--ioengine=io_uring",
            "--direct=1",
        ],
    )
}

/// Seconds for one fio job with `how` to read the raw twin front to back in 256 KiB reads.
fn fio_read_secs(ds: &DataSet, how: &[&str]) -> Result<f64> {
    let file = format!("--filename={}", ds.raw.display());
    let size = format!("--size={}", ds.size);
    let mut args = how.to_vec();
    args.extend([file.as_str(), "--readonly", "--rw=read", "--bs=256k"]);
    args.extend([size.as_str(), "--output-format=json"]);
    let out = crate::sys::run("fio", &args)?;
    let v = fio_json(&out)?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .ok_or_else(|| anyhow!("no read.bw_bytes in fio's json"))?;
    Ok(ds.size as f64 / bw)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

// ---------------------------------------------------------------------------------------
// nbd-iops
// ---------------------------------------------------------------------------------------

fn fio_iops_args(uri: &str, seconds: u64) -> Vec<String> {
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

fn fio_json(out: &str) -> Result<serde_json::Value> {
    let at = out
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no json: {out}"))?;
    serde_json::from_str(&out[at..]).context("parse fio json")
}

/// Random 4 KiB reads at queue depth 16 with fio's nbd engine, cold (page cache dropped,
/// fresh server) and warm (the export read once first, in random order, same server).
///
/// # Errors
/// A server or fio failing.
pub fn iops_bench(cfg: &Config, n: &NbdConfig, ds: &DataSet) -> Result<String> {
    // [cold, warm] × [ferry, nbdkit, qemu-nbd] → IOPS of each run, server CPU per run.
    let mut iops = vec![vec![Vec::new(); 3]; 2];
    let mut cpu = vec![vec![Vec::new(); 3]; 2];
    let mut disk = vec![vec![Vec::new(); 3]; 2];
    for run in 0..cfg.runs {
        for (w, warm) in [false, true].into_iter().enumerate() {
            for (i, &kind) in PEERS3.iter().enumerate() {
                let srv = Server::start(kind, ds)?;
                cfg.cache.drop_now();
                let uri = srv.uri(ds);
                if warm {
                    let uri_arg = format!("--uri={uri}");
                    crate::sys::run(
                        "fio",
                        &[
                            "--name=warm",
                            "--ioengine=nbd",
                            &uri_arg,
                            "--rw=randread",
                            "--bs=256k",
                            "--iodepth=16",
                            "--output-format=json",
                        ],
                    )?;
                }
                cfg.loads.sample();
                let before = srv.usage();
                let args = fio_iops_args(&uri, n.iops_seconds);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let v = fio_json(&crate::sys::run("fio", &args)?)?;
                let after = srv.usage();
                srv.stop()?;
                let r = v["jobs"][0]["read"]["iops"]
                    .as_f64()
                    .ok_or_else(|| anyhow!("no read.iops in fio's json"))?;
                note(&format!(
                    "nbd-iops run {} {}: {} {r:.0} IOPS",
                    run + 1,
                    if warm { "warm" } else { "cold" },
                    kind.name()
                ));
                iops[w][i].push(r);
                cpu[w][i].push(after.cpu_secs - before.cpu_secs);
                disk[w][i].push((after.disk_read_bytes - before.disk_read_bytes) as f64);
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## NBD random 4 KiB reads (nbd-iops)\n\n\
         The same {} MiB data set as nbd-seq, served by the same three servers. `fio \
         {}` ({} runs per server and cache state, interleaved; median shown). *Cold*: page \
         cache dropped, server started fresh; every read goes to disk (fio's nbd engine \
         cannot pass an fadvise hint to the server, so each server's own read-ahead decides \
         how much a 4 KiB miss fetches: the peers read through the page cache with the \
         kernel's read-ahead, which soon pulls in much of the file; Ferry's block cache \
         fetches the 4 KiB page asked for, and once a tenth of its recent misses are second \
         misses in a 64 KiB block apart from the pages already held, such a miss reads the \
         rest of the block (a boot never gets there: its store-bytes goal stands; the \
         counter is `ferry_cache_block_completions_total`). *Warm*: the export is read once \
         first on the same server process, every 256 KiB of it once in random order (`fio \
         --rw=randread --bs=256k --iodepth=16` over the whole export; a front-to-back copy \
         would be a scan, which Ferry's cache lets go past its last 64 MiB, see nbd-seq), so \
         the run measures the serving path (Ferry from its block cache, the peers from the \
         page cache). Server CPU is per 1,000 reads \
         served; disk read is `/proc/PID/io` `read_bytes` over the run.\n",
        n.seq_bytes >> 20,
        fio_iops_args("nbd://127.0.0.1:PORT/seq", n.iops_seconds)[..8].join(" "),
        cfg.runs,
    );
    out.push_str(
        "| cache | ferry IOPS | nbdkit IOPS | qemu-nbd IOPS | ferry ÷ nbdkit | ferry ÷ qemu-nbd \
         | server CPU ms per 1k reads (ferry / nbdkit / qemu-nbd) \
         | disk read MB (ferry / nbdkit / qemu-nbd) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut goals = String::new();
    for (w, label) in ["cold", "warm"].iter().enumerate() {
        let m: Vec<f64> = (0..3).map(|i| median(&iops[w][i])).collect();
        let per_k: Vec<f64> = (0..3)
            .map(|i| 1e6 * median(&cpu[w][i]) / (m[i] * n.iops_seconds as f64))
            .collect();
        let _ = writeln!(
            out,
            "| {label} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1} \
             | {:.0} / {:.0} / {:.0} |",
            m[0],
            m[1],
            m[2],
            m[0] / m[1],
            m[0] / m[2],
            per_k[0],
            per_k[1],
            per_k[2],
            median(&disk[w][0]) / 1e6,
            median(&disk[w][1]) / 1e6,
            median(&disk[w][2]) / 1e6,
        );
        for (i, peer) in [(1, "nbdkit"), (2, "qemu-nbd")] {
            let q = m[0] / m[i];
            let _ = writeln!(
                goals,
                "- {label}: ferry ÷ {peer} = **{q:.2}** (goal ≥ {GOAL_VS_PEERS:.1}: {})",
                verdict(q >= GOAL_VS_PEERS)
            );
        }
    }
    out.push('\n');
    out.push_str(&goals);
    out.push('\n');
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// bootstorm
// ---------------------------------------------------------------------------------------

/// One read of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRead {
    pub offset: u64,
    pub len: u64,
}

/// A synthesized boot trace and its facts.
#[derive(Debug, Clone)]
pub struct Trace {
    pub reads: Vec<TraceRead>,
    pub total_bytes: u64,
    pub unique_bytes: u64,
    pub small_reads: u64,
    pub small_bytes: u64,
    pub large_reads: u64,
    pub large_bytes: u64,
    pub reread_runs: u64,
    pub runs: u64,
}

const KIB: u64 = 1024;
/// Small reads: 4–64 KiB, mostly 4 KiB.
fn small_len(rng: &mut SmallRng) -> u64 {
    let p: f64 = rng.r#gen();
    let pages = if p < 0.85 {
        1
    } else if p < 0.93 {
        rng.gen_range(2..=4)
    } else if p < 0.98 {
        rng.gen_range(5..=8)
    } else {
        rng.gen_range(9..=16)
    };
    pages * 4 * KIB
}

/// Large reads: 128 KiB–1 MiB, log-uniform, 4 KiB multiples.
fn large_len(rng: &mut SmallRng) -> u64 {
    let e: f64 = rng.gen_range(17.0..=20.0);
    ((2f64.powf(e) as u64) / (4 * KIB)).max(32) * 4 * KIB
}

/// Synthesizes the trace: `reads` reads totalling about `bytes` over a disk of `disk` bytes.
///
/// Reads come in runs (a file read front to back): small runs of 1–24 contiguous small
/// reads, large runs of 1–8 contiguous large reads (sequential streams). 70% of runs start
/// 0–256 KiB after the previous run's end (files laid out near each other), 30% at a
/// uniformly random 4 KiB-aligned offset; 5% of runs re-read an earlier run. The number of
/// large reads is chosen so the total comes to `bytes`.
pub fn synthesize(disk: u64, reads: u64, bytes: u64, seed: u64) -> Trace {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Sizes first: all small, then swap small reads for large ones until the budget is met.
    let mut small: Vec<u64> = (0..reads).map(|_| small_len(&mut rng)).collect();
    let mut total: u64 = small.iter().sum();
    let mut large: Vec<u64> = Vec::new();
    while total < bytes && !small.is_empty() {
        let l = large_len(&mut rng);
        let s = small.pop().unwrap_or(0);
        total = total - s + l;
        large.push(l);
    }
    // Group into runs.
    let mut runs: Vec<Vec<u64>> = Vec::new();
    let mut si = small.into_iter().peekable();
    let mut li = large.into_iter().peekable();
    let large_share = {
        let (s, l) = (si.len() as f64, li.len() as f64);
        (l / 4.5) / (s / 12.5 + l / 4.5).max(1.0)
    };
    while si.peek().is_some() || li.peek().is_some() {
        let take_large = li.peek().is_some() && (si.peek().is_none() || rng.gen_bool(large_share));
        let run: Vec<u64> = if take_large {
            let n = rng.gen_range(1..=8);
            li.by_ref().take(n).collect()
        } else {
            let n = rng.gen_range(1..=24);
            si.by_ref().take(n).collect()
        };
        runs.push(run);
    }
    runs.shuffle(&mut rng);
    // Lay the runs out.
    let pages = disk / (4 * KIB);
    let mut out: Vec<TraceRead> = Vec::with_capacity(reads as usize);
    let mut placed: Vec<(u64, usize, usize)> = Vec::new(); // (start, first read, count)
    let mut cursor = 0u64;
    let mut reread_runs = 0;
    for run in &runs {
        let len: u64 = run.iter().sum();
        if !placed.is_empty() && rng.gen_bool(0.05) {
            // Re-read an earlier run (same offsets and sizes), in place of this run's sizes.
            let &(_, first, count) = &placed[rng.gen_range(0..placed.len())];
            let again: Vec<TraceRead> = out[first..first + count].to_vec();
            out.extend(again);
            reread_runs += 1;
            continue;
        }
        let start = if rng.gen_bool(0.7) && cursor + len + 256 * KIB < disk {
            cursor + rng.gen_range(0..=64) * 4 * KIB
        } else {
            rng.gen_range(0..pages.saturating_sub(len / (4 * KIB) + 1).max(1)) * 4 * KIB
        };
        let first = out.len();
        let mut at = start;
        for &l in run {
            out.push(TraceRead { offset: at, len: l });
            at += l;
        }
        cursor = at;
        placed.push((start, first, run.len()));
    }
    let mut t = Trace {
        total_bytes: out.iter().map(|r| r.len).sum(),
        unique_bytes: unique_bytes(&out),
        small_reads: out.iter().filter(|r| r.len <= 64 * KIB).count() as u64,
        small_bytes: out
            .iter()
            .filter(|r| r.len <= 64 * KIB)
            .map(|r| r.len)
            .sum(),
        large_reads: 0,
        large_bytes: 0,
        reread_runs,
        runs: runs.len() as u64,
        reads: out,
    };
    t.large_reads = t.reads.len() as u64 - t.small_reads;
    t.large_bytes = t.total_bytes - t.small_bytes;
    t
}

/// Bytes of the union of the reads' ranges.
fn unique_bytes(reads: &[TraceRead]) -> u64 {
    let mut iv: Vec<(u64, u64)> = reads.iter().map(|r| (r.offset, r.offset + r.len)).collect();
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in iv {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// Writes the trace as a fio version 2 iolog.
fn write_iolog(t: &Trace, path: &Path) -> Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "fio version 2 iolog\nboot add\nboot open")?;
    for r in &t.reads {
        writeln!(w, "boot read {} {}", r.offset, r.len)?;
    }
    writeln!(w, "boot close")?;
    w.flush()?;
    Ok(())
}

/// One boot-storm scenario on one server.
#[derive(Debug, Clone)]
pub struct StormRow {
    pub kind: Kind,
    pub clients: usize,
    /// Seconds of each client, start to exit.
    pub completion: Vec<f64>,
    /// Until the last client finished.
    pub makespan: f64,
    pub usage: Usage,
}

impl StormRow {
    fn boots_per_min(&self) -> f64 {
        self.clients as f64 / self.makespan * 60.0
    }
}

fn storm(
    cfg: &Config,
    ds: &DataSet,
    t: &Trace,
    log: &Path,
    kind: Kind,
    clients: usize,
) -> Result<StormRow> {
    let srv = Server::start(kind, ds)?;
    cfg.cache.drop_now();
    cfg.loads.sample();
    let uri = srv.uri(ds);
    let before = srv.usage();
    let outs: Vec<PathBuf> = (0..clients)
        .map(|i| cfg.dir.join(format!("boot-fio-{i}.json")))
        .collect();
    let t0 = Instant::now();
    let mut procs = Vec::with_capacity(clients);
    for out in &outs {
        let child = Command::new("fio")
            .arg("--name=boot")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={uri}"))
            .arg(format!("--read_iolog={}", log.display()))
            .arg("--replay_no_stall=1")
            .arg("--output-format=json")
            .arg(format!("--output={}", out.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start fio")?;
        procs.push((Instant::now(), child));
    }
    let waiters: Vec<_> = procs
        .into_iter()
        .map(|(start, mut child)| {
            std::thread::spawn(move || -> Result<(f64, f64)> {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                let st = child.wait()?;
                let end = Instant::now();
                if !st.success() {
                    bail!("fio replay failed ({st}): {}", err.trim());
                }
                Ok((
                    end.duration_since(start).as_secs_f64(),
                    end.duration_since(t0).as_secs_f64(),
                ))
            })
        })
        .collect();
    let mut completion = Vec::with_capacity(clients);
    let mut makespan: f64 = 0.0;
    for w in waiters {
        let (c, e) = w.join().map_err(|_| anyhow!("waiter panicked"))??;
        completion.push(c);
        makespan = makespan.max(e);
    }
    let after = srv.usage();
    let mut usage = srv.stop()?;
    usage.cpu_secs = after.cpu_secs - before.cpu_secs;
    usage.disk_read_bytes = after.disk_read_bytes - before.disk_read_bytes;
    for out in &outs {
        let v = fio_json(&std::fs::read_to_string(out)?)?;
        let got = v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0);
        if got != t.total_bytes {
            bail!(
                "a replay read {got} bytes, the trace holds {}",
                t.total_bytes
            );
        }
        let _ = std::fs::remove_file(out);
    }
    let row = StormRow {
        kind,
        clients,
        completion,
        makespan,
        usage,
    };
    note(&format!(
        "bootstorm {} × {clients}: p50 {:.2} s, p99 {:.2} s, {:.0} boots/min, CPU {:.1} s, store {:.0} MB",
        kind.name(),
        percentile(&row.completion, 50.0),
        percentile(&row.completion, 99.0),
        row.boots_per_min(),
        row.usage.cpu_secs,
        row.usage
            .store_read_bytes
            .unwrap_or(row.usage.disk_read_bytes) as f64
            / 1e6
    ));
    Ok(row)
}

/// The boot storm: a synthesized trace replayed by 1, 10, 100 concurrent fio processes
/// against Ferry and nbdkit.
///
/// # Errors
/// A server or fio failing, or a replay reading less than the trace.
pub fn bootstorm_bench(cfg: &Config, n: &NbdConfig) -> Result<String> {
    let reads = ((BOOT_TRACE_READS as f64) * n.boot_scale).round().max(10.0) as u64;
    let bytes = ((BOOT_TRACE_BYTES as f64) * n.boot_scale).round() as u64;
    let t = synthesize(n.boot_disk_bytes, reads, bytes, cfg.seed ^ 0xb007);
    note(&format!(
        "bootstorm: trace of {} reads, {:.1} MB ({:.1} MB unique)",
        t.reads.len(),
        t.total_bytes as f64 / 1e6,
        t.unique_bytes as f64 / 1e6
    ));
    let log = cfg.dir.join("boot-trace.iolog");
    write_iolog(&t, &log)?;
    let ds = make_data_set(cfg, BOOT_NAME, n.boot_disk_bytes, cfg.seed ^ 0xb0)?;
    let mut rows = Vec::new();
    for &c in &n.boot_clients {
        for kind in [Kind::Ferry, Kind::Nbdkit] {
            rows.push(storm(cfg, &ds, &t, &log, kind, c)?);
        }
    }
    remove_data_set(cfg, &ds);
    if !cfg.keep {
        let _ = std::fs::remove_file(&log);
    }
    Ok(render_storm(cfg, n, &t, &rows))
}

fn render_storm(cfg: &Config, n: &NbdConfig, t: &Trace, rows: &[StormRow]) -> String {
    let mut out = String::new();
    let scaled = if (n.boot_scale - 1.0).abs() > 1e-9 {
        format!(
            " **Scaled to {:.3}× the published shape** ({} reads instead of {}).",
            n.boot_scale,
            t.reads.len(),
            BOOT_TRACE_READS
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "## NBD boot storm (bootstorm)\n\n\
         **The trace is synthesized, not recorded**, with the published shape of a Windows \
         boot (~600 MB in ~70,000 mostly small reads).{scaled} Seed {}; {} reads, {:.1} MB \
         ({:.1} MB unique, {:.1} KiB mean) over a {} MiB vDisk of random bytes:\n\n\
         - {} small reads (4–64 KiB: 85% 4 KiB, 8% 8–16 KiB, 5% 20–32 KiB, 2% 36–64 KiB), \
         {:.1} MB, in runs of 1–24 contiguous reads (a file read front to back);\n\
         - {} large reads (128 KiB–1 MiB, log-uniform) carrying {:.1} MB, in sequential runs \
         of 1–8;\n\
         - {} runs; 70% start 0–256 KiB after the previous run's end (files laid out near \
         each other), 30% at a uniformly random 4 KiB-aligned offset; {} runs (5%) re-read an \
         earlier run.\n\n\
         Each client is one `fio --name=boot --ioengine=nbd --uri=nbd://127.0.0.1:PORT/{BOOT_NAME} \
         --read_iolog=TRACE --replay_no_stall=1` process (queue depth 1, the reads in trace \
         order, no think time); N clients start together. Every scenario starts with the page \
         cache dropped and a fresh server (Ferry's block cache empty: 64 KiB blocks of 4 KiB pages, budget a \
         quarter of RAM, default read-ahead). Ferry serves the VHDX from its store; nbdkit's \
         file plugin serves the raw twin. Completion is each client's wall time from start \
         to exit (fio's start-up included); boots/min is clients ÷ the time until the last \
         finished. Server CPU is utime + stime of the server process over the scenario; \
         *store read* is Ferry's `ferry_store_read_bytes_total` (what the block cache read \
         from the VHDX; *of which read-ahead* is `ferry_cache_read_ahead_blocks_total` × 64 KiB) and *disk read* `/proc/PID/io` `read_bytes` (what the kernel read \
         from the device for the server, read-ahead included). Every replay is checked to \
         have read the whole trace.\n",
        cfg.seed,
        t.reads.len(),
        t.total_bytes as f64 / 1e6,
        t.unique_bytes as f64 / 1e6,
        t.total_bytes as f64 / t.reads.len().max(1) as f64 / 1024.0,
        n.boot_disk_bytes >> 20,
        t.small_reads,
        t.small_bytes as f64 / 1e6,
        t.large_reads,
        t.large_bytes as f64 / 1e6,
        t.runs,
        t.reread_runs,
    );
    out.push_str(
        "| clients | server | p50 s | p99 s | max s | boots/min | server CPU s | store read MB \
         | of which read-ahead MB | store ÷ unique | disk read MB | disk ÷ unique |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let u = t.unique_bytes as f64;
    for r in rows {
        let store = r
            .usage
            .store_read_bytes
            .map_or("–".into(), |b| format!("{:.0}", b as f64 / 1e6));
        let store_ratio = r
            .usage
            .store_read_bytes
            .map_or("–".into(), |b| format!("{:.3}", b as f64 / u));
        let ra = r.usage.read_ahead_blocks.map_or("–".into(), |b| {
            format!(
                "{:.0}",
                (b * u64::from(block_cache::DEFAULT_BLOCK_BYTES)) as f64 / 1e6
            )
        });
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {store} | {ra} | {store_ratio} | {:.0} | {:.3} |",
            r.clients,
            r.kind.name(),
            percentile(&r.completion, 50.0),
            percentile(&r.completion, 99.0),
            percentile(&r.completion, 100.0),
            r.boots_per_min(),
            r.usage.cpu_secs,
            r.usage.disk_read_bytes as f64 / 1e6,
            r.usage.disk_read_bytes as f64 / u,
        );
    }
    out.push('\n');
    // Goals at the largest client count.
    let Some(&top) = n.boot_clients.iter().max() else {
        return out;
    };
    let f = rows
        .iter()
        .find(|r| r.clients == top && r.kind == Kind::Ferry);
    let k = rows
        .iter()
        .find(|r| r.clients == top && r.kind == Kind::Nbdkit);
    if let (Some(f), Some(k)) = (f, k) {
        let (fp, kp) = (
            percentile(&f.completion, 99.0),
            percentile(&k.completion, 99.0),
        );
        let (fb, kb) = (f.boots_per_min(), k.boots_per_min());
        let _ = writeln!(
            out,
            "Goals at {top} clients:\n\n\
             - p99 completion: ferry {fp:.2} s vs nbdkit {kp:.2} s (nbdkit ÷ ferry = **{:.2}**; \
             goal: ferry's p99 ≤ nbdkit's: {})",
            kp / fp,
            verdict(fp <= kp)
        );
        let _ = writeln!(
            out,
            "- boots per minute: ferry {fb:.0} vs nbdkit {kb:.0} (ferry ÷ nbdkit = **{:.2}**; \
             goal ≥ {GOAL_VS_PEERS:.1}: {})",
            fb / kb,
            verdict(fb >= kb * GOAL_VS_PEERS)
        );
        if let Some(s) = f.usage.store_read_bytes {
            let q = s as f64 / u;
            let _ = writeln!(
                out,
                "- store bytes ÷ unique bytes: **{q:.3}** (goal ≤ {GOAL_STORE_OVER_UNIQUE:.2}: {})",
                verdict(q <= GOAL_STORE_OVER_UNIQUE)
            );
        }
        // PVS: 500 boots × 600 MB in 300 s = 1.0 GB/s of boot reads served.
        let pvs_mb_s = PVS_BOOTS_PER_MIN * BOOT_TRACE_BYTES as f64 / 60.0 / 1e6;
        let ferry_mb_s = fb / 60.0 * t.total_bytes as f64 / 1e6;
        let cpus = crate::sys::cpus();
        let per_boot = f.usage.cpu_secs / top as f64;
        let capacity = cpus as f64 * 60.0 / per_boot;
        let _ = writeln!(
            out,
            "- external bar: PVS's published 500 boots of ~600 MB in 5 minutes per server = \
             {PVS_BOOTS_PER_MIN:.0} boots/min, {pvs_mb_s:.0} MB/s of boot reads served; ferry \
             served {ferry_mb_s:.0} MB/s of boot reads at {top} clients ({fb:.0} boots/min of \
             this {:.0} MB trace, ≈ {:.0} boots/min of a 600 MB boot at that rate: {}). \
             {top} replaying clients share this machine's {cpus} CPUs with the server, and a \
             boot here has no think time. The server used {per_boot:.2} CPU-s per boot: at that \
             cost, {cpus} CPUs given to the server alone would carry about {capacity:.0} \
             boots/min of this trace (an extrapolation from CPU time, not a measurement).",
            t.total_bytes as f64 / 1e6,
            ferry_mb_s * 60.0 / (BOOT_TRACE_BYTES as f64 / 1e6),
            verdict(ferry_mb_s >= pvs_mb_s),
        );
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesized_trace_has_the_published_shape() {
        let t = synthesize(4 << 30, BOOT_TRACE_READS, BOOT_TRACE_BYTES, 1);
        let n = t.reads.len() as f64;
        assert!((n - 70_000.0).abs() / 70_000.0 < 0.1, "{n} reads");
        let mb = t.total_bytes as f64 / 1e6;
        assert!((540.0..660.0).contains(&mb), "{mb} MB");
        assert!(t.unique_bytes <= t.total_bytes);
        assert!(t.reads.iter().all(|r| r.offset + r.len <= 4 << 30));
    }

    #[test]
    fn unique_bytes_merges_overlaps() {
        let r = |offset, len| TraceRead { offset, len };
        assert_eq!(unique_bytes(&[r(0, 10), r(5, 10), r(100, 1)]), 16);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 50.0), 50.0);
    }
}

// ---------------------------------------------------------------------------------------
// Offline boot replay through the block cache (diagnostics)
// ---------------------------------------------------------------------------------------

/// A read-only device whose bytes are a function of their offset (never zero), counting
/// nothing itself: the cache's counters say what it read.
#[derive(Debug)]
struct PatternDevice {
    size: u64,
}

impl disk::BlockDevice for PatternDevice {
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }

    fn geometry(&self) -> disk::device::Geometry {
        disk::device::Geometry {
            size: self.size,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }

    fn format(&self) -> &'static str {
        "pattern"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        disk::device::check_bounds(self.size, offset, buf.len() as u64)?;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = ((offset + i as u64) % 251) as u8 | 1;
        }
        Ok(())
    }
}

/// `ferry-bench sim-boot [--clients N] [--read-ahead BLOCKS] [--seed S]`: replays the
/// synthesized boot trace through a [`block_cache::BlockCache`] over an in-memory device,
/// with no network, and prints the cache's store bytes ÷ the trace's unique bytes. A quick
/// check of cache policy; the report's figures come from `bootstorm`.
///
/// # Errors
/// Bad arguments or a failed read.
pub fn sim_boot(args: &[String]) -> Result<()> {
    let (mut clients, mut ra, mut seed) = (1usize, None::<u32>, 1u64);
    let (mut complete, mut random) = (true, 0usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing value");
        match a.as_str() {
            "--clients" => clients = val()?.parse()?,
            "--read-ahead" => ra = Some(val()?.parse()?),
            "--seed" => seed = val()?.parse()?,
            "--no-complete" => complete = false,
            "--random" => random = val()?.parse()?,
            other => bail!("sim-boot: unknown argument {other:?}"),
        }
    }
    let mut t = synthesize(
        BOOT_DISK_BYTES_DEFAULT,
        BOOT_TRACE_READS,
        BOOT_TRACE_BYTES,
        seed ^ 0xb007,
    );
    if random > 0 {
        // `--random N`: N uniformly random 4 KiB reads of the first 2 GiB (fio's randread
        // of nbd-iops, without its random map) instead of the boot trace.
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut seen = std::collections::HashSet::new();
        t.reads = (0..random)
            .map(|_| {
                let offset = rng.gen_range(0..(2u64 << 30) / 4096) * 4096;
                seen.insert(offset);
                TraceRead { offset, len: 4096 }
            })
            .collect();
        t.unique_bytes = seen.len() as u64 * 4096;
    }
    let mut cfg = block_cache::CacheConfig {
        budget_bytes: 8 << 30,
        complete_blocks: complete,
        ..block_cache::CacheConfig::default()
    };
    if let Some(n) = ra {
        cfg.read_ahead_blocks_max = n;
    }
    let cache = block_cache::BlockCache::with_config(cfg)?;
    let dev: Arc<dyn disk::BlockDevice> = Arc::new(PatternDevice {
        size: BOOT_DISK_BYTES_DEFAULT,
    });
    let key = block_cache::ChainKey::new("sim", None);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for _ in 0..clients {
            let w = cache.wrap(key.clone(), dev.clone());
            let t = &t;
            hs.push(s.spawn(move || -> Result<()> {
                let mut buf = vec![0u8; 1 << 20];
                for r in &t.reads {
                    let b = &mut buf[..r.len as usize];
                    w.read_at(b, r.offset)?;
                    for i in (0..b.len()).step_by(509) {
                        let at = r.offset + i as u64;
                        if b[i] != ((at % 251) as u8 | 1) {
                            bail!("wrong byte at {at}");
                        }
                    }
                }
                Ok(())
            }));
        }
        for h in hs {
            h.join().map_err(|_| anyhow!("replay panicked"))??;
        }
        anyhow::Ok(())
    })?;
    let st = cache.stats();
    println!(
        "clients {clients}: {:.2} s; unique {:.1} MB; store {:.1} MB in {} reads \
         (read-ahead {} blocks, {} completions); store/unique {:.3}; hits {} misses {} \
         waits {} cached {:.1} MB",
        t0.elapsed().as_secs_f64(),
        t.unique_bytes as f64 / 1e6,
        st.store_read_bytes as f64 / 1e6,
        st.store_reads,
        st.read_ahead_blocks,
        st.completions,
        st.store_read_bytes as f64 / t.unique_bytes as f64,
        st.hits,
        st.misses,
        st.inflight_waits,
        st.cached_bytes as f64 / 1e6,
    );
    Ok(())
}
