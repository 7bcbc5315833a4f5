//! Connection churn: rounds of hundreds of clients that connect at once, read, and leave
//! leave nothing of themselves in the server. After every round the server counts as many
//! connections closed as opened, every export it opened is released, no connection task is
//! left on its runtime, and nothing holds the device any more.
//!
//! This is the invariant behind the devices benchmark's memory figures (docs/scale.md,
//! "Devices per server"): what a 4,095-device server keeps after its devices leave is the
//! allocator's, not connection state. Memory itself is not asserted here (it depends on the
//! allocator and the machine); live objects are.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Client, Server, Source, tcp, wait_until};
use nbd_server::ServerConfig;

/// Clients per round, and rounds.
const CLIENTS: usize = 300;
const ROUNDS: u64 = 4;
/// Generous bound for the server to notice every close (a test fails past it rather than
/// hang; passing never depends on it).
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn rounds_of_hundreds_of_connections_leave_no_connection_state_behind() {
    let src = Source::new();
    let cfg = ServerConfig {
        max_connections: CLIENTS,
        ..ServerConfig::default()
    };
    let srv = Server::start(src.clone(), cfg);
    let tasks_idle = srv.runtime.metrics().num_alive_tasks();
    for round in 1..=ROUNDS {
        let mut clients: Vec<_> = (0..CLIENTS).map(|_| Client::greet(tcp(srv.addr))).collect();
        for c in &mut clients {
            c.go("mem").unwrap();
        }
        for (i, c) in clients.iter_mut().enumerate() {
            let offset = (i as u64 * 4096) % (1 << 20);
            assert_eq!(c.read_at(offset, 4096).len(), 4096);
        }
        // Every connection is in transmission: each holds the device and has its tasks.
        assert!(Arc::strong_count(&src.disk) > CLIENTS);
        assert!(srv.runtime.metrics().num_alive_tasks() >= tasks_idle + CLIENTS);
        drop(clients);
        let expected = round * CLIENTS as u64;
        let settled = wait_until(PATIENCE, || {
            srv.metrics.closed.load(Ordering::SeqCst) == expected
                && src.released.load(Ordering::SeqCst) == expected
                && Arc::strong_count(&src.disk) == 1
                && srv.runtime.metrics().num_alive_tasks() == tasks_idle
        });
        assert!(
            settled,
            "round {round}: opened {}, closed {}, released {}, device references {}, \
             tasks {} (idle {tasks_idle})",
            srv.metrics.opened.load(Ordering::SeqCst),
            srv.metrics.closed.load(Ordering::SeqCst),
            src.released.load(Ordering::SeqCst),
            Arc::strong_count(&src.disk),
            srv.runtime.metrics().num_alive_tasks(),
        );
        assert_eq!(srv.metrics.opened.load(Ordering::SeqCst), expected);
    }
    assert!(srv.metrics.protocol_errors().is_empty());
}
