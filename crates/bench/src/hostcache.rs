//! `hostcache`: issue 21's device side. The synthesized boot trace replayed through
//! `ferry target` (the agent in this process, `ram` write cache) with and without the
//! boot-set prefetch, against fio straight at Ferry's server and at nbdkit, each through
//! the delaying relay (`relay.rs`) at 0, 0.5 and 2 ms of added round trip; then N agents on
//! one host booting one version through one host read cache: the server's read bytes ÷ the
//! boot set's bytes.
//!
//! ```text
//!   fio ─unix─► ferry target [prefetch] ─► relay (+d each way) ─► ferry-bench serve-internal
//!   fio ───────────────────────────────► relay (+d each way) ─► ferry | nbdkit file RAW
//! ```
//!
//! The boot set given to the prefetch is the trace itself, in order: what the server
//! records from a first boot of the version (this run measures a second boot).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent::prefetch::{BootSetSource, PrefetchConfig};
use agent::{AgentConfig, CacheMode, HostCacheConfig};
use anyhow::{Context, Result, bail};

use crate::nbd::{
    DataSet, Kind, NbdConfig, Server, check_replays, make_data_set, remove_data_set,
    replay_at_once, synthesize, verdict, write_iolog,
};
use crate::relay::{Relay, measured_rtt};
use crate::{Config, note};

/// One-way delays: 0, 0.25 ms and 1 ms each way (0, 0.5 and 2 ms of round trip).
const ONE_WAY_US: [u64; 3] = [0, 250, 1000];
/// The trace is scaled to at most this share of the published boot (at 2 ms a read costs
/// a round trip: 70,000 reads would take minutes per row).
const SCALE_MAX: f64 = 0.1;
/// Agents on one host in the shared-cache run.
const AGENTS_FULL: usize = 8;
const AGENTS_QUICK: usize = 4;
/// Goal from the issue: prefetched boot ≤ 0.8 × nbdkit's time.
const GOAL_VS_NBDKIT: f64 = 0.8;
/// Goal: N agents make the server read ≈ 1× the boot set (a block read twice when two
/// agents' claims cross is allowed for).
const GOAL_SERVER_OVER_SET: f64 = 1.25;
/// Bytes-in-flight settings the 2 ms sweep tries (the first is the default's share).
const INFLIGHT_SWEEP: [u64; 3] = [1 << 20, 8 << 20, 32 << 20];

/// The agent, in this process, on its own runtime thread.
struct Agent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    sock: PathBuf,
}

/// What an agent reads through besides the server.
#[derive(Clone, Default)]
struct Extras {
    host_cache: Option<PathBuf>,
    boot_set: Option<Arc<dyn BootSetSource>>,
    inflight_bytes: Option<u64>,
}

impl Agent {
    fn start(
        cfg: &Config,
        server: SocketAddr,
        ds: &DataSet,
        tag: &str,
        x: Extras,
    ) -> Result<Agent> {
        let sock = cfg.dir.join(format!("hc-{tag}.sock"));
        let _ = std::fs::remove_file(&sock);
        let mut ac = AgentConfig::new(
            vec![server.to_string()],
            &format!("{}@0", ds.name),
            CacheMode::Ram,
            sock.clone(),
        );
        ac.ram_bytes = 256 << 20;
        ac.device = format!("bench-{tag}");
        ac.boot_quiet = None;
        ac.host_cache = x.host_cache.map(|dir| HostCacheConfig {
            dir,
            bytes: 2 << 30,
            block_bytes: host_cache::BLOCK_BYTES_DEFAULT,
        });
        ac.boot_set = x.boot_set;
        if let Some(b) = x.inflight_bytes {
            ac.prefetch = PrefetchConfig {
                inflight_bytes: b,
                ..PrefetchConfig::default()
            };
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(agent::run(ac, rx))?;
            anyhow::Ok(())
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if thread.is_finished() || std::time::Instant::now() > deadline {
                let r = thread.join();
                bail!("ferry target did not start: {r:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Agent {
            stop: Some(tx),
            thread: Some(thread),
            sock,
        })
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    fn stop(mut self) -> Result<()> {
        drop(self.stop.take());
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("agent thread panicked"),
            None => Ok(()),
        }
    }
}

/// One timed replay.
struct Row {
    rtt_ms: f64,
    what: String,
    secs: f64,
}

/// How a replay reaches its server.
#[derive(Clone, Copy, PartialEq)]
enum Path_ {
    Direct(Kind),
    Target {
        prefetch: bool,
        inflight: Option<u64>,
    },
}

#[allow(clippy::too_many_arguments)]
fn replay(
    cfg: &Config,
    ds: &DataSet,
    log: &Path,
    total: u64,
    set: &Arc<dyn BootSetSource>,
    one_way: Duration,
    how: Path_,
) -> Result<f64> {
    let kind = match how {
        Path_::Direct(k) => k,
        Path_::Target { .. } => Kind::Ferry,
    };
    let srv = Server::start(kind, ds)?;
    cfg.cache.drop_now();
    let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], srv.port)), one_way)?;
    let (secs, agent) = match how {
        Path_::Direct(_) => {
            let uri = format!("nbd://{}/{}", relay.addr(), ds.name);
            let (c, _, outs) = replay_at_once(&cfg.dir, "hc", &[uri], log)?;
            check_replays(&outs, total)?;
            (c[0], None)
        }
        Path_::Target { prefetch, inflight } => {
            let x = Extras {
                boot_set: prefetch.then(|| Arc::clone(set)),
                inflight_bytes: inflight,
                ..Extras::default()
            };
            let a = Agent::start(cfg, relay.addr(), ds, "one", x)?;
            let (c, _, outs) = replay_at_once(&cfg.dir, "hc", &[a.uri()], log)?;
            check_replays(&outs, total)?;
            (c[0], Some(a))
        }
    };
    if let Some(a) = agent {
        a.stop()?;
    }
    drop(relay);
    srv.stop()?;
    Ok(secs)
}

/// N agents through one host cache (or each alone): (server read bytes, seconds).
fn shared(
    cfg: &Config,
    ds: &DataSet,
    log: &Path,
    total: u64,
    agents: usize,
    host_cache: bool,
) -> Result<(u64, f64)> {
    let srv = Server::start(Kind::Ferry, ds)?;
    cfg.cache.drop_now();
    let dir = tempfile::Builder::new()
        .prefix("ferry-bench-hc-")
        .tempdir_in("/dev/shm")
        .context("a host cache directory in /dev/shm")?;
    let addr = SocketAddr::from(([127, 0, 0, 1], srv.port));
    let mut started = Vec::new();
    for i in 0..agents {
        let x = Extras {
            host_cache: host_cache.then(|| dir.path().to_path_buf()),
            ..Extras::default()
        };
        started.push(Agent::start(cfg, addr, ds, &format!("n{i}"), x)?);
    }
    let uris: Vec<String> = started.iter().map(Agent::uri).collect();
    let (_, makespan, outs) = replay_at_once(&cfg.dir, "hcn", &uris, log)?;
    check_replays(&outs, total)?;
    for a in started {
        a.stop()?;
    }
    let u = srv.stop()?;
    Ok((u.nbd_read_bytes.unwrap_or(0), makespan))
}

/// The section (see the module docs).
///
/// # Errors
/// A server, agent, relay or fio failing, or a replay reading less than the trace.
pub fn hostcache_bench(cfg: &Config, n: &NbdConfig) -> Result<String> {
    let scale = n.boot_scale.min(SCALE_MAX);
    let reads = ((crate::nbd::BOOT_TRACE_READS as f64) * scale)
        .round()
        .max(10.0) as u64;
    let bytes = ((crate::nbd::BOOT_TRACE_BYTES as f64) * scale).round() as u64;
    let t = synthesize(n.boot_disk_bytes, reads, bytes, cfg.seed ^ 0xb007);
    let log = cfg.dir.join("hc-trace.iolog");
    write_iolog(&t, &log)?;
    let set: Arc<dyn BootSetSource> = Arc::new(
        t.reads
            .iter()
            .map(|r| (r.offset, u32::try_from(r.len).unwrap_or(u32::MAX)))
            .collect::<Vec<(u64, u32)>>(),
    );
    note(&format!(
        "hostcache: trace of {} reads, {:.1} MB ({:.1} MB unique)",
        t.reads.len(),
        t.total_bytes as f64 / 1e6,
        t.unique_bytes as f64 / 1e6
    ));
    let ds = make_data_set(cfg, "boot", n.boot_disk_bytes, cfg.seed ^ 0xb0)?;
    let r = run_rows(cfg, n, &ds, &log, &t, &set);
    remove_data_set(cfg, &ds);
    if !cfg.keep {
        let _ = std::fs::remove_file(&log);
    }
    let (rows, rtts, sweep, shared_rows, agents) = r?;
    let bb = host_cache::BLOCK_BYTES_DEFAULT;
    let blocks: std::collections::HashSet<u64> = t
        .reads
        .iter()
        .flat_map(|r| r.offset / bb..(r.offset + r.len).div_ceil(bb))
        .collect();
    let set_block_bytes = blocks.len() as u64 * bb;
    Ok(render(
        &t,
        scale,
        &rows,
        &rtts,
        &sweep,
        &shared_rows,
        agents,
        set_block_bytes,
    ))
}

type Rows = (
    Vec<Row>,
    Vec<f64>,
    Vec<(u64, f64)>,
    Vec<(bool, u64, f64)>,
    usize,
);

fn run_rows(
    cfg: &Config,
    n: &NbdConfig,
    ds: &DataSet,
    log: &Path,
    t: &crate::nbd::Trace,
    set: &Arc<dyn BootSetSource>,
) -> Result<Rows> {
    let mut rows = Vec::new();
    let mut rtts = Vec::new();
    let cases: [(&str, Path_); 4] = [
        ("fio → nbdkit", Path_::Direct(Kind::Nbdkit)),
        ("fio → ferry server", Path_::Direct(Kind::Ferry)),
        (
            "ferry target",
            Path_::Target {
                prefetch: false,
                inflight: None,
            },
        ),
        (
            "ferry target + prefetch",
            Path_::Target {
                prefetch: true,
                inflight: None,
            },
        ),
    ];
    for us in ONE_WAY_US {
        let d = Duration::from_micros(us);
        let rtt = measured_rtt(d, 200)?.as_secs_f64() * 1e3;
        rtts.push(rtt);
        for (what, how) in cases {
            let secs = replay(cfg, ds, log, t.total_bytes, set, d, how)?;
            note(&format!(
                "hostcache: +{:.1} ms RTT, {what}: {secs:.2} s",
                2.0 * us as f64 / 1e3
            ));
            rows.push(Row {
                rtt_ms: 2.0 * us as f64 / 1e3,
                what: what.to_string(),
                secs,
            });
        }
    }
    let mut sweep = Vec::new();
    let d = Duration::from_micros(ONE_WAY_US[2]);
    for b in INFLIGHT_SWEEP {
        let how = Path_::Target {
            prefetch: true,
            inflight: Some(b),
        };
        let secs = replay(cfg, ds, log, t.total_bytes, set, d, how)?;
        note(&format!(
            "hostcache: 2 ms, prefetch in flight {} MiB: {secs:.2} s",
            b >> 20
        ));
        sweep.push((b, secs));
    }
    let agents = if n.quick { AGENTS_QUICK } else { AGENTS_FULL };
    let mut shared_rows = Vec::new();
    for hc in [false, true] {
        let (bytes, secs) = shared(cfg, ds, log, t.total_bytes, agents, hc)?;
        note(&format!(
            "hostcache: {agents} agents, host cache {hc}: server read {:.1} MB in {secs:.2} s",
            bytes as f64 / 1e6
        ));
        shared_rows.push((hc, bytes, secs));
    }
    Ok((rows, rtts, sweep, shared_rows, agents))
}

#[allow(clippy::too_many_arguments)]
fn render(
    t: &crate::nbd::Trace,
    scale: f64,
    rows: &[Row],
    rtts: &[f64],
    sweep: &[(u64, f64)],
    shared_rows: &[(bool, u64, f64)],
    agents: usize,
    set_block_bytes: u64,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Boot prefetch and host read cache (hostcache)\n\n\
         Issue 21's device side. The boot storm's synthesized trace, **scaled to {scale:.3}×** \
         the published shape ({} reads, {:.1} MB, {:.1} MB unique), replayed by one `fio \
         --ioengine=nbd --read_iolog` (queue depth 1, no think time) through a TCP relay that \
         adds a fixed delay each way (`crates/bench/src/relay.rs`: `tc netem` is not \
         available here, so the delay is added in user space; measured median round trips \
         through it: {}). Every row starts a fresh server with the page cache dropped. \
         *ferry target* is the agent in this process (`ram` write cache) attached through \
         the relay, fio on its unix socket; *+ prefetch* gives it the trace as the version's \
         boot set (what the server records from a first boot), fetched ahead through a \
         private read cache of 64 KiB blocks, {} MiB in flight, at most {} MiB ahead of the \
         furthest read.\n",
        t.reads.len(),
        t.total_bytes as f64 / 1e6,
        t.unique_bytes as f64 / 1e6,
        rtts.iter()
            .map(|r| format!("{r:.2} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        agent::prefetch::INFLIGHT_BYTES >> 20,
        agent::prefetch::AHEAD_BYTES >> 20,
    );
    out.push_str("| added RTT | path | boot replay s | ÷ nbdkit |\n|---:|---|---:|---:|\n");
    for r in rows {
        let k = rows
            .iter()
            .find(|k| k.rtt_ms == r.rtt_ms && k.what == "fio → nbdkit")
            .map_or(f64::NAN, |k| k.secs);
        let _ = writeln!(
            out,
            "| {:.1} ms | {} | {:.2} | {:.2} |",
            r.rtt_ms,
            r.what,
            r.secs,
            r.secs / k
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "Prefetch window at 2 ms (bytes in flight; {} MiB ahead):\n",
        agent::prefetch::AHEAD_BYTES >> 20
    );
    out.push_str("| in flight | boot replay s |\n|---:|---:|\n");
    for (b, s) in sweep {
        let _ = writeln!(out, "| {} MiB | {s:.2} |", b >> 20);
    }
    out.push('\n');
    for r in rows.iter().filter(|r| r.what == "ferry target + prefetch") {
        let k = rows
            .iter()
            .find(|k| k.rtt_ms == r.rtt_ms && k.what == "fio → nbdkit")
            .map_or(f64::NAN, |k| k.secs);
        let q = r.secs / k;
        let _ = writeln!(
            out,
            "- +{:.1} ms: prefetched target ÷ nbdkit = **{q:.2}** (goal ≤ {GOAL_VS_NBDKIT}: {})",
            r.rtt_ms,
            verdict(q <= GOAL_VS_NBDKIT)
        );
    }
    let _ = writeln!(
        out,
        "\n{agents} agents on one host (no added delay, no prefetch) replay the trace at once \
         against one fresh server; *server read* is its `ferry_nbd_bytes_total{{type=\"read\"}}` \
         (bytes sent in read replies); the boot set is the trace's unique bytes ({:.1} MB), \
         or {:.1} MB in the host cache's 64 KiB blocks (what one agent alone fetches through \
         it):\n",
        t.unique_bytes as f64 / 1e6,
        set_block_bytes as f64 / 1e6
    );
    out.push_str(
        "| host cache | server read MB | ÷ boot set | ÷ boot set in 64 KiB blocks | makespan s |\n\
         |---|---:|---:|---:|---:|\n",
    );
    for (hc, bytes, secs) in shared_rows {
        let q = *bytes as f64 / t.unique_bytes as f64;
        let qb = *bytes as f64 / set_block_bytes as f64;
        let _ = writeln!(
            out,
            "| {} | {:.1} | {q:.2} | **{qb:.2}** | {secs:.2} |",
            if *hc {
                "one, shared (/dev/shm)"
            } else {
                "none"
            },
            *bytes as f64 / 1e6
        );
    }
    if let Some((_, bytes, _)) = shared_rows.iter().find(|r| r.0) {
        let q = *bytes as f64 / set_block_bytes as f64;
        let _ = writeln!(
            out,
            "\n- {agents} agents, one host cache: server bytes ÷ the boot set's blocks = **{q:.2}** \
             (goal ≈ 1, ≤ {GOAL_SERVER_OVER_SET}: {}); without it ≈ {agents}×",
            verdict(q <= GOAL_SERVER_OVER_SET)
        );
    }
    out.push('\n');
    out
}
