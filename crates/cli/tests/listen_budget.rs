//! Issue 30's listener findings against the real binary under a low open-file limit: a
//! flood on one port must not stop the others (H1), the plain `ferry farm serve` API must
//! not be held by idle connections, and half-open STARTTLS handshakes, from one address or
//! from many, must not lock anyone out of NBD (M). Floods are bounded and come from loopback addresses
//! (127.0.0.0/8 are all this machine's, and distinct clients to the server).
//!
//! Each test asserts what keeps working, never how fast; the bounds below only turn a
//! hang into a failure.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::farm::Farm;
use common::{Proc, WAIT, free_port, path_str, scrape};

/// How long a client waits for an answer the server owes it (a failure past it, never a
/// pass condition).
const PATIENCE: Duration = Duration::from_secs(10);
/// The open-file limit the servers run under (a systemd service's default).
const NOFILE: u32 = 1024;
/// Slow clients on the boot port (issue 30, H1).
const BOOT_FLOOD: usize = 1600;
/// Loopback addresses the flood comes from (BOOT_FLOOD / FLOOD_ADDRESSES each, the boot
/// port's per-address cap: every flood connection passes its address's cap, so only the
/// listener's share of open files holds them back).
const FLOOD_ADDRESSES: usize = 100;

/// `cmd` run as `sh -c 'ulimit -n NOFILE && exec ...'` (soft and hard limit), without the
/// environment that would point it at another farm.
fn under_ulimit(args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("ulimit -n {NOFILE} && exec \"$@\""))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(args);
    for v in ["FERRY_TOKEN", "FERRY_API", "FERRY_FARM_KEY", "FERRY_DB"] {
        c.env_remove(v);
    }
    c
}

/// This test process may hold the flood's sockets.
fn raise_own_open_files() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
}

/// `n` TCP connections to `to`, from 127.0.0.10, 127.0.0.11, ... (`per_address` each),
/// each sending `first` and then nothing; those that connected.
fn flood(to: SocketAddr, n: usize, per_address: usize, first: &'static [u8]) -> Vec<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let ip = Ipv4Addr::new(127, 0, 0, 10 + u8::try_from(i / per_address).unwrap());
            set.spawn(async move {
                let s = tokio::net::TcpSocket::new_v4().ok()?;
                s.bind(SocketAddr::V4(SocketAddrV4::new(ip, 0))).ok()?;
                let mut c = tokio::time::timeout(Duration::from_secs(3), s.connect(to))
                    .await
                    .ok()?
                    .ok()?;
                let _ = tokio::io::AsyncWriteExt::write_all(&mut c, first).await;
                let s = c.into_std().ok()?;
                s.set_nonblocking(false).ok()?;
                Some(s)
            });
        }
        let mut held = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Ok(Some(s)) = r {
                held.push(s);
            }
        }
        held
    })
}

/// A blocking raw NBD client (fixed newstyle, `NBD_OPT_EXPORT_NAME`, simple replies).
struct Nbd(TcpStream);

impl Nbd {
    /// Connects from 127.0.0.1 and opens `name`.
    fn open(to: SocketAddr, name: &str) -> std::io::Result<Nbd> {
        let mut s = TcpStream::connect(to)?;
        s.set_read_timeout(Some(PATIENCE))?;
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting)?;
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        // NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES.
        s.write_all(&3u32.to_be_bytes())?;
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
        opt.extend_from_slice(&u32::try_from(name.len()).unwrap().to_be_bytes());
        opt.extend_from_slice(name.as_bytes());
        s.write_all(&opt)?;
        let mut export = [0u8; 10];
        s.read_exact(&mut export)?;
        Ok(Nbd(s))
    }

    /// `NBD_CMD_READ` of `len` bytes at `offset`.
    fn read(&mut self, offset: u64, len: u32) -> std::io::Result<Vec<u8>> {
        let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
        req.extend_from_slice(&[0, 0, 0, 0]); // flags, NBD_CMD_READ
        req.extend_from_slice(&7u64.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        self.0.write_all(&req)?;
        let mut head = [0u8; 16];
        self.0.read_exact(&mut head)?;
        assert_eq!(head[..8], [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0], "{head:?}");
        let mut data = vec![0u8; len as usize];
        self.0.read_exact(&mut data)?;
        Ok(data)
    }
}

/// The first 4 KiB of `golden` (0x21, see `common::farm`), read through `c`.
fn reads_golden(c: &mut Nbd) -> bool {
    c.read(0, 4096).is_ok_and(|d| d.iter().all(|&b| b == 0x21))
}

/// `GET path` over HTTPS on loopback `port`, trusting `ca`: the status, or the error.
fn https_get(port: u16, path: &str, ca: &Path) -> Result<u16, String> {
    let ca = std::fs::read(ca).unwrap();
    let client = reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(PATIENCE)
        .build()
        .unwrap();
    client
        .get(format!("https://127.0.0.1:{port}{path}"))
        .send()
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// `GET path` in plain HTTP on loopback `port`: the status line, or the error.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    text.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "no answer".to_string())
}

/// `f` until it succeeds, for up to [`PATIENCE`] (a client that retries, as iPXE and the
/// NBD clients do): its last error past that.
fn retry<T, E>(mut f: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= PATIENCE => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The soft open-file limit of process `pid`.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// H1: under `ulimit -n 1024`, 1,600 slow or idle clients on the boot port (from 100
/// addresses) leave NBD, the API and metrics accepting and an established NBD client
/// reading; a device from another address gets its boot script during the flood, and the
/// boot port serves everyone again once the flood's request heads time out.
#[test]
fn boot_port_flood_under_1024_files_leaves_nbd_api_and_metrics_serving() {
    raise_own_open_files();
    let f = Farm::init();
    let (nbd, api, boot, metrics) = (free_port(), free_port(), free_port(), free_port());
    let mut cmd = under_ulimit(&["server", "--farm", path_str(&f.data())]);
    cmd.args(["--store", path_str(&f.store())])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
        .arg(format!("--api-listen=127.0.0.1:{api}"))
        .arg(format!("--boot-listen=127.0.0.1:{boot}"))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
        .args(["--server-name", "s1", "--http-header-timeout", "10s"]);
    let mut proc = Proc::spawn(&mut cmd, f.dir.path().join("s1.log"));
    proc.wait_until("serving", || {
        [nbd, api, boot, metrics]
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    });
    assert_eq!(soft_nofile(proc.pid()), u64::from(NOFILE));
    let nbd_addr: SocketAddr = format!("127.0.0.1:{nbd}").parse().unwrap();
    let mut established = Nbd::open(nbd_addr, "golden").expect("open golden");
    assert!(reads_golden(&mut established));

    // Half send part of a request head and stop (slowloris), half send nothing.
    let boot_addr: SocketAddr = format!("127.0.0.1:{boot}").parse().unwrap();
    let per_address = BOOT_FLOOD / FLOOD_ADDRESSES;
    let mut held = flood(
        boot_addr,
        BOOT_FLOOD / 2,
        per_address,
        b"GET /boot/ipxe HTTP/1.1\r\n",
    );
    held.extend(flood(boot_addr, BOOT_FLOOD / 2, per_address, b""));
    assert!(
        held.len() >= BOOT_FLOOD / 2,
        "only {} connected",
        held.len()
    );

    // A device from an address of its own boots meanwhile: the full boot port closes the
    // oldest connection of an address holding the most to make room for it (retrying as
    // iPXE does: while the flood's last connections are being closed, at most
    // `budget::EVICTIONS_PENDING_MAX` of them, a newcomer may be refused for a moment).
    let line = retry(|| http_get(boot, "/boot/ipxe")).unwrap_or_else(|e| {
        panic!(
            "a device's boot script during the flood: {e}\n{}\n{}",
            scrape(metrics)
                .lines()
                .filter(|l| l.starts_with("ferry_listener"))
                .collect::<Vec<_>>()
                .join("\n"),
            proc.log_text()
        )
    });
    assert!(line.contains(" 200 "), "during the flood: {line}");

    // Every other listener still accepts and serves.
    let mut fresh = Nbd::open(nbd_addr, "golden").expect("a new NBD client during the flood");
    assert!(reads_golden(&mut fresh));
    assert!(reads_golden(&mut established));
    let ca = f.data().join("secrets").join("ca-cert.pem");
    assert_eq!(https_get(api, "/api/v1/openapi.json", &ca), Ok(200));
    let page = scrape(metrics);
    let refused = page
        .lines()
        .find_map(|l| l.strip_prefix("ferry_listener_refused_full_total{listener=\"boot\"} "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no boot refusals counted:\n{page}"));
    assert!(refused > 0);
    let evicted = page
        .lines()
        .find_map(|l| l.strip_prefix("ferry_listener_evicted_total{listener=\"boot\"} "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no boot evictions counted:\n{page}"));
    assert!(evicted > 0);
    // The flood's request heads time out, and the boot port serves again.
    let start = Instant::now();
    loop {
        if let Ok(line) = http_get(boot, "/boot/ipxe")
            && line.contains(" 200 ")
        {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the boot port never recovered: {}",
            proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(held);
    proc.stop();
}

/// `ferry farm serve`'s plain API under `ulimit -n 1024`: 1,100 idle connections from one
/// address hold at most its per-address cap, and another client is answered.
#[test]
fn idle_connections_from_one_address_do_not_hold_the_plain_api() {
    raise_own_open_files();
    let f = Farm::init();
    let port = free_port();
    let mut cmd = under_ulimit(&["farm", "serve", "--data", path_str(&f.data())]);
    cmd.arg(format!("--listen=127.0.0.1:{port}"));
    let mut proc = Proc::spawn(&mut cmd, f.dir.path().join("api.log"));
    proc.wait_until("serving", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let held = flood(to, 1100, 1100, b"");
    assert!(held.len() >= 1000, "only {} connected", held.len());
    let line = http_get(port, "/api/v1/openapi.json").expect("an answer during the flood");
    assert!(line.contains(" 200 "), "{line}");
    drop(held);
    proc.stop();
}

/// M: 300 clients from one address that send STARTTLS and then never start the TLS
/// handshake hold at most that address's cap of NBD connections (loopback counted as
/// remote), and a client from another address is served; 400 more from 50 addresses fill
/// NBD's share, and a new client is still served (it takes a half-open handshake's place)
/// while a device streaming since before the floods is never closed.
#[test]
fn half_open_starttls_locks_no_one_out_of_nbd() {
    raise_own_open_files();
    let f = Farm::init();
    let config = f.dir.path().join("ferry.toml");
    std::fs::write(&config, "[access]\nplain_reads = \"any\"\n").unwrap();
    let (nbd, api, metrics) = (free_port(), free_port(), free_port());
    let mut cmd = under_ulimit(&["server", "--farm", path_str(&f.data())]);
    cmd.args(["--store", path_str(&f.store())])
        .args(["--config", path_str(&config)])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
        .arg(format!("--api-listen=127.0.0.1:{api}"))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
        .args([
            "--server-name",
            "s1",
            "--loopback-is-remote",
            "--nbd-per-address",
            "8",
        ]);
    let mut proc = Proc::spawn(&mut cmd, f.dir.path().join("s1.log"));
    proc.wait_until("serving", || TcpStream::connect(("127.0.0.1", nbd)).is_ok());
    let to: SocketAddr = format!("127.0.0.1:{nbd}").parse().unwrap();
    let mut established = Nbd::open(to, "golden").expect("a device before the floods");
    // Greeting, client flags, NBD_OPT_STARTTLS; the server's ACK is never followed by a
    // ClientHello.
    let mut starttls = 3u32.to_be_bytes().to_vec();
    starttls.extend_from_slice(b"IHAVEOPT");
    starttls.extend_from_slice(&5u32.to_be_bytes());
    starttls.extend_from_slice(&0u32.to_be_bytes());
    let starttls: &'static [u8] = starttls.leak();
    let mut held = flood(to, 300, 300, starttls);
    assert!(held.len() >= 250, "only {} connected", held.len());
    let mut fresh = Nbd::open(to, "golden").expect("a client from 127.0.0.1 during the flood");
    assert!(reads_golden(&mut fresh));
    // Only the address's cap was served (got the greeting); the rest were closed at once
    // (or, on a loaded machine, not yet: a timeout is not a greeting).
    let mut greeted = 0;
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Ok(n) if n > 0) {
            greeted += 1;
        }
    }
    assert!(greeted <= 8, "{greeted} half-open handshakes held");

    // From many addresses (8 each), more than NBD's share of open files: the listener is
    // full of half-open handshakes, a new client closes the oldest of the address holding
    // the most, and the device that was streaming before is never closed for anyone.
    let mut many = flood(to, 400, 8, starttls);
    assert!(many.len() >= 300, "only {} connected", many.len());
    let mut fresh =
        retry(|| Nbd::open(to, "golden")).expect("a client while NBD is full of handshakes");
    assert!(reads_golden(&mut fresh));
    assert!(reads_golden(&mut established));
    let page = scrape(metrics);
    let evicted = page
        .lines()
        .find_map(|l| l.strip_prefix("ferry_listener_evicted_total{listener=\"nbd\"} "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no NBD evictions counted:\n{page}"));
    assert!(evicted > 0, "the floods filled NBD's share");
    many.clear();
    drop(held);
    proc.stop();
}
