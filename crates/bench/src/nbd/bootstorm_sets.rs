//! The boot-set rows of `bootstorm` (issue 21): what the section says about them and the
//! goals it checks. The rows themselves are run by `bootstorm.rs` (mode
//! `ferry + boot set`): the version's first boot is replayed once, untimed, on a Ferry
//! server with boot sets on, which records the set beside the version; each timed scenario
//! then starts a fresh server (page cache dropped) whose first connection starts the
//! prefetch of that set into the block cache, PREFETCH_DEPTH reads deep, in boot order.

use std::fmt::Write as _;

use super::harness::{Kind, NbdConfig, Usage, percentile, verdict};
use super::trace::Trace;

/// How a scenario's server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Ferry as before boot sets (none recorded, none prefetched).
    Ferry,
    /// nbdkit's file plugin.
    Nbdkit,
    /// Ferry with the version's boot set, recorded by an earlier boot on another server
    /// process: the second boot of the version.
    FerryBootSet,
}

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Ferry => "ferry",
            Mode::Nbdkit => "nbdkit",
            Mode::FerryBootSet => "ferry + boot set",
        }
    }

    pub(crate) fn kind(self) -> Kind {
        match self {
            Mode::Nbdkit => Kind::Nbdkit,
            Mode::Ferry | Mode::FerryBootSet => Kind::Ferry,
        }
    }
}

/// One boot-storm scenario on one server.
#[derive(Debug, Clone)]
pub struct StormRow {
    pub kind: Kind,
    pub mode: Mode,
    pub clients: usize,
    /// Seconds of each client, start to exit.
    pub completion: Vec<f64>,
    /// Until the last client finished.
    pub makespan: f64,
    pub usage: Usage,
}

/// Appends the explanation of the boot-set rows and their goals: one client's second boot
/// against nbdkit (time) and against the unique bytes (store reads); 10 and 100 clients
/// against today's Ferry.
pub(crate) fn render_goals(out: &mut String, n: &NbdConfig, t: &Trace, rows: &[StormRow]) {
    let _ = writeln!(
        out,
        "*ferry + boot set* is the **second boot** of the version: its first boot was \
         replayed once (untimed) on a Ferry server with boot sets on, which recorded the \
         reads of that connection's boot window and kept the set beside the version \
         (`boot.vhdx.bootset`, docs/boot-sets.md). Each such row then starts a fresh server \
         with the page cache dropped; the first connection's open starts one prefetch of \
         the set into the block cache ({} reads in flight, in boot order, contiguous runs \
         read at once), racing the boot; the store read includes it. *ferry* is today's \
         Ferry (boot sets off). The replay is the same trace, so the set is exactly what \
         the boot will read; a real second boot differs a little from the first.\n",
        server::boot_sets::PREFETCH_DEPTH
    );
    let u = t.unique_bytes as f64;
    let find = |c: usize, m: Mode| rows.iter().find(|r| r.clients == c && r.mode == m);
    let _ = writeln!(out, "Goals of the boot set (issue 21):\n");
    if let (Some(b), Some(k)) = (find(1, Mode::FerryBootSet), find(1, Mode::Nbdkit)) {
        let (bt, kt) = (
            percentile(&b.completion, 50.0),
            percentile(&k.completion, 50.0),
        );
        let q = bt / kt;
        let _ = writeln!(
            out,
            "- one client, cold server, second boot: ferry + boot set {bt:.2} s vs nbdkit \
             {kt:.2} s (ferry ÷ nbdkit = **{q:.2}**; goal ≤ {GOAL_RATIO:.1}: {})",
            verdict(q <= GOAL_RATIO),
        );
        if let Some(s) = b.usage.store_read_bytes {
            let r = s as f64 / u;
            let _ = writeln!(
                out,
                "- its store bytes ÷ unique bytes: **{r:.3}** (prefetch {:.0} MB of {:.0} MB; \
                 goal ≤ {GOAL_STORE:.2}: {})",
                b.usage.prefetch_bytes.unwrap_or(0) as f64 / 1e6,
                s as f64 / 1e6,
                verdict(r <= GOAL_STORE)
            );
        }
    }
    for &c in n.boot_clients.iter().filter(|&&c| c > 1) {
        let (Some(b), Some(f)) = (find(c, Mode::FerryBootSet), find(c, Mode::Ferry)) else {
            continue;
        };
        let (bp, fp) = (
            percentile(&b.completion, 99.0),
            percentile(&f.completion, 99.0),
        );
        let store = b
            .usage
            .store_read_bytes
            .map_or("–".into(), |s| format!("{:.3}", s as f64 / u));
        let _ = writeln!(
            out,
            "- {c} clients: p99 ferry + boot set {bp:.2} s vs today's ferry {fp:.2} s \
             (÷ = **{:.2}**; goal: no slower: {}); store ÷ unique {store}",
            bp / fp,
            verdict(bp <= fp * SLOWER_TOLERANCE)
        );
    }
    out.push('\n');
}

/// Issue 21's goals, named where they are checked.
const GOAL_RATIO: f64 = 0.8;
const GOAL_STORE: f64 = 1.1;
/// "No slower" allows this much noise between two runs of the same storm.
const SLOWER_TOLERANCE: f64 = 1.05;
