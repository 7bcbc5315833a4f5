//! End-to-end tests of device login from the target: `ferry farm init`, a farm API
//! (`ferry farm serve`, or `ferry server --farm` which also serves the session exports over
//! NBD), objects made through the CLI, and `ferry target --server URL --device MAC
//! --device-secret FILE` with the secret `ferry device credential` printed.
//!
//! * refusals: an unknown MAC (403), a wrong device secret, the farm key itself and a
//!   secret replaced by a reset (401), a second maintenance device (409), each a clear
//!   message and a nonzero exit;
//! * the proof the target computes (its key-file and MAC parsing, then
//!   `contract::login::proof`) equals the farm's own `farm::login::proof`;
//! * the full path (issue 5's acceptance): a production device logs in and reads the
//!   production version through the target's export (qemu-io); a maintenance device
//!   writes version 1 in private mode; after `promote` to production and a target restart
//!   the production device reads version 1; with the device set to `server` mode it writes
//!   through the writable session export with no local cache.
//!
//! Tool rule (STYLE.md §6): a missing qemu-io skips the read test with a printed reason on
//! a developer's machine and fails it under `CI=true`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Proc, ferry, free_port, path_str};
use interop::{MIB, create_vhdx, dynamic, require, run_ok, session};
use serde_json::Value;

const MAC: &str = "AA:BB:CC:00:00:01";
const MAC_MAINTENANCE: &str = "aa:bb:cc:00:00:02";
const MAC_UNKNOWN: &str = "aa:bb:cc:00:00:99";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A farm data directory (`ferry farm init`) and its API, served by `ferry farm serve` or
/// by `ferry server --farm`.
struct Farm {
    dir: tempfile::TempDir,
    api: String,
    token: String,
    key_file: PathBuf,
    proc: Option<Proc>,
}

impl Farm {
    fn init() -> Farm {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let out = run_ok(ferry().args(["farm", "init", "--data", path_str(&data), "--json"]));
        let init: Value = serde_json::from_str(&out).expect("init JSON");
        let key_file = PathBuf::from(init["farm_key_file"].as_str().unwrap());
        assert_eq!(key_file, data.join("secrets").join("farm.key"));
        Farm {
            api: String::new(),
            token: init["admin_token"].as_str().unwrap().to_string(),
            key_file,
            proc: None,
            dir,
        }
    }

    /// `stores/main/golden.vhdx`: 0x11 in the first MiB, 0x12 at 32 MiB; returns the
    /// store directory.
    fn golden(&self) -> PathBuf {
        let store = self.data().join("stores").join("main");
        std::fs::create_dir_all(&store).unwrap();
        let base = store.join("golden.vhdx");
        create_vhdx(&base, &dynamic(SIZE, 2 * MIB as u32));
        session(&base, |d| {
            d.write_at(&vec![0x11; MIB as usize], 0).unwrap();
            d.write_at(&vec![0x12; MIB as usize], 32 * MIB).unwrap();
        });
        store
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn wait_api(&mut self, port: u16) {
        self.api = format!("http://127.0.0.1:{port}");
        let p = self.proc.as_mut().unwrap();
        p.wait_until("serving the API", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// `ferry farm serve`: the API only, no NBD server registered.
    fn serve(&mut self) {
        let port = free_port();
        let mut cmd = ferry();
        cmd.args(["farm", "serve", "--data", path_str(&self.data())])
            .arg(format!("--listen=127.0.0.1:{port}"));
        self.proc = Some(Proc::spawn(&mut cmd, self.scratch("farm.log")));
        self.wait_api(port);
    }

    /// `ferry server --farm`: the API and the NBD server of the store `stores/main`; returns
    /// the NBD address.
    fn server(&mut self) -> String {
        self.server_on(free_port(), free_port())
    }

    /// [`Farm::server`] on the given ports (a restart keeps its addresses).
    fn server_on(&mut self, api: u16, nbd: u16) -> String {
        let store = self.data().join("stores").join("main");
        std::fs::create_dir_all(&store).unwrap();
        let mut cmd = ferry();
        cmd.args(["server", "--farm", path_str(&self.data())])
            .args(["--store", path_str(&store)])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
            .arg("--metrics-listen=")
            .arg(format!("--api-listen=127.0.0.1:{api}"))
            .args(["--server-name", "s1"]);
        self.proc = Some(Proc::spawn(&mut cmd, self.scratch("server.log")));
        self.wait_api(api);
        let p = self.proc.as_mut().unwrap();
        p.wait_until("serving NBD", || {
            TcpStream::connect(("127.0.0.1", nbd)).is_ok()
        });
        format!("127.0.0.1:{nbd}")
    }

    /// `ferry ARGS --api .. --token .. --json`, which must succeed.
    fn json(&self, args: &[&str]) -> Value {
        let out = ferry()
            .args(args)
            .args(["--api", &self.api, "--token", &self.token, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "ferry {args:?}: {}", text(&out));
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Value::Null;
        }
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A site (unless the server made one), store `main`, vDisk `golden` (imported when
    /// `stores/main/golden.vhdx` exists, else created), a collection, a production device
    /// `MAC` and a maintenance device `MAC_MAINTENANCE`.
    fn populate(&self) {
        if self.json(&["site", "list"])["total"] == 0 {
            self.json(&["site", "add", "hq"]);
        }
        self.json(&["store", "add", "main", "--path", "main"]);
        let mut add = vec!["farm", "vdisk", "add", "golden", "--store", "1"];
        if !self.data().join("stores/main/golden.vhdx").exists() {
            add.extend(["--size", "64M"]);
        }
        add.extend(["--cache-mode", "ram_overflow", "--ram-bytes", "16777216"]);
        self.json(&add);
        let c = [
            "collection",
            "add",
            "lab",
            "--site",
            "1",
            "--vdisk",
            "golden",
        ];
        self.json(&c);
        for (mac, name, ty) in [
            (MAC, "pc1", "production"),
            (MAC_MAINTENANCE, "pc2", "maintenance"),
        ] {
            let d = self.json(&[
                "device",
                "add",
                mac,
                "--name",
                name,
                "--collection",
                "1",
                "--vdisk",
                "golden",
                "--type",
                ty,
            ]);
            assert_eq!(d["device_type"], ty, "{d}");
        }
    }

    /// A new device secret of `mac` (`ferry device credential`), in a file.
    fn secret(&self, mac: &str) -> PathBuf {
        let v = self.json(&["device", "credential", mac]);
        let file = self.scratch(&format!("{}.secret", mac.replace(':', "-")));
        std::fs::write(&file, v["device_secret"].as_str().unwrap()).unwrap();
        file
    }

    /// `ferry target --server API --device MAC --device-secret FILE ...` run to its end (a
    /// login that fails, or an attach that fails).
    fn target_output(&self, mac: &str, secret_file: &Path, extra: &[&str]) -> Output {
        let socket = self.scratch("t.sock");
        ferry()
            .args(["target", "--server", &self.api, "--device", mac])
            .args(["--device-secret", path_str(secret_file)])
            .args(["--state-dir", path_str(&self.scratch("state"))])
            .arg(format!("--export=unix:{}", path_str(&socket)))
            .args(["--overflow", path_str(self.dir.path())])
            .args(["--timeout", "2", "--failover-timeout", "2"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("run ferry target")
    }

    /// A running `ferry target` after device login, exporting on `NAME.sock`.
    fn target(&self, mac: &str, name: &str) -> Target {
        let socket = self.scratch(&format!("{name}.sock"));
        let overflow = self.scratch("overflow");
        std::fs::create_dir_all(&overflow).unwrap();
        // Its first secret from an administrator; later runs find it in the state directory.
        let state = self.scratch("state");
        let kept = state.join(format!(
            "device-{}.secret",
            mac.to_lowercase().replace(':', "-")
        ));
        let mut cmd = ferry();
        cmd.args(["target", "--server", &self.api, "--device", mac]);
        if !kept.exists() {
            cmd.args(["--device-secret", path_str(&self.secret(mac))]);
        }
        cmd.args(["--state-dir", path_str(&state)])
            .arg(format!("--export=unix:{}", path_str(&socket)))
            .args(["--overflow", path_str(&overflow)]);
        let mut proc = Proc::spawn(&mut cmd, self.scratch(&format!("target-{name}.log")));
        let ctl = PathBuf::from(format!("{}.ctl", path_str(&socket)));
        proc.wait_until("exporting", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
        });
        Target { proc, socket }
    }
}

struct Target {
    proc: Proc,
    socket: PathBuf,
}

impl Target {
    fn status(&self) -> Value {
        let export = format!("--export=unix:{}", path_str(&self.socket));
        let out = run_ok(ferry().args(["target", "status", "--json", &export]));
        serde_json::from_str(&out).expect("status is JSON")
    }

    /// qemu-io on the export; asserts no command failed.
    fn qemu_io(&self, cmds: &[&str]) -> String {
        let mut c = Command::new("qemu-io");
        c.stdin(Stdio::null()).args(["-f", "raw"]);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        let uri = format!("nbd+unix:///?socket={}", path_str(&self.socket));
        let out = c.arg(uri).output().expect("run qemu-io");
        let t = text(&out);
        assert!(out.status.success(), "qemu-io {cmds:?}: {t}");
        assert!(!t.contains("Pattern verification failed"), "{cmds:?}: {t}");
        assert!(!t.contains("failed:"), "{cmds:?}: {t}");
        t
    }
}

#[test]
fn the_targets_proof_is_the_farms() {
    let key_hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let key = ::agent::login::parse_secret(key_hex).unwrap();
    for mac in ["aa:bb:cc:00:00:01", "AA-BB-CC-00-00-01", "aabbcc000001"] {
        for nonce in ["nonce", "9f86d081884c7d659a2feaa0c55ad015"] {
            let parsed = ::agent::login::parse_mac(mac).unwrap();
            assert_eq!(
                contract::login::proof(&key, nonce, parsed),
                farm::login::proof(key_hex, nonce, mac).unwrap(),
                "{mac} {nonce}"
            );
        }
    }
}

#[test]
fn login_refuses_unknown_devices_wrong_keys_and_a_second_maintenance_device() {
    let mut f = Farm::init();
    f.serve();
    f.populate();

    let wrong = f.scratch("wrong.key");
    std::fs::write(&wrong, format!("{}\n", "ab".repeat(32))).unwrap();
    let out = f.target_output(MAC_UNKNOWN, &wrong, &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("is unknown to the farm"), "{t}");
    assert!(t.contains(MAC_UNKNOWN), "{t}");

    // A wrong secret, and the farm key itself (issue 30: it logs no device in), are
    // refused, also before the device has any key; neither is kept.
    for key in [&wrong, &f.key_file] {
        let out = f.target_output(MAC, key, &[]);
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(t.contains("login refused"), "{t}");
    }
    let first = f.secret(MAC);
    let out = f.target_output(MAC, &f.key_file, &[]);
    assert!(!out.status.success(), "{}", text(&out));

    let out = f.target_output(MAC, &f.scratch("missing.key"), &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("read the device secret"), "{t}");

    let out = f.target_output(MAC, &first, &["--cache", "ram"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("come from the farm"), "{t}");

    let out = ferry()
        .args(["target", "--server", &f.api, "--device", MAC])
        .args(["--state-dir", path_str(&f.scratch("empty-state"))])
        .arg(format!("--export=unix:{}", path_str(&f.scratch("x.sock"))))
        .env_remove("FERRY_DEVICE_SECRET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("FERRY_DEVICE_SECRET") && t.contains("ferry device credential"),
        "{t}"
    );

    // The right secret: the login succeeds; `ferry farm serve` registers no NBD server, so
    // the target falls back to the API's host on port 10809 and the attach fails there (no
    // server, or no such session). Version 1 in maintenance lets the maintenance device in.
    f.json(&["version", "new", "--vdisk", "golden"]);
    let maintenance = f.secret(MAC_MAINTENANCE);
    let out = f.target_output(MAC_MAINTENANCE, &maintenance, &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("logged in to the farm"), "{t}");
    assert!(t.contains("ferry-s-"), "{t}");
    assert!(t.contains("cache=private"), "{t}");
    assert!(t.contains("lists no NBD server"), "{t}");
    assert!(t.contains("127.0.0.1:10809"), "{t}");
    assert!(t.contains("cannot attach"), "{t}");
    // A reset revokes that secret: the next login with it is refused (a copy: the reset's
    // file has the same name).
    let old = f.scratch("maintenance-old.secret");
    std::fs::copy(&maintenance, &old).unwrap();
    f.secret(MAC_MAINTENANCE);
    let out = f.target_output(MAC_MAINTENANCE, &old, &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("login refused"), "{t}");

    // Its session lives on (24 h): a second maintenance device of the vDisk is refused.
    f.json(&[
        "device",
        "add",
        "aa:bb:cc:00:00:03",
        "--name",
        "pc3",
        "--collection",
        "1",
        "--vdisk",
        "golden",
        "--type",
        "maintenance",
    ]);
    let pc3 = f.secret("aa:bb:cc:00:00:03");
    let out = f.target_output("aa:bb:cc:00:00:03", &pc3, &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("cannot boot device aa:bb:cc:00:00:03"), "{t}");
    assert!(t.contains("another maintenance device"), "{t}");

    f.proc.take().unwrap().stop();
}

/// The vDisk's virtual size.
const SIZE: u64 = 64 * MIB;

#[test]
fn a_production_device_reads_the_production_version_and_the_promoted_one_after_restart() {
    if !require("qemu-io") {
        return;
    }
    let mut f = Farm::init();
    f.golden();
    let nbd = f.server();
    f.populate();

    // Production device: version 0, ram-overflow with 16 MiB of RAM (the vDisk's defaults).
    let pc1 = f.target(MAC, "pc1");
    let s = pc1.status();
    assert_eq!(s["mac"], "aa:bb:cc:00:00:01", "{s}");
    assert!(s["export"].as_str().unwrap().starts_with("ferry-s-"), "{s}");
    assert_eq!(s["server"], nbd.as_str(), "{s}");
    assert_eq!(s["vdisk"], "golden", "{s}");
    assert_eq!(s["cache_mode"], "ram-overflow", "{s}");
    assert_eq!(s["ram_bytes_max"], 16 << 20, "{s}");
    assert_eq!(s["size_bytes"], SIZE, "{s}");
    pc1.qemu_io(&[
        "read -P 0x11 0 1M",
        "read -P 0x12 32M 1M",
        "read -P 0 1M 1M",
    ]);
    // Writes stay in the device's cache.
    pc1.qemu_io(&["write -P 0x99 0 64k", "read -P 0x99 0 64k"]);
    let human = run_ok(ferry().args([
        "target",
        "status",
        &format!("--export=unix:{}", path_str(&pc1.socket)),
    ]));
    assert!(human.contains("aa:bb:cc:00:00:01"), "{human}");
    // The target reports its counters to the farm: the console's live status shows them.
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let reported = loop {
        let v: Value = client
            .get(format!("{}/api/v1/status", f.api))
            .bearer_auth(&f.token)
            .send()
            .and_then(|r| r.json())
            .expect("GET /api/v1/status");
        let read = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == MAC.to_lowercase().as_str())
            .and_then(|d| d["counters"]["bytes_read"].as_u64())
            .unwrap_or(0);
        if read >= 3 * MIB || Instant::now() > deadline {
            break (read, v);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        reported.0 >= 3 * MIB,
        "the farm saw {} bytes read by pc1: {}",
        reported.0,
        reported.1
    );
    // ...and the server it streams from: this one, registered as s1 at the NBD address
    // (issue 17: the console's Server column showed "—" for a connected device).
    let pc1_status = reported.1["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["mac"] == MAC.to_lowercase().as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(pc1_status["counters"]["server_name"], "s1", "{pc1_status}");
    assert_eq!(
        pc1_status["counters"]["server_address"],
        nbd.as_str(),
        "{pc1_status}"
    );

    // Maintenance device: version 1 in private mode, writes go to golden.1.avhdx.
    f.json(&["version", "new", "--vdisk", "golden"]);
    let pc2 = f.target(MAC_MAINTENANCE, "pc2");
    let s = pc2.status();
    assert_eq!(s["cache_mode"], "private", "{s}");
    pc2.qemu_io(&["read -P 0x11 0 1M", "write -P 0x22 0 1M", "flush"]);
    pc2.proc.stop();
    // Its session ends with the device; then version 1 goes to test and production.
    f.json(&["device", "remove", "2"]);
    f.json(&["version", "promote", "1", "--vdisk", "golden"]);
    let v = f.json(&["version", "promote", "1", "--vdisk", "golden"]);
    assert_eq!(v["access"], "production", "{v}");

    // The running production device still reads version 0 (its session's version)...
    pc1.qemu_io(&["read -P 0x11 64k 960k"]);
    pc1.proc.stop();
    // ...and after a restart it logs in again and reads version 1.
    let pc1 = f.target(MAC, "pc1");
    pc1.qemu_io(&["read -P 0x22 0 1M", "read -P 0x12 32M 1M"]);
    pc1.proc.stop();

    // Server mode set on the device: no local cache, the writable session export.
    f.json(&["device", "set", "1", "--cache-mode", "server"]);
    let pc1 = f.target(MAC, "pc1");
    let s = pc1.status();
    assert_eq!(s["cache_mode"], "server", "{s}");
    assert_eq!(s["ram_bytes_max"], 0, "{s}");
    pc1.qemu_io(&[
        "read -P 0x22 0 1M",
        "write -P 0x44 0 64k",
        "read -P 0x44 0 64k",
    ]);
    pc1.proc.stop();
    f.proc.take().unwrap().stop();
}

/// A farm server whose API listens beyond loopback serves HTTPS with its certificate from
/// the farm's authority: a client trusting the farm's CA gets answers, plain HTTP gets
/// none.
#[test]
fn a_farm_server_off_loopback_serves_its_api_over_https_with_the_farm_certificate() {
    let f = Farm::init();
    let store = f.data().join("stores").join("main");
    std::fs::create_dir_all(&store).unwrap();
    let (api, nbd) = (free_port(), free_port());
    let mut cmd = ferry();
    cmd.args(["server", "--farm", path_str(&f.data())])
        .args(["--store", path_str(&store)])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
        .arg("--metrics-listen=")
        .arg(format!("--api-listen=0.0.0.0:{api}"))
        .args(["--server-name", "s1"]);
    let mut proc = Proc::spawn(&mut cmd, f.scratch("server.log"));
    proc.wait_until("serving the API", || {
        TcpStream::connect(("127.0.0.1", api)).is_ok()
    });
    let ca = std::fs::read(f.data().join("secrets").join("ca-cert.pem")).unwrap();
    let client = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let r = client
        .get(format!("https://127.0.0.1:{api}/api/v1/openapi.json"))
        .send()
        .expect("HTTPS with the farm's CA");
    assert!(r.status().is_success(), "{}", r.status());
    let plain = reqwest::blocking::Client::new()
        .get(format!("http://127.0.0.1:{api}/api/v1/openapi.json"))
        .send();
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "plain HTTP was answered"
    );
    proc.stop();
}

/// `nbdinfo URI`'s output, and whether it succeeded.
fn nbdinfo(uri: &str) -> (bool, String) {
    let out = Command::new("nbdinfo")
        .arg(uri)
        .output()
        .expect("run nbdinfo");
    (out.status.success(), text(&out))
}

/// `qemu-io -f raw -c CMD URI` run by a client without a certificate: whether it succeeded.
fn plain_qemu_io(uri: &str, cmd: &str) -> (bool, String) {
    let out = Command::new("qemu-io")
        .stdin(Stdio::null())
        .args(["-f", "raw", "-c", cmd, uri])
        .output()
        .expect("run qemu-io");
    let t = text(&out);
    (out.status.success() && !t.contains("failed"), t)
}

/// Issue 18's acceptance on a farm server: an NBD client without a certificate can neither
/// write a device's write cache or the vDisk itself nor open a device's session, while an
/// administrator's certificate opens it over TLS and the logged-in target (TLS with its
/// login certificate) keeps reading; a server restart leaves the target reading (the
/// session is found in the farm database), and a session ended through the API closes the
/// target's connection, which logs in again by itself and reads on.
#[test]
fn outsiders_are_refused_and_the_target_survives_a_restart_and_an_ended_session() {
    if !require("qemu-io") || !require("nbdinfo") {
        return;
    }
    let mut f = Farm::init();
    let store = f.golden();
    let (api_port, nbd_port) = (free_port(), free_port());
    let nbd = f.server_on(api_port, nbd_port);
    f.populate();
    // ram-overflow (the vDisk's mode): reads of blocks the device did not write go to the
    // server, so the restart is on the read path; the session is a read-only export, which
    // an administrator may open beside the device.
    let pc1 = f.target(MAC, "pc1");
    let s = pc1.status();
    let session_export = s["export"].as_str().unwrap().to_string();
    assert!(session_export.starts_with("ferry-s-"), "{s}");
    pc1.qemu_io(&["read -P 0x11 0 1M"]);

    // Outsiders without a certificate, on the server's own host.
    let (ok, t) = nbdinfo(&format!("nbd://{nbd}/{session_export}"));
    assert!(!ok, "a plain client opened the session export: {t}");
    for export in [
        "golden+aa-bb-cc-00-00-01",
        "golden+aa-bb-cc-00-00-77+persistent",
        "golden+private",
    ] {
        let (ok, t) = plain_qemu_io(&format!("nbd://{nbd}/{export}"), "write -P 0x66 8192 16");
        assert!(!ok, "a plain client wrote {export}: {t}");
    }
    // A refused outsider leaves no file behind (issue 18: 200 anonymous device names left
    // 200 cache directories).
    let write_cache = store.join(".write-cache");
    assert!(
        !write_cache.join("aa-bb-cc-00-00-77").exists(),
        "a refused client made a write-cache directory"
    );
    // Reading the vDisk from the server's own host stays allowed ([access] plain_reads).
    let (ok, t) = nbdinfo(&format!("nbd://{nbd}/golden"));
    assert!(ok, "{t}");
    // An administrator's certificate opens the session over TLS.
    let certs = f.scratch("admin-tls");
    run_ok(
        ferry()
            .args([
                "farm",
                "cert",
                "admin",
                "alice",
                "--data",
                path_str(&f.data()),
            ])
            .args(["--out", path_str(&certs)]),
    );
    let (ok, t) = nbdinfo(&format!(
        "nbds://{nbd}/{session_export}?tls-certificates={}",
        path_str(&certs)
    ));
    assert!(ok, "the admin certificate did not open the session: {t}");
    // No plain client changed a byte the device reads.
    pc1.qemu_io(&["read -P 0x11 0 1M", "read -P 0x12 32M 1M"]);

    // A server restart on the same ports: the target reads on.
    f.proc.take().unwrap().stop();
    let again = f.server_on(api_port, nbd_port);
    assert_eq!(again, nbd);
    pc1.qemu_io(&["read -P 0x12 32M 1M", "read -P 0x11 0 1M"]);
    let log = f.proc.as_ref().unwrap().log_text();
    assert!(log.contains("session found in the farm database"), "{log}");

    // The session ended through the API: its connection closes, the target logs in again.
    let client = reqwest::blocking::Client::new();
    let sessions: Value = client
        .get(format!("{}/api/v1/sessions", f.api))
        .bearer_auth(&f.token)
        .send()
        .and_then(|r| r.json())
        .expect("GET /api/v1/sessions");
    let id = sessions["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["export_name"] == session_export.as_str())
        .and_then(|x| x["id"].as_str())
        .expect("the target's session is listed")
        .to_string();
    let r = client
        .delete(format!("{}/api/v1/sessions/{id}", f.api))
        .bearer_auth(&f.token)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    pc1.qemu_io(&["read -P 0x12 32M 1M"]);
    let log = f.proc.as_ref().unwrap().log_text();
    assert!(
        log.contains("session ended: closing its connections"),
        "{log}"
    );
    let tlog = pc1.proc.log_text();
    assert!(tlog.contains("logged in again"), "{tlog}");
    let (ok, _) = nbdinfo(&format!("nbd://{nbd}/{session_export}"));
    assert!(!ok);
    // Its status names the new session, and its reports reach the farm under it (issue
    // 31: they kept the first session's name and were refused).
    let renewed = pc1.status()["export"].as_str().unwrap().to_string();
    assert!(
        renewed.starts_with("ferry-s-") && renewed != session_export,
        "{renewed}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v: Value = client
            .get(format!("{}/api/v1/status", f.api))
            .bearer_auth(&f.token)
            .send()
            .and_then(|r| r.json())
            .expect("GET /api/v1/status");
        let d = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == MAC.to_lowercase().as_str())
            .cloned()
            .unwrap_or(Value::Null);
        let live = d["session"]["id"].as_str();
        if live.is_some() && d["counters"]["session_id"].as_str() == live {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no report of the new session reached the farm: {d}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    pc1.proc.stop();
    f.proc.take().unwrap().stop();
}
