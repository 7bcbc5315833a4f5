//! The boot storm over one server and over three (issue 20): the bootstorm section's
//! synthesized trace replayed by [`STORM_CLIENTS`] concurrent fio processes, once against
//! one `ferry-bench serve-internal` and once against three serving the same store, clients
//! assigned round-robin (what a farm's least-loaded login order does with a storm of equal
//! devices). Reported: boots per minute, the ratio 3 ÷ 1, and the servers' CPU-seconds per
//! boot (utime + stime of every server process, summed).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::bootstorm::{check_replays, replay_at_once};
use super::harness::{DataSet, Kind, NbdConfig, Server, make_data_set, percentile};
use super::harness::{remove_data_set, verdict};
use super::trace::{BOOT_TRACE_BYTES, BOOT_TRACE_READS, Trace, synthesize, write_iolog};
use crate::{Config, note};

/// Clients of each storm (a multiple of three, so each of three servers gets as many).
pub const STORM_CLIENTS: usize = 30;
/// Server counts compared.
const SERVER_COUNTS: [usize; 2] = [1, 3];
const NAME: &str = "boot";

/// One storm over `servers` servers.
#[derive(Debug, Clone)]
pub struct MultiRow {
    pub servers: usize,
    pub clients: usize,
    pub completion: Vec<f64>,
    pub makespan: f64,
    /// utime + stime of every server over the storm, summed.
    pub cpu_secs: f64,
}

impl MultiRow {
    pub fn boots_per_min(&self) -> f64 {
        self.clients as f64 / self.makespan * 60.0
    }

    pub fn cpu_per_boot(&self) -> f64 {
        self.cpu_secs / self.clients as f64
    }
}

fn storm(cfg: &Config, ds: &DataSet, t: &Trace, log: &Path, servers: usize) -> Result<MultiRow> {
    let srvs = (0..servers)
        .map(|_| Server::start(Kind::Ferry, ds))
        .collect::<Result<Vec<_>>>()?;
    cfg.cache.drop_now();
    cfg.loads.sample();
    let before: f64 = srvs.iter().map(|s| s.usage().cpu_secs).sum();
    let uris: Vec<String> = (0..STORM_CLIENTS)
        .map(|i| srvs[i % servers].uri(ds))
        .collect();
    let (completion, makespan, outs) = replay_at_once(&cfg.dir, "multi", &uris, log)?;
    let after: f64 = srvs.iter().map(|s| s.usage().cpu_secs).sum();
    for s in srvs {
        s.stop()?;
    }
    check_replays(&outs, t.total_bytes)?;
    let row = MultiRow {
        servers,
        clients: STORM_CLIENTS,
        completion,
        makespan,
        cpu_secs: after - before,
    };
    note(&format!(
        "multi: {STORM_CLIENTS} boots over {servers} server(s): {:.0} boots/min, p99 {:.2} s, \
         server CPU {:.1} s ({:.2} per boot)",
        row.boots_per_min(),
        percentile(&row.completion, 99.0),
        row.cpu_secs,
        row.cpu_per_boot()
    ));
    Ok(row)
}

/// The storm over one server and over three; returns the subsection's Markdown.
///
/// # Errors
/// A server or fio failing, or a replay reading less than the trace.
pub fn multi_storm(cfg: &Config, n: &NbdConfig) -> Result<String> {
    let reads = ((BOOT_TRACE_READS as f64) * n.boot_scale).round().max(10.0) as u64;
    let bytes = ((BOOT_TRACE_BYTES as f64) * n.boot_scale).round() as u64;
    let t = synthesize(n.boot_disk_bytes, reads, bytes, cfg.seed ^ 0xb007);
    let log = cfg.dir.join("multi-trace.iolog");
    write_iolog(&t, &log)?;
    let ds = make_data_set(cfg, NAME, n.boot_disk_bytes, cfg.seed ^ 0xb0)?;
    // Runs interleaved (1, 3, 1, 3, ...), so both counts meet the same background load.
    let rows = (0..cfg.runs)
        .flat_map(|_| SERVER_COUNTS)
        .map(|s| storm(cfg, &ds, &t, &log, s))
        .collect::<Result<Vec<_>>>();
    remove_data_set(cfg, &ds);
    let _ = std::fs::remove_file(&log);
    Ok(render(&t, &rows?, cfg.runs))
}

/// Lowest and highest of a figure over runs.
type Range = (f64, f64);

/// The median storm of `servers` servers by boots per minute, and the range of boots per
/// minute and of CPU-s per boot over its runs.
fn summary(rows: &[MultiRow], servers: usize) -> Option<(MultiRow, Range, Range)> {
    let mut of: Vec<&MultiRow> = rows.iter().filter(|r| r.servers == servers).collect();
    of.sort_by(|a, b| a.boots_per_min().total_cmp(&b.boots_per_min()));
    let mid = (*of.get(of.len() / 2)?).clone();
    let range = |f: fn(&MultiRow) -> f64| {
        of.iter()
            .map(|r| f(r))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    Some((
        mid,
        range(MultiRow::boots_per_min),
        range(MultiRow::cpu_per_boot),
    ))
}

fn render(t: &Trace, rows: &[MultiRow], runs: u32) -> String {
    let mut out = String::new();
    let cpus = crate::sys::cpus();
    let _ = writeln!(
        out,
        "### Boot storm over 1 and 3 servers\n\n\
         The bootstorm section's trace ({} reads, {:.1} MB, the same seed and vDisk), replayed \
         by {STORM_CLIENTS} fio clients at once (`--read_iolog`, queue depth 1, no think \
         time), once against one `ferry-bench serve-internal` and once against three serving \
         the same store directory, each with its own block cache, clients assigned \
         round-robin (10 per server: what the farm's least-loaded login order does with a \
         storm of equal devices). Page cache dropped and fresh servers before each storm; \
         {runs} runs of each, interleaved (1, 3, 1, 3, ...); the median run by boots/min \
         shown, with the range over the runs. \
         Server CPU is utime + stime of every server process over the storm, summed. **All \
         the servers and all {STORM_CLIENTS} clients share this machine's {cpus} CPUs**: \
         three servers here add no CPU and no disk, only separate caches (each reads the \
         trace's unique bytes from the store once), so the ratio shows what splitting costs \
         or saves, not what three machines would carry; CPU-seconds per boot is the figure \
         that carries over.\n",
        t.reads.len(),
        t.total_bytes as f64 / 1e6,
    );
    out.push_str(
        "| servers | clients | p50 s | p99 s | boots/min (min–max) | server CPU s (sum) | CPU s per boot (min–max) |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let one = summary(rows, 1);
    let three = summary(rows, 3);
    for (r, (blo, bhi), (clo, chi)) in one.iter().chain(three.iter()) {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.0} ({blo:.0}–{bhi:.0}) | {:.1} | {:.2} ({clo:.2}–{chi:.2}) |",
            r.servers,
            r.clients,
            percentile(&r.completion, 50.0),
            percentile(&r.completion, 99.0),
            r.boots_per_min(),
            r.cpu_secs,
            r.cpu_per_boot(),
        );
    }
    out.push('\n');
    if let (Some((one, ..)), Some((three, ..))) = (one, three) {
        let ratio = three.boots_per_min() / one.boots_per_min();
        let cpu = three.cpu_per_boot() / one.cpu_per_boot();
        let at = cpus as f64 * 60.0 / three.cpu_per_boot();
        let _ = writeln!(
            out,
            "- scaling, boots/min over 3 servers ÷ over 1: **{ratio:.2}** on one {cpus}-CPU \
             machine (splitting costs nothing if ≥ 0.9: {})\n\
             - server CPU-seconds per boot, 3 servers ÷ 1: **{cpu:.2}** ({:.2} vs {:.2}: each \
             server fills its own cache)\n\
             - at {:.2} CPU-s per boot, each server machine with {cpus} CPUs for the server \
             alone would carry about {at:.0} boots/min of this trace, so three such machines \
             about {:.0} (an extrapolation from CPU time, not a measurement)\n",
            verdict(ratio >= 0.9),
            three.cpu_per_boot(),
            one.cpu_per_boot(),
            three.cpu_per_boot(),
            3.0 * at,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(servers: usize, makespan: f64, cpu_secs: f64) -> MultiRow {
        MultiRow {
            servers,
            clients: 30,
            completion: vec![makespan],
            makespan,
            cpu_secs,
        }
    }

    #[test]
    fn summary_takes_the_median_run_of_a_count_and_its_ranges() {
        // 30 boots in 60 s = 30/min, in 90 s = 20/min, in 45 s = 40/min.
        let rows = [
            row(1, 60.0, 30.0),
            row(3, 10.0, 300.0),
            row(1, 90.0, 60.0),
            row(1, 45.0, 15.0),
        ];
        let (mid, boots, cpu) = summary(&rows, 1).unwrap();
        assert_eq!(mid.boots_per_min(), 30.0);
        assert_eq!(boots, (20.0, 40.0));
        assert_eq!(cpu, (0.5, 2.0));
        assert!(summary(&rows, 2).is_none());
    }
}
