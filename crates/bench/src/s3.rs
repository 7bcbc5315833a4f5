//! `s3`: cold reads through `ferry server` from an S3-compatible bucket (`--store s3://…`,
//! a fresh tier each run) against the same vDisk from a local store, in the same run.
//!
//! The bucket is moto's S3 server (`FERRY_MOTO`, or `moto_server` on the PATH) on a
//! loopback port: a Python server, so the figures bound the cost of the tier's 1 MiB
//! ranged GETs and hash checks plus moto's own speed, not a real object store's. The vDisk
//! is a VHDX converted from a raw file of random bytes, pushed with `ferry vdisk push`.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use rand::{RngCore as _, SeedableRng as _};

use crate::nbd::{fio_iops_args, fio_json, free_port, median};
use crate::{Config, note};

/// The vDisk's size in a full run.
pub const S3_BYTES_DEFAULT: u64 = 1 << 30;
/// The vDisk's size under `--quick`.
pub const S3_BYTES_QUICK: u64 = 128 << 20;
/// How long a process may take to start listening.
const START_WAIT: Duration = Duration::from_secs(60);
const BUCKET: &str = "ferry-bench";
/// The section's title (an `## NBD` section, so a run of it alone merges into the report).
const TITLE: &str = "## NBD from an S3 store: cold reads (s3)";

/// `FERRY_BIN`, else `ferry` beside this executable.
fn ferry_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_BIN") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("ferry")))
        .unwrap_or_else(|| PathBuf::from("ferry"))
}

fn moto_binary() -> PathBuf {
    std::env::var_os("FERRY_MOTO").map_or_else(|| PathBuf::from("moto_server"), PathBuf::from)
}

/// A child process, killed when dropped.
struct Proc(Child);

impl Proc {
    fn start(cmd: &mut Command, port: u16, what: &str) -> Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {what}"))?;
        let mut p = Proc(child);
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(s) = p.0.try_wait()? {
                bail!("{what} exited ({s}) before listening");
            }
            if start.elapsed() > START_WAIT {
                bail!("{what} never listened on {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn create_bucket(port: u16) -> Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(
        s,
        "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    if !reply.starts_with("HTTP/1.1 200") {
        bail!("create bucket: {}", reply.lines().next().unwrap_or(""));
    }
    Ok(())
}

fn ferry(endpoint: &str) -> Command {
    let mut c = Command::new(ferry_binary());
    c.env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("FERRY_S3_ENDPOINT", endpoint);
    c
}

fn run_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Starts `ferry server` on `store` (a directory, or the bucket with a new tier `tier`).
fn serve(endpoint: &str, store: &str, tier: Option<&Path>) -> Result<(Proc, String)> {
    let port = free_port()?;
    let mut cmd = ferry(endpoint);
    cmd.args(["server", "--store", store])
        .arg(format!("--nbd-listen=127.0.0.1:{port}"))
        .args(["--metrics-listen=", "--cache-ram=512M"]);
    if let Some(t) = tier {
        cmd.arg("--tier-dir").arg(t);
    }
    let p = Proc::start(&mut cmd, port, "ferry server")?;
    Ok((p, format!("nbd://127.0.0.1:{port}/disk")))
}

/// The cold sequential and random figures of one store: (seconds, IOPS), medians.
fn measure(
    cfg: &Config,
    endpoint: &str,
    store: &str,
    bucket: bool,
    seconds: u64,
) -> Result<(f64, f64)> {
    let (mut seq, mut iops) = (Vec::new(), Vec::new());
    for run in 0..cfg.runs {
        for random in [false, true] {
            let tier = cfg.dir.join(format!("s3-tier-{run}-{random}"));
            let (srv, uri) = serve(endpoint, store, bucket.then_some(tier.as_path()))?;
            cfg.cache.drop_now();
            cfg.loads.sample();
            if random {
                let args = fio_iops_args(&uri, seconds);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let v = fio_json(&crate::sys::run("fio", &args)?)?;
                let r = v["jobs"][0]["read"]["iops"]
                    .as_f64()
                    .ok_or_else(|| anyhow!("no read.iops in fio's json"))?;
                iops.push(r);
            } else {
                let t = Instant::now();
                crate::sys::run("nbdcopy", &[&uri, "null:"])?;
                seq.push(t.elapsed().as_secs_f64());
            }
            drop(srv);
            let _ = std::fs::remove_dir_all(&tier);
        }
        note(&format!("s3 run {}: {store}", run + 1));
    }
    Ok((median(&seq), median(&iops)))
}

/// Random bytes of `size`, as a raw file, converted to `disk.vhdx` in `store`.
fn make_vdisk(cfg: &Config, size: u64, store: &Path) -> Result<()> {
    std::fs::create_dir_all(store)?;
    let raw = cfg.dir.join("s3-disk.raw");
    let mut f = std::fs::File::create(&raw)?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(cfg.seed ^ 0x53);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..size.div_ceil(buf.len() as u64) {
        rng.fill_bytes(&mut buf);
        f.write_all(&buf)?;
    }
    drop(f);
    let vhdx = store.join("disk.vhdx");
    run_ok(
        Command::new(ferry_binary())
            .args(["vdisk", "convert"])
            .arg(&raw)
            .arg(&vhdx)
            .args(["--format", "vhdx", "--quiet"]),
        "ferry vdisk convert",
    )?;
    let _ = std::fs::remove_file(&raw);
    Ok(())
}

/// The `s3` section.
///
/// # Errors
/// moto, ferry, nbdcopy or fio failing.
pub fn s3_bench(cfg: &Config, size: u64, quick: bool) -> Result<String> {
    let moto = moto_binary();
    if Command::new(&moto).arg("--help").output().is_err() {
        note("s3: moto's S3 server not found (FERRY_MOTO); section not run");
        return Ok(format!(
            "{TITLE}\n\nNot run: moto's S3 server was not found at {} (set FERRY_MOTO; \
             scripts/test.sh installs it).\n",
            moto.display()
        ));
    }
    let seconds = cfg.iops_seconds;
    let store = cfg.dir.join("s3-local-store");
    make_vdisk(cfg, size, &store)?;
    let mport = free_port()?;
    let _moto = Proc::start(
        Command::new(&moto).args(["-H", "127.0.0.1", "-p", &mport.to_string()]),
        mport,
        "moto_server (FERRY_MOTO)",
    )?;
    create_bucket(mport)?;
    let endpoint = format!("http://127.0.0.1:{mport}");
    let url = format!("s3://{BUCKET}/bench");
    run_ok(
        ferry(&endpoint)
            .args(["vdisk", "push"])
            .arg(store.join("disk.vhdx"))
            .arg(&url)
            .arg("--quiet"),
        "ferry vdisk push",
    )?;
    let store_s = store.to_str().context("work dir is not UTF-8")?;
    let (lseq, liops) = measure(cfg, &endpoint, store_s, false, seconds)?;
    let (sseq, siops) = measure(cfg, &endpoint, &url, true, seconds)?;
    let _ = std::fs::remove_dir_all(&store);
    let mib = size as f64 / f64::from(1 << 20);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{TITLE}\n\n\
         One {mib:.0} MiB VHDX of random bytes, served by `ferry server` from a local store \
         and from a bucket (`--store s3://…`, pushed with `ferry vdisk push`) on moto's S3 \
         server (Python, loopback){}. Every run starts a fresh server with an empty block \
         cache and, for the bucket, an empty tier directory, after the page cache is \
         dropped: every byte of the bucket store comes by 1 MiB ranged GETs, each chunk \
         BLAKE3-checked and written to the tier before use. Sequential: `nbdcopy URI null:`; \
         random: `fio {}`. {} run(s), median.\n",
        if quick { " (--quick)" } else { "" },
        fio_iops_args("URI", seconds).join(" "),
        cfg.runs
    );
    let _ = writeln!(out, "| cold read | local store | S3 store | S3 / local |");
    let _ = writeln!(out, "|---|---|---|---|");
    let _ = writeln!(
        out,
        "| sequential, whole disk | {:.1} MiB/s | {:.1} MiB/s | {:.2} |",
        mib / lseq,
        mib / sseq,
        lseq / sseq
    );
    let _ = writeln!(
        out,
        "| random 4 KiB, QD16 | {liops:.0} IOPS | {siops:.0} IOPS | {:.3} |",
        siops / liops
    );
    let _ = writeln!(
        out,
        "\nA random 4 KiB read of a cold chunk costs a whole 1 MiB GET and its hash, so the \
         random figure is bounded by the bucket's throughput, not its latency alone; once a \
         chunk is in the tier it reads as a local file does (a restarted server fetches \
         nothing again).\n"
    );
    Ok(out)
}
