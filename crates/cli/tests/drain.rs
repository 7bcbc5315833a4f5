//! Two `ferry server --farm` processes on one farm (issue 20): a device logged in through
//! the first reads from it; `ferry server drain NAME` makes that server close the
//! session's connections, the target fails over to the second server without a new login
//! and keeps reading the same bytes (qemu-io verifies them), and the farm's live status
//! shows it on the second server. (The login order itself is `crates/farm/tests/balance.rs`.)
//!
//! Tool rule: a missing qemu-io skips with a printed reason, and fails under `CI=true`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Proc, ferry, free_port, path_str};
use interop::{MIB, create_vhdx, dynamic, require, run_ok, session};
use serde_json::Value;

const MAC: &str = "aa:bb:cc:00:20:01";
const SIZE: u64 = 64 * MIB;
/// A hang guard for the move (a drain check each second), not a measure.
const MOVE_WAIT: Duration = Duration::from_secs(60);

struct Farm {
    dir: tempfile::TempDir,
    token: String,
    key_file: PathBuf,
}

impl Farm {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn store(&self) -> PathBuf {
        self.data().join("stores").join("main")
    }

    /// `ferry server --farm` named `name`; returns it with its API URL and NBD address.
    fn server(&self, name: &str) -> (Proc, String, String) {
        let (api, nbd) = (free_port(), free_port());
        let mut cmd = ferry();
        cmd.args(["server", "--farm", path_str(&self.data())])
            .args(["--store", path_str(&self.store())])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg("--metrics-listen=")
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .args(["--server-name", name]);
        let mut p = Proc::spawn(&mut cmd, self.dir.path().join(format!("{name}.log")));
        p.wait_until("serving the API and NBD", || {
            TcpStream::connect(("127.0.0.1", api)).is_ok()
                && TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        });
        (
            p,
            format!("http://127.0.0.1:{api}"),
            format!("127.0.0.1:{nbd}"),
        )
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
}

fn status(socket: &Path) -> Value {
    let export = format!("--export=unix:{}", path_str(socket));
    serde_json::from_str(&run_ok(
        ferry().args(["target", "status", "--json", &export]),
    ))
    .unwrap()
}

/// qemu-io reads of the golden pattern through the target's export; asserts they verify.
fn reads_verify(socket: &Path) {
    let out = Command::new("qemu-io")
        .stdin(Stdio::null())
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0x21 0 1M",
            "-c",
            "read -P 0x22 32M 1M",
        ])
        .arg(format!("nbd+unix:///?socket={}", path_str(socket)))
        .output()
        .unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io: {t}");
    assert!(!t.contains("failed"), "qemu-io: {t}");
}

#[test]
fn a_drained_server_s_device_fails_over_and_keeps_reading() {
    if !require("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let init: Value = serde_json::from_str(&run_ok(ferry().args([
        "farm",
        "init",
        "--data",
        path_str(&data),
        "--json",
    ])))
    .unwrap();
    let f = Farm {
        token: init["admin_token"].as_str().unwrap().to_string(),
        key_file: PathBuf::from(init["farm_key_file"].as_str().unwrap()),
        dir,
    };
    std::fs::create_dir_all(f.store()).unwrap();
    let base = f.store().join("golden.vhdx");
    create_vhdx(&base, &dynamic(SIZE, 2 * MIB as u32));
    session(&base, |d| {
        d.write_at(&vec![0x21; MIB as usize], 0).unwrap();
        d.write_at(&vec![0x22; MIB as usize], 32 * MIB).unwrap();
    });

    let (s1, api1, nbd1) = f.server("s1");
    f.json(&api1, &["store", "add", "main", "--path", "main"]);
    f.json(&api1, &["farm", "vdisk", "add", "golden", "--store", "1"]);
    f.json(
        &api1,
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
    f.json(
        &api1,
        &[
            "device",
            "add",
            MAC,
            "--name",
            "pc1",
            "--collection",
            "1",
            "--vdisk",
            "golden",
        ],
    );
    let (s2, api2, nbd2) = f.server("s2");
    let servers = f.json(&api2, &["farm", "server", "list"]);
    let id_of = |name: &str| {
        servers["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["id"].as_i64())
            .unwrap_or_else(|| panic!("no server {name}: {servers}"))
    };
    let (id1, id2) = (id_of("s1"), id_of("s2"));

    // The device logs in through s1's API: both servers empty, s1 (the lower id) first.
    let socket = f.dir.path().join("pc1.sock");
    let overflow = f.dir.path().join("overflow");
    std::fs::create_dir_all(&overflow).unwrap();
    let mut cmd = ferry();
    cmd.args(["target", "--server", &api1, "--device", MAC])
        .args(["--farm-key", path_str(&f.key_file)])
        .args(["--state-dir", path_str(&f.dir.path().join("state"))])
        .arg(format!("--export=unix:{}", path_str(&socket)))
        .args(["--overflow", path_str(&overflow)]);
    let mut target = Proc::spawn(&mut cmd, f.dir.path().join("target.log"));
    let ctl = PathBuf::from(format!("{}.ctl", path_str(&socket)));
    target.wait_until("exporting", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
    });
    assert_eq!(status(&socket)["server"], nbd1.as_str());
    reads_verify(&socket);

    // Drain s1: it closes the session's connections; the target's next request fails over
    // to s2 (the reads go on while it does: none may fail).
    let set = f.json(&api2, &["server", "drain", "s1"]);
    assert_eq!(set["draining"], true, "{set}");
    let deadline = Instant::now() + MOVE_WAIT;
    loop {
        reads_verify(&socket);
        let s = status(&socket);
        if s["server"] == nbd2.as_str() {
            assert!(s["failovers"].as_u64().unwrap_or(0) >= 1, "{s}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the target did not move to s2 within {MOVE_WAIT:?}: {s}\ns1 log:\n{}",
            s1.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    reads_verify(&socket);
    assert!(
        s1.log_text()
            .contains("draining: closed the session's connections"),
        "{}",
        s1.log_text()
    );
    let target_log = target.log_text();
    assert!(!target_log.contains("ERROR"), "{target_log}");

    // The farm counts the device on s2 (its status reports name it), and a login now
    // names the draining s1 last.
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + MOVE_WAIT;
    loop {
        let v: Value = client
            .get(format!("{api1}/api/v1/status"))
            .bearer_auth(&f.token)
            .send()
            .and_then(|r| r.json())
            .unwrap();
        let on = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == MAC)
            .map(|d| d["counters"]["server_id"].clone());
        if on == Some(Value::from(id2)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the farm did not see pc1 on s2: {v}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let listed = f.json(&api2, &["farm", "server", "list"]);
    let s1_row = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id1)
        .cloned()
        .unwrap();
    assert_eq!(s1_row["draining"], true, "{listed}");
    // `ferry farm server set` (by id) ends it; `ferry server undrain` (by name) too.
    let set = f.json(
        &api2,
        &[
            "farm",
            "server",
            "set",
            &id1.to_string(),
            "--no-drain",
            "--rating",
            "200",
        ],
    );
    assert_eq!(
        (set["draining"].clone(), set["rating"].clone()),
        (false.into(), 200.into())
    );
    f.json(&api2, &["server", "drain", "s1"]);
    let set = f.json(&api2, &["server", "undrain", "s1"]);
    assert_eq!(set["draining"], false, "{set}");
    let out = ferry()
        .args([
            "server", "drain", "nosuch", "--api", &api2, "--token", &f.token,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no server named \"nosuch\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.stop();
    s2.stop();
    s1.stop();
}
