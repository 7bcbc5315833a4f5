//! The `boot` section: real boots of the test OS (Debian 12, systemd; the `guest` crate) in
//! QEMU (TCG), timed from QEMU's start to the `FERRY-BOOT-OK` marker after multi-user.target.
//!
//! ```text
//!   one image     guest::ImageBuilder: the test OS with the stripped `ferry` and the boot
//!                 agent, `ferry target install-initramfs --agent … --update` run in its root,
//!                 so its initramfs holds Ferry's boot script and Debian's nbd-client support
//!   local         the raw disk as a virtio disk (-snapshot), root=/dev/vda1: the ceiling
//!   nbdkit        nbdkit --filter=cow --filter=stats file disk.raw, Debian's nbdroot=
//!   ferry cold    `ferry server --store` (fresh process, page cache dropped) serving the
//!                 captured VHDX, the boot agent in the initramfs (boot=ferry ferry.server=)
//!   ferry warm    a second boot against the same running server (its block cache is warm)
//!   ferry + set   a fresh server (page cache dropped) with the boot set the boots above
//!                 recorded beside the version: it prefetches the set as it starts
//!   concurrent    M machines at once against the warm server: time until all are up
//! ```
//!
//! Same kernel, initramfs, QEMU options (1 vCPU, 768 MiB) and console for all. Bytes read
//! from the store per boot come from the server's `/metrics` (`ferry_store_read_bytes_total`)
//! and from nbdkit's stats filter (reads reaching the file plugin, under the cow filter).

mod render;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use guest::{BOOT_MARKER, ImageBuilder, Qemu};

use crate::{Config, note, sys};

/// Boots per configuration (median reported): full run and `--quick`.
pub const RUNS_DEFAULT: u32 = 2;
pub const RUNS_QUICK: u32 = 1;
/// Machines booted at once in the concurrency run, and the most `--boot-machines` allows.
pub const MACHINES_DEFAULT: usize = 4;
pub const MACHINES_MAX: usize = 16;
/// Every machine: QEMU's `-m` and `-smp`.
const GUEST_MIB: u32 = 768;
const GUEST_CPUS: u32 = 1;
/// A guard against a hung boot (TCG on shared cores), not a measure.
const BOOT_WAIT: Duration = Duration::from_secs(900);
/// How long a server may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(30);
/// How often the concurrency run reads the consoles.
const POLL: Duration = Duration::from_millis(50);
/// The version the marker names, and the export's name.
const VERSION: &str = "bench";
const EXPORT: &str = "debian";
/// The most bytes of a `/metrics` answer read.
const METRICS_BYTES_MAX: u64 = 8 << 20;
/// Goals from issue 19: Ferry cold no slower than nbdkit; Ferry warm within 10% of local.
pub const GOAL_COLD_VS_NBDKIT: f64 = 1.0;
pub const GOAL_WARM_VS_LOCAL: f64 = 1.10;
/// Issue 21: the second boot of a version with its boot set, ≤ 0.8× nbdkit's time.
pub const GOAL_SET_VS_NBDKIT: f64 = 0.8;

/// The kernel command lines (the same console and panic for all).
const LOCAL_APPEND: &str = "root=/dev/vda1 console=ttyS0 rw panic=30";

/// The network of both network rows as Ferry's boot script hands iPXE's lease to the kernel
/// (`api::boot_script::NETWORK_ARGS`, expanded for QEMU's user network and the machines'
/// MAC, `guest::DEFAULT_MAC`): the initramfs configures the NIC without asking DHCP again.
pub const NETWORK_APPEND: &str =
    "ip=10.0.2.15::10.0.2.2:255.255.255.0:::off:10.0.2.3 BOOTIF=01-52-54-00-12-34-56";

fn nbdkit_append(port: u16) -> String {
    format!(
        "{NETWORK_APPEND} nbdroot=10.0.2.2:{port}/root root=/dev/nbd0p1 console=ttyS0 rw \
         panic=30"
    )
}

fn ferry_append(port: u16) -> String {
    format!(
        "boot=ferry {NETWORK_APPEND} ferry.server=10.0.2.2:{port} ferry.export={EXPORT} \
         ferry.cache=ram root=/dev/nbd0p1 console=ttyS0 panic=30"
    )
}

/// One configuration's boots.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Seconds from QEMU's start to the marker, per boot.
    pub secs: Vec<f64>,
    /// Bytes read from the store per boot, when known.
    pub store_read: Vec<u64>,
    /// Bytes the server sent to the client per boot, when known (Ferry only).
    pub served: Vec<u64>,
    /// Where each boot's time went, when its console said.
    pub phases: Vec<Phases>,
}

impl Row {
    /// The median boot's seconds (NaN without boots).
    pub fn median(&self) -> f64 {
        median(&self.secs)
    }
}

/// The median of `v` (the mean of the middle two of an even count; NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => s[n / 2],
        _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Where a boot's time went, by the guest kernel's clock (seconds since it started).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phases {
    /// The initramfs's `/init` started.
    pub init: f64,
    /// The root file system was mounted (`EXT4-fs (…): mounted`).
    pub root: f64,
    /// The last kernel message before the marker.
    pub last: f64,
}

/// The kernel timestamp `[   17.77]` a console line starts with.
fn kernel_ts(line: &str) -> Option<f64> {
    let rest = line.trim_start_matches(['\r', '\n']).strip_prefix('[')?;
    rest.split_once(']')?.0.trim().parse().ok()
}

/// The [`Phases`] of a console log, when it holds all three.
pub fn phases(log: &str) -> Option<Phases> {
    let before = &log[..log.find(BOOT_MARKER)?];
    let first =
        |needle: &dyn Fn(&str) -> bool| before.lines().find(|l| needle(l)).and_then(kernel_ts);
    Some(Phases {
        init: first(&|l| l.contains("Run /init as init process"))?,
        root: first(&|l| l.contains("EXT4-fs (") && l.contains("mounted filesystem"))?,
        last: before.lines().rev().find_map(kernel_ts)?,
    })
}

/// Everything the section measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub local: Row,
    pub local_warm: Row,
    pub nbdkit: Row,
    pub ferry_cold: Row,
    pub ferry_warm: Row,
    /// A fresh server with the boot set the earlier boots recorded (page cache dropped).
    pub ferry_set: Row,
    /// Per machine of the concurrency run: seconds to its marker.
    pub concurrent: Vec<f64>,
    /// Bytes read from the store during the concurrency run.
    pub concurrent_store_read: Option<u64>,
    /// The raw disk's allocated bytes, its size, and the VHDX file's size.
    pub raw_allocated: u64,
    pub raw_bytes: u64,
    pub vhdx_bytes: u64,
    /// 1-minute load as each boot (or the concurrency run) started.
    pub loads: Vec<f64>,
    /// Seconds the image build and capture took (untimed in the results).
    pub image_secs: f64,
    pub capture_secs: f64,
}

/// What the section needs from the command line.
#[derive(Debug, Clone)]
pub struct BootConfig {
    pub runs: u32,
    pub machines: usize,
    pub quick: bool,
}

/// Runs the section, or says why it cannot (not root, a tool or binary missing).
///
/// # Errors
/// A build, a server or a boot failing.
pub fn boot_bench(cfg: &Config, b: &BootConfig) -> Result<String> {
    let bins = match Binaries::find() {
        Ok(bins) => bins,
        Err(why) => {
            note(&format!("boot: skipped: {why}"));
            return Ok(render::skipped(&why));
        }
    };
    let root = match guest::try_guest_root() {
        Ok(root) => root,
        Err(e) => {
            let why = format!("the guest root could not be built ({e})");
            note(&format!("boot: skipped: {why}"));
            return Ok(render::skipped(&why));
        }
    };
    let dir = cfg.dir.join("boot");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let r = run(cfg, b, &bins, &root, &dir);
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let res = r?;
    Ok(render::section(cfg, b, &res))
}

/// The programs the section runs besides the guest harness's.
#[derive(Debug)]
struct Binaries {
    ferry: PathBuf,
    agent: PathBuf,
}

impl Binaries {
    /// Finds them, or says what is missing.
    fn find() -> std::result::Result<Binaries, String> {
        let mut missing = guest::missing_tools();
        for tool in ["nbdkit", "strip"] {
            if sys::run(tool, &["--version"]).is_err() {
                missing.push(tool.into());
            }
        }
        let ferry = ferry_binary();
        if !ferry.is_file() {
            missing.push(format!(
                "the ferry binary at {} (cargo build --release -p ferry, or FERRY_BIN)",
                ferry.display()
            ));
        }
        let agent = boot_agent();
        if !agent.is_file() {
            missing.push(format!(
                "the boot agent at {} (cargo build --profile boot-agent --target \
                 x86_64-unknown-linux-musl -p boot-agent, or FERRY_BOOT_AGENT)",
                agent.display()
            ));
        }
        if missing.is_empty() {
            Ok(Binaries { ferry, agent })
        } else {
            Err(format!("missing {}", missing.join(", ")))
        }
    }
}

/// `FERRY_BIN`, else `ferry` beside this executable (`target/release/ferry`).
pub(crate) fn ferry_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_BIN") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("ferry")))
        .unwrap_or_else(|| PathBuf::from("ferry"))
}

/// `FERRY_BOOT_AGENT`, else the boot-agent profile's output in this executable's target
/// directory, else in the workspace's `target/`.
fn boot_agent() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_BOOT_AGENT") {
        return PathBuf::from(p);
    }
    let tail = "x86_64-unknown-linux-musl/boot-agent/ferry-boot";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|t| t.join(tail)));
    match beside {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .join(tail),
    }
}

fn run(cfg: &Config, b: &BootConfig, bins: &Binaries, root: &Path, dir: &Path) -> Result<Results> {
    let mut res = Results::default();
    note("boot: building the image (the test OS with ferry and the boot agent in its initramfs)");
    let started = Instant::now();
    let stripped = dir.join("ferry");
    sys::run(
        "strip",
        &[
            "-o",
            &stripped.to_string_lossy(),
            &bins.ferry.to_string_lossy(),
        ],
    )?;
    let install = "ferry target install-initramfs --agent /root/ferry-boot --update \
                   && rm /root/ferry-boot";
    let image = ImageBuilder::new(root)
        .copy(&stripped, "/usr/local/bin/ferry", 0o755)
        .copy(&bins.agent, "/root/ferry-boot", 0o755)
        .version(VERSION)
        .run_in_root(install)
        .build(&dir.join("image"))
        .map_err(|e| anyhow!("build the boot image: {e}"))?;
    res.image_secs = started.elapsed().as_secs_f64();
    let store = dir.join("store");
    std::fs::create_dir_all(&store)?;
    let vhdx = store.join(format!("{EXPORT}.vhdx"));
    let started = Instant::now();
    sys::run(
        &bins.ferry.to_string_lossy(),
        &[
            "vdisk",
            "capture",
            &image.disk.to_string_lossy(),
            &vhdx.to_string_lossy(),
        ],
    )?;
    sys::fsync_path(&vhdx)?;
    res.capture_secs = started.elapsed().as_secs_f64();
    res.raw_allocated = sys::allocated_bytes(&image.disk)?;
    res.raw_bytes = std::fs::metadata(&image.disk)?.len();
    res.vhdx_bytes = std::fs::metadata(&vhdx)?.len();
    note(&format!(
        "boot: image built in {:.0} s, captured in {:.1} s ({:.0} MB VHDX)",
        res.image_secs,
        res.capture_secs,
        res.vhdx_bytes as f64 / 1e6
    ));
    let vm = |tag: &str| {
        Qemu::new(dir.join(format!("console-{tag}.log")))
            .memory_mib(GUEST_MIB)
            .cpus(GUEST_CPUS)
    };
    for run in 1..=b.runs {
        // Local disk, page cache dropped, then again with the image in the page cache.
        for warm in [false, true] {
            if !warm {
                cfg.cache.drop_now();
            }
            res.loads.push(sys::load1());
            let q = vm("local").disk(&image.disk).arg("-snapshot").direct_boot(
                &image.kernel,
                &image.initrd,
                LOCAL_APPEND,
            );
            let (secs, ph) = boot_once(q, "local disk")?;
            let row = if warm {
                &mut res.local_warm
            } else {
                &mut res.local
            };
            row.secs.push(secs);
            row.phases.extend(ph);
            note(&format!(
                "boot run {run}: local disk{}: {secs:.1} s",
                if warm { " (warm page cache)" } else { "" }
            ));
        }
        // nbdkit through Debian's nbd-client initramfs.
        cfg.cache.drop_now();
        let nbdkit = Nbdkit::start(&image.disk, &dir.join("nbdkit-stats.txt"))?;
        res.loads.push(sys::load1());
        let q = vm("nbdkit").direct_boot(&image.kernel, &image.initrd, &nbdkit_append(nbdkit.port));
        let secs = boot_once(q, "nbdkit");
        let read = nbdkit.stop();
        let (secs, ph) = secs?;
        res.nbdkit.secs.push(secs);
        res.nbdkit.phases.extend(ph);
        if let Some(r) = read {
            res.nbdkit.store_read.push(r);
        }
        note(&format!(
            "boot run {run}: nbdkit: {secs:.1} s, {} read from the file",
            mb(read)
        ));
        // Ferry: a fresh server, cold, then warm. The set an earlier run recorded is
        // removed: this is the version's first boot (today's Ferry), which records it.
        let set_file = server::boot_sets::set_path(&vhdx);
        let _ = std::fs::remove_file(&set_file);
        cfg.cache.drop_now();
        let server = FerryServer::start(&bins.ferry, &store, dir)?;
        for warm in [false, true] {
            let before = server.metrics()?;
            res.loads.push(sys::load1());
            let q =
                vm("ferry").direct_boot(&image.kernel, &image.initrd, &ferry_append(server.nbd));
            let (secs, ph) = boot_once(q, "ferry")?;
            let after = server.metrics()?;
            let row = if warm {
                &mut res.ferry_warm
            } else {
                &mut res.ferry_cold
            };
            row.secs.push(secs);
            row.phases.extend(ph);
            let (store_read, served) = after.since(before);
            row.store_read.push(store_read);
            row.served.push(served);
            note(&format!(
                "boot run {run}: ferry {}: {secs:.1} s, {} read from the store, {} served",
                if warm { "warm" } else { "cold" },
                mb(Some(store_read)),
                mb(Some(served))
            ));
        }
        if run == b.runs {
            concurrent(&mut res, b, &server, &vm, &image)?;
        }
        // The boots above recorded the version's boot set; the server keeps it beside
        // the version when their connections end.
        wait_for_file(&set_file)?;
        server.stop();
        // Ferry with the boot set: a fresh server, page cache dropped, which prefetches
        // the set when it starts (as any server does); the machine starts right after.
        cfg.cache.drop_now();
        let server = FerryServer::start(&bins.ferry, &store, dir)?;
        res.loads.push(sys::load1());
        let q =
            vm("ferry-set").direct_boot(&image.kernel, &image.initrd, &ferry_append(server.nbd));
        let (secs, ph) = boot_once(q, "ferry with the boot set")?;
        let (store_read, served) = server.metrics()?.since(Counters::default());
        res.ferry_set.secs.push(secs);
        res.ferry_set.phases.extend(ph);
        res.ferry_set.store_read.push(store_read);
        res.ferry_set.served.push(served);
        note(&format!(
            "boot run {run}: ferry + boot set: {secs:.1} s, {} read from the store, {} served",
            mb(Some(store_read)),
            mb(Some(served))
        ));
        server.stop();
    }
    Ok(res)
}

/// Waits until the server has written `file` (a boot set, saved when a boot's connection
/// ends), or says it never came.
fn wait_for_file(file: &Path) -> Result<()> {
    let deadline = Instant::now() + LISTEN_WAIT;
    while !file.is_file() {
        if Instant::now() > deadline {
            bail!("no boot set at {} after the boots", file.display());
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// `b.machines` machines at once against the warm `server`.
fn concurrent(
    res: &mut Results,
    b: &BootConfig,
    server: &FerryServer,
    vm: &dyn Fn(&str) -> Qemu,
    image: &guest::GuestImage,
) -> Result<()> {
    let before = server.metrics()?;
    res.loads.push(sys::load1());
    let mut vms = Vec::new();
    for i in 0..b.machines {
        let q = vm(&format!("ferry-{i}")).direct_boot(
            &image.kernel,
            &image.initrd,
            &ferry_append(server.nbd),
        );
        vms.push(q.spawn().map_err(|e| anyhow!("start machine {i}: {e}"))?);
    }
    let marker = format!("{BOOT_MARKER} version={VERSION}");
    let mut done: Vec<Option<f64>> = vec![None; vms.len()];
    let start = Instant::now();
    while done.iter().any(Option::is_none) {
        for (i, vm) in vms.iter_mut().enumerate() {
            if done[i].is_some() {
                continue;
            }
            if vm.log().contains(&marker) {
                done[i] = Some(vm.elapsed().as_secs_f64());
            } else if vm.wait_exit(Duration::ZERO).is_ok() {
                bail!(
                    "concurrent machine {i}: QEMU exited before the marker; see {}",
                    vm.serial_log().display()
                );
            }
        }
        if start.elapsed() > BOOT_WAIT {
            bail!("concurrent machines: not all up after {BOOT_WAIT:?}");
        }
        std::thread::sleep(POLL);
    }
    for vm in &mut vms {
        vm.kill();
    }
    let after = server.metrics()?;
    res.concurrent = done.into_iter().flatten().collect();
    res.concurrent_store_read = Some(after.since(before).0);
    note(&format!(
        "boot: {} machines at once (ferry warm): all up after {:.1} s",
        b.machines,
        res.concurrent.iter().copied().fold(0.0, f64::max)
    ));
    Ok(())
}

/// Boots `q` to the marker; the seconds from QEMU's start, and the phases its console shows.
fn boot_once(q: Qemu, what: &str) -> Result<(f64, Option<Phases>)> {
    let mut vm = q
        .spawn()
        .map_err(|e| anyhow!("start the {what} machine: {e}"))?;
    let took = vm
        .wait_for(&format!("{BOOT_MARKER} version={VERSION}"), BOOT_WAIT)
        .map_err(|e| anyhow!("{what} boot: {e}"))?;
    vm.kill();
    Ok((took.as_secs_f64(), phases(&vm.log())))
}

fn mb(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "? MB".into(), |b| format!("{:.1} MB", b as f64 / 1e6))
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(port: u16, child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + LISTEN_WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited before listening ({st})");
        }
        if Instant::now() > deadline {
            bail!("{what} does not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Stops `child` with SIGTERM, and with SIGKILL if it has not exited after
/// [`LISTEN_WAIT`]; returns whether it exited on the SIGTERM.
fn terminate(child: &mut Child) -> bool {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + LISTEN_WAIT;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.wait();
    true
}

/// `nbdkit --filter=cow --filter=stats file DISK` on loopback (the guest's 10.0.2.2). The
/// stats filter sits under the cow filter, so it counts the reads that reach the file.
struct Nbdkit {
    child: Child,
    port: u16,
    stats: PathBuf,
}

impl Nbdkit {
    fn start(disk: &Path, stats: &Path) -> Result<Nbdkit> {
        let _ = std::fs::remove_file(stats);
        let port = free_port()?;
        let mut child = Command::new("nbdkit")
            .args(["--exit-with-parent", "-f", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(["--filter=cow", "--filter=stats", "file"])
            .arg(disk)
            .arg(format!("statsfile={}", stats.display()))
            .stdin(Stdio::null())
            .spawn()
            .context("start nbdkit")?;
        wait_listening(port, &mut child, "nbdkit")?;
        Ok(Nbdkit {
            child,
            port,
            stats: stats.to_path_buf(),
        })
    }

    /// Stops nbdkit with SIGTERM (so the stats filter writes its file) and returns the bytes
    /// it read from the file, when the stats say.
    fn stop(mut self) -> Option<u64> {
        if !terminate(&mut self.child) {
            return None;
        }
        parse_stats_read(&std::fs::read_to_string(&self.stats).ok()?)
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bytes of the `read:` line of nbdkit's stats filter (`read: 32 ops, 0.0016 s, 8.00
/// MiB, …`; the size is printed with a binary unit and two decimals).
pub fn parse_stats_read(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("read:"))?;
    let size = line.split(',').nth(2)?.trim();
    let (num, unit) = size.split_once(' ')?;
    let num: f64 = num.parse().ok()?;
    let mult = match unit {
        "bytes" | "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    Some((num * mult as f64).round() as u64)
}

/// `ferry server --store DIR` (standalone) with its NBD and metrics ports on loopback.
struct FerryServer {
    child: Child,
    nbd: u16,
    metrics: u16,
}

/// The counters of one `/metrics` read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `ferry_store_read_bytes_total`.
    pub store_read: u64,
    /// `ferry_nbd_bytes_total{type="read"}`.
    pub served: u64,
}

impl Counters {
    /// (store read, served) since `earlier`.
    fn since(self, earlier: Counters) -> (u64, u64) {
        (
            self.store_read.saturating_sub(earlier.store_read),
            self.served.saturating_sub(earlier.served),
        )
    }
}

impl FerryServer {
    fn start(ferry: &Path, store: &Path, dir: &Path) -> Result<FerryServer> {
        let (nbd, metrics) = (free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join("server.log"))?;
        let mut child = Command::new(ferry)
            .arg("server")
            .arg("--store")
            .arg(store)
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
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

    fn metrics(&self) -> Result<Counters> {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics))?;
        s.set_read_timeout(Some(LISTEN_WAIT))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut text = String::new();
        s.take(METRICS_BYTES_MAX).read_to_string(&mut text)?;
        parse_metrics(&text).ok_or_else(|| anyhow!("no store counters in /metrics: {text:.300}"))
    }

    /// SIGTERM, so that it saves what it recorded; SIGKILL after [`LISTEN_WAIT`].
    fn stop(mut self) {
        terminate(&mut self.child);
    }
}

impl Drop for FerryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The counters in a Prometheus text answer (headers before it are ignored).
pub fn parse_metrics(text: &str) -> Option<Counters> {
    let value = |name: &str, label: Option<&str>| -> Option<u64> {
        text.lines().find_map(|l| {
            let (key, v) = l.rsplit_once(' ')?;
            let (n, labels) = key.split_once('{').unwrap_or((key, ""));
            let ok = n == name && label.is_none_or(|lab| labels.contains(lab));
            ok.then(|| v.trim().parse::<f64>().ok().map(|f| f as u64))
                .flatten()
        })
    };
    Some(Counters {
        store_read: value("ferry_store_read_bytes_total", None)?,
        served: value("ferry_nbd_bytes_total", Some("type=\"read\"")).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_read_line_is_parsed_in_binary_units() {
        let text = "total: 64 ops, 0.9 s, 8.00 MiB, 8.81 MiB/s\n\
                    read: 32 ops, 0.001634 s, 8.00 MiB, 4.78 GiB/s op, 8.81 MiB/s total\n";
        assert_eq!(parse_stats_read(text), Some(8 << 20));
    }

    #[test]
    fn stats_without_reads_give_none() {
        assert_eq!(
            parse_stats_read("total: 0 ops, 0 s, 0 bytes, 0 bytes/s\n"),
            None
        );
    }

    #[test]
    fn metrics_counters_are_found_by_name_and_label() {
        let text = "HTTP/1.0 200 OK\r\n\r\n# TYPE ferry_store_read_bytes_total counter\n\
                    ferry_store_read_bytes_total 196608\n\
                    ferry_nbd_bytes_total{type=\"write\"} 5\n\
                    ferry_nbd_bytes_total{type=\"read\"} 12288\n";
        assert_eq!(
            parse_metrics(text),
            Some(Counters {
                store_read: 196_608,
                served: 12_288
            })
        );
    }

    #[test]
    fn metrics_without_the_store_counter_give_none() {
        assert_eq!(parse_metrics("ferry_nbd_connections 1\n"), None);
    }

    #[test]
    fn phases_are_read_from_kernel_timestamps_before_the_marker() {
        let log = "[    0.000000] Linux version\r\n[    4.070447] Run /init as init process\r\n\
                   Begin: Mounting root file system ... done.\r\n\
                   [   18.663148] EXT4-fs (nbd0p1): mounted filesystem with ordered data mode.\r\n\
                   [   28.845914] random: crng init done\r\n\
                   FERRY-BOOT-OK version=bench\r\n[   40.0] later\r\n";
        assert_eq!(
            phases(log),
            Some(Phases {
                init: 4.070447,
                root: 18.663148,
                last: 28.845914
            })
        );
    }

    #[test]
    fn phases_need_the_marker() {
        assert_eq!(phases("[    4.0] Run /init as init process\n"), None);
    }

    #[test]
    fn median_takes_the_middle_boot() {
        assert_eq!(median(&[30.0, 90.0, 31.0]), 31.0);
        assert_eq!(median(&[30.0, 32.0]), 31.0);
        assert!(median(&[]).is_nan());
    }
}
