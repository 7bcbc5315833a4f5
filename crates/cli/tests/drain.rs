//! Two `ferry server --farm` processes on one farm (issue 20): a device logged in through
//! the first reads from it; `ferry server drain NAME` makes that server close the
//! session's connections, the target fails over to the second server without a new login
//! and keeps reading the same bytes (qemu-io verifies them), and the farm's live status
//! shows it on the second server. (The login order itself is `crates/farm/tests/balance.rs`.)
//!
//! Rebalancing: four devices logged in to the only server; a second server joins; the
//! first moves its excess (two devices) to it, each device learning the new server from
//! its status reports and failing over to it, with the same session (no new login) and
//! reads that keep verifying.
//!
//! The servers run with short farm-member intervals (the hidden `--member-*` flags: drain
//! checks every 250 ms, a settling time of 14 s instead of 25 s), so the test waits for the
//! devices, not for production timers; the timing cases themselves run in simulated time in
//! `crates/member/tests/sim_drain.rs`.
//!
//! Tool rule: a missing qemu-io skips with a printed reason, and fails under `CI=true`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use common::farm::{Farm, reads_verify, status};
use common::{Proc, ferry, path_str};
use interop::require;
use serde_json::Value;

const MAC: &str = "aa:bb:cc:00:20:01";
/// The farm-member intervals of these servers: a drain check every 250 ms; rebalance checks
/// as often as a farm's (5 s ± 20 %, longer than a status report's 2 s, so that a moved
/// device is counted on its new server before the next check), settling for 14 s (longer
/// than the 12 s a device takes to learn a new server) and a forget window of 20 s.
const MEMBER_FLAGS: [&str; 3] = [
    "--member-drain-check-every=250ms",
    "--member-rebalance-settle=14s",
    "--member-rebalance-forget=20s",
];

/// `ferry server --farm` named `name` with [`MEMBER_FLAGS`].
fn server(f: &Farm, name: &str) -> (Proc, String, String) {
    f.server_with(name, |c| {
        c.args(["--store", path_str(&f.store())]).args(MEMBER_FLAGS);
    })
}
/// A hang guard for the move (a drain check each second), not a measure.
const MOVE_WAIT: Duration = Duration::from_secs(60);
/// A hang guard for a rebalance (14 s of settling, then checks 4 to 6 s apart), not a
/// measure.
const REBALANCE_WAIT: Duration = Duration::from_secs(120);

#[test]
fn a_drained_server_s_device_fails_over_and_keeps_reading() {
    if !require("qemu-io") {
        return;
    }
    let f = Farm::init();
    let (s1, api1, nbd1) = server(&f, "s1");
    f.objects(&api1, &[(MAC, "pc1")]);
    let (s2, api2, nbd2) = server(&f, "s2");
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
    let (target, socket) = f.target(&api1, MAC, "pc1");
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

/// The ids of the farm's live sessions.
fn session_ids(f: &Farm, api: &str) -> Vec<String> {
    let v = f.json(api, &["farm", "session", "list"]);
    let mut ids: Vec<String> = v["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions: {v}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_server_that_joins_takes_its_share_without_a_new_login() {
    if !require("qemu-io") {
        return;
    }
    let f = Farm::init();
    let (s1, api1, nbd1) = server(&f, "s1");
    let devices = [
        ("aa:bb:cc:00:20:11", "pc11"),
        ("aa:bb:cc:00:20:12", "pc12"),
        ("aa:bb:cc:00:20:13", "pc13"),
        ("aa:bb:cc:00:20:14", "pc14"),
    ];
    f.objects(&api1, &devices);
    let targets: Vec<(Proc, PathBuf)> = devices
        .iter()
        .map(|(mac, name)| f.target(&api1, mac, name))
        .collect();
    for (_, socket) in &targets {
        assert_eq!(status(socket)["server"], nbd1.as_str());
    }
    let sessions = session_ids(&f, &api1);
    assert_eq!(sessions.len(), 4);

    // s2 joins: s1 carries 4 of 4, its share is 2, so it moves 2 (after the excess has
    // lasted the settling time, by then every device has learnt s2 from its reports).
    let (s2, _api2, nbd2) = server(&f, "s2");
    let deadline = Instant::now() + REBALANCE_WAIT;
    let on = |nbd: &str| {
        targets
            .iter()
            .filter(|(_, socket)| status(socket)["server"] == nbd)
            .count()
    };
    loop {
        let (n1, n2) = (on(&nbd1), on(&nbd2));
        if n2 == 2 && n1 == 2 {
            break;
        }
        assert!(n2 <= 2, "s2 got more than its share: {n2} of 4");
        assert!(
            Instant::now() < deadline,
            "no rebalance within {REBALANCE_WAIT:?} (s1 {n1}, s2 {n2})\ns1 log:\n{}",
            s1.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        s1.log_text()
            .contains("rebalancing: closed the session's connections"),
        "{}",
        s1.log_text()
    );
    // Moved by failover, not by a new login: the same four sessions, reads that verify,
    // no error on any device.
    assert_eq!(session_ids(&f, &api1), sessions);
    for (target, socket) in &targets {
        reads_verify(socket);
        let s = status(socket);
        if s["server"] == nbd2.as_str() {
            assert!(s["failovers"].as_u64().unwrap_or(0) >= 1, "{s}");
        }
        let log = target.log_text();
        assert!(!log.contains("ERROR"), "{log}");
    }
    for (target, _) in targets {
        target.stop();
    }
    s2.stop();
    s1.stop();
}

/// Issue 31: a second server started with a name the farm already has is refused, never
/// merged into the first's row: on the same farm directory by the state directory's lock,
/// with a state directory of its own by the farm (the name belongs to another identity).
/// The first keeps its row, its identity is kept 0600 in its state directory, and
/// `ferry farm server remove` refuses it while it runs.
#[test]
fn a_second_server_with_the_same_name_is_refused_not_merged() {
    use std::os::unix::fs::PermissionsExt as _;
    let f = Farm::init();
    let (_s1, api1, _) = f.server("pvs1");
    let uid_file = f.data().join("servers/pvs1/server-id");
    let mode = std::fs::metadata(&uid_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", uid_file.display());
    let second = |extra: &[&str]| {
        let out = ferry()
            .args(["server", "--farm", path_str(&f.data())])
            .args(["--store", path_str(&f.store()), "--server-name", "pvs1"])
            .arg("--metrics-listen=")
            .arg(format!("--nbd-listen=127.0.0.1:{}", common::free_port()))
            .arg(format!("--api-listen=127.0.0.1:{}", common::free_port()))
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "a second pvs1 started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = second(&[]);
    assert!(
        err.contains("another `ferry server` runs with the state directory"),
        "{err}"
    );
    let own = f.dir.path().join("other-state");
    let err = second(&["--state-dir", path_str(&own)]);
    assert!(
        err.contains("there is already a server named \"pvs1\"") && err.contains("--server-name"),
        "{err}"
    );
    let servers = f.json(&api1, &["farm", "server", "list"]);
    let items = servers["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{servers}");
    let id = items[0]["id"].as_i64().unwrap().to_string();
    let out = ferry()
        .args(["farm", "server", "remove", &id])
        .args(["--api", &api1, "--token", &f.token])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is running"), "{err}");
}

/// Issue 31: a device's status reports survive the loss of the API it logged in through:
/// `ferry target --server API1,API2` logs in through s1; s1 is killed; the device fails over
/// to s2 for its reads, and its reports, failing at s1, go to s2's API, whose live status
/// then shows the device's counters on s2 (counters are kept per API process: before, only
/// s1's API ever saw them).
#[test]
fn status_reports_reach_another_api_when_the_login_one_is_gone() {
    let f = Farm::init();
    let (s1, api1, _) = server(&f, "s1");
    f.objects(&api1, &[(MAC, "pc1")]);
    let (_s2, api2, _) = server(&f, "s2");
    let both = format!("{api1},{api2}");
    let (_target, socket) = f.target_with(&api1, MAC, "pc1", &["--server", &both]);
    s1.kill();
    let client = reqwest::blocking::Client::new();
    let deadline = Instant::now() + MOVE_WAIT;
    loop {
        // A read through the export, so the device fails over to s2.
        let _ = status(&socket);
        let v: Value = client
            .get(format!("{api2}/api/v1/status"))
            .bearer_auth(&f.token)
            .send()
            .and_then(|r| r.json())
            .unwrap();
        let server = v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == MAC)
            .map(|d| d["counters"]["server_name"].clone());
        if server == Some(Value::from("s2")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "s2's API never saw pc1's reports: {v}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
