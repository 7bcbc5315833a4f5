//! `bootstorm`: the synthesized boot trace replayed by 1, 10, 100 concurrent fio processes
//! against Ferry and nbdkit, with per-client completion, server CPU and store bytes ÷
//! unique bytes.

use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};

use super::bootstorm_sets::{Mode, StormRow};
use super::harness::{
    DataSet, GOAL_VS_PEERS, Kind, NbdConfig, Server, fio_json, make_data_set, percentile,
    remove_data_set, verdict,
};
use super::trace::{BOOT_TRACE_BYTES, BOOT_TRACE_READS, Trace, synthesize, write_iolog};
use crate::{Config, note};

/// Goal from the issue: the store read at most this much more than the trace's unique bytes.
const GOAL_STORE_OVER_UNIQUE: f64 = 1.05;
/// PVS's published figure per server: 500 boots in 5 minutes.
const PVS_BOOTS_PER_MIN: f64 = 100.0;

const BOOT_NAME: &str = "boot";

impl StormRow {
    fn boots_per_min(&self) -> f64 {
        self.clients as f64 / self.makespan * 60.0
    }
}

/// Starts one fio replay of `log` per URI, all at once (outputs `DIR/TAG-fio-I.json`), and
/// waits for them: each client's completion time, the makespan (seconds from the first
/// start) and the output files, for [`check_replays`].
pub(crate) fn replay_at_once(
    dir: &Path,
    tag: &str,
    uris: &[String],
    log: &Path,
) -> Result<(Vec<f64>, f64, Vec<PathBuf>)> {
    let outs: Vec<PathBuf> = (0..uris.len())
        .map(|i| dir.join(format!("{tag}-fio-{i}.json")))
        .collect();
    let t0 = Instant::now();
    let mut procs = Vec::with_capacity(uris.len());
    for (uri, out) in uris.iter().zip(&outs) {
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
    let mut completion = Vec::with_capacity(uris.len());
    let mut makespan: f64 = 0.0;
    for w in waiters {
        let (c, e) = w.join().map_err(|_| anyhow!("waiter panicked"))??;
        completion.push(c);
        makespan = makespan.max(e);
    }
    Ok((completion, makespan, outs))
}

/// Checks that every replay in `outs` read the whole trace (`total_bytes`), and removes
/// the output files.
pub(crate) fn check_replays(outs: &[PathBuf], total_bytes: u64) -> Result<()> {
    for out in outs {
        let v = fio_json(&std::fs::read_to_string(out)?)?;
        let got = v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0);
        if got != total_bytes {
            bail!("a replay read {got} bytes, the trace holds {total_bytes}");
        }
        let _ = std::fs::remove_file(out);
    }
    Ok(())
}

/// Records the data set's boot set if it has none: one boot (one client) on a server with
/// boot sets on, which keeps the set beside the version when the boot ends (untimed).
fn learn(cfg: &Config, ds: &DataSet, t: &Trace, log: &Path) -> Result<()> {
    let set = server::boot_sets::set_path(&ds.vhdx);
    if set.exists() {
        return Ok(());
    }
    let srv = Server::start_boot_sets(ds)?;
    cfg.cache.drop_now();
    let (_, _, outs) = replay_at_once(&cfg.dir, "learn", &[srv.uri(ds)], log)?;
    let usage = srv.stop()?;
    check_replays(&outs, t.total_bytes)?;
    if !set.exists() || usage.boots_recorded != Some(1) {
        bail!(
            "the first boot recorded no boot set ({} missing, {:?} recorded)",
            set.display(),
            usage.boots_recorded
        );
    }
    note(&format!(
        "bootstorm: first boot recorded {} ({} bytes)",
        set.display(),
        std::fs::metadata(&set).map_or(0, |m| m.len())
    ));
    Ok(())
}

fn storm(
    cfg: &Config,
    ds: &DataSet,
    t: &Trace,
    log: &Path,
    mode: Mode,
    clients: usize,
) -> Result<StormRow> {
    let kind = mode.kind();
    let srv = match mode {
        Mode::FerryBootSet => {
            learn(cfg, ds, t, log)?;
            Server::start_boot_sets(ds)?
        }
        Mode::Ferry | Mode::Nbdkit => Server::start(kind, ds)?,
    };
    cfg.cache.drop_now();
    cfg.loads.sample();
    let uri = srv.uri(ds);
    let before = srv.usage();
    let uris = vec![uri; clients];
    let (completion, makespan, outs) = replay_at_once(&cfg.dir, "boot", &uris, log)?;
    let after = srv.usage();
    let mut usage = srv.stop()?;
    usage.cpu_secs = after.cpu_secs - before.cpu_secs;
    usage.disk_read_bytes = after.disk_read_bytes - before.disk_read_bytes;
    check_replays(&outs, t.total_bytes)?;
    let row = StormRow {
        kind,
        mode,
        clients,
        completion,
        makespan,
        usage,
    };
    note(&format!(
        "bootstorm {} × {clients}: p50 {:.2} s, p99 {:.2} s, {:.0} boots/min, CPU {:.1} s, store {:.0} MB",
        mode.label(),
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
        for mode in [Mode::Ferry, Mode::Nbdkit, Mode::FerryBootSet] {
            rows.push(storm(cfg, &ds, &t, &log, mode, c)?);
        }
    }
    let _ = std::fs::remove_file(server::boot_sets::set_path(&ds.vhdx));
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
            r.mode.label(),
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
    super::bootstorm_sets::render_goals(&mut out, n, t, rows);
    // Goals at the largest client count.
    let Some(&top) = n.boot_clients.iter().max() else {
        return out;
    };
    let f = rows
        .iter()
        .find(|r| r.clients == top && r.mode == Mode::Ferry);
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
