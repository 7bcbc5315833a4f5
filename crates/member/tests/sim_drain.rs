//! Drain and rebalancing of the farm-member runtime in simulated time (the real farm on
//! SQLite, a `SimClock`, simulated devices that fail over): minutes of a farm run in well
//! under a second, from a printed seed (`SIM_SEED=n cargo test -p member --test sim_drain`
//! replays one).
//!
//! * A drain moves at most `DRAIN_SESSIONS_PER_CHECK` sessions per check, one check each
//!   `drain_check_every`; a device that comes back is moved again no sooner than
//!   `drain_move_again_after`, at most `DRAIN_MOVES_PER_SESSION` times, then served; ending
//!   the drain forgets the moves.
//! * A server that joins gets its share: nothing moves before the excess has lasted
//!   `rebalance_settle`, the joined server never gets more than its share, and a session
//!   moved for balance is not moved again within `rebalance_forget`; a device that does not
//!   know the new server yet is not moved (shown with a settling time shorter than the
//!   devices take to learn it).
//! * Two servers that join share the moved devices (spread across the tie), and each device
//!   moves once (issue 31).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Node, Sim, ms, on};
use farm::balance::REBALANCE_TOLERANCE_PERCENT;
use member::Timing;
use member::drain::{DRAIN_MOVES_PER_SESSION, DRAIN_SESSIONS_PER_CHECK};
use rand::Rng as _;

/// The simulation's step: shorter than every interval it checks.
const STEP: Duration = Duration::from_millis(500);

#[tokio::test]
async fn a_drain_moves_sessions_at_its_pace_and_each_a_bounded_number_of_times() {
    let seed = testkit::seed_from_env(0xD7A1);
    let timing = Timing::default();
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let n: usize = sim.rng.gen_range(20..60);
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(sim.device(&nodes, None).await);
    }
    // s2 joins; some devices (old agents) never refresh their lists, which name s1 alone.
    nodes.push(sim.server("s2").await);
    let mut stuck = Vec::new();
    for (i, d) in devices.iter_mut().enumerate() {
        if sim.rng.gen_bool(0.25) {
            d.refresh_at_ms = i64::MAX;
            stuck.push(i);
        }
    }
    sim.set_draining(nodes[0].id, true).await;

    let mut checks_with_moves: Vec<i64> = Vec::new();
    let mut moves: HashMap<String, Vec<(i64, u32)>> = HashMap::new();
    let end = sim.now() + ms(Duration::from_secs(120));
    while sim.now() < end {
        let ticks = sim.step(&mut nodes, STEP).await;
        let s1 = ticks[0].as_ref().unwrap();
        assert!(s1.drained.len() <= DRAIN_SESSIONS_PER_CHECK, "{s1:?}");
        if !s1.drained.is_empty() {
            checks_with_moves.push(sim.now());
        }
        for (name, times) in &s1.drained {
            moves
                .entry(name.clone())
                .or_default()
                .push((sim.now(), *times));
        }
        assert!(
            ticks[1].as_ref().unwrap().drained.is_empty(),
            "s2 does not drain"
        );
        sim.devices(&nodes, &mut devices).await;
    }

    // The pace: one check per interval, 16 sessions each until all moved once.
    for w in checks_with_moves.windows(2) {
        assert!(
            w[1] - w[0] >= ms(timing.drain_check_every),
            "{checks_with_moves:?}"
        );
    }
    let first_wave = n.div_ceil(DRAIN_SESSIONS_PER_CHECK);
    let firsts = &checks_with_moves[..first_wave];
    assert_eq!(
        firsts.last().unwrap() - firsts[0],
        ms(timing.drain_check_every) * i64::try_from(first_wave - 1).unwrap(),
        "{n} sessions move in consecutive checks: {checks_with_moves:?}"
    );
    for d in &devices {
        let m = &moves[&d.export];
        assert!(m.len() <= DRAIN_MOVES_PER_SESSION as usize, "{m:?}");
        for w in m.windows(2) {
            assert!(
                w[1].0 - w[0].0 >= ms(timing.drain_move_again_after),
                "{m:?}"
            );
        }
    }
    for (i, d) in devices.iter().enumerate() {
        if stuck.contains(&i) {
            assert_eq!(d.on, "s1", "a device that knows no other server stays");
            assert_eq!(moves[&d.export].len(), DRAIN_MOVES_PER_SESSION as usize);
            assert!(nodes[0].served.is_open(&d.export), "and is served at last");
        } else {
            assert_eq!(d.on, "s2", "device {i} failed over to s2");
        }
    }
    assert_eq!(on(&devices, "s1"), stuck.len());

    // Ending the drain forgets the moves.
    sim.set_draining(nodes[0].id, false).await;
    let ticks = sim.step(&mut nodes, timing.drain_check_every).await;
    assert_eq!(ticks[0].as_ref().unwrap().draining, Some(false));
    assert!(
        devices
            .iter()
            .all(|d| nodes[0].rt.drain().times_moved(&d.export) == 0)
    );
}

/// s1 serves `n` devices alone; s2 joins; returns the devices' moves by s1's rebalancing
/// (session → times) and checks the share, the settling and the forget window.
async fn joins_and_takes_its_share(seed: u64, timing: Timing, learn_late: bool) -> usize {
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let n: usize = sim.rng.gen_range(8..40);
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(sim.device(&nodes, None).await);
    }
    sim.step(&mut nodes, STEP).await;
    sim.clock
        .advance(Duration::from_secs(sim.rng.gen_range(0..30)));
    let joined = sim.now();
    nodes.push(sim.server("s2").await);
    if learn_late {
        // Every device learns s2 only 15 s after it joined.
        for d in &mut devices {
            d.refresh_at_ms = joined + ms(Duration::from_secs(15));
        }
    }
    let share = n.div_ceil(2);
    let mut moves: HashMap<String, Vec<i64>> = HashMap::new();
    let mut came_back = 0;
    let end = joined + ms(Duration::from_secs(300));
    while sim.now() < end {
        let ticks = sim.step(&mut nodes, STEP).await;
        assert!(
            ticks[1].as_ref().unwrap().rebalanced.is_empty(),
            "s2 is under its share"
        );
        for name in &ticks[0].as_ref().unwrap().rebalanced {
            assert!(
                sim.now() - joined >= ms(timing.rebalance_settle),
                "a move {} ms after s2 joined",
                sim.now() - joined
            );
            moves.entry(name.clone()).or_default().push(sim.now());
        }
        let moved = sim.devices(&nodes, &mut devices).await;
        came_back += ticks[0]
            .as_ref()
            .unwrap()
            .rebalanced
            .len()
            .saturating_sub(moved.len());
        assert!(
            on(&devices, "s2") <= n - share,
            "s2 got more than its share of {n}"
        );
    }
    // s1 ends within the farm's tolerance above its share (a check moves at most 8), and
    // the farm counts no excess.
    let percent = usize::try_from(REBALANCE_TOLERANCE_PERCENT).unwrap();
    let tolerance = (share * percent / 100).max(1);
    let s1 = on(&devices, "s1");
    assert!(
        (share..=share + tolerance).contains(&s1),
        "{s1} of {n} devices on s1"
    );
    assert_eq!(sim.farm.rebalance_excess(nodes[0].id).await.unwrap(), 0);
    for m in moves.values() {
        for w in m.windows(2) {
            assert!(w[1] - w[0] >= ms(timing.rebalance_forget), "{m:?}");
        }
    }
    came_back
}

#[tokio::test]
async fn a_server_that_joins_takes_its_share_after_the_settling_time() {
    let seed = testkit::seed_from_env(0x0B1A);
    let came_back = joins_and_takes_its_share(seed, Timing::default(), false).await;
    assert_eq!(came_back, 0, "every device knew s2 by the time it settled");
}

/// With a settling time shorter than the devices take to learn the new server, a device that
/// does not know it yet is not moved (its recorded destination is none: `farm::moves`), so
/// no device comes back; each moves once it knows.
#[tokio::test]
async fn a_device_that_does_not_know_the_new_server_yet_is_not_moved() {
    let seed = testkit::seed_from_env(0x0B1B);
    let hasty = Timing {
        rebalance_every: Duration::from_secs(1),
        rebalance_settle: Duration::from_secs(2),
        rebalance_forget: Duration::from_secs(20),
        ..Timing::default()
    };
    let came_back = joins_and_takes_its_share(seed, hasty, true).await;
    assert_eq!(came_back, 0, "a device moved before it knew s2");
}

/// Two servers join one that carries every device: the devices its rebalancing moves
/// spread over both (not all to the one that sorts first, which then moves half of them
/// on), each device moves once, and every server ends within its share.
#[tokio::test]
async fn two_servers_that_join_share_the_moved_devices_and_each_moves_once() {
    let seed = testkit::seed_from_env(0x0B1C);
    let timing = Timing::default();
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let n: usize = sim.rng.gen_range(24..60);
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(sim.device(&nodes, None).await);
    }
    sim.step(&mut nodes, STEP).await;
    nodes.push(sim.server("s2").await);
    nodes.push(sim.server("s3").await);
    let mut moves: HashMap<String, usize> = HashMap::new();
    let end = sim.now() + ms(Duration::from_secs(300));
    while sim.now() < end {
        let ticks = sim.step(&mut nodes, STEP).await;
        for t in &ticks {
            for name in &t.as_ref().unwrap().rebalanced {
                *moves.entry(name.clone()).or_default() += 1;
            }
        }
        sim.devices(&nodes, &mut devices).await;
    }
    let share = n.div_ceil(3);
    let percent = usize::try_from(REBALANCE_TOLERANCE_PERCENT).unwrap();
    let tolerance = (share * percent / 100).max(1);
    let counts: Vec<usize> = ["s1", "s2", "s3"].iter().map(|s| on(&devices, s)).collect();
    for c in &counts {
        assert!(*c <= share + tolerance, "{counts:?} of {n}: share {share}");
    }
    assert!(counts[1] > 0 && counts[2] > 0, "{counts:?}");
    assert!(
        moves.values().all(|m| *m == 1),
        "a device moved twice: {moves:?} ({counts:?})"
    );
    for node in &nodes {
        assert_eq!(sim.farm.rebalance_excess(node.id).await.unwrap(), 0);
    }
}
