//! The Markdown report: measured rows in, one document out (printed, and with `--out` written
//! over docs/BENCHMARKS.md). Rendering only; nothing here measures.

use std::fmt::Write as _;

use crate::data::{MergeSetup, RawSummary};
use crate::sys::{CacheDrop, Machine};

/// Goals from the issue: ferry ÷ qemu-img at least 1.0 (aim 1.2), ferry ÷ cp at least 0.8.
const GOAL_VS_QEMU: f64 = 1.0;
const AIM_VS_QEMU: f64 = 1.2;
const GOAL_VS_CP: f64 = 0.8;

/// Every timed run of one tool in one copy benchmark.
#[derive(Debug, Clone)]
pub struct CopyRun {
    /// "ferry", "qemu-img" or "cp".
    pub tool: &'static str,
    /// What was run.
    pub command: String,
    /// Virtual size of the disk copied (for `cp`, the apparent size of the file).
    pub virtual_bytes: u64,
    /// Seconds of each run, fsync included.
    pub secs: Vec<f64>,
    /// Bytes the output file had allocated after each run.
    pub written_bytes: Vec<u64>,
    /// Bytes read from storage (not the page cache) during each run.
    pub disk_read_bytes: Vec<u64>,
}

impl CopyRun {
    /// A tool with no runs yet.
    pub fn new(tool: &'static str, command: &str, virtual_bytes: u64) -> CopyRun {
        CopyRun {
            tool,
            command: command.into(),
            virtual_bytes,
            secs: vec![],
            written_bytes: vec![],
            disk_read_bytes: vec![],
        }
    }

    /// Records one run.
    pub fn add(&mut self, secs: f64, written_bytes: u64, disk_read_bytes: u64) {
        self.secs.push(secs);
        self.written_bytes.push(written_bytes);
        self.disk_read_bytes.push(disk_read_bytes);
    }

    /// The median run's seconds.
    pub fn secs_median(&self) -> f64 {
        let mut s = self.secs.clone();
        s.sort_by(f64::total_cmp);
        s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
    }

    fn written(&self) -> u64 {
        self.written_bytes.last().copied().unwrap_or(0)
    }

    /// Written bytes per second (10^6) of the median run.
    pub fn written_mb_s(&self) -> f64 {
        self.written() as f64 / 1e6 / self.secs_median()
    }

    fn virtual_mb_s(&self) -> f64 {
        self.virtual_bytes as f64 / 1e6 / self.secs_median()
    }
}

/// One copy benchmark's rows, ferry first.
#[derive(Debug, Clone)]
pub struct CopyTable {
    /// ferry, qemu-img, cp.
    pub runs: Vec<CopyRun>,
}

impl CopyTable {
    fn get(&self, tool: &str) -> Option<&CopyRun> {
        self.runs.iter().find(|r| r.tool == tool)
    }

    /// ferry's written-bytes throughput ÷ `tool`'s.
    pub fn ratio(&self, tool: &str) -> Option<f64> {
        Some(self.get("ferry")?.written_mb_s() / self.get(tool)?.written_mb_s())
    }

    fn render(&self, out: &mut String) {
        let ferry = self.get("ferry");
        out.push_str(
            "| tool | seconds | virtual MB/s | read from disk MB | written MB | written MB/s \
             | ferry ÷ tool (written MB/s) | speed-up (tool s ÷ ferry s) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.runs {
            let secs = match r.secs.len() {
                0 | 1 => format!("{:.2}", r.secs_median()),
                _ => {
                    let lo = r.secs.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = r.secs.iter().copied().fold(0.0, f64::max);
                    format!("{:.2} ({lo:.2}–{hi:.2})", r.secs_median())
                }
            };
            let (ratio, speedup) = match ferry {
                Some(f) => (
                    format!("{:.2}", f.written_mb_s() / r.written_mb_s()),
                    format!("{:.2}", r.secs_median() / f.secs_median()),
                ),
                None => ("–".into(), "–".into()),
            };
            let _ = writeln!(
                out,
                "| {} | {secs} | {:.0} | {:.0} | {:.0} | {:.0} | {ratio} | {speedup} |",
                r.tool,
                r.virtual_mb_s(),
                r.disk_read_bytes.last().copied().unwrap_or(0) as f64 / 1e6,
                r.written() as f64 / 1e6,
                r.written_mb_s(),
            );
        }
        out.push_str("\nCommands:\n\n");
        for r in &self.runs {
            let _ = writeln!(out, "- {}: `{}`", r.tool, r.command);
        }
        out.push('\n');
        self.render_goals(out);
    }

    fn render_goals(&self, out: &mut String) {
        let verdict = |v: f64, goal: f64| if v >= goal { "met" } else { "**not met**" };
        if let Some(q) = self.ratio("qemu-img") {
            let _ = writeln!(
                out,
                "- ferry ÷ qemu-img = **{q:.2}** (goal ≥ {GOAL_VS_QEMU:.1}: {}; aim {AIM_VS_QEMU:.1}: {})",
                verdict(q, GOAL_VS_QEMU),
                verdict(q, AIM_VS_QEMU),
            );
        }
        if let Some(c) = self.ratio("cp") {
            let _ = writeln!(
                out,
                "- ferry ÷ cp = **{c:.2}** of cp's written-bytes throughput (goal ≥ {GOAL_VS_CP:.1}: {})",
                verdict(c, GOAL_VS_CP),
            );
        }
        out.push('\n');
    }
}

/// One IOPS workload.
#[derive(Debug, Clone)]
pub struct IopsRow {
    /// "randread 4 KiB, cold cache" and the like.
    pub workload: String,
    /// Operations per second through the library.
    pub ferry_iops: f64,
    /// fio's operations per second on a plain file.
    pub fio_iops: f64,
    /// Seconds of Ferry's closing commit after the timed window.
    pub close_secs: f64,
    /// Bytes Ferry read from storage (not the page cache) in its timed window.
    pub ferry_disk_read_bytes: u64,
    /// Bytes fio read from storage in its run.
    pub fio_disk_read_bytes: u64,
    /// The fio command line (file name elided).
    pub fio_command: String,
}

/// The IOPS benchmark's rows.
#[derive(Debug, Clone)]
pub struct IopsTable {
    /// randread, randwrite.
    pub rows: Vec<IopsRow>,
    /// Worker threads (fio jobs).
    pub threads: usize,
    /// Seconds per run.
    pub seconds: u64,
}

impl IopsTable {
    fn render(&self, out: &mut String) {
        out.push_str(
            "| workload | ferry IOPS | fio psync IOPS (plain file) | ferry ÷ fio \
             | read from disk MB (ferry / fio) | ferry closing commit (s, untimed) |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} | {:.2} |",
                r.workload,
                r.ferry_iops,
                r.fio_iops,
                r.ferry_iops / r.fio_iops,
                r.ferry_disk_read_bytes as f64 / 1e6,
                r.fio_disk_read_bytes as f64 / 1e6,
                r.close_secs,
            );
        }
        out.push_str("\nCommands:\n\n");
        let mut shown: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !shown.contains(&r.fio_command.as_str()) {
                shown.push(&r.fio_command);
                let _ = writeln!(out, "- `{}`", r.fio_command);
            }
        }
        out.push('\n');
    }
}

/// Everything one run of the harness found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Facts about the machine.
    pub machine: Machine,
    /// Load averages when the run started and ended.
    pub load_start: String,
    /// See `load_start`.
    pub load_end: String,
    /// (min, mean, max) 1-minute load as the timed runs started.
    pub load_during: Option<(f64, f64, f64)>,
    /// CPUs of the machine.
    pub cpus: usize,
    /// Whether every timed run started from a cold page cache.
    pub cache: CacheDrop,
    /// The generated disk.
    pub raw: RawSummary,
    /// The seed of every generated byte and offset.
    pub seed: u64,
    /// Timed runs per tool.
    pub runs: u32,
    /// `--quick`.
    pub quick: bool,
    /// Capture raw → VHDX.
    pub capture: Option<CopyTable>,
    /// Merged base.
    pub merge: Option<(CopyTable, MergeSetup)>,
    /// IOPS on the 3-version chain, with a description of the chain.
    pub iops: Option<(IopsTable, String)>,
    /// The NBD sections (nbd-seq, nbd-iops, bootstorm), rendered by `nbd.rs`.
    pub nbd: Vec<String>,
    /// The NBD-over-TLS section (`nbd/tls.rs`), which carries its own conditions.
    pub tls: Option<String>,
    /// The target write-cache section (`target.rs`), which carries its own conditions.
    pub target: Option<String>,
    /// The several-servers section (`nbd/multi.rs`, `failover.rs`); its conditions line is
    /// added here.
    pub multi: Option<String>,
    /// The boot section (`boot.rs`), which carries its own conditions.
    pub boot: Option<String>,
    /// The devices-per-server section, whole.
    pub devices: Option<String>,
    /// Wall-clock minutes of the whole harness run.
    pub total_minutes: f64,
}

/// Merges the `## NBD`, `## Target` and `## Boot` sections of `new` into `old`, and its `## How to run`
/// (the harness's own text, the same for every run): a section replaces the one of the same
/// title in place, one without a match is appended; every other section of `old` is kept, so
/// a run of only some NBD benchmarks keeps the rest of the report.
pub fn merge_nbd_sections(old: &str, new: &str) -> String {
    fn sections(text: &str) -> Vec<&str> {
        let mut starts: Vec<usize> = text.match_indices("\n## ").map(|(i, _)| i + 1).collect();
        starts.insert(0, 0);
        starts.push(text.len());
        starts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
    }
    fn title(s: &str) -> &str {
        s.lines().next().unwrap_or("")
    }
    let fresh: Vec<&str> = sections(new)
        .into_iter()
        .filter(|s| {
            s.starts_with("## NBD")
                || s.starts_with("## Target")
                || s.starts_with("## Boot")
                || s.starts_with("## Several servers")
                || s.starts_with("## Devices")
                || s.starts_with("## How to run")
        })
        .collect();
    let mut used = vec![false; fresh.len()];
    let mut out = String::new();
    for s in sections(old) {
        match fresh.iter().position(|f| title(f) == title(s)) {
            Some(k) => {
                out.push_str(fresh[k]);
                used[k] = true;
            }
            None => out.push_str(s),
        }
        if !out.ends_with("\n\n") {
            out.push('\n');
        }
    }
    for (f, u) in fresh.iter().zip(used) {
        if !u {
            out.push_str(f);
        }
    }
    out
}

const HOW_TO_RUN: &str = "\
`./scripts/bench.sh` builds `ferry-bench` in release mode and runs `ferry-bench --out \
docs/BENCHMARKS.md`, which rewrites this file from its own output (never edit it by hand); a \
full run takes about 35 to 50 minutes. Options pass through: `--quick` (256 MiB disk, 2-second \
I/O runs: a smoke test), `--size 8G` (virtual disk size, default 4G), `--dir DIR` (work \
directory on the disk to measure; default a temporary directory under /var/tmp, removed \
afterwards; needs about 5× the disk size free), `--runs N` (timed runs per tool, default 3, \
median reported), `--threads N` and `--iops-seconds S` (random I/O workers and duration), \
`--only capture,merge,iops,nbd-seq,nbd-iops,bootstorm,target,nbd-tls,multi,boot,devices,s3,hostcache` \
(a run of only NBD, target, boot or devices sections merges them into the existing file instead of \
rewriting it; `--only multi` the boot storm over 1 and 3 servers and the failover stalls, about 8 \
minutes; `--only hostcache` the boot-set prefetch and the host read cache through the delaying \
relay (the trace scaled to at most 0.1), about 5 minutes with `--boot-disk-size 1G`; \
`--only target` runs the write-cache section alone, plain and over TLS, about 8 \
minutes; `--only nbd-tls` the TLS \
section alone, about 8 minutes; `--only boot` the QEMU boot section alone, about 15 to 25 \
minutes on 2 cores, with `--boot-runs N` (default 2) and `--boot-machines M` (default 4)), \
`--only s3` (cold reads through `ferry server` from a bucket on moto's S3 server, \
`FERRY_MOTO`, against a local store; `--nbd-size` sets its vDisk, default 1G, --quick 128M), \
`--nbd-size 2G`, `--boot-disk-size 4G`, \
`--boot-scale F` (boot trace size relative to 600 MB / 70,000 reads), `--boot-clients \
1,10,100`, `--only devices` (one `ferry server` carrying 512 and 4,095 devices, about 3 \
minutes; `--devices 512,4095`, `--device-rounds 4`, `--device-idle-seconds 10`), `--seed N`, `--no-verify` (skip the untimed `qemu-img \
compare`/`check` of Ferry's outputs), `--keep`, and `--out FILE` (write the report \
elsewhere). It needs qemu-img, fio and coreutils (and nbdkit, qemu-nbd and nbdcopy for the NBD \
sections; for the boot section root, qemu-system-x86_64, debootstrap, nbdkit, the release \
`ferry` binary beside `ferry-bench` or in `FERRY_BIN`, and the static boot agent, \
`FERRY_BOOT_AGENT`), and root to drop the page cache between runs \
(without root it still runs and says so below). Progress goes to stderr; run it on a quiet \
machine.";

impl Report {
    /// The whole Markdown document.
    pub fn render(&self) -> String {
        let mut out = String::from("# Ferry benchmarks\n\n## How to run\n\n");
        out.push_str(HOW_TO_RUN);
        out.push_str("\n\n");
        if self.raw.blocks > 0 {
            self.render_machine(&mut out);
            self.render_data(&mut out);
        }
        if let Some(t) = &self.capture {
            out.push_str("## Capture: raw → VHDX\n\n");
            out.push_str(
                "The same sparse raw file, captured by Ferry's library, converted by `qemu-img` \
                 to a dynamic VHDX with the same 32 MiB block size, and copied by `cp \
                 --sparse=always` (which also skips the holes). Throughput of bytes written is \
                 the output file's allocated bytes (`st_blocks × 512`) over the time.\n\n",
            );
            t.render(&mut out);
        }
        if let Some((t, setup)) = &self.merge {
            self.render_merge_intro(&mut out, setup);
            t.render(&mut out);
        }
        if let Some((t, chain)) = &self.iops {
            self.render_iops_intro(&mut out, t, chain);
            t.render(&mut out);
        }
        if !self.nbd.is_empty() {
            self.render_nbd_conditions(&mut out);
            for s in &self.nbd {
                out.push_str(s);
            }
        }
        if let Some(t) = &self.tls {
            out.push_str(t);
        }
        if let Some(t) = &self.target {
            out.push_str(t);
        }
        if let Some(m) = &self.multi {
            out.push_str("## Several servers (multi)\n\n");
            self.render_run_line(&mut out);
            out.push_str(m);
        }
        if let Some(t) = &self.boot {
            out.push_str(t);
        }
        if let Some(t) = &self.devices {
            out.push_str(t);
        }
        out
    }

    /// When, with what, and under which load a section that stands alone ran (the machine as
    /// in the other sections).
    fn render_run_line(&self, out: &mut String) {
        let row = |k: &str| {
            self.machine
                .rows
                .iter()
                .find(|(key, _)| key == k)
                .map_or("?", |(_, v)| v.as_str())
        };
        let _ = write!(
            out,
            "Run {} UTC, ferry {}, {} CPUs (the machine of *NBD serving: machine and \
             conditions*)",
            row("date (UTC)"),
            row("ferry"),
            self.cpus
        );
        match self.load_during {
            Some((min, mean, max)) => {
                let _ = writeln!(
                    out,
                    "; the 1-minute load as the timed runs started was {min:.1} / {mean:.1} / \
                     {max:.1} (min / mean / max){}.\n",
                    if mean > self.cpus as f64 {
                        ": **the machine was busy**, other processes competed for its CPUs"
                    } else {
                        ""
                    }
                );
            }
            None => out.push_str(".\n\n"),
        }
    }

    /// The NBD sections' own conditions, so they stand alone when merged into a report
    /// written by an earlier run.
    fn render_nbd_conditions(&self, out: &mut String) {
        out.push_str(
            "## NBD serving: machine and conditions\n\n\
             Ferry's NBD server runs in a child process of the harness (`ferry-bench \
             serve-internal --store DIR --port 0`: `nbd_server::Listener` over \
             `server::exports::Registry` and a `block_cache::BlockCache`, on a multi-threaded \
             tokio runtime), so its CPU time and storage reads are read from `/proc/PID/stat` \
             and `/proc/PID/io` like the peers'. Everything runs on this one machine: the \
             clients (nbdcopy, fio) share its CPUs with the server.\n\n| | |\n|---|---|\n",
        );
        for (k, v) in &self.machine.rows {
            let _ = writeln!(out, "| {k} | {v} |");
        }
        for (k, prog, args) in [
            ("nbdkit", "nbdkit", &["--version"][..]),
            ("qemu-nbd", "qemu-nbd", &["--version"][..]),
            ("nbdcopy", "nbdcopy", &["--version"][..]),
        ] {
            let _ = writeln!(out, "| {k} | {} |", crate::sys::tool_version(prog, args));
        }
        let _ = writeln!(
            out,
            "| load average at start / end | {} / {} |",
            self.load_start, self.load_end
        );
        if let Some((min, mean, max)) = self.load_during {
            let _ = writeln!(
                out,
                "| 1-min load as timed runs started (min / mean / max) | {min:.2} / {mean:.2} / {max:.2} |"
            );
        }
        let cache = match self.cache {
            CacheDrop::Dropped => "dropped before every timed run",
            CacheDrop::NotPermitted => {
                "**not dropped** (not permitted): runs may read cached bytes"
            }
        };
        let mode = if self.quick {
            "`--quick` smoke run (numbers are not meaningful)"
        } else {
            "full"
        };
        let _ = writeln!(out, "| page cache | {cache} |");
        let _ = writeln!(out, "| mode | {mode} |");
        let _ = writeln!(
            out,
            "| harness wall time | {:.1} min |\n",
            self.total_minutes
        );
        self.render_busy(out);
    }

    fn render_machine(&self, out: &mut String) {
        out.push_str("## Machine and conditions\n\n| | |\n|---|---|\n");
        for (k, v) in &self.machine.rows {
            let _ = writeln!(out, "| {k} | {v} |");
        }
        let _ = writeln!(
            out,
            "| load average at start (1, 5, 15 min) | {} |",
            self.load_start
        );
        let _ = writeln!(out, "| load average at end | {} |", self.load_end);
        if let Some((min, mean, max)) = self.load_during {
            let _ = writeln!(
                out,
                "| 1-min load as timed runs started (min / mean / max) | {min:.2} / {mean:.2} / {max:.2} |"
            );
        }
        let cache = match self.cache {
            CacheDrop::Dropped => "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before \
                                   every timed run: every tool reads from disk"
                .to_string(),
            CacheDrop::NotPermitted => "**not dropped** (writing /proc/sys/vm/drop_caches was \
                                        not permitted): runs may read cached bytes"
                .to_string(),
        };
        let _ = writeln!(out, "| page cache | {cache} |");
        let mode = if self.quick {
            "`--quick` smoke run (numbers are not meaningful)"
        } else {
            "full"
        };
        let _ = writeln!(
            out,
            "| mode | {mode}; {} timed run(s) per tool, median shown |",
            self.runs
        );
        let _ = writeln!(
            out,
            "| harness wall time | {:.1} min |\n",
            self.total_minutes
        );
        out.push_str(
            "Every copy run is timed from start to the end of an fsync of its output file, \
             so page-cache speed never counts as disk speed. MB is 10^6 bytes. \"Read from \
             disk\" is the storage I/O the kernel accounted to the run (`/proc/self/io` \
             `read_bytes`, children included), as opposed to page-cache hits.\n\n",
        );
        self.render_busy(out);
    }

    /// A warning when other work competed for the machine during the timed runs.
    fn render_busy(&self, out: &mut String) {
        let Some((_, mean, max)) = self.load_during else {
            return;
        };
        if max < 0.5 * self.cpus as f64 {
            return;
        }
        let _ = writeln!(
            out,
            "**The machine was busy**: the 1-minute load averaged {mean:.1} (up to {max:.1}) on \
             {} CPUs while the timed runs started, from other processes competing for CPU and \
             disk. Absolute figures are lower and noisier than on a quiet machine; the ratios \
             compare tools measured back to back under the same load.\n",
            self.cpus,
        );
    }

    fn render_data(&self, out: &mut String) {
        let r = &self.raw;
        let _ = writeln!(
            out,
            "## Data\n\nA sparse raw file of {} MiB: {} of its {} 1 MiB-aligned 32 MiB blocks \
             ({:.0}%) hold random bytes ({:.1} MB, seed {}), the others are holes.\n",
            r.size_bytes >> 20,
            r.data_blocks,
            r.blocks,
            100.0 * r.data_blocks as f64 / r.blocks.max(1) as f64,
            r.data_bytes as f64 / 1e6,
            self.seed,
        );
    }

    fn render_merge_intro(&self, out: &mut String, s: &MergeSetup) {
        let _ = writeln!(
            out,
            "## Merged base: base + one version → one VHDX\n\n\
             The base is Ferry's capture of the raw file. A differencing version \
             (`disk::version::new_version`) then received {} random writes of 4 KiB to 1 MiB \
             through the library ({:.1} MB written, {:.1} MB of distinct 4 KiB pages: {:.1}% of \
             the disk). Ferry merges the chain; `qemu-img` (which cannot read differencing \
             VHDX) converts the same content, flattened to a sparse raw file beforehand by the \
             library ({:.1} MB of data, untimed); `cp` copies a non-sparse file as large as \
             Ferry's output ({:.1} MB).\n",
            s.delta.writes,
            s.delta.bytes_written as f64 / 1e6,
            s.delta.covered_bytes as f64 / 1e6,
            100.0 * s.delta.covered_bytes as f64 / self.raw.size_bytes as f64,
            s.flat_data_bytes as f64 / 1e6,
            s.cp_source_bytes as f64 / 1e6,
        );
    }

    fn render_iops_intro(&self, out: &mut String, t: &IopsTable, chain: &str) {
        let _ = writeln!(
            out,
            "## Random 4 KiB I/O on a 3-version chain\n\n\
             {chain} The top is opened writable; {} threads each run a synchronous loop of \
             `read_at`/`write_at` of 4 KiB at uniformly random aligned offsets of the whole \
             virtual disk for {} s. The physical limit of the same run is fio with the same \
             thread count on a plain file in the same directory. Neither side fsyncs in the \
             timed window; Ferry's closing commit (log entries and fsyncs for the BAT and \
             sector bitmaps) is timed separately.\n\n\
             *Cold cache*: the page cache is dropped after opening. fio advises the kernel that \
             its access is random (`fadvise_hint`, on by default), so each of its reads fetches \
             4 KiB from disk; Ferry's files get the kernel's default read-ahead, so a random \
             miss may fetch much more, and once the chain's data is cached (compare the \
             read-from-disk column with the data sizes above) Ferry is measuring the page \
             cache. A cold ratio above 1 therefore says more about read-ahead and RAM than \
             about the library. *Warm cache*: every file is read once before the run (and fio \
             gets `--invalidate=0` to keep it cached), so both sides measure the CPU path (map lookup, locks, copy) without disk; that ratio is \
             the library's overhead over a bare `pread`. Writes are measured cold only: a 4 KiB \
             write needs no cached data, and both sides' writes land in the page cache.\n",
            t.threads, t.seconds,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tool: &'static str, secs: &[f64], written_bytes: u64) -> CopyRun {
        let mut r = CopyRun::new(tool, "cmd", 1 << 30);
        for &s in secs {
            r.add(s, written_bytes, 0);
        }
        r
    }

    #[test]
    fn nbd_sections_replace_old_ones_and_keep_the_rest() {
        let old = "# T\n\n## Capture\n\nc\n\n## NBD a\n\nold a\n\n## NBD b\n\nold b\n\n";
        let new = "# T\n\n## NBD a\n\nnew a\n\n## NBD c\n\nnew c\n\n";
        assert_eq!(
            merge_nbd_sections(old, new),
            "# T\n\n## Capture\n\nc\n\n## NBD a\n\nnew a\n\n## NBD b\n\nold b\n\n## NBD c\n\nnew c\n\n"
        );
    }

    #[test]
    fn nbd_sections_merge_also_replaces_how_to_run() {
        let old = "# T\n\n## How to run\n\nold\n\n## Capture\n\nc\n\n";
        let new = "# T\n\n## How to run\n\nnew\n\n## NBD over TLS\n\nt\n\n";
        assert_eq!(
            merge_nbd_sections(old, new),
            "# T\n\n## How to run\n\nnew\n\n## Capture\n\nc\n\n## NBD over TLS\n\nt\n\n"
        );
    }

    #[test]
    fn a_multi_run_replaces_its_section_and_keeps_the_nbd_conditions() {
        let old = "# T\n\n## NBD serving: machine and conditions\n\nm\n\n\
                   ## Several servers (multi)\n\nold\n\n## Boot\n\nb\n\n";
        let new = "# T\n\n## Several servers (multi)\n\nnew\n\n";
        assert_eq!(
            merge_nbd_sections(old, new),
            "# T\n\n## NBD serving: machine and conditions\n\nm\n\n\
             ## Several servers (multi)\n\nnew\n\n## Boot\n\nb\n\n"
        );
    }

    #[test]
    fn median_of_three_runs_ignores_the_outlier() {
        assert_eq!(run("ferry", &[2.0, 9.0, 1.0], 1).secs_median(), 2.0);
    }

    #[test]
    fn ratio_compares_written_bytes_throughput() {
        // ferry writes 100 MB in 1 s, qemu-img 100 MB in 2 s: ferry is twice as fast.
        let t = CopyTable {
            runs: vec![
                run("ferry", &[1.0], 100_000_000),
                run("qemu-img", &[2.0], 100_000_000),
            ],
        };
        assert_eq!(t.ratio("qemu-img"), Some(2.0));
    }
}
