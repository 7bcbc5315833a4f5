//! Sessions whose machines vanish, in simulated time (the real farm on SQLite, a
//! `SimClock`): a machine that neither reports nor is held open by a server (power cut,
//! network gone: no clean shutdown ended its session) has its session ended after
//! `farm::counters::SESSION_VANISHED_MS`, within one sweep; a machine whose server holds its
//! connections open keeps its session however long it stays silent; and a server sweeps
//! only once the database has answered it that long (so a restart ends nothing at once).
//! Seeded: `SIM_SEED=n cargo test -p member --test sim_vanish` replays a run.

mod common;

use std::time::Duration;

use common::{Node, Sim, ms};
use farm::counters::SESSION_VANISHED_MS;
use member::Timing;
use rand::Rng as _;

const STEP: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_vanished_machine_s_session_ends_after_the_timeout_and_a_held_one_never() {
    let seed = testkit::seed_from_env(0x7A15);
    let timing = Timing::default();
    let every = ms(timing.vanish_check_every);
    let mut sim = Sim::new(seed, timing).await;
    let mut nodes: Vec<Node> = vec![sim.server("s1").await];
    let started = sim.now();
    let n = sim.rng.gen_range(2..8);
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(sim.device(&nodes, None).await);
    }
    // Half of them vanish at once: their connections are gone and they never report.
    let gone: Vec<_> = devices.iter().step_by(2).cloned().collect();
    for d in &gone {
        nodes[0].served.drop_connections(&d.export);
    }
    let logged_in = sim.now();
    let mut ended_at = None;
    while sim.now() - logged_in < 3 * SESSION_VANISHED_MS {
        let ticks = sim.step(&mut nodes, STEP).await;
        let t = ticks[0].as_ref().unwrap();
        if !t.vanished.is_empty() {
            let mut ended = t.vanished.clone();
            ended.sort();
            let mut want: Vec<String> = gone.iter().map(|d| d.export.clone()).collect();
            want.sort();
            assert_eq!(ended, want, "only the vanished machines' sessions end");
            assert!(ended_at.is_none(), "ended twice");
            ended_at = Some(sim.now());
        }
    }
    let at = ended_at.expect("the vanished sessions never ended");
    let after = at - logged_in;
    assert!(
        (SESSION_VANISHED_MS..=SESSION_VANISHED_MS + every + ms(STEP)).contains(&after),
        "ended {after} ms after the machines vanished"
    );
    // The server swept only once the database had answered it that long.
    assert!(at - started >= SESSION_VANISHED_MS);
    for d in &gone {
        assert!(
            sim.farm
                .session_by_export(&d.export)
                .await
                .unwrap()
                .is_none()
        );
    }
    // The held ones, silent as long, are still there and open.
    for d in devices.iter().skip(1).step_by(2) {
        assert!(
            sim.farm
                .session_by_export(&d.export)
                .await
                .unwrap()
                .is_some(),
            "a held session ended"
        );
        assert!(nodes[0].served.is_open(&d.export));
    }
}
