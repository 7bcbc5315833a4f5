//! Refused options, counted and logged per client so that no client can flood the log
//! (issue 30: 20,000 refused options once wrote 12.7 MB of log in 0.9 s).
//!
//! Every option negotiation refuses (an export that cannot be opened, listed or is
//! forbidden, an unknown or malformed option, anything before STARTTLS when TLS is required)
//! goes through [`logged`]: a [`RefusalLog`] keyed by the client's IP address (the unix
//! socket is one client) decides whether its line is written, and writes one summary line
//! per interval naming each client whose lines were left out and how many. [`totals`]
//! counts refusals and suppressed lines for metrics.
//!
//! The log is one per process, not one per listener: the log it protects is the process's,
//! and a client reaching two listeners (TCP and the unix socket, or a server and its
//! agent in one test process) must not get two budgets.

use std::net::IpAddr;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Instant;

pub use contract::refusal_log::Totals as RefusalTotals;
use contract::refusal_log::{Limits, RefusalLog, Summary};

use crate::source::Peer;

/// The process's refusal log: clients by IP address, `None` for the unix socket.
static LOG: LazyLock<Mutex<RefusalLog<Option<IpAddr>>>> =
    LazyLock::new(|| Mutex::new(RefusalLog::new(Limits::default())));

/// Records one refusal of `peer`; true when its log line may be written now. Writes the
/// summary lines of an interval that ended first.
pub(crate) fn logged(peer: &Peer) -> bool {
    let record = {
        let mut log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
        log.record(peer.addr.map(|a| a.ip()), Instant::now())
    };
    for s in &record.summaries {
        summarize(s);
    }
    record.log
}

fn summarize(s: &Summary<Option<IpAddr>>) {
    let interval = Limits::default().interval;
    match s.client {
        Some(Some(client)) => tracing::warn!(%client, refused = s.refused,
            suppressed = s.suppressed, ?interval, "NBD refusals of this client not logged"),
        Some(None) => tracing::warn!(
            client = "unix socket",
            refused = s.refused,
            suppressed = s.suppressed,
            ?interval,
            "NBD refusals of this client not logged"
        ),
        None => tracing::warn!(
            refused = s.refused,
            suppressed = s.suppressed,
            ?interval,
            "NBD refusals of other clients not logged"
        ),
    }
}

/// Refusals recorded and log lines left out since the process started, for metrics.
pub fn totals() -> RefusalTotals {
    LOG.lock().unwrap_or_else(PoisonError::into_inner).totals()
}
