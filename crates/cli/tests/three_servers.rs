//! Three `ferry server --farm` processes on loopback sharing one PostgreSQL farm and one
//! store directory (issue 20, part 5): thirty devices (`ferry target --device MAC`, each
//! with its own device secret and exporting on its own unix socket) log in and are spread
//! over the three servers; each runs fio (randrw with crc32c verify over its write cache,
//! and reads of the vDisk that go to its server). Mid-run one server gets SIGKILL and
//! another is drained (`ferry server drain`). Every fio must end with no I/O error and
//! every verify passing, the drained server with no NBD connection left, no device counted
//! on the killed one, and every device on the living, undrained server (its own status and
//! the farm's status API agree).
//!
//! Tool rule: a missing fio, qemu-io or PostgreSQL skips with a printed reason, and fails
//! under `CI=true` (scripts/test.sh starts PostgreSQL and exports FERRY_TEST_PG_URL).
//! The time limits are hang guards, not measures.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "../../farm/tests/it/common/mod.rs"]
mod pg;

use common::{Proc, ferry, free_port, path_str};
use interop::{MIB, create_vhdx, dynamic, require_all, run_ok, session};
use serde_json::Value;

/// Devices, spread by login over the three servers.
const DEVICES: usize = 30;
const SERVERS: usize = 3;
const SIZE: u64 = 64 * MIB;
/// Where the vDisk holds [`PATTERN`]: the devices' fio reads it from their server.
const PATTERN_AT: u64 = 48 * MIB;
const PATTERN: u8 = 0x22;
/// Each device's RAM write cache (the farm grants it at login).
const RAM_BYTES: u64 = 64 * MIB;
/// How long each fio runs: long enough for the kill and the drain to happen inside it
/// (asserted: every fio is still running once both are over).
const FIO_RUNTIME_S: u64 = 60;
/// A hang guard for each phase (a failover, a drain, a status report), not a measure.
const PHASE_WAIT: Duration = Duration::from_secs(90);

struct Farm {
    dir: tempfile::TempDir,
    db: String,
    token: String,
}

/// One `ferry server --farm` with its API URL, NBD address and metrics URL.
struct Server {
    proc: Option<Proc>,
    name: String,
    api: String,
    nbd: String,
    metrics: String,
}

impl Farm {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn store(&self) -> PathBuf {
        self.data().join("stores").join("main")
    }

    fn server(&self, name: &str) -> Server {
        let (api, nbd, metrics) = (free_port(), free_port(), free_port());
        let mut cmd = ferry();
        cmd.args(["server", "--farm", path_str(&self.data())])
            .args(["--db", &self.db])
            .args(["--store", path_str(&self.store())])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .args(["--server-name", name]);
        let mut p = Proc::spawn(&mut cmd, self.dir.path().join(format!("{name}.log")));
        p.wait_until("serving the API and NBD", || {
            TcpStream::connect(("127.0.0.1", api)).is_ok()
                && TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        });
        Server {
            proc: Some(p),
            name: name.to_string(),
            api: format!("http://127.0.0.1:{api}"),
            nbd: format!("127.0.0.1:{nbd}"),
            metrics: format!("http://127.0.0.1:{metrics}/metrics"),
        }
    }

    /// `ferry ARGS --api API --token .. --json`, which must succeed.
    fn json(&self, api: &str, args: &[&str]) -> Value {
        let out = ferry()
            .args(args)
            .args(["--api", api, "--token", &self.token, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ferry {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// The farm's live status (`GET /api/v1/status`).
    fn status(&self, api: &str) -> Value {
        reqwest::blocking::Client::new()
            .get(format!("{api}/api/v1/status"))
            .bearer_auth(&self.token)
            .send()
            .and_then(|r| r.json())
            .unwrap()
    }
}

impl Server {
    fn log_text(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }

    /// Its open NBD connections (the `ferry_nbd_connections` gauge).
    fn connections(&self) -> u64 {
        let text = reqwest::blocking::get(&self.metrics)
            .and_then(|r| r.text())
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("ferry_nbd_connections "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no ferry_nbd_connections gauge:\n{text}"))
    }
}

/// A device: its target, export socket and fio.
struct Device {
    mac: String,
    socket: PathBuf,
    target: Option<Proc>,
    fio: Option<Child>,
    fio_out: PathBuf,
}

impl Device {
    fn status(&self) -> Value {
        let export = format!("--export=unix:{}", path_str(&self.socket));
        serde_json::from_str(&run_ok(
            ferry().args(["target", "status", "--json", &export]),
        ))
        .unwrap()
    }

    fn server(&self) -> String {
        self.status()["server"].as_str().unwrap_or("").to_string()
    }

    fn target_log(&self) -> String {
        self.target.as_ref().map(Proc::log_text).unwrap_or_default()
    }
}

fn mac_of(i: usize) -> String {
    format!("aa:bb:cc:00:30:{i:02x}")
}

/// The fio job of device `d`: randrw with crc32c verify over the first 16 MiB (its writes
/// stay in its write cache, the reads of blocks it has not written go to the server), and
/// reads of the vDisk's pattern region, which always go to the server. Rates are capped so
/// that thirty devices leave the two CPUs to the servers and the targets.
fn fio_job(d: &Device, dir: &Path) -> PathBuf {
    let job = format!(
        "[global]\n\
         ioengine=nbd\n\
         uri=nbd+unix:///?socket={sock}\n\
         bs=4k\n\
         time_based=1\n\
         runtime={FIO_RUNTIME_S}\n\
         [rw]\n\
         rw=randrw\n\
         offset=0\n\
         size=16M\n\
         iodepth=2\n\
         rate_iops=40\n\
         verify=crc32c\n\
         verify_backlog=32\n\
         verify_fatal=1\n\
         [reads]\n\
         rw=randread\n\
         offset={PATTERN_AT}\n\
         size=16M\n\
         iodepth=1\n\
         rate_iops=40\n",
        sock = path_str(&d.socket),
    );
    let path = dir.join(format!("{}.fio", d.mac.replace(':', "")));
    std::fs::write(&path, job).unwrap();
    path
}

/// Waits (up to [`PHASE_WAIT`]) until `done()`, else fails with `what` and `detail()`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool, detail: impl Fn() -> String) {
    let deadline = Instant::now() + PHASE_WAIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {PHASE_WAIT:?}\n{}",
            detail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn thirty_devices_survive_a_killed_and_a_drained_server_of_three() {
    if !require_all(&["fio", "qemu-io"]) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = rt.block_on(pg::fresh_pg_database()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let init: Value = serde_json::from_str(&run_ok(ferry().args([
        "farm",
        "init",
        "--data",
        path_str(&data),
        "--db",
        &db,
        "--json",
    ])))
    .unwrap();
    let f = Farm {
        token: init["admin_token"].as_str().unwrap().to_string(),
        db,
        dir,
    };
    std::fs::create_dir_all(f.store()).unwrap();
    let base = f.store().join("golden.vhdx");
    create_vhdx(&base, &dynamic(SIZE, 2 * MIB as u32));
    session(&base, |d| {
        d.write_at(&vec![PATTERN; 16 * MIB as usize], PATTERN_AT)
            .unwrap();
    });

    let mut servers: Vec<Server> = (1..=SERVERS).map(|i| f.server(&format!("s{i}"))).collect();
    // The devices log in through s3's API and report their status to it: s3 lives on.
    let api = servers[2].api.clone();
    f.json(&api, &["store", "add", "main", "--path", "main"]);
    f.json(&api, &["farm", "vdisk", "add", "golden", "--store", "1"]);
    f.json(
        &api,
        &[
            "collection",
            "add",
            "lab",
            "--site",
            "1",
            "--vdisk",
            "golden",
        ],
    );
    let ram = RAM_BYTES.to_string();
    for i in 0..DEVICES {
        f.json(
            &api,
            &[
                "device",
                "add",
                &mac_of(i),
                "--name",
                &format!("pc{i}"),
                "--collection",
                "1",
                "--vdisk",
                "golden",
                "--cache-mode",
                "ram_overflow",
                "--ram-bytes",
                &ram,
            ],
        );
    }
    let listed = f.json(&api, &["farm", "server", "list"]);
    let id_of = |name: &str| {
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["id"].as_i64())
            .unwrap_or_else(|| panic!("no server {name}: {listed}"))
    };
    let ids: Vec<i64> = servers.iter().map(|s| id_of(&s.name)).collect();

    // Thirty logins, one after another: each goes to the least loaded server.
    let mut devices = Vec::new();
    for i in 0..DEVICES {
        let mac = mac_of(i);
        let home = f.dir.path().join(format!("dev{i}"));
        std::fs::create_dir_all(home.join("overflow")).unwrap();
        let socket = home.join("nbd.sock");
        // The device's own secret, from an administrator's credential reset.
        let cred = f.json(&api, &["device", "credential", &mac]);
        let secret = home.join("device.secret");
        std::fs::write(&secret, cred["device_secret"].as_str().unwrap()).unwrap();
        let mut cmd = ferry();
        cmd.args(["target", "--server", &api, "--device", &mac])
            .args(["--device-secret", path_str(&secret)])
            .args(["--state-dir", path_str(&home.join("state"))])
            .arg(format!("--export=unix:{}", path_str(&socket)))
            .args(["--overflow", path_str(&home.join("overflow"))]);
        let mut target = Proc::spawn(&mut cmd, home.join("target.log"));
        let ctl = PathBuf::from(format!("{}.ctl", path_str(&socket)));
        target.wait_until("exporting", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
        });
        devices.push(Device {
            mac,
            socket,
            target: Some(target),
            fio: None,
            fio_out: home.join("fio.out"),
        });
    }
    let on = |nbd: &str, devices: &[Device]| devices.iter().filter(|d| d.server() == nbd).count();
    for s in &servers {
        assert_eq!(
            on(&s.nbd, &devices),
            DEVICES / SERVERS,
            "logins were not spread evenly: {:?}",
            devices.iter().map(Device::server).collect::<Vec<_>>()
        );
    }

    // fio on every device.
    for d in &mut devices {
        let job = fio_job(d, f.dir.path());
        let out = std::fs::File::create(&d.fio_out).unwrap();
        let err = out.try_clone().unwrap();
        d.fio = Some(
            Command::new("fio")
                .arg(&job)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap(),
        );
    }
    let all_detail = |devices: &[Device]| {
        devices
            .iter()
            .map(|d| format!("{}: {}", d.mac, d.status()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    wait_for(
        "every device writes and reads",
        || {
            devices.iter().all(|d| {
                let s = d.status();
                s["writes"].as_u64().unwrap_or(0) > 0 && s["reads"].as_u64().unwrap_or(0) > 0
            })
        },
        || all_detail(&devices),
    );

    // SIGKILL s1: its devices fail over (to s2 or s3, along their lists).
    let (killed_nbd, drained_nbd, living_nbd) = (
        servers[0].nbd.clone(),
        servers[1].nbd.clone(),
        servers[2].nbd.clone(),
    );
    servers[0].proc.take().unwrap().kill();
    wait_for(
        "the killed server's devices fail over",
        || on(&killed_nbd, &devices) == 0,
        || all_detail(&devices),
    );

    // Drain s2: it closes its sessions' connections; they fail over to s3.
    let set = f.json(&api, &["server", "drain", "s2"]);
    assert_eq!(set["draining"], true, "{set}");
    wait_for(
        "the drained server's devices move to s3",
        || devices.iter().all(|d| d.server() == living_nbd) && servers[1].connections() == 0,
        || {
            format!(
                "{}\ns2 connections: {}\ns2 log:\n{}",
                all_detail(&devices),
                servers[1].connections(),
                servers[1].log_text()
            )
        },
    );
    for d in &mut devices {
        let running = d.fio.as_mut().unwrap().try_wait().unwrap().is_none();
        assert!(
            running,
            "fio of {} ended before the kill and the drain were over: raise FIO_RUNTIME_S",
            d.mac
        );
    }

    // Every fio ends well: exit 0, no job error, no verify failure.
    for d in &mut devices {
        let status = d.fio.take().unwrap().wait().unwrap();
        let out = std::fs::read_to_string(&d.fio_out).unwrap();
        assert!(status.success(), "fio of {}: {status}\n{out}", d.mac);
        assert_eq!(out.matches("err= 0").count(), 2, "fio of {}:\n{out}", d.mac);
        for bad in ["verify", "error", "fio: io_u"] {
            assert!(!out.contains(bad), "fio of {} says {bad:?}:\n{out}", d.mac);
        }
    }
    let mut moved = 0;
    for d in &devices {
        let s = d.status();
        assert_eq!(s["errors"], 0, "{}: {s}", d.mac);
        assert_eq!(s["server"], living_nbd.as_str(), "{}: {s}", d.mac);
        moved += usize::from(s["failovers"].as_u64().unwrap_or(0) > 0);
        // The vDisk's bytes, through the moved device, are still the vDisk's.
        let out = Command::new("qemu-io")
            .stdin(Stdio::null())
            .args(["-f", "raw", "-c"])
            .arg(format!("read -P {PATTERN} {PATTERN_AT} 1M"))
            .arg(format!("nbd+unix:///?socket={}", path_str(&d.socket)))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !text.contains("failed"), "{text}");
        let log = d.target_log();
        assert!(!log.contains("ERROR"), "{}:\n{log}", d.mac);
    }
    // The devices of s1 and of s2 all moved (s3's never had to).
    assert!(
        moved >= 2 * DEVICES / SERVERS,
        "only {moved} devices failed over"
    );
    assert_eq!(on(&drained_nbd, &devices), 0);

    // The farm sees every device on s3: none on the killed s1, none on the drained s2.
    wait_for(
        "the farm's status shows every device on s3",
        || {
            let v = f.status(&api);
            let on_ids: Vec<Option<i64>> = v["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| d["counters"]["server_id"].as_i64())
                .collect();
            on_ids.len() == DEVICES && on_ids.iter().all(|id| *id == Some(ids[2]))
        },
        || f.status(&api).to_string(),
    );
    let v = f.status(&api);
    assert_eq!(v["connected"], DEVICES as i64, "{v}");
    assert!(
        servers[1]
            .log_text()
            .contains("draining: closed the session's connections"),
        "{}",
        servers[1].log_text()
    );
    assert_eq!(servers[1].connections(), 0);

    for d in &mut devices {
        d.target.take().unwrap().stop();
    }
    for s in &mut servers[1..] {
        s.proc.take().unwrap().stop();
    }
}
