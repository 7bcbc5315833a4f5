//! The farm-member runtime's heartbeat, session resolution and recheck, failover order and
//! promotion prefetch in simulated time (the real farm on SQLite, a `SimClock`; each server
//! with its own farm handle, as separate processes have). Seeded: `SIM_SEED=n cargo test -p
//! member --test sim_farm` replays a run.
//!
//! * A server heartbeats every `heartbeat_every`; one that stops is no longer counted by
//!   rebalancing after `farm::balance::REBALANCE_ALIVE_MS` (so the empty place of a server
//!   that died a moment after it joined moves no device) and is listed as lost, after every
//!   live server, after `farm::model::SERVER_ALIVE_MS`.
//! * A session granted through another server is looked up in the database and honoured;
//!   when that server's API ends it, this server closes it at its next session recheck; one
//!   this server's API ends closes at once.
//! * Devices are told the least loaded server first, draining servers after every other live
//!   one, and lost ones last.
//! * A production version's boot set is prefetched at the first promotion check that sees it,
//!   once.

mod common;

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use common::{ADMIN, Node, Sim, ms};
use contract::ExportName;
use farm::balance::REBALANCE_ALIVE_MS;
use farm::model::SERVER_ALIVE_MS;
use member::{FarmHandle, FarmSessions, Timing};
use rand::Rng as _;
use server::exports::SessionResolver as _;

const STEP: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_server_that_stops_heartbeating_is_lost_after_the_timeout() {
    let seed = testkit::seed_from_env(0x4EA7);
    let timing = Timing::default();
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let n = sim.rng.gen_range(4..20);
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(sim.device(&nodes, None).await);
    }
    sim.step(&mut nodes, STEP).await;
    assert_eq!(
        sim.farm.rebalance_excess(nodes[0].id).await.unwrap(),
        0,
        "s1 alone"
    );

    // s2 registers and dies at once: its empty place makes an excess on s1 until its
    // heartbeat is too old for rebalancing, which is sooner than s1's settling time.
    nodes.push(sim.server("s2").await);
    nodes[1].up = false;
    assert!(sim.farm.rebalance_excess(nodes[0].id).await.unwrap() > 0);
    let last_beat = sim.farm.server(nodes[1].id).await.unwrap().heartbeat_at_ms;
    let mut beats = Vec::new();
    let mut dead_for_rebalance = None;
    loop {
        let ticks = sim.step(&mut nodes, STEP).await;
        let s1 = ticks[0].as_ref().unwrap();
        assert!(
            s1.rebalanced.is_empty(),
            "s2's empty place moved a device {} ms after its last heartbeat",
            sim.now() - last_beat
        );
        if s1.heartbeat {
            beats.push(sim.now());
        }
        let excess = sim.farm.rebalance_excess(nodes[0].id).await.unwrap();
        if excess == 0 && dead_for_rebalance.is_none() {
            dead_for_rebalance = Some(sim.now() - last_beat);
        }
        let listed = sim.farm.device_servers(devices[0].id).await.unwrap();
        let s2 = listed.iter().find(|s| s.name == "s2").unwrap();
        let silent_ms = sim.now() - last_beat;
        if silent_ms > SERVER_ALIVE_MS {
            assert!(
                !s2.alive,
                "s2 listed alive {silent_ms} ms after its heartbeat"
            );
            break;
        }
        assert!(
            s2.alive,
            "s2 listed lost {silent_ms} ms after its heartbeat"
        );
    }
    assert!(beats.len() >= 5, "{beats:?}");
    for w in beats.windows(2) {
        assert_eq!(
            w[1] - w[0],
            ms(timing.heartbeat_every),
            "s1's heartbeats: {beats:?}"
        );
    }
    let s1_beat = sim.farm.server(nodes[0].id).await.unwrap().heartbeat_at_ms;
    assert_eq!(s1_beat, *beats.last().unwrap());
    assert_eq!(dead_for_rebalance, Some(REBALANCE_ALIVE_MS + ms(STEP)));
    let listed = sim.farm.device_servers(devices[0].id).await.unwrap();
    let names: Vec<(&str, bool)> = listed.iter().map(|s| (s.name.as_str(), s.alive)).collect();
    assert_eq!(names, [("s1", true), ("s2", false)]);
}

/// The resolver of `node`, serving the farm's store as that server sees it.
async fn resolver(sim: &Sim, node: &Node) -> Arc<FarmSessions> {
    let store_dir = node.farm.store_dir(sim.store, Some(node.id)).await.unwrap();
    let handle = FarmHandle {
        farm: Arc::clone(&node.farm),
        server_id: node.id,
        name: node.name.clone(),
        advertise: format!("{}.example:10809", node.name),
    };
    Arc::new(FarmSessions::new(
        &handle,
        tokio::runtime::Handle::current(),
        &store_dir,
    ))
}

/// What `resolver` makes of the session export `export` (on the blocking pool, as the NBD
/// server calls it).
async fn resolve(resolver: &Arc<FarmSessions>, export: &str) -> Option<String> {
    let ExportName::Session(key) = ExportName::from_str(export).unwrap() else {
        panic!("{export} is no session export");
    };
    let r = Arc::clone(resolver);
    tokio::task::spawn_blocking(move || r.resolve(&key).map(|s| s.export.to_string()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_another_server_granted_is_honoured_and_closed_when_it_ends() {
    let seed = testkit::seed_from_env(0x5E55);
    let timing = Timing::default();
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await, sim.server("s2").await];
    sim.step(&mut nodes, STEP).await;
    sim.clock
        .advance(Duration::from_millis(sim.rng.gen_range(0..10_000)));

    // Logged in through s1's API; s2 never saw the session, and honours it.
    let (mac, _) = sim.add_device().await;
    let g = sim.login(&mac, Some(&nodes[0])).await;
    let d = (g.session_id, g.export_name);
    let s2 = resolver(&sim, &nodes[1]).await;
    assert_eq!(resolve(&s2, &d.1).await.as_deref(), Some("golden@0"));
    nodes[1].served.connect(&d.1);

    // s1's API ends it: s2 closes it at its next recheck, not before.
    nodes[0].farm.end_session(&d.0, ADMIN).await.unwrap();
    let ended = sim.now();
    loop {
        let ticks = sim.step(&mut nodes, STEP).await;
        let revoked = &ticks[1].as_ref().unwrap().revoked;
        if !revoked.is_empty() {
            assert_eq!(revoked, std::slice::from_ref(&d.1));
            break;
        }
        assert!(nodes[1].served.is_open(&d.1));
        assert!(sim.now() - ended <= ms(timing.session_recheck_every));
    }
    assert!(!nodes[1].served.is_open(&d.1));
    assert_eq!(
        resolve(&s2, &d.1).await,
        None,
        "an ended session resolves no more"
    );

    // s2's own API ends a session it serves: closed at once.
    let (mac, _) = sim.add_device().await;
    let g = sim.login(&mac, Some(&nodes[1])).await;
    let d = (g.session_id, g.export_name);
    assert_eq!(resolve(&s2, &d.1).await.as_deref(), Some("golden@0"));
    nodes[1].served.connect(&d.1);
    nodes[1].farm.end_session(&d.0, ADMIN).await.unwrap();
    assert!(!nodes[1].served.is_open(&d.1));
}

/// The live sessions each of `nodes` carries, by the farm's count.
async fn loads(sim: &Sim, nodes: &[Node]) -> Vec<i64> {
    let per = sim.farm.sessions_per_server().await.unwrap();
    nodes
        .iter()
        .map(|n| {
            per.iter()
                .find(|(id, _)| *id == n.id)
                .map_or(0, |(_, c)| *c)
        })
        .collect()
}

#[tokio::test]
async fn a_device_is_told_the_least_loaded_server_first_draining_ones_after_and_lost_ones_last() {
    let seed = testkit::seed_from_env(0x0DE5);
    let mut sim = Sim::new(seed, Timing::default()).await;
    let mut nodes: Vec<Node> = vec![
        sim.server("s1").await,
        sim.server("s2").await,
        sim.server("s3").await,
    ];
    sim.step(&mut nodes, STEP).await;
    let name_of = |nodes: &[Node], i: usize| nodes[i].name.clone();

    // Every server serving: each login names a least loaded one first.
    for _ in 0..sim.rng.gen_range(3..30) {
        let before = loads(&sim, &nodes).await;
        let (mac, _) = sim.add_device().await;
        let g = sim.login(&mac, None).await;
        let first = nodes
            .iter()
            .position(|n| n.name == g.servers[0].name)
            .unwrap();
        assert_eq!(
            before[first],
            *before.iter().min().unwrap(),
            "{before:?} {g:?}"
        );
        assert_eq!(g.servers.len(), 3);
        sim.step(&mut nodes, STEP).await;
    }
    let l = loads(&sim, &nodes).await;
    assert!(
        l.iter().max().unwrap() - l.iter().min().unwrap() <= 1,
        "{l:?}"
    );

    // s2 drains: named after every other live server, whatever its load.
    let draining = sim.rng.gen_range(0..3);
    sim.set_draining(nodes[draining].id, true).await;
    for _ in 0..sim.rng.gen_range(1..10) {
        let (mac, _) = sim.add_device().await;
        let g = sim.login(&mac, None).await;
        assert_eq!(g.servers[2].name, name_of(&nodes, draining), "{g:?}");
        assert!(g.servers[2].draining && g.servers[2].alive);
        sim.step(&mut nodes, STEP).await;
    }

    // Another server stops heartbeating: listed lost, after the draining one, once its
    // heartbeat is older than SERVER_ALIVE_MS.
    let lost = (draining + 1 + sim.rng.gen_range(0..2)) % 3;
    nodes[lost].up = false;
    let last = sim
        .farm
        .server(nodes[lost].id)
        .await
        .unwrap()
        .heartbeat_at_ms;
    sim.clock.advance(Duration::from_millis(
        u64::try_from(SERVER_ALIVE_MS).unwrap(),
    ));
    sim.step(&mut nodes, STEP).await;
    assert!(sim.now() - last > SERVER_ALIVE_MS);
    let (mac, _) = sim.add_device().await;
    let g = sim.login(&mac, None).await;
    let told: Vec<(String, bool, bool)> = g
        .servers
        .iter()
        .map(|s| (s.name.clone(), s.alive, s.draining))
        .collect();
    let serving = 3 - draining - lost;
    assert_eq!(
        told,
        [
            (name_of(&nodes, serving), true, false),
            (name_of(&nodes, draining), true, true),
            (name_of(&nodes, lost), false, false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_version_s_boot_set_is_prefetched_once_at_the_next_check() {
    let seed = testkit::seed_from_env(0x9F37);
    let timing = Timing::default();
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let prefetched = |t: &[Option<member::Ticked>]| t[0].as_ref().unwrap().prefetched.clone();
    assert!(
        prefetched(&sim.step(&mut nodes, STEP).await).is_empty(),
        "no set yet"
    );

    // Version 0 (production) gets a set: prefetched at the next check, once.
    sim.clock
        .advance(Duration::from_millis(sim.rng.gen_range(0..10_000)));
    sim.farm
        .save_boot_set("golden", 0, b"set", (1, 1, 3))
        .await
        .unwrap();
    let recorded = sim.now();
    let mut seen = Vec::new();
    while sim.now() - recorded <= 3 * ms(timing.promotion_check_every) {
        for v in prefetched(&sim.step(&mut nodes, STEP).await) {
            seen.push((sim.now() - recorded, v));
        }
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].0 <= ms(timing.promotion_check_every), "{seen:?}");
    assert_eq!(seen[0].1, ("golden".to_string(), 0));

    // Version 1 is made, booted in test (its set recorded), then promoted.
    let v1 = sim.farm.new_version(sim.vdisk, ADMIN).await.unwrap().number;
    sim.farm.promote(sim.vdisk, v1, ADMIN).await.unwrap();
    sim.farm
        .save_boot_set("golden", v1, b"set", (1, 1, 3))
        .await
        .unwrap();
    for _ in 0..15 {
        assert!(
            prefetched(&sim.step(&mut nodes, STEP).await).is_empty(),
            "in test"
        );
    }
    sim.farm.promote(sim.vdisk, v1, ADMIN).await.unwrap();
    let promoted = sim.now();
    loop {
        let got = prefetched(&sim.step(&mut nodes, STEP).await);
        if !got.is_empty() {
            assert_eq!(got, [("golden".to_string(), u32::try_from(v1).unwrap())]);
            break;
        }
        assert!(sim.now() - promoted <= ms(timing.promotion_check_every));
    }
    assert_eq!(nodes[0].served.prefetches.lock().unwrap().len(), 2);
}
