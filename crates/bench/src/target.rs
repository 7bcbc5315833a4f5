//! The target's write caches under the VDI workload (DESIGN.md): fio's nbd engine, 4 KiB,
//! 90% writes, 80% random, queue depth 16, against the export of `ferry target` (the agent
//! runs in this process, attached to `ferry-bench serve-internal`), for every cache mode with
//! a 1 GiB RAM cache and 1 GiB and 2 GiB working sets, each once over plain NBD and once over
//! TLS (the server requiring `NBD_OPT_STARTTLS`, the agent presenting an administrator's
//! client certificate from a throwaway farm CA, [`make_cert_dir`]), the two interleaved. In
//! the same run:
//!
//! ```text
//!   peers     qemu-nbd + qcow2 overlay (backing: the raw golden) on disk, on /dev/shm
//!             nbdkit --filter=cow file RAW
//!   ceilings  nbdkit memory 4G              what fio's nbd client path carries at all
//!             fio io_uring O_DIRECT 4k randwrite QD16 on the overflow directory's fs
//! ```
//!
//! Every export is reached over a unix socket. Each case starts fresh (empty cache, new
//! overlay), is prefilled untimed by a sequential 1 MiB write of its working set (so a
//! 2 GiB set really overflows 1 GiB of RAM), then timed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::{AgentConfig, CacheMode};
use anyhow::{Context, Result, anyhow, bail};

use crate::nbd::{DataSet, Kind, Server, make_cert_dir};
use crate::{Config, note};

/// The RAM cache of every case.
const RAM_BYTES: u64 = 1 << 30;
/// Working sets.
const WORKING_SETS: [u64; 2] = [1 << 30, 2 << 30];
/// The golden image (a little over the larger working set).
pub const GOLDEN_BYTES: u64 = (2 << 30) + (256 << 20);
/// Goals from the issue.
const GOAL_RAM_VS_PEERS: f64 = 1.5;
const GOAL_RAM_VS_MEMORY: f64 = 0.7;
const GOAL_DISK_VS_CEILING: f64 = 0.7;
const GOAL_OVERFLOW_2G_VS_1G: f64 = 0.6;
/// Goal from issue 18: the target over TLS keeps at least this share of the target without
/// TLS, as in the nbd-tls section.
const GOAL_TLS_VS_PLAIN: f64 = 0.8;
/// The suffix of a TLS row's label (the plain row's label without it).
const TLS_SUFFIX: &str = " over TLS";

fn vdi_args(uri: &str, ws: u64, seconds: u64) -> Vec<String> {
    vec![
        "--name=vdi".into(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randrw".into(),
        "--rwmixwrite=90".into(),
        "--percentage_random=80".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        format!("--size={ws}"),
        format!("--runtime={seconds}"),
        "--time_based".into(),
        "--output-format=json".into(),
    ]
}

fn fio_iops(args: &[String]) -> Result<f64> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::sys::run("fio", &a)?;
    let at = out
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no json"))?;
    let v: serde_json::Value = serde_json::from_str(&out[at..]).context("fio json")?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio reported error {}", job["error"]);
    }
    Ok(job["read"]["iops"].as_f64().unwrap_or(0.0) + job["write"]["iops"].as_f64().unwrap_or(0.0))
}

/// Untimed sequential fill of the working set.
fn prefill(uri: &str, ws: u64) -> Result<()> {
    crate::sys::run(
        "fio",
        &[
            "--name=prefill",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=write",
            "--bs=1M",
            "--iodepth=4",
            &format!("--size={ws}"),
        ],
    )
    .map(drop)
}

fn unix_uri(sock: &Path) -> String {
    format!("nbd+unix:///?socket={}", sock.display())
}

fn wait_socket(sock: &Path, alive: &mut dyn FnMut() -> bool, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        if !alive() {
            bail!("{what} exited before listening");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {}", sock.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The agent, in this process, on its own runtime thread.
struct Agent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    sock: PathBuf,
}

impl Agent {
    fn start(
        cfg: &Config,
        port: u16,
        ds: &DataSet,
        mode: CacheMode,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Agent> {
        let sock = cfg.dir.join("target.sock");
        let mut ac = AgentConfig::new(
            vec![format!("127.0.0.1:{port}")],
            ds.name,
            mode,
            sock.clone(),
        );
        ac.ram_bytes = RAM_BYTES;
        // Diagnostics (the granularity measurement in docs/target.md): the cache block.
        if let Some(b) = std::env::var("FERRY_BENCH_CACHE_BLOCK")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            ac.block_bytes = b;
        }
        ac.overflow_dir = Some(cfg.dir.clone());
        ac.device = "bench".into();
        ac.tls = tls;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(agent::run(ac, rx))?;
            anyhow::Ok(())
        });
        let agent = Agent {
            stop: Some(tx),
            thread: Some(thread),
            sock,
        };
        let th = &agent.thread;
        wait_socket(
            &agent.sock,
            &mut || th.as_ref().is_some_and(|t| !t.is_finished()),
            "ferry target",
        )?;
        Ok(agent)
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

/// A peer or ceiling server in a child process on a unix socket.
struct Peer {
    child: Child,
}

impl Peer {
    fn start(cmd: &mut Command, sock: &Path, what: &str) -> Result<Peer> {
        let _ = std::fs::remove_file(sock);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {what}"))?;
        wait_socket(sock, &mut || matches!(child.try_wait(), Ok(None)), what)?;
        Ok(Peer { child })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One timed case: IOPS, or why it was not run.
type Case = std::result::Result<f64, String>;

/// The agent's TLS client configuration from a [`pki::CertDir`] made by [`make_cert_dir`]:
/// the farm CA and the administrator's client certificate (as `ferry target --tls-dir`
/// builds it).
fn client_tls(certs: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let read = |name: &str| {
        let p = certs.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))
    };
    let (ca, cert, key) = (
        read(pki::CA_CERT)?,
        read(pki::CLIENT_CERT)?,
        read(pki::CLIENT_KEY)?,
    );
    Ok(pki::client_config(&ca, Some((&cert, &key)))?)
}

/// The certificate directory and the agent's client configuration of the TLS cases.
struct Tls {
    certs: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

/// One case of `mode` and working set `ws`; over TLS with `tls`.
fn target_case(
    cfg: &Config,
    ds: &DataSet,
    mode: CacheMode,
    ws: u64,
    tls: Option<&Tls>,
) -> Result<Case> {
    if mode == CacheMode::Ram && ws > RAM_BYTES {
        return Ok(Err(
            "n/a: working set over the RAM budget (ENOSPC by design)".into(),
        ));
    }
    let srv = Server::start_with(Kind::Ferry, ds, tls.map(|t| t.certs.as_path()))?;
    let agent = Agent::start(cfg, srv.port, ds, mode, tls.map(|t| Arc::clone(&t.client)))?;
    let uri = unix_uri(&agent.sock);
    // Diagnostics: FERRY_BENCH_NO_PREFILL=1 times a cold cache (first writes included).
    if std::env::var_os("FERRY_BENCH_NO_PREFILL").is_none() {
        prefill(&uri, ws)?;
    }
    cfg.loads.sample();
    let iops = fio_iops(&vdi_args(&uri, ws, cfg.iops_seconds));
    agent.stop()?;
    srv.stop()?;
    Ok(Ok(iops?))
}

fn peer_case(cfg: &Config, ds: &DataSet, peer: &str, ws: u64) -> Result<Case> {
    let sock = cfg.dir.join("peer.sock");
    let overlay = match peer {
        "qemu-nbd qcow2 (disk)" => Some(cfg.dir.join("overlay.qcow2")),
        "qemu-nbd qcow2 (/dev/shm)" => Some(PathBuf::from("/dev/shm/ferry-bench-overlay.qcow2")),
        _ => None,
    };
    let p = match (&overlay, peer) {
        (Some(ovl), _) => {
            let _ = std::fs::remove_file(ovl);
            crate::sys::run(
                "qemu-img",
                &[
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    "-F",
                    "raw",
                    "-b",
                    &ds.raw.display().to_string(),
                    &ovl.display().to_string(),
                ],
            )?;
            let mut c = Command::new("qemu-nbd");
            c.args(["-f", "qcow2", "-t", "-e", "16", "--cache=writeback", "-k"])
                .arg(&sock)
                .arg(ovl);
            Peer::start(&mut c, &sock, "qemu-nbd")?
        }
        (None, "nbdkit cow") => {
            let mut c = Command::new("nbdkit");
            c.env("TMPDIR", &cfg.dir)
                .args(["-f", "--exit-with-parent", "-U"])
                .arg(&sock)
                .args(["--filter=cow", "file"])
                .arg(&ds.raw);
            Peer::start(&mut c, &sock, "nbdkit cow")?
        }
        _ => {
            let mut c = Command::new("nbdkit");
            c.args(["-f", "--exit-with-parent", "-U"])
                .arg(&sock)
                .args(["memory", "4G"]);
            Peer::start(&mut c, &sock, "nbdkit memory")?
        }
    };
    let uri = unix_uri(&sock);
    prefill(&uri, ws)?;
    cfg.loads.sample();
    let iops = fio_iops(&vdi_args(&uri, ws, cfg.iops_seconds));
    drop(p);
    if let Some(o) = overlay {
        let _ = std::fs::remove_file(o);
    }
    Ok(Ok(iops?))
}

/// fio io_uring O_DIRECT 4 KiB random writes at QD16 on a file in the overflow directory.
fn disk_ceiling(cfg: &Config) -> Result<f64> {
    let file = cfg.dir.join("ceiling.dat");
    let r = fio_iops(&[
        "--name=disk".into(),
        format!("--filename={}", file.display()),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        "--size=1G".into(),
        format!("--runtime={}", cfg.iops_seconds),
        "--time_based".into(),
        "--output-format=json".into(),
    ]);
    let _ = std::fs::remove_file(file);
    r
}

const PEERS: [&str; 3] = [
    "qemu-nbd qcow2 (disk)",
    "qemu-nbd qcow2 (/dev/shm)",
    "nbdkit cow",
];
const MODES: [CacheMode; 6] = CacheMode::ALL;

fn show(c: &Case) -> String {
    match c {
        Ok(v) => format!("{v:.0}"),
        Err(why) => why.clone(),
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

/// Runs every case and renders the section.
///
/// # Errors
/// Certificates, a server, the agent or fio failing.
pub fn target_bench(cfg: &Config, ds: &DataSet) -> Result<String> {
    let certs = make_cert_dir(&cfg.dir.join("target-tls-certs"))?;
    let r = client_tls(&certs).and_then(|client| {
        let tls = Tls {
            certs: certs.clone(),
            client,
        };
        run_cases(cfg, ds, &tls)
    });
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&certs);
    }
    r
}

fn run_cases(cfg: &Config, ds: &DataSet, tls: &Tls) -> Result<String> {
    let mut rows: Vec<(String, Vec<Case>)> = Vec::new();
    // Diagnostics: FERRY_BENCH_TARGET_MODES=ram,disk runs only those modes, and no peers.
    let only: Option<Vec<String>> = std::env::var("FERRY_BENCH_TARGET_MODES")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    // Modes: private last (it writes the golden image itself).
    for mode in MODES {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|m| m == mode.cli_name()))
        {
            continue;
        }
        // Plain and TLS interleaved, so that both see the same load.
        let (mut plain, mut over_tls) = (Vec::new(), Vec::new());
        for ws in WORKING_SETS {
            for (with, v) in [(None, &mut plain), (Some(tls), &mut over_tls)] {
                let c = target_case(cfg, ds, mode, ws, with)?;
                note(&format!(
                    "target {}{} ws {} GiB: {}",
                    mode.cli_name(),
                    if with.is_some() { TLS_SUFFIX } else { "" },
                    ws >> 30,
                    show(&c)
                ));
                v.push(c);
            }
        }
        let label = format!("ferry target `{}`", mode.cli_name());
        rows.push((format!("{label}{TLS_SUFFIX}"), over_tls));
        rows.insert(rows.len() - 1, (label, plain));
    }
    if only.is_some() {
        return Ok(render(cfg, &rows, 0.0));
    }
    for peer in PEERS.into_iter().chain(["nbdkit memory (ceiling)"]) {
        let mut v = Vec::new();
        for ws in WORKING_SETS {
            let c = peer_case(cfg, ds, peer, ws)?;
            note(&format!(
                "target peer {peer} ws {} GiB: {}",
                ws >> 30,
                show(&c)
            ));
            v.push(c);
        }
        rows.push((peer.to_string(), v));
    }
    let disk = disk_ceiling(cfg)?;
    note(&format!("target disk ceiling: {disk:.0} IOPS"));
    Ok(render(cfg, &rows, disk))
}

fn render(cfg: &Config, rows: &[(String, Vec<Case>)], disk: f64) -> String {
    let get = |name: &str, i: usize| -> f64 {
        rows.iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v[i].as_ref().ok().copied())
            .unwrap_or(0.0)
    };
    let memory = get("nbdkit memory (ceiling)", 0);
    let best_peer = PEERS.iter().map(|p| get(p, 0)).fold(0.0, f64::max);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Target write caches (target)\n\n\
         The VDI workload against `ferry target`'s unix-socket export (the agent in the \
         harness's process, attached over loopback NBD to `ferry-bench serve-internal` serving \
         a {:.2} GiB random-data vDisk): `fio {}` after an untimed sequential 1 MiB prefill of \
         the working set, one {} s run per case, RAM cache 1 GiB, cache block 4 KiB, overflow \
         file in the work directory. Each mode runs twice per working set, interleaved: over \
         plain NBD, and *over TLS* (the server requiring `NBD_OPT_STARTTLS`, rustls on both \
         sides, the agent presenting an administrator's client certificate of a throwaway farm \
         CA, as `ferry target --tls-dir` does). Peers and the `nbdkit memory` ceiling serve the same \
         data (raw) on unix sockets with the same workload; the disk ceiling is `fio \
         --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k --iodepth=16` on a 1 GiB file \
         in the work directory. IOPS are reads + writes.\n",
        GOLDEN_BYTES as f64 / (1u64 << 30) as f64,
        vdi_args("nbd+unix:///?socket=S", 1 << 30, cfg.iops_seconds)[3..10].join(" "),
        cfg.iops_seconds,
    );
    out.push_str("| export | IOPS, 1 GiB working set | IOPS, 2 GiB working set | ÷ nbdkit memory (1 GiB) |\n|---|---:|---:|---:|\n");
    for (name, v) in rows {
        let ratio = v[0]
            .as_ref()
            .map(|x| format!("{:.2}", x / memory.max(1.0)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {ratio} |",
            show(&v[0]),
            show(&v[1])
        );
    }
    let _ = writeln!(
        out,
        "| fio io_uring O_DIRECT (disk ceiling) | {disk:.0} | | |\n"
    );
    if let Some((min, mean, max)) = cfg.loads.summary() {
        let _ = writeln!(
            out,
            "Machine as in *Machine and conditions*, {} CPUs. The 1-minute load as the timed \
             runs started was {min:.1} / {mean:.1} / {max:.1} (min / mean / max): the clients, \
             the agent, the server and the peers share those CPUs with whatever else runs, so \
             compare the ratios of one run, not absolute figures across runs.\n",
            crate::sys::cpus()
        );
    }
    let ram = get("ferry target `ram`", 0);
    let dsk = get("ferry target `disk`", 0);
    let (ro1, ro2) = (
        get("ferry target `ram-overflow`", 0),
        get("ferry target `ram-overflow`", 1),
    );
    let ceiling = disk.min(memory);
    let q1 = ram / best_peer.max(1.0);
    let q2 = ram / memory.max(1.0);
    let q3 = dsk / ceiling.max(1.0);
    let q4 = ro2 / ro1.max(1.0);
    let _ = writeln!(
        out,
        "- `ram` ÷ best peer = **{q1:.2}** (goal ≥ {GOAL_RAM_VS_PEERS}: {})\n\
         - `ram` ÷ nbdkit memory = **{q2:.2}** (goal ≥ {GOAL_RAM_VS_MEMORY}: {})\n\
         - `disk` ÷ min(disk ceiling, nbdkit memory) = **{q3:.2}** (goal ≥ \
         {GOAL_DISK_VS_CEILING}: {})\n\
         - `ram-overflow` 2 GiB ÷ 1 GiB = **{q4:.2}** (goal ≥ {GOAL_OVERFLOW_2G_VS_1G}: {})\n",
        verdict(q1 >= GOAL_RAM_VS_PEERS),
        verdict(q2 >= GOAL_RAM_VS_MEMORY),
        verdict(q3 >= GOAL_DISK_VS_CEILING),
        verdict(q4 >= GOAL_OVERFLOW_2G_VS_1G),
    );
    render_tls(rows, &mut out);
    out
}

/// TLS ÷ plain per mode and working set, from the rows of [`run_cases`]: the table, and
/// the lowest ratio against [`GOAL_TLS_VS_PLAIN`].
fn render_tls(rows: &[(String, Vec<Case>)], out: &mut String) {
    let _ = writeln!(
        out,
        "| workload | TLS ÷ plain, 1 GiB working set | TLS ÷ plain, 2 GiB working set |\n\
         |---|---:|---:|"
    );
    let mut lowest: Option<f64> = None;
    for (name, tls) in rows {
        let Some(plain_name) = name.strip_suffix(TLS_SUFFIX) else {
            continue;
        };
        let Some((_, plain)) = rows.iter().find(|(n, _)| n == plain_name) else {
            continue;
        };
        let cells: Vec<String> = plain
            .iter()
            .zip(tls)
            .map(|(p, t)| match tls_ratio(p, t) {
                Some(q) => {
                    lowest = Some(lowest.map_or(q, |l| l.min(q)));
                    format!("{q:.2}")
                }
                None => "n/a".into(),
            })
            .collect();
        let _ = writeln!(out, "| {plain_name} | {} |", cells.join(" | "));
    }
    match lowest {
        Some(q) => {
            let _ = writeln!(
                out,
                "\n- TLS ÷ plain, lowest over the workloads = **{q:.2}** (goal ≥ \
                 {GOAL_TLS_VS_PLAIN}: {})\n",
                verdict(q >= GOAL_TLS_VS_PLAIN)
            );
        }
        None => out.push_str("\n- TLS ÷ plain: no workload ran both ways\n\n"),
    }
}

/// A TLS case's IOPS ÷ its plain twin's; `None` when either did not run.
fn tls_ratio(plain: &Case, tls: &Case) -> Option<f64> {
    match (plain, tls) {
        (Ok(p), Ok(t)) if *p > 0.0 => Some(t / p),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, v: [Case; 2]) -> (String, Vec<Case>) {
        (name.to_string(), v.to_vec())
    }

    #[test]
    fn tls_ratio_needs_both_cases_and_a_plain_figure() {
        assert_eq!(tls_ratio(&Ok(100.0), &Ok(80.0)), Some(0.8));
        assert_eq!(tls_ratio(&Ok(0.0), &Ok(80.0)), None);
        assert_eq!(tls_ratio(&Err("n/a".into()), &Err("n/a".into())), None);
    }

    #[test]
    fn the_tls_table_pairs_each_mode_with_its_plain_twin_and_judges_the_lowest() {
        let rows = [
            row("ferry target `ram`", [Ok(1000.0), Err("n/a".into())]),
            row(
                "ferry target `ram` over TLS",
                [Ok(900.0), Err("n/a".into())],
            ),
            row("ferry target `disk`", [Ok(500.0), Ok(400.0)]),
            row("ferry target `disk` over TLS", [Ok(350.0), Ok(400.0)]),
            row("nbdkit cow", [Ok(700.0), Ok(600.0)]),
        ];
        let mut out = String::new();
        render_tls(&rows, &mut out);
        assert!(out.contains("| ferry target `ram` | 0.90 | n/a |"), "{out}");
        assert!(
            out.contains("| ferry target `disk` | 0.70 | 1.00 |"),
            "{out}"
        );
        assert!(!out.contains("nbdkit"), "{out}");
        assert!(out.contains("**0.70** (goal ≥ 0.8: **not met**)"), "{out}");
    }
}
