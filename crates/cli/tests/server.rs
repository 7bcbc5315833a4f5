//! End-to-end tests of `ferry server`: the real binary on free loopback ports, driven by real
//! NBD clients (nbdinfo, nbdcopy, qemu-io, fio) and a raw HTTP request for `/metrics`, and
//! stopped with SIGTERM, which must exit 0.
//!
//! The store holds `golden.vhdx` (64 MiB, data in a few ranges) and its version
//! `golden.1.avhdx`, made with the disk library. Reference contents come from
//! `ferry vdisk convert --format raw`.
//!
//! Tool rule (STYLE.md §6): a missing client skips a test with a printed reason on a
//! developer's machine and fails it under `CI=true`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Proc, WAIT, ferry, free_port, path_str, tool};
use interop::{
    MIB, create_vhdx, dynamic, pattern, require, require_all, run_ok, session, sha256_file,
};

/// The vDisk's virtual size.
const SIZE: u64 = 64 * MIB;
/// A store with `golden.vhdx` and `golden.1.avhdx`, plus raw conversions of both chains.
struct Store {
    dir: tempfile::TempDir,
    /// `ferry vdisk convert golden.1.avhdx --format raw`: what `golden` must serve.
    top_raw: PathBuf,
    /// The conversion of `golden.vhdx` alone: what `golden@0` must serve.
    base_raw: PathBuf,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("store");
        std::fs::create_dir(&store).expect("create store");
        let base = store.join("golden.vhdx");
        let top = store.join("golden.1.avhdx");
        create_vhdx(&base, &dynamic(SIZE, MIB as u32));
        session(&base, |d| {
            d.write_at(&pattern(3 * MIB as usize, 1), 0).unwrap();
            d.write_at(&pattern(8 * MIB as usize, 2), 20 * MIB).unwrap();
        });
        disk::version::new_version(&base, &top).unwrap();
        session(&top, |d| {
            d.write_at(&pattern(64 << 10, 3), MIB + 512).unwrap();
            d.write_at(&pattern(2 * MIB as usize, 4), 60 * MIB).unwrap();
        });
        let top_raw = dir.path().join("top.raw");
        let base_raw = dir.path().join("base.raw");
        for (src, dst) in [(&top, &top_raw), (&base, &base_raw)] {
            let out = ferry()
                .args([
                    "vdisk",
                    "convert",
                    path_str(src),
                    path_str(dst),
                    "--format",
                    "raw",
                ])
                .output()
                .expect("run ferry vdisk convert");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Store {
            dir,
            top_raw,
            base_raw,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// A scratch file name in the test's directory.
    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A running `ferry server`; killed (not gracefully) if a test fails before `stop`.
struct Server {
    proc: Proc,
    nbd_port: u16,
    metrics_port: u16,
}

impl Server {
    /// Starts `ferry server --store STORE` on free ports and waits until both accept.
    fn start(store: &Store) -> Server {
        let (nbd_port, metrics_port) = (free_port(), free_port());
        let log = store.scratch(&format!("server-{nbd_port}.log"));
        let mut proc = Proc::spawn(
            ferry()
                .args(["server", "--store", path_str(&store.path())])
                .arg(format!("--nbd-listen=127.0.0.1:{nbd_port}"))
                .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
                .arg("--cache-ram=256M"),
            log,
        );
        for port in [nbd_port, metrics_port] {
            proc.wait_until(&format!("port {port} accepting"), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        }
        Server {
            proc,
            nbd_port,
            metrics_port,
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.nbd_port)
    }

    /// `GET /metrics` over a raw TcpStream; returns the body after checking the head.
    fn metrics(&self) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).expect("connect metrics");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read metrics response");
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        body.to_string()
    }

    /// The sum of every sample of metric `name` (all label sets).
    fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.metrics(), name)
    }

    /// Sends SIGTERM and asserts a graceful exit with status 0.
    fn stop(self) {
        self.proc.stop();
    }
}

/// Sums the samples of `name` in a Prometheus text exposition.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `nbdcopy URI OUT`, then the sha256 of OUT.
fn copy_sha(srv: &Server, export: &str, out: &Path) -> String {
    run_ok(tool("nbdcopy").arg(srv.uri(export)).arg(out));
    sha256_file(out)
}

/// Waits until no export of `mode` is open (a closed connection's release has run).
fn wait_released(srv: &Server, mode: &str) {
    let start = Instant::now();
    let needle = format!("ferry_exports{{mode=\"{mode}\"}} 0");
    while !srv.metrics().lines().any(|l| l == needle) {
        assert!(start.elapsed() < WAIT, "{mode} export never released");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nbdinfo_size_and_nbdcopy_equal_convert() {
    if !require_all(&["nbdinfo", "nbdcopy"]) {
        return;
    }
    let store = Store::new();
    let srv = Server::start(&store);
    let size = run_ok(tool("nbdinfo").arg("--size").arg(srv.uri("golden")));
    assert_eq!(size.trim(), SIZE.to_string());
    let text = run_ok(tool("nbdinfo").arg(srv.uri("golden")));
    assert!(text.contains(&format!("export-size: {SIZE}")), "{text}");
    let golden = copy_sha(&srv, "golden", &store.scratch("golden.raw"));
    assert_eq!(
        golden,
        sha256_file(&store.top_raw),
        "golden != convert of the chain"
    );
    let base = copy_sha(&srv, "golden@0", &store.scratch("base.raw"));
    assert_eq!(
        base,
        sha256_file(&store.base_raw),
        "golden@0 != convert of the base"
    );
    assert_ne!(golden, base, "the version changes the disk");
    srv.stop();
}

#[test]
fn fio_verify_on_device_export_then_golden_again() {
    if !require_all(&["fio", "nbdcopy"]) {
        return;
    }
    let store = Store::new();
    let srv = Server::start(&store);
    let before = copy_sha(&srv, "golden", &store.scratch("before.raw"));
    let out = run_ok(
        tool("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
                "--size=16M",
                "--iodepth=16",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                // No verify-state file in the working directory (the crate's source tree).
                "--verify_state_save=0",
                "--output-format=json",
            ])
            .arg(format!("--uri={}", srv.uri("golden+dev1"))),
    );
    let v: serde_json::Value = serde_json::from_str(&out[out.find('{').expect("json")..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap() >= 16 * MIB,
        "{job}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 16 * MIB,
        "verify read back: {job}"
    );
    // The device reconnects at once, as a rebooting target does. If the previous
    // connection's release is still running, the open waits for it rather than refusing the
    // export as busy (made deterministic in the server's `a_busy_open_waits_for_the_holder_
    // to_let_go`; here it depends on how fast the release is).
    let device = copy_sha(&srv, "golden+dev1", &store.scratch("dev1.raw"));
    assert_eq!(
        device, before,
        "a reconnected server-cache device kept its writes"
    );
    wait_released(&srv, "server_cache");
    let golden = copy_sha(&srv, "golden", &store.scratch("golden.raw"));
    assert_eq!(golden, before, "the golden image changed");
    srv.stop();
}

#[test]
fn persistent_write_survives_restart() {
    if !require_all(&["qemu-io", "nbdcopy"]) {
        return;
    }
    let store = Store::new();
    let export = "golden+dev2+persistent";
    let srv = Server::start(&store);
    let out = run_ok(
        tool("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x5a 2M 64k", "-c", "flush"])
            .arg(srv.uri(export)),
    );
    assert!(!out.contains("fail") && !out.contains("error"), "{out}");
    srv.stop();
    let srv = Server::start(&store);
    let out = run_ok(
        tool("qemu-io")
            .args(["-r", "-f", "raw", "-c", "read -P 0x5a 2M 64k"])
            .arg(srv.uri(export)),
    );
    assert!(!out.contains("fail") && !out.contains("error"), "{out}");
    let golden = copy_sha(&srv, "golden", &store.scratch("golden.raw"));
    assert_eq!(
        golden,
        sha256_file(&store.top_raw),
        "the write leaked into golden"
    );
    srv.stop();
}

#[test]
fn metrics_show_requests_and_second_copy_hits_cache() {
    if !require("nbdcopy") {
        return;
    }
    let store = Store::new();
    let srv = Server::start(&store);
    let out = store.scratch("copy.raw");
    copy_sha(&srv, "golden", &out);
    let first = srv.metrics();
    assert!(first.contains("ferry_nbd_requests_total"), "{first}");
    assert!(
        metric_sum(&first, "ferry_nbd_requests_total") > 0.0,
        "{first}"
    );
    let store_after_first = metric_sum(&first, "ferry_store_read_bytes_total");
    assert!(
        store_after_first > 0.0,
        "the first copy read the store: {first}"
    );
    copy_sha(&srv, "golden", &out);
    let second = srv.metrics();
    let grown = metric_sum(&second, "ferry_store_read_bytes_total") - store_after_first;
    assert!(
        grown <= 0.05 * SIZE as f64,
        "the second copy read {grown} bytes from the store"
    );
    assert!(srv.metric("ferry_cache_hits_total") > 0.0, "{second}");
    srv.stop();
}

/// A copy of an export larger than a quarter of the cache is a scan: its fills are one read
/// each into a shared huge-page buffer, let go past a small window. Two whole copies
/// (nbdcopy: several connections, many requests in flight) of a vDisk holding data
/// everywhere still equal its bytes, and memory stays near the budget.
#[test]
fn a_scanned_copy_equals_the_data() {
    if !require("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("create store");
    let size = 48 * MIB;
    let bytes = pattern(size as usize, 9);
    let vhdx = store.join("full.vhdx");
    create_vhdx(&vhdx, &dynamic(size, MIB as u32));
    session(&vhdx, |d| d.write_at(&bytes, 0).unwrap());
    let raw = dir.path().join("full.raw");
    std::fs::write(&raw, &bytes).expect("write raw");
    // 16 MiB of cache: the 48 MiB chain is larger than a quarter of it, so it is scanned.
    let (nbd_port, metrics_port) = (free_port(), free_port());
    let mut proc = Proc::spawn(
        ferry()
            .args(["server", "--store", path_str(&store)])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd_port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .arg("--cache-ram=16M"),
        dir.path().join("server.log"),
    );
    for port in [nbd_port, metrics_port] {
        proc.wait_until(&format!("port {port} accepting"), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }
    let srv = Server {
        proc,
        nbd_port,
        metrics_port,
    };
    for i in 0..2 {
        let out = dir.path().join(format!("copy-{i}.raw"));
        assert_eq!(
            copy_sha(&srv, "full", &out),
            sha256_file(&raw),
            "copy {i} != the vDisk's bytes"
        );
    }
    let text = srv.metrics();
    assert!(
        metric_sum(&text, "ferry_cache_scan_evictions_total") > 0.0,
        "the copies were scans: {text}"
    );
    assert!(
        metric_sum(&text, "ferry_store_read_bytes_total") >= (2 * size - 16 * MIB) as f64,
        "the second copy read the store again (the first did not stay): {text}"
    );
    assert!(
        metric_sum(&text, "ferry_cache_resident_bytes") <= (16 + 16 + 8) as f64 * MIB as f64,
        "resident memory stays near the budget (16 MiB) plus the scan pool: {text}"
    );
    srv.stop();
}

fn run_ferry(args: &[&str]) -> Output {
    ferry()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ferry")
}

#[test]
fn unknown_config_key_exits_1_naming_the_key() {
    let store = Store::new();
    let config = store.scratch("ferry.toml");
    std::fs::write(&config, "[nbd]\nlisten_adress = \"127.0.0.1:1\"\n").unwrap();
    let out = run_ferry(&[
        "server",
        "--config",
        path_str(&config),
        "--store",
        path_str(&store.path()),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("listen_adress"), "{stderr}");
}

/// A server configured for PVS's 4,095 devices raises its own open-file limit from a
/// 1,024 default (else accepts past about a thousand fail with EMFILE).
#[test]
fn a_server_raises_its_open_file_limit_to_fit_max_connections() {
    if !interop::require("prlimit") {
        return;
    }
    let store = Store::new();
    let config = store.scratch("ferry.toml");
    std::fs::write(&config, "[nbd]\nmax_connections = 4096\n").unwrap();
    let nbd_port = free_port();
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=1024:8192", "--", env!("CARGO_BIN_EXE_ferry")])
        .args(["server", "--config", path_str(&config)])
        .args(["--store", path_str(&store.path())])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd_port}"))
        .arg("--metrics-listen=");
    let mut proc = Proc::spawn(&mut cmd, store.scratch("limits.log"));
    proc.wait_until("NBD accepting", || {
        TcpStream::connect(("127.0.0.1", nbd_port)).is_ok()
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", proc.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let soft: u64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(soft >= 4096 + 512, "{line}");
    proc.stop();
}

#[test]
fn server_without_store_exits_1_asking_for_one() {
    let out = run_ferry(&["server", "--nbd-listen=127.0.0.1:0", "--metrics-listen="]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--store"), "{stderr}");
}

#[test]
fn farm_api_in_plain_http_on_a_non_loopback_address_exits_1_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let init = run_ferry(&["farm", "init", "--data", data]);
    assert!(init.status.success(), "{init:?}");
    let out = run_ferry(&["farm", "serve", "--data", data, "--listen", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a loopback address"), "{stderr}");
}

#[test]
fn server_help_shows_an_example() {
    let out = run_ferry(&["server", "--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("ferry server --store ferry-data"),
        "{stdout}"
    );
    assert!(stdout.contains("--nbd-listen"), "{stdout}");
}
