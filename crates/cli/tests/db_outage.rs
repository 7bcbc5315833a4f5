//! The farm's database goes away under a running farm (issue 31, part 7). Two `ferry server
//! --farm` processes share a PostgreSQL cluster of the test's own; once both have read
//! their snapshot of the farm, PostgreSQL is stopped (`pg_ctl stop -m fast`), and:
//!
//! - a device streaming from s1 keeps reading the right bytes (qemu-io verifies them);
//! - a change through the API is refused with 503, `Retry-After` and a message that says
//!   the database cannot be reached and nothing changed;
//! - s1 is killed: the device fails over to s2, which knew its session from its snapshot,
//!   with no new login, and keeps reading;
//! - a known device with a key of its own logs in through s2 and reads its vDisk; a known
//!   diskless device's boot script carries a ticket, its kernel is served, and the ticket
//!   logs it in;
//! - s2's metrics say the database is down and two logins wait.
//!
//! Then PostgreSQL starts again: s2 says the database is back, writes the two logins (the
//! farm's session list holds both sessions, the ticket login's new device key too), a
//! change works again, and every device still reads.
//!
//! The servers run with short farm-member intervals (heartbeat and snapshot every 500 ms),
//! so the test waits for the farm, not for production timers. Tool rule: a missing qemu-io
//! or PostgreSQL server skips with a printed reason, and fails under `CI=true`.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::farm::{Farm, reads_verify, status};
use common::pg_cluster::PgCluster;
use common::{Proc, ferry, free_port, path_str, scrape};
use interop::{require, run_ok};
use serde_json::Value;

const MAC1: &str = "aa:bb:cc:00:31:01";
const MAC2: &str = "aa:bb:cc:00:31:02";
const MAC3: &str = "aa:bb:cc:00:31:03";
const MEMBER_FLAGS: [&str; 3] = [
    "--member-heartbeat-every=500ms",
    "--member-snapshot-every=500ms",
    "--member-session-recheck-every=1s",
];
/// A hang guard for each phase, not a measure.
const PHASE_WAIT: Duration = Duration::from_secs(60);

struct Member {
    proc: Proc,
    api: String,
    nbd: String,
    metrics: u16,
    boot: u16,
}

/// `ferry server --farm` named `name` on `db`; with `boot`, with the boot service on a
/// port of its own (and so the API in HTTPS under the farm's CA).
fn server(f: &Farm, db: &str, name: &str, boot: bool) -> Member {
    let (metrics, boot_port) = (free_port(), free_port());
    let (proc, api, nbd) = f.server_with(name, |c| {
        c.args(["--store", path_str(&f.store())])
            .args(["--db", db])
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
            .args(MEMBER_FLAGS);
        if boot {
            c.arg(format!("--boot-listen=127.0.0.1:{boot_port}"));
        }
    });
    let api = if boot {
        api.replace("http://", "https://")
    } else {
        api
    };
    Member {
        proc,
        api,
        nbd,
        metrics,
        boot: boot_port,
    }
}

/// A client of the farm's HTTPS APIs (the farm's CA).
fn https_client(f: &Farm) -> reqwest::blocking::Client {
    let pem = std::fs::read(f.data().join("secrets").join("ca-cert.pem")).unwrap();
    reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

/// A gauge of `m`'s metrics.
fn gauge(m: &Member, name: &str) -> f64 {
    let text = scrape(m.metrics);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}:\n{text}"))
}

fn wait_for(what: &str, m: &Member, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + PHASE_WAIT;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} within {PHASE_WAIT:?}\nlog:\n{}",
            m.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `rooted.vhdx` in the store: a whole-disk ext4 root with a kernel and an initramfs (what
/// a boot script needs); returns the kernel's bytes.
fn root_vdisk(f: &Farm) -> Vec<u8> {
    let tree = f.dir.path().join("tree");
    for d in ["etc", "sbin", "usr", "boot"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    let kernel: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(tree.join("boot/vmlinuz-6.1.0-13-amd64"), &kernel).unwrap();
    std::fs::write(tree.join("boot/initrd.img-6.1.0-13-amd64"), b"initramfs").unwrap();
    let raw = f.dir.path().join("root.raw");
    run_ok(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&tree)
            .arg(&raw)
            .arg("16M"),
    );
    let vhdx = f.store().join("rooted.vhdx");
    run_ok(ferry().args(["vdisk", "capture", path_str(&raw), path_str(&vhdx)]));
    kernel
}

/// Puts `mac`'s device secret where a target with state directory `state` keeps it, so
/// that its login needs no API call of the test's.
fn keep_secret(f: &Farm, api: &str, mac: &str, state: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let v = f.json(api, &["device", "credential", mac]);
    std::fs::create_dir_all(state).unwrap();
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = state.join(format!("device-{}.secret", mac.replace(':', "-")));
    std::fs::write(&file, v["device_secret"].as_str().unwrap()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The sessions of the farm, by device id.
fn session_devices(f: &Farm, client: &reqwest::blocking::Client, api: &str) -> Vec<i64> {
    let v: Value = client
        .get(format!("{api}/api/v1/sessions"))
        .bearer_auth(&f.token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let mut ids: Vec<i64> = v["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions: {v}"))
        .iter()
        .filter_map(|s| s["device_id"].as_i64())
        .collect();
    ids.sort_unstable();
    ids
}

fn device_id(f: &Farm, api: &str, mac: &str) -> i64 {
    let v = f.json(api, &["device", "list"]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["mac"] == mac)
        .and_then(|d| d["id"].as_i64())
        .unwrap_or_else(|| panic!("no device {mac}: {v}"))
}

#[test]
fn running_devices_keep_streaming_and_known_devices_boot_while_the_database_is_away() {
    if !require("qemu-io") || !require("mkfs.ext4") {
        return;
    }
    let Some(pg) = PgCluster::create() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL's server binaries (/usr/lib/postgresql/N/bin) are required under CI"
        );
        eprintln!("SKIPPED: no PostgreSQL server binaries");
        return;
    };
    pg.start();
    let db = pg.url();
    let f = Farm::init_with_db(&db);
    let s1 = server(&f, &db, "s1", false);
    f.objects(&s1.api, &[(MAC1, "pc1"), (MAC2, "pc2")]);
    let kernel = root_vdisk(&f);
    f.json(&s1.api, &["farm", "vdisk", "add", "rooted", "--store", "1"]);
    f.json(
        &s1.api,
        &[
            "device",
            "add",
            MAC3,
            "--name",
            "pc3",
            "--collection",
            "1",
            "--vdisk",
            "rooted",
            "--diskless",
        ],
    );
    let s2 = server(&f, &db, "s2", true);
    let tls = https_client(&f);
    let ca = f.data().join("secrets").join("ca-cert.pem");
    let (id2, id3) = (device_id(&f, &s1.api, MAC2), device_id(&f, &s1.api, MAC3));
    let state2 = f.dir.path().join("state-pc2");
    keep_secret(&f, &s1.api, MAC2, &state2);

    // pc1 streams from s1 (the lower id, both empty).
    let (_t1, sock1) = f.target(&s1.api, MAC1, "pc1");
    assert_eq!(status(&sock1)["server"], s1.nbd.as_str());
    reads_verify(&sock1);
    let logged_in = Instant::now();
    for m in [&s1, &s2] {
        wait_for("a snapshot read after pc1's login", m, || {
            let age = gauge(m, "ferry_farm_snapshot_age_seconds");
            age >= 0.0 && age < logged_in.elapsed().as_secs_f64()
        });
    }

    // The database goes away.
    pg.stop();
    reads_verify(&sock1);
    let refused = tls
        .post(format!("{}/api/v1/sites", s2.api))
        .bearer_auth(&f.token)
        .json(&serde_json::json!({ "name": "branch" }))
        .send()
        .unwrap();
    assert_eq!(refused.status().as_u16(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body = refused.text().unwrap();
    assert!(
        body.contains("database cannot be reached") && body.contains("nothing was changed"),
        "{body}"
    );
    for m in [&s1, &s2] {
        wait_for("the database seen down", m, || {
            gauge(m, "ferry_farm_database_up") == 0.0
        });
    }

    // s1 dies: pc1 fails over to s2, which knows its session from the snapshot.
    s1.proc.kill();
    let deadline = Instant::now() + PHASE_WAIT;
    loop {
        reads_verify(&sock1);
        let s = status(&sock1);
        if s["server"] == s2.nbd.as_str() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pc1 did not fail over to s2: {s}\n{}",
            s2.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A known device logs in through s2 and reads.
    let (_t2, sock2) = f.target_with(&s2.api, MAC2, "pc2", &["--farm-ca", path_str(&ca)]);
    assert_eq!(status(&sock2)["server"], s2.nbd.as_str());
    reads_verify(&sock2);
    // A known diskless device's boot script carries a ticket, which logs it in.
    let script = reqwest::blocking::Client::new()
        .get(format!("http://127.0.0.1:{}/boot/ipxe/{MAC3}", s2.boot))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let kernel_path = script
        .split_whitespace()
        .find(|w| w.starts_with("/boot/files/") && w.ends_with("/kernel"))
        .unwrap_or_else(|| panic!("no kernel path in the boot script:\n{script}"));
    let served = reqwest::blocking::get(format!("http://127.0.0.1:{}{kernel_path}", s2.boot))
        .unwrap()
        .bytes()
        .unwrap();
    assert!(
        served[..] == kernel[..],
        "the kernel served offline differs"
    );
    let ticket = script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ferry.ticket="))
        .unwrap_or_else(|| panic!("no ticket in the boot script:\n{script}"))
        .to_string();
    let grant: Value = tls
        .post(format!("{}/api/v1/login", s2.api))
        .json(&serde_json::json!({ "mac": MAC3, "ticket": ticket }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(
        grant["export_name"].as_str().is_some() && grant["device_secret"].as_str().is_some(),
        "{grant}"
    );
    assert_eq!(gauge(&s2, "ferry_farm_offline_logins"), 2.0);

    // The database returns: the two logins are written, changes work again.
    pg.start();
    wait_for("the offline logins written", &s2, || {
        gauge(&s2, "ferry_farm_database_up") == 1.0
            && gauge(&s2, "ferry_farm_offline_logins") == 0.0
    });
    let sessions = session_devices(&f, &tls, &s2.api);
    assert!(
        sessions.contains(&id2) && sessions.contains(&id3),
        "sessions {sessions:?} lack devices {id2} and {id3}"
    );
    let added = tls
        .post(format!("{}/api/v1/sites", s2.api))
        .bearer_auth(&f.token)
        .json(&serde_json::json!({ "name": "branch" }))
        .send()
        .unwrap();
    assert!(added.status().is_success(), "{:?}", added.text());
    reads_verify(&sock1);
    reads_verify(&sock2);
    let log = s2.proc.log_text();
    for line in [
        "the farm database cannot be reached",
        "the farm database is back",
        "wrote a login made while the farm database was away",
    ] {
        assert!(log.contains(line), "no {line:?} in s2's log:\n{log}");
    }
}
