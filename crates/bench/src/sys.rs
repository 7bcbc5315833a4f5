//! The machine side of a benchmark: timing with a final fsync, dropping the page cache,
//! allocated sizes, running external tools, and the facts about the machine the report states.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Whether the page cache can be dropped between runs, decided once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheDrop {
    /// `/proc/sys/vm/drop_caches` accepted a write: every run starts cold.
    Dropped,
    /// Not permitted (not root, or a read-only /proc): runs may read cached bytes.
    NotPermitted,
}

impl CacheDrop {
    /// Tries once and remembers the answer.
    pub fn probe() -> CacheDrop {
        sync_all();
        match std::fs::write("/proc/sys/vm/drop_caches", "3\n") {
            Ok(()) => CacheDrop::Dropped,
            Err(_) => CacheDrop::NotPermitted,
        }
    }

    /// Writes dirty pages back, then drops the page cache, dentries and inodes if permitted.
    pub fn drop_now(self) {
        sync_all();
        if self == CacheDrop::Dropped {
            // The probe proved the write is allowed; a later failure only makes this run
            // warmer, so it is reported and the run goes on.
            if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "3\n") {
                crate::note(&format!("warning: dropping the page cache failed: {e}"));
            }
        }
    }
}

/// `sync(1)`: every dirty page of every file system goes to disk.
pub fn sync_all() {
    let _ = Command::new("sync").status();
}

/// Makes every written byte of `path` durable (a new descriptor's fsync covers the inode's
/// dirty pages, whoever wrote them).
///
/// # Errors
/// When the file cannot be opened or fsync fails.
pub fn fsync_path(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("open {} for fsync", path.display()))?;
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))
}

/// Runs `f`, then fsyncs `output`; returns the seconds both took.
///
/// # Errors
/// Whatever `f` or the fsync returns.
pub fn timed_with_fsync(output: &Path, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    fsync_path(output)?;
    Ok(start.elapsed().as_secs_f64())
}

/// This process's storage I/O so far, reaped children included (`/proc/self/io`): what
/// really went to or came from the block device, as opposed to the page cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// `read_bytes`: bytes this process caused to be read from storage.
    pub read_bytes: u64,
    /// `write_bytes`: bytes this process caused to be written (counted when dirtied).
    pub write_bytes: u64,
}

impl IoCounters {
    /// The counters now (zeros when the kernel does not keep them).
    pub fn now() -> IoCounters {
        let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
        let field = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim_start_matches(':').trim().parse().ok())
                .unwrap_or(0)
        };
        IoCounters {
            read_bytes: field("read_bytes"),
            write_bytes: field("write_bytes"),
        }
    }

    /// The I/O since `earlier`.
    pub fn since(self, earlier: IoCounters) -> IoCounters {
        IoCounters {
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
        }
    }
}

/// Bytes the file system allocated for `path` (`st_blocks * 512`): what a copy had to write.
///
/// # Errors
/// When `stat` fails.
pub fn allocated_bytes(path: &Path) -> Result<u64> {
    let m = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    Ok(m.blocks() * 512)
}

/// Runs a command to completion; a non-zero exit is an error that shows its stderr.
///
/// # Errors
/// When it cannot start or exits non-zero.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("start {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first line a tool prints for `args`, or a note that it is missing.
pub fn tool_version(program: &str, args: &[&str]) -> String {
    match run(program, args) {
        Ok(s) => s.lines().next().unwrap_or("").trim().to_string(),
        Err(_) => format!("{program}: not available"),
    }
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The 1-minute load average (0 when unknown).
pub fn load1() -> f64 {
    loadavg()
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0)
}

/// 1-minute load averages sampled as each timed run starts.
#[derive(Debug, Default)]
pub struct LoadLog {
    samples: std::sync::Mutex<Vec<f64>>,
}

impl LoadLog {
    /// Records the load now.
    pub fn sample(&self) {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(load1());
    }

    /// (min, mean, max) of the samples, if any.
    pub fn summary(&self) -> Option<(f64, f64, f64)> {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_empty() {
            return None;
        }
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(0.0, f64::max);
        Some((min, s.iter().sum::<f64>() / s.len() as f64, max))
    }
}

/// The number of CPUs this process may use.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Facts about the machine, for the report's first table.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `(name, value)` rows in display order.
    pub rows: Vec<(String, String)>,
}

impl Machine {
    /// Gathers the facts for a run in `dir`.
    pub fn gather(dir: &Path) -> Machine {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut push = |k: &str, v: String| rows.push((k.to_string(), v));
        push(
            "date (UTC)",
            tool_version("date", &["-u", "+%Y-%m-%d %H:%M:%S"]),
        );
        push("cpus (nproc)", tool_version("nproc", &[]));
        push("cpu model", cpu_model());
        push("memory", mem_total());
        push("kernel", tool_version("uname", &["-r"]));
        push("work dir file system (df -T)", df_type(dir));
        push("read-ahead of that device (read_ahead_kb)", read_ahead(dir));
        push("ferry", ferry_version());
        push("qemu-img", tool_version("qemu-img", &["--version"]));
        push("fio", tool_version("fio", &["--version"]));
        push("cp", tool_version("cp", &["--version"]));
        Machine { rows }
    }
}

fn cpu_model() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "unknown".into(), |s| s.trim().to_string())
}

fn mem_total() -> String {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: Option<u64> = text
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok());
    kib.map_or_else(
        || "unknown".into(),
        |k| format!("{:.1} GiB", k as f64 / 1048576.0),
    )
}

fn df_type(dir: &Path) -> String {
    let dir = dir.to_string_lossy();
    let Ok(out) = run("df", &["-T", &dir]) else {
        return "unknown".into();
    };
    let Some(line) = out.lines().nth(1) else {
        return "unknown".into();
    };
    let cols: Vec<&str> = line.split_whitespace().collect();
    match cols.as_slice() {
        [dev, fs, ..] => format!("{fs} on {dev}"),
        _ => "unknown".into(),
    }
}

/// The read-ahead of the block device under `dir`, from sysfs (a partition's queue is its
/// disk's).
fn read_ahead(dir: &Path) -> String {
    let dir = dir.to_string_lossy();
    let dev = run("df", &["--output=source", &dir]).ok().and_then(|s| {
        s.lines()
            .nth(1)
            .map(|l| l.trim().trim_start_matches("/dev/").to_string())
    });
    let Some(dev) = dev else {
        return "unknown".into();
    };
    let base = Path::new("/sys/class/block").join(&dev);
    let candidates = [
        base.join("queue/read_ahead_kb"),
        base.join("../queue/read_ahead_kb"),
    ];
    candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map_or_else(|| "unknown".into(), |kb| format!("{} KiB", kb.trim()))
}

fn ferry_version() -> String {
    let commit = run(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    )
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|_| "unknown commit".into());
    let dirty = run(
        "git",
        &["-C", env!("CARGO_MANIFEST_DIR"), "status", "--porcelain"],
    )
    .is_ok_and(|s| !s.trim().is_empty());
    let suffix = if dirty { " + uncommitted changes" } else { "" };
    let build = if cfg!(debug_assertions) {
        "DEBUG build"
    } else {
        "release build"
    };
    format!("{} ({commit}{suffix}), {build}", env!("CARGO_PKG_VERSION"))
}
