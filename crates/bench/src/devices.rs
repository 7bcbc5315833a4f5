//! `devices`: one `ferry server` carrying N devices, as a PVS server carries up to 4,095.
//! N raw NBD connections ([`client::Device`], all in this process) connect at once, idle
//! reading 4 KiB once a second each (at a random phase, as devices do not tick together),
//! and disconnect at once; several rounds on the same server process. Measured: connect
//! time (TCP connect to `NBD_OPT_GO` acknowledged), read latency, the server's resident
//! memory (`/proc/PID/status`) warm and idle, with N connected and after each round, and
//! connections stranded (a connect that never entered transmission, or a connection the
//! server still counts once every client has gone: both must be 0).
//!
//! The peer is the same server with one device: the read latency of the same 4 KiB reads
//! when nothing else is connected, measured in the same run.
//!
//! ```text
//!   ferry server (the release binary, a child)  ◄── N × Device (tokio tasks, this process)
//!     max_connections 4096, 256 MiB block cache,      connect ─► idle reads ─► disconnect
//!     a 64 MiB VHDX whose first 16 MiB are warm        × rounds
//! ```

mod client;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rand::{Rng, SeedableRng};

use crate::nbd::{DataSet, free_port, make_data_set, remove_data_set, wait_listening};
use crate::{Config, note};
use client::Device;

/// Devices per row: the full run's and `--quick`'s.
pub const COUNTS_DEFAULT: &[usize] = &[512, 4095];
pub const COUNTS_QUICK: &[usize] = &[64, 512];
/// Rounds of connect, idle, disconnect per row.
pub const ROUNDS_DEFAULT: u32 = 4;
pub const ROUNDS_QUICK: u32 = 2;
/// Seconds each round idles with N connected (one read per device per second).
pub const IDLE_SECS_DEFAULT: u64 = 10;
pub const IDLE_SECS_QUICK: u64 = 3;
/// The most devices a row may have (PVS's limit per server; the server's accept queue).
pub const DEVICES_MAX: usize = 4095;

/// The vDisk served, and the part of it the devices read (warmed into the block cache
/// first, so the cache does not grow during the rounds).
const DISK_BYTES: u64 = 64 << 20;
const HOT_BYTES: u64 = 16 << 20;
/// Bytes of one device read.
const READ_BYTES: usize = 4096;
/// The server's block cache budget and connection cap.
const CACHE_BYTES: u64 = 256 << 20;
const MAX_CONNECTIONS: usize = 4096;
/// Reads of the solo device (one at a time, [`SOLO_GAP`] apart): the peer's latency.
const SOLO_READS: usize = 500;
const SOLO_GAP: Duration = Duration::from_millis(5);
/// How long a device has to connect and enter transmission before it counts as stranded.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server has to count every connection closed once the clients have left.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after the last connection closed before memory is read: the server gives freed
/// memory back at most 5 s after connections closed (`nbd_server`'s trim.rs), then a second.
const SETTLE: Duration = Duration::from_secs(6);
/// How long the server has to listen after it starts.
const LISTEN_WAIT: Duration = Duration::from_secs(20);
/// The most memory a row's server may keep from its first round's end to its last: a
/// round's connections come and go, so a server that gives freed memory back keeps about
/// none beyond what grows once to its high-water mark (the runtime's tables). glibc's
/// malloc without trimming kept 35 to 70 KB a device each round.
const KEPT_BASE_BYTES: f64 = 16e6;
const KEPT_PER_DEVICE_BYTES: f64 = 4e3;
/// The most bytes of a `/metrics` answer read.
const METRICS_BYTES_MAX: u64 = 4 << 20;

/// What the section runs.
#[derive(Debug, Clone)]
pub struct DevicesConfig {
    pub counts: Vec<usize>,
    pub rounds: u32,
    pub idle_secs: u64,
    pub quick: bool,
}

/// A process's resident memory, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    /// `VmRSS`, bytes.
    rss: u64,
    /// `RssAnon`, bytes (heap and stacks: what connections allocate).
    anon: u64,
}

impl Mem {
    fn of(pid: u32) -> Mem {
        Mem::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
    }

    /// From the text of `/proc/PID/status` (0 for a field not found).
    fn parse(text: &str) -> Mem {
        let kb = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |k| k << 10)
        };
        Mem {
            rss: kb("VmRSS:"),
            anon: kb("RssAnon:"),
        }
    }
}

/// One round's figures.
#[derive(Debug, Clone, Default)]
struct Round {
    connect_ms: Vec<f64>,
    read_ms: Vec<f64>,
    /// Connects that did not reach transmission in [`CONNECT_TIMEOUT`], and reads that failed.
    failed_connects: usize,
    failed_reads: usize,
    /// Connections the server still counted [`CLOSE_TIMEOUT`] after every client left.
    left_open: u64,
    connected: Mem,
    after: Mem,
    connect_wall_secs: f64,
}

/// One row: N devices over several rounds.
#[derive(Debug, Clone)]
struct Row {
    devices: usize,
    /// The server warm, before the first round.
    baseline: Mem,
    rounds: Vec<Round>,
    /// The solo device's read latencies on the same server, before the rounds.
    solo_ms: Vec<f64>,
}

/// Runs the section.
///
/// # Errors
/// The server or a client failing outright (a device that fails is counted, not an error).
pub fn devices_bench(cfg: &Config, d: &DevicesConfig) -> Result<String> {
    if d.counts.iter().any(|&n| n == 0 || n > DEVICES_MAX) {
        bail!("--devices must be 1..={DEVICES_MAX}");
    }
    let limit = raise_nofile()?;
    let need = d.counts.iter().max().copied().unwrap_or(0) as u64 * 2 + 256;
    if limit < need {
        bail!("RLIMIT_NOFILE hard limit {limit} is below the {need} descriptors the section needs");
    }
    let ferry = crate::boot::ferry_binary();
    if !ferry.is_file() {
        bail!(
            "no ferry binary at {} (build it with cargo build --release, or set FERRY_BIN)",
            ferry.display()
        );
    }
    let load_start = crate::sys::loadavg();
    let ds = make_data_set(cfg, "devices", DISK_BYTES, cfg.seed ^ 0xde71)?;
    let rows = (|| {
        let mut rows = Vec::new();
        for &n in &d.counts {
            rows.push(run_row(cfg, d, &ferry, &ds, n)?);
        }
        anyhow::Ok(rows)
    })();
    remove_data_set(cfg, &ds);
    let load_end = crate::sys::loadavg();
    Ok(render(d, &ferry, &rows?, (&load_start, &load_end)))
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (the server, a child,
/// inherits it); returns the limit.
fn raise_nofile() -> Result<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    )
    .context("raise RLIMIT_NOFILE")?;
    Ok(hard.unwrap_or(u64::MAX))
}

fn run_row(cfg: &Config, d: &DevicesConfig, ferry: &Path, ds: &DataSet, n: usize) -> Result<Row> {
    let server = FerryServer::start(ferry, ds, &cfg.dir)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], server.nbd));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let name = ds.name;
    let seed = cfg.seed;
    let solo_ms = rt.block_on(async move {
        let mut dev = Device::connect(addr, name).await?;
        if dev.size < HOT_BYTES {
            bail!("the export is {} bytes, under {HOT_BYTES}", dev.size);
        }
        let mut buf = vec![0u8; 64 << 10];
        // Warm: the hot part of the disk into the block cache.
        for off in (0..HOT_BYTES).step_by(buf.len()) {
            dev.read(off, &mut buf).await?;
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut solo = Vec::with_capacity(SOLO_READS);
        let mut page = vec![0u8; READ_BYTES];
        for _ in 0..SOLO_READS {
            let off = hot_offset(&mut rng);
            let t = Instant::now();
            dev.read(off, &mut page).await?;
            solo.push(ms(t.elapsed()));
            tokio::time::sleep(SOLO_GAP).await;
        }
        dev.disconnect().await?;
        anyhow::Ok(solo)
    })?;
    server.wait_closed()?;
    std::thread::sleep(SETTLE);
    let baseline = server.mem();
    note(&format!(
        "devices: {n} devices, server warm at {:.0} MB RSS ({:.0} MB anonymous)",
        mb(baseline.rss),
        mb(baseline.anon)
    ));
    let mut rounds = Vec::new();
    for r in 1..=d.rounds {
        cfg.loads.sample();
        let round = rt.block_on(run_round(
            &server,
            addr,
            name,
            n,
            d.idle_secs,
            seed ^ u64::from(r),
        ))?;
        // Diagnostics: FERRY_BENCH_DEVICES_GDB runs a gdb command in the server after each
        // round, e.g. "call (void)malloc_stats()" (to its log) or "call (int)malloc_trim(0)";
        // the report's runs never set it.
        if let Ok(cmd) = std::env::var("FERRY_BENCH_DEVICES_GDB") {
            let pid = server.child.id().to_string();
            let _ = Command::new("gdb")
                .args(["-p", &pid, "-batch", "-ex", &cmd])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let m = server.mem();
            note(&format!(
                "devices: after gdb {cmd:?}: RSS {:.0} MB",
                mb(m.rss)
            ));
        }
        note(&format!(
            "devices: {n} round {r}: connect p99 {:.1} ms, read p99 {:.1} ms, {} + {} failed, \
             {} left open, RSS {:.0} MB connected, {:.0} MB after",
            percentile(&round.connect_ms, 99.0),
            percentile(&round.read_ms, 99.0),
            round.failed_connects,
            round.failed_reads,
            round.left_open,
            mb(round.connected.rss),
            mb(round.after.rss),
        ));
        rounds.push(round);
    }
    drop(rt);
    server.stop();
    Ok(Row {
        devices: n,
        baseline,
        rounds,
        solo_ms,
    })
}

/// A 4 KiB-aligned offset in the warm part of the disk.
fn hot_offset(rng: &mut impl Rng) -> u64 {
    rng.gen_range(0..HOT_BYTES / READ_BYTES as u64) * READ_BYTES as u64
}

async fn run_round(
    server: &FerryServer,
    addr: SocketAddr,
    name: &'static str,
    n: usize,
    idle_secs: u64,
    seed: u64,
) -> Result<Round> {
    let mut round = Round::default();
    // Connect, all at once.
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move {
            let t = Instant::now();
            let r = tokio::time::timeout(CONNECT_TIMEOUT, Device::connect(addr, name)).await;
            (r, t.elapsed())
        });
    }
    let mut devices = Vec::with_capacity(n);
    while let Some(j) = tasks.join_next().await {
        match j? {
            (Ok(Ok(dev)), took) => {
                round.connect_ms.push(ms(took));
                devices.push(dev);
            }
            (Ok(Err(e)), _) => {
                round.failed_connects += 1;
                if round.failed_connects <= 3 {
                    note(&format!("devices: a connect failed: {e:#}"));
                }
            }
            (Err(_), _) => {
                round.failed_connects += 1;
                if round.failed_connects <= 3 {
                    note("devices: a connect timed out");
                }
            }
        }
    }
    round.connect_wall_secs = start.elapsed().as_secs_f64();
    // Idle, a read a second each.
    let epoch = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut dev) in devices.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ (i as u64) << 20);
            let phase = Duration::from_micros(rng.gen_range(0..1_000_000));
            let mut tick = tokio::time::interval_at(epoch + phase, Duration::from_secs(1));
            let mut page = vec![0u8; READ_BYTES];
            let mut lat = Vec::with_capacity(idle_secs as usize);
            let mut failed = 0;
            for _ in 0..idle_secs {
                tick.tick().await;
                let t = Instant::now();
                match dev.read(hot_offset(&mut rng), &mut page).await {
                    Ok(()) => lat.push(ms(t.elapsed())),
                    Err(_) => failed += 1,
                }
            }
            (dev, lat, failed)
        });
    }
    let mut devices = Vec::with_capacity(n);
    while let Some(j) = tasks.join_next().await {
        let (dev, lat, failed) = j?;
        round.read_ms.extend(lat);
        round.failed_reads += failed;
        devices.push(dev);
    }
    round.connected = server.mem();
    // Disconnect, all at once.
    let mut tasks = tokio::task::JoinSet::new();
    for dev in devices {
        tasks.spawn(dev.disconnect());
    }
    while tasks.join_next().await.is_some() {}
    round.left_open = tokio::task::spawn_blocking({
        let port = server.metrics;
        move || wait_connections_closed(port)
    })
    .await??;
    tokio::time::sleep(SETTLE).await;
    round.after = server.mem();
    Ok(round)
}

/// Waits (at most [`CLOSE_TIMEOUT`]) for the server to count no open connection; returns
/// how many it still counts.
fn wait_connections_closed(metrics_port: u16) -> Result<u64> {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    loop {
        let open = connections_open(metrics_port)?;
        if open == 0 || Instant::now() > deadline {
            return Ok(open);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ferry_nbd_connections` (the gauge of open connections) from `/metrics`.
fn connections_open(metrics_port: u16) -> Result<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", metrics_port))?;
    s.set_read_timeout(Some(LISTEN_WAIT))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    s.take(METRICS_BYTES_MAX).read_to_string(&mut text)?;
    text.lines()
        .find_map(|l| l.strip_prefix("ferry_nbd_connections "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| anyhow!("no ferry_nbd_connections in /metrics: {text:.300}"))
}

/// `ferry server --config FILE` on loopback.
struct FerryServer {
    child: Child,
    nbd: u16,
    metrics: u16,
}

impl FerryServer {
    fn start(ferry: &Path, ds: &DataSet, dir: &Path) -> Result<FerryServer> {
        let (nbd, metrics) = (free_port()?, free_port()?);
        let conf = dir.join("devices.toml");
        std::fs::write(
            &conf,
            format!(
                "[store]\ndir = {:?}\n\n[nbd]\nlisten = \"127.0.0.1:{nbd}\"\n\
                 max_connections = {MAX_CONNECTIONS}\n\n[cache]\nram_bytes = {CACHE_BYTES}\n\n\
                 [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n",
                ds.store.display().to_string()
            ),
        )?;
        let log = std::fs::File::create(dir.join("devices-server.log"))?;
        let mut child = Command::new(ferry)
            .arg("server")
            .arg("--config")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start ferry server")?;
        wait_listening(nbd, &mut child, "ferry server (NBD)")?;
        wait_listening(metrics, &mut child, "ferry server (metrics)")?;
        Ok(FerryServer {
            child,
            nbd,
            metrics,
        })
    }

    fn mem(&self) -> Mem {
        Mem::of(self.child.id())
    }

    fn wait_closed(&self) -> Result<()> {
        match wait_connections_closed(self.metrics)? {
            0 => Ok(()),
            n => bail!("the server still counts {n} connections"),
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FerryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// Nearest-rank percentile (NaN when empty).
fn percentile(v: &[f64], p: f64) -> f64 {
    crate::nbd::percentile(v, p)
}

fn render(d: &DevicesConfig, ferry: &Path, rows: &[Row], load: (&str, &str)) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Devices per server (devices)\n\n\
         One `ferry server` (the release binary beside `ferry-bench` or `FERRY_BIN`: {}) carries N devices, as a PVS server \
         carries up to 4,095. N raw NBD clients in the harness (tokio tasks, `NBD_OPT_GO`, \
         simple replies) connect at once, idle {} s reading 4 KiB a second each (at a random \
         phase within the second) from the first {} MiB of a {} MiB VHDX, warm in the block \
         cache, and disconnect at once; {} rounds on the same server process \
         (`max_connections = {MAX_CONNECTIONS}`, a {} MiB block cache). *Connect*: TCP connect \
         to `NBD_OPT_GO` acknowledged. *Solo*: {SOLO_READS} reads of one device alone on the \
         same server just before the rounds (the peer: the same reads without the other \
         devices). Memory is the server's `VmRSS` (`/proc/PID/status`): *warm* after the \
         solo device left, *connected* at the end of a round's idle time, *after* once the \
         server counts no connection open (`ferry_nbd_connections` 0) and {} s more (the server \
         gives freed memory back within 5 s of connections closing). \
         *Stranded*: connects that did not reach transmission in {} s, plus connections the \
         server still counted {} s after every client left. {} CPUs, shared by the clients \
         and the server; load average at the section's start / end: {} / {}.{}\n",
        crate::sys::tool_version(&ferry.to_string_lossy(), &["--version"]),
        d.idle_secs,
        HOT_BYTES >> 20,
        DISK_BYTES >> 20,
        d.rounds,
        CACHE_BYTES >> 20,
        SETTLE.as_secs(),
        CONNECT_TIMEOUT.as_secs(),
        CLOSE_TIMEOUT.as_secs(),
        crate::sys::cpus(),
        load.0,
        load.1,
        if d.quick {
            " `--quick` smoke run: the numbers are not meaningful."
        } else {
            ""
        },
    );
    out.push_str(
        "| devices | connect p50 / p99 ms | read p50 / p99 ms | solo read p99 ms \
         | read p99 ÷ solo | server RSS warm MB | connected MB (per device KB) | stranded |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut goals = String::new();
    for row in rows {
        let connect: Vec<f64> = row
            .rounds
            .iter()
            .flat_map(|r| r.connect_ms.clone())
            .collect();
        let read: Vec<f64> = row.rounds.iter().flat_map(|r| r.read_ms.clone()).collect();
        let stranded: u64 = row
            .rounds
            .iter()
            .map(|r| (r.failed_connects + r.failed_reads) as u64 + r.left_open)
            .sum();
        let connected = row
            .rounds
            .iter()
            .map(|r| r.connected.rss)
            .max()
            .unwrap_or(0);
        let per_device = connected.saturating_sub(row.baseline.rss) as f64 / row.devices as f64;
        let solo = percentile(&row.solo_ms, 99.0);
        let _ = writeln!(
            out,
            "| {} | {:.1} / {:.1} | {:.2} / {:.2} | {solo:.2} | {:.1} | {:.0} | {:.0} ({:.0}) \
             | {stranded} |",
            row.devices,
            percentile(&connect, 50.0),
            percentile(&connect, 99.0),
            percentile(&read, 50.0),
            percentile(&read, 99.0),
            percentile(&read, 99.0) / solo,
            mb(row.baseline.rss),
            mb(connected),
            per_device / 1e3,
        );
        let first = row.rounds.first().map_or(0, |r| r.after.rss);
        let last = row.rounds.last().map_or(0, |r| r.after.rss);
        let kept = last.saturating_sub(first) as f64;
        let bound = KEPT_BASE_BYTES + KEPT_PER_DEVICE_BYTES * row.devices as f64;
        let _ = writeln!(
            goals,
            "- {} devices: stranded **{stranded}** (goal 0: {}); memory kept from round 1 to \
             round {} **{:.1} MB** (goal under {:.1} MB, {:.0} MB + {:.0} KB a device: {})",
            row.devices,
            crate::nbd::verdict(stranded == 0),
            row.rounds.len(),
            kept / 1e6,
            bound / 1e6,
            KEPT_BASE_BYTES / 1e6,
            KEPT_PER_DEVICE_BYTES / 1e3,
            crate::nbd::verdict(kept < bound),
        );
    }
    out.push_str("\nServer RSS in MB, connected / after, round by round:\n\n| devices | warm |");
    let rounds = rows.iter().map(|r| r.rounds.len()).max().unwrap_or(0);
    for i in 1..=rounds {
        let _ = write!(out, " round {i} |");
    }
    out.push_str("\n|---:|---:|");
    for _ in 0..rounds {
        out.push_str("---:|");
    }
    out.push('\n');
    for row in rows {
        let _ = write!(out, "| {} | {:.0} |", row.devices, mb(row.baseline.rss));
        for r in &row.rounds {
            let _ = write!(
                out,
                " {:.0} / {:.0} |",
                mb(r.connected.rss),
                mb(r.after.rss)
            );
        }
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&goals);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_proc_status_in_bytes() {
        let text = "Name:\tferry\nVmRSS:\t  380120 kB\nRssAnon:\t  370000 kB\n";
        let m = Mem::parse(text);
        assert_eq!(m.rss, 380_120 << 10);
        assert_eq!(m.anon, 370_000 << 10);
        assert_eq!(Mem::parse("").rss, 0);
    }

    fn row(stranded: usize, after_mb: &[u64]) -> Row {
        Row {
            devices: 100,
            baseline: Mem {
                rss: 30 << 20,
                anon: 0,
            },
            rounds: after_mb
                .iter()
                .map(|&a| Round {
                    connect_ms: vec![1.0, 2.0],
                    read_ms: vec![0.5],
                    failed_connects: stranded,
                    after: Mem {
                        rss: a * 1_000_000,
                        anon: 0,
                    },
                    connected: Mem {
                        rss: 40 << 20,
                        anon: 0,
                    },
                    ..Round::default()
                })
                .collect(),
            solo_ms: vec![0.25],
        }
    }

    #[test]
    fn stranded_connections_and_kept_memory_fail_their_goals() {
        let d = DevicesConfig {
            counts: vec![100],
            rounds: 2,
            idle_secs: 1,
            quick: false,
        };
        let ok = render(&d, Path::new("ferry"), &[row(0, &[40, 41])], ("0", "0"));
        assert!(ok.starts_with("## Devices per server"), "{ok}");
        assert!(!ok.contains("not met"), "{ok}");
        let stranded = render(&d, Path::new("ferry"), &[row(1, &[40, 41])], ("0", "0"));
        assert!(
            stranded.contains("stranded **2** (goal 0: **not met**)"),
            "{stranded}"
        );
        let kept = render(&d, Path::new("ferry"), &[row(0, &[40, 80])], ("0", "0"));
        assert!(kept.contains("**40.0 MB** (goal under 16.4 MB"), "{kept}");
        assert!(kept.contains("**not met**"), "{kept}");
    }
}
