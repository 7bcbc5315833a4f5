//! The longest I/O stall a device sees when its server goes (issue 20): a farm (SQLite) with
//! two `ferry server --farm` processes, and for each trial a new device, a `ferry target
//! --device MAC` logged in through the farm (its list: the first server, then the second),
//! doing continuous random 4 KiB I/O through its export at queue depth 1 with fio (80%
//! reads of the vDisk, which go to the server; 20% writes, which stay in its RAM write
//! cache). Two seconds in, its server is
//!
//! ```text
//!   drained   `ferry server drain s1`: the server closes the session's connections
//!   killed    SIGKILL: the kernel resets its connections
//!   frozen    SIGSTOP: connections stay open and nothing answers (a hung host, a pulled
//!             cable): the target's --timeout (here FROZEN_TIMEOUT_S) ends the wait
//! ```
//!
//! and the device fails over to the second. At queue depth 1 each I/O waits for the one
//! before, so the longest I/O (fio's `lat_ns` max, reads and writes) is the longest gap
//! between consecutive completed I/Os. A trial with no event gives the baseline. Each trial
//! checks that the device moved (its status names the second server, one failover or more)
//! and that fio saw no error; then the first server is undrained, or started again.

use std::fmt::Write as _;
use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::nbd::free_port;
use crate::{Config, note};

/// Goal from the issue: the longest stall of a drain.
const GOAL_DRAIN_MS: f64 = 100.0;
/// The target's `--timeout` in these trials (the default is 30 s), which bounds a frozen
/// server's stall.
const FROZEN_TIMEOUT_S: u64 = 2;
/// Trials per event (`--quick`: [`TRIALS_QUICK`]).
const TRIALS: usize = 5;
const TRIALS_QUICK: usize = 2;
/// The vDisk the device reads.
const DISK_BYTES: u64 = 256 << 20;
/// fio's run, and when in it the event comes.
const FIO_SECONDS: u64 = 7;
const EVENT_AFTER: Duration = Duration::from_secs(2);
/// Hang guard for a process to listen.
const START_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    None,
    Drain,
    Kill,
    Freeze,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::None => "none (baseline)",
            Event::Drain => "drained",
            Event::Kill => "killed (SIGKILL)",
            Event::Freeze => "frozen (SIGSTOP)",
        }
    }
}

/// One trial: the longest I/O in ms, and the I/Os completed.
#[derive(Debug, Clone, Copy)]
struct Trial {
    stall_ms: f64,
    ios: u64,
}

/// `FERRY_BIN`, else `ferry` beside this executable (`target/release/ferry`).
fn ferry_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_BIN") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("ferry")))
        .unwrap_or_else(|| PathBuf::from("ferry"))
}

/// A child killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("start {cmd:?}"))?;
        Ok(Proc { child, log })
    }

    fn wait_until(&mut self, what: &str, ready: impl Fn() -> bool) -> Result<()> {
        let start = Instant::now();
        while !ready() {
            if let Some(st) = self.child.try_wait()? {
                bail!("{what}: exited ({st}): {}", self.log_text());
            }
            if start.elapsed() > START_WAIT {
                bail!("{what}: not within {START_WAIT:?}: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) -> Result<()> {
        crate::sys::run("kill", &[sig, &self.child.id().to_string()]).map(drop)
    }

    /// SIGTERM, then wait.
    fn stop(mut self) -> Result<()> {
        self.signal("-TERM")?;
        let start = Instant::now();
        while self.child.try_wait()?.is_none() {
            if start.elapsed() > START_WAIT {
                bail!("no exit after SIGTERM: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Farm {
    ferry: PathBuf,
    dir: PathBuf,
    token: String,
}

/// A `ferry server --farm`.
struct FarmServer {
    proc: Proc,
    api: String,
    nbd: String,
}

impl Farm {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn store(&self) -> PathBuf {
        self.data().join("stores").join("main")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.ferry);
        for v in ["FERRY_TOKEN", "FERRY_API", "FERRY_FARM_KEY", "FERRY_DB"] {
            c.env_remove(v);
        }
        c
    }

    fn server(&self, name: &str) -> Result<FarmServer> {
        let (api, nbd) = (free_port()?, free_port()?);
        let mut cmd = self.cmd();
        cmd.arg("server")
            .arg("--farm")
            .arg(self.data())
            .arg("--store")
            .arg(self.store())
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg("--metrics-listen=")
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .args(["--server-name", name]);
        let mut proc = Proc::spawn(&mut cmd, self.dir.join(format!("{name}.log")))?;
        proc.wait_until(&format!("ferry server {name}"), || {
            TcpStream::connect(("127.0.0.1", api)).is_ok()
                && TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        })?;
        Ok(FarmServer {
            proc,
            api: format!("http://127.0.0.1:{api}"),
            nbd: format!("127.0.0.1:{nbd}"),
        })
    }

    /// `ferry ARGS --api API --token .. --json`.
    fn json(&self, api: &str, args: &[&str]) -> Result<Value> {
        let out = self
            .cmd()
            .args(args)
            .args(["--api", api, "--token", &self.token, "--json"])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "ferry {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    fn target_status(&self, socket: &Path) -> Result<Value> {
        let out = self
            .cmd()
            .args(["target", "status", "--json"])
            .arg(format!("--export=unix:{}", socket.display()))
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "ferry target status: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

/// fio at queue depth 1 on `socket`'s export for [`FIO_SECONDS`], JSON into `out`.
fn fio(socket: &Path, out: &Path) -> Result<Child> {
    Command::new("fio")
        .arg("--name=stall")
        .arg("--ioengine=nbd")
        .arg(format!("--uri=nbd+unix:///?socket={}", socket.display()))
        .args(["--rw=randrw", "--rwmixread=80", "--bs=4k", "--iodepth=1"])
        .arg(format!("--runtime={FIO_SECONDS}"))
        .arg("--time_based")
        .arg("--output-format=json")
        .arg(format!("--output={}", out.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start fio")
}

/// The longest I/O (ms) and the I/Os of fio's JSON report; fails on a job error.
fn fio_result(out: &Path) -> Result<Trial> {
    let text = std::fs::read_to_string(out)?;
    let at = text
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no json"))?;
    let v: Value = serde_json::from_str(&text[at..])?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(-1) != 0 {
        bail!("fio reported error {}", job["error"]);
    }
    let max = |d: &str| job[d]["lat_ns"]["max"].as_f64().unwrap_or(0.0);
    let ios = |d: &str| job[d]["total_ios"].as_u64().unwrap_or(0);
    Ok(Trial {
        stall_ms: max("read").max(max("write")) / 1e6,
        ios: ios("read") + ios("write"),
    })
}

struct Bench {
    farm: Farm,
    s1: Option<FarmServer>,
    s2: FarmServer,
    devices: usize,
}

impl Bench {
    fn s1(&self) -> Result<&FarmServer> {
        self.s1.as_ref().ok_or_else(|| anyhow!("s1 is not running"))
    }

    fn trial(&mut self, event: Event) -> Result<Trial> {
        let i = self.devices;
        self.devices += 1;
        let mac = format!("aa:bb:cc:00:40:{i:02x}");
        let f = &self.farm;
        let api2 = self.s2.api.clone();
        f.json(
            &api2,
            &[
                "device",
                "add",
                &mac,
                "--name",
                &format!("stall{i}"),
                "--collection",
                "1",
                "--vdisk",
                "stall",
                "--cache-mode",
                "ram_overflow",
                "--ram-bytes",
                &(DISK_BYTES).to_string(),
            ],
        )?;
        let home = f.dir.join(format!("dev{i}"));
        std::fs::create_dir_all(home.join("overflow"))?;
        // The device's own secret, as an administrator gives it.
        let cred = f.json(&api2, &["device", "credential", &mac])?;
        let secret_file = home.join("device.secret");
        std::fs::write(&secret_file, cred["device_secret"].as_str().unwrap_or(""))?;
        let socket = home.join("nbd.sock");
        let (s1_api, s1_nbd) = {
            let s1 = self.s1()?;
            (s1.api.clone(), s1.nbd.clone())
        };
        let f = &self.farm;
        let mut cmd = f.cmd();
        cmd.arg("target")
            .arg("--server")
            .arg(format!("{api2},{s1_api}"))
            .args(["--device", &mac])
            .arg("--device-secret")
            .arg(&secret_file)
            .arg("--state-dir")
            .arg(home.join("state"))
            .arg(format!("--export=unix:{}", socket.display()))
            .arg("--overflow")
            .arg(home.join("overflow"))
            .args(["--timeout", &FROZEN_TIMEOUT_S.to_string()]);
        let mut target = Proc::spawn(&mut cmd, home.join("target.log"))?;
        let ctl = PathBuf::from(format!("{}.ctl", socket.display()));
        target.wait_until("ferry target exporting", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
        })?;
        let on = f.target_status(&socket)?;
        if on["server"] != s1_nbd.as_str() {
            bail!("the device logged in to {} instead of s1", on["server"]);
        }
        let out = home.join("fio.json");
        let mut fio = fio(&socket, &out)?;
        std::thread::sleep(EVENT_AFTER);
        match event {
            Event::None => {}
            Event::Drain => drop(f.json(&api2, &["server", "drain", "s1"])?),
            Event::Kill => drop(self.s1.take()),
            Event::Freeze => self.s1()?.proc.signal("-STOP")?,
        }
        let st = fio.wait()?;
        if !st.success() {
            bail!("fio failed ({st}) in the {} trial", event.name());
        }
        let trial = fio_result(&out)?;
        let f = &self.farm;
        let after = f.target_status(&socket)?;
        let moved = after["server"] == self.s2.nbd.as_str()
            && after["failovers"].as_u64().unwrap_or(0) >= 1;
        if event != Event::None && !moved {
            bail!("the device did not fail over: {after}");
        }
        if after["errors"].as_u64().unwrap_or(1) != 0 {
            bail!("the target counted errors: {after}");
        }
        target.stop()?;
        match event {
            Event::None => {}
            Event::Drain => drop(f.json(&api2, &["server", "undrain", "s1"])?),
            Event::Kill | Event::Freeze => {
                drop(self.s1.take()); // a frozen one is killed (SIGKILL needs no SIGCONT)
                self.s1 = Some(self.farm.server("s1")?);
            }
        }
        note(&format!(
            "failover: {}: longest I/O {:.1} ms ({} I/Os)",
            event.name(),
            trial.stall_ms,
            trial.ios
        ));
        Ok(trial)
    }
}

/// The failover stall trials; returns the subsection's Markdown.
///
/// # Errors
/// ferry or fio failing, or a device that did not fail over.
pub fn failover_stall(cfg: &Config, quick: bool) -> Result<String> {
    let ferry = ferry_binary();
    if !ferry.is_file() {
        bail!(
            "the ferry binary at {} (cargo build --release -p ferry, or FERRY_BIN)",
            ferry.display()
        );
    }
    let dir = cfg.dir.join("failover");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let r = run(cfg, ferry, &dir, quick);
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r
}

fn run(cfg: &Config, ferry: PathBuf, dir: &Path, quick: bool) -> Result<String> {
    let data = dir.join("data");
    let init = crate::sys::run(
        &ferry.to_string_lossy(),
        &["farm", "init", "--data", &data.to_string_lossy(), "--json"],
    )?;
    let init: Value = serde_json::from_str(&init)?;
    let farm = Farm {
        ferry,
        dir: dir.to_path_buf(),
        token: init["admin_token"].as_str().unwrap_or("").to_string(),
    };
    std::fs::create_dir_all(farm.store())?;
    let ds = crate::nbd::make_data_set(cfg, "stall", DISK_BYTES, cfg.seed ^ 0x57a1)?;
    std::fs::copy(&ds.vhdx, farm.store().join("stall.vhdx"))?;
    crate::nbd::remove_data_set(cfg, &ds);
    let s1 = farm.server("s1")?;
    let s2 = farm.server("s2")?;
    let api = s2.api.clone();
    farm.json(&api, &["store", "add", "main", "--path", "main"])?;
    farm.json(&api, &["farm", "vdisk", "add", "stall", "--store", "1"])?;
    farm.json(
        &api,
        &[
            "collection",
            "add",
            "lab",
            "--site",
            "1",
            "--vdisk",
            "stall",
        ],
    )?;
    let mut b = Bench {
        farm,
        s1: Some(s1),
        s2,
        devices: 0,
    };
    let trials = if quick { TRIALS_QUICK } else { TRIALS };
    let mut rows = Vec::new();
    // The baseline last: a device that did not move keeps its session on s1, and the next
    // login would go to s2 (each device that moved counts on s2, so s1 stays the emptier).
    for event in [Event::Drain, Event::Kill, Event::Freeze, Event::None] {
        let n = if event == Event::None { 1 } else { trials };
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            cfg.loads.sample();
            t.push(b.trial(event)?);
        }
        rows.push((event, t));
    }
    Ok(render(&rows))
}

fn render(rows: &[(Event, Vec<Trial>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Failover stall\n\n\
         A farm (SQLite) with two `ferry server --farm` processes on loopback; for each trial \
         a new device, `ferry target --device MAC --timeout {FROZEN_TIMEOUT_S}` (cache \
         `ram_overflow`), logs in and is given the first server, then the second. fio runs on \
         its export for {FIO_SECONDS} s at queue depth 1 (`--rw=randrw --rwmixread=80 \
         --bs=4k`: the reads of the {} MiB vDisk go to the server, the writes stay in the RAM \
         write cache); {} s in, the first server is drained (`ferry server drain s1`: it \
         closes the session's connections within a second), killed (SIGKILL: the kernel \
         resets its connections) or frozen (SIGSTOP: the connections stay open and nothing \
         answers, as with a hung host or a pulled cable). At queue depth 1 each I/O waits \
         for the one before, so the longest I/O (fio's `lat_ns` max over reads and writes) \
         is the longest gap between completed I/Os: the stall. Every trial checks that the \
         device ended on the second server with one failover or more, and that fio and the \
         target counted no error. Between trials the first server is undrained, or started \
         again. Everything shares this machine's CPUs.\n",
        DISK_BYTES >> 20,
        EVENT_AFTER.as_secs(),
    );
    out.push_str(
        "| the device's server | trials | longest I/O, median ms | longest I/O, max ms | I/Os per trial (median) |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let stats = |t: &[Trial]| {
        let v: Vec<f64> = t.iter().map(|t| t.stall_ms).collect();
        let ios: Vec<f64> = t.iter().map(|t| t.ios as f64).collect();
        (
            crate::nbd::median(&v),
            v.iter().copied().fold(0.0, f64::max),
            crate::nbd::median(&ios),
        )
    };
    for (e, t) in rows {
        let (med, max, ios) = stats(t);
        let _ = writeln!(
            out,
            "| {} | {} | {med:.1} | {max:.1} | {ios:.0} |",
            e.name(),
            t.len()
        );
    }
    out.push('\n');
    let max_of = |e: Event| rows.iter().find(|(x, _)| *x == e).map(|(_, t)| stats(t).1);
    if let (Some(d), Some(k), Some(z)) = (
        max_of(Event::Drain),
        max_of(Event::Kill),
        max_of(Event::Freeze),
    ) {
        let kill_bound = FROZEN_TIMEOUT_S as f64 * 1000.0;
        let _ = writeln!(
            out,
            "- drained: longest stall **{d:.1} ms** (goal ≤ {GOAL_DRAIN_MS:.0} ms: {})\n\
             - killed: longest stall **{k:.1} ms** (goal ≤ the failover bound, here \
             `--timeout` = {FROZEN_TIMEOUT_S} s: {}). A killed server's connections are reset \
             by its kernel, so the next request fails at once and the failover costs one \
             connect, TLS handshake and NBD attach to the next server.\n\
             - frozen: longest stall **{z:.1} ms**: a server that keeps its connections and \
             stops answering holds a request for `--timeout` ({FROZEN_TIMEOUT_S} s here; 30 s \
             by default), then the failover; a host that is gone adds up to the connect \
             timeout (5 s) per unreachable server tried (docs/target.md, *Failover*)\n",
            crate::nbd::verdict(d <= GOAL_DRAIN_MS),
            crate::nbd::verdict(k <= kill_bound),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_is_the_longest_read_or_write_and_a_job_error_fails() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("fio.json");
        std::fs::write(
            &out,
            "fio: note\n{\"jobs\":[{\"error\":0,\
             \"read\":{\"total_ios\":10,\"lat_ns\":{\"max\":2500000}},\
             \"write\":{\"total_ios\":5,\"lat_ns\":{\"max\":17000000}}}]}",
        )
        .unwrap();
        let t = fio_result(&out).unwrap();
        assert_eq!((t.stall_ms, t.ios), (17.0, 15));
        std::fs::write(&out, "{\"jobs\":[{\"error\":5}]}").unwrap();
        assert!(fio_result(&out).is_err());
    }
}
