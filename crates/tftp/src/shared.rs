//! What the listening loop and every transfer share: the settings, the counters, the file
//! source, the transfer slots (limits overall and per client address, and on transfers whose
//! first packet is not acknowledged yet), the token buckets of ERROR replies and per-request
//! logs, and the per-client log of refusals.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use contract::refusal_log::{RefusalLog, Summary};
use tokio::net::UdpSocket;
use tokio::sync::Notify;

use crate::config::Config;
use crate::counters::{Counters, RateLimit, Rejected};
use crate::packet::{ErrorCode, encode_error};
use crate::source::FileSource;

/// One transfer in the slot table.
#[derive(Debug)]
struct Entry {
    /// The client acknowledged the transfer's first packet.
    acknowledged: bool,
    /// Signalled by the listener when the client repeats its request while the first
    /// packet is unacknowledged; the transfer then sends it again (at most once more).
    repeat: Arc<Notify>,
}

/// Transfers of one client IP address.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PerIp {
    transfers: usize,
    unacknowledged: usize,
}

/// What the listener does with a read request, by the slot table.
#[derive(Debug)]
pub(crate) enum Take {
    /// A new slot: start the transfer; it waits on this for repeated requests.
    Taken(Arc<Notify>),
    /// The client address and port already have a transfer (a retransmitted request); it was
    /// told, in case its first packet was lost.
    Repeated,
    /// Refused for this reason.
    Refused(Rejected),
}

/// Transfers in progress: per client address and port, and per client IP, with how many
/// of them wait for the acknowledgement of their first packet.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    peers: HashMap<SocketAddr, Entry>,
    per_ip: HashMap<IpAddr, PerIp>,
    unacknowledged: usize,
}

impl Slots {
    /// Takes a slot for `peer` if every limit of `c` allows.
    pub(crate) fn try_take(&mut self, peer: SocketAddr, c: &Config) -> Take {
        if let Some(e) = self.peers.get(&peer) {
            if !e.acknowledged {
                e.repeat.notify_one();
            }
            return Take::Repeated;
        }
        let ip = self.per_ip.get(&peer.ip()).copied().unwrap_or_default();
        if self.peers.len() >= c.max_transfers || ip.transfers >= c.max_transfers_per_client {
            return Take::Refused(Rejected::Limit);
        }
        if self.unacknowledged >= c.max_unacknowledged
            || ip.unacknowledged >= c.max_unacknowledged_per_client
        {
            return Take::Refused(Rejected::Unacknowledged);
        }
        let repeat = Arc::new(Notify::new());
        self.peers.insert(
            peer,
            Entry {
                acknowledged: false,
                repeat: Arc::clone(&repeat),
            },
        );
        let n = self.per_ip.entry(peer.ip()).or_default();
        n.transfers += 1;
        n.unacknowledged += 1;
        self.unacknowledged += 1;
        Take::Taken(repeat)
    }

    /// `peer`'s transfer got the acknowledgement of its first packet.
    pub(crate) fn acknowledged(&mut self, peer: SocketAddr) {
        let Some(e) = self.peers.get_mut(&peer) else {
            return;
        };
        if e.acknowledged {
            return;
        }
        e.acknowledged = true;
        self.unacknowledged -= 1;
        if let Some(n) = self.per_ip.get_mut(&peer.ip()) {
            n.unacknowledged -= 1;
        }
    }

    pub(crate) fn release(&mut self, peer: SocketAddr) {
        let Some(e) = self.peers.remove(&peer) else {
            return;
        };
        if !e.acknowledged {
            self.unacknowledged -= 1;
        }
        if let Some(n) = self.per_ip.get_mut(&peer.ip()) {
            n.transfers -= 1;
            if !e.acknowledged {
                n.unacknowledged -= 1;
            }
            if n.transfers == 0 {
                debug_assert_eq!(n.unacknowledged, 0, "unacknowledged among no transfers");
                self.per_ip.remove(&peer.ip());
            }
        }
    }
}

/// What the listener and every transfer share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) counters: Arc<Counters>,
    pub(crate) source: Arc<dyn FileSource>,
    pub(crate) slots: Mutex<Slots>,
    pub(crate) replies: Mutex<RateLimit>,
    pub(crate) logs: Mutex<RateLimit>,
    /// Refusals per client address: which get a log line, and the summaries of the rest.
    pub(crate) refusals: Mutex<RefusalLog<IpAddr>>,
}

impl Shared {
    /// `Some(suppressed)` when a per-request log line may be written now.
    pub(crate) fn log_allowed(&self) -> Option<u64> {
        let mut l = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        l.allow(Instant::now())
    }

    /// Records a refusal of `peer`'s packet for the log: true when its line may be written
    /// now. Writes the summary lines of an interval that ended first.
    pub(crate) fn refusal_logged(&self, peer: SocketAddr) -> bool {
        let record = {
            let mut r = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
            r.record(peer.ip(), Instant::now())
        };
        self.summarize(&record.summaries);
        if !record.log {
            Counters::inc(&self.counters.logs_suppressed);
        }
        record.log
    }

    /// Writes the summary lines of an interval that ended (called on a timer too, so the
    /// last burst's summary is not held back until the next refusal).
    pub(crate) fn flush_refusals(&self) {
        let summaries = {
            let mut r = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
            r.flush(Instant::now())
        };
        self.summarize(&summaries);
    }

    fn summarize(&self, summaries: &[Summary<IpAddr>]) {
        let interval = self.config.refusal_logs.interval;
        for s in summaries {
            match s.client {
                Some(client) => {
                    tracing::warn!(%client, refused = s.refused, suppressed = s.suppressed,
                    ?interval, "tftp refusals of this client not logged")
                }
                None => tracing::warn!(
                    refused = s.refused,
                    suppressed = s.suppressed,
                    ?interval,
                    "tftp refusals of other clients not logged"
                ),
            }
        }
    }

    /// Sends ERROR `code` to `to` from `socket` if the reply budget allows; counts it.
    pub(crate) async fn reply_error(
        &self,
        socket: &UdpSocket,
        to: SocketAddr,
        code: ErrorCode,
        message: &str,
    ) {
        let allowed = {
            let mut r = self.replies.lock().unwrap_or_else(PoisonError::into_inner);
            r.allow(Instant::now()).is_some()
        };
        if !allowed {
            Counters::inc(&self.counters.errors_suppressed);
            return;
        }
        let mut buf = Vec::with_capacity(64);
        encode_error(code, message, &mut buf);
        if socket.send_to(&buf, to).await.is_ok() {
            Counters::inc(&self.counters.errors_sent);
        }
    }
}

/// A taken transfer slot; dropping it frees the slot.
pub(crate) struct Slot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) peer: SocketAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        s.release(self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_limit_per_client_and_overall() {
        let c = Config {
            max_transfers: 3,
            max_transfers_per_client: 2,
            ..Config::default()
        };
        let mut s = Slots::default();
        let a1: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let a2: SocketAddr = "10.0.0.1:1001".parse().unwrap();
        let a3: SocketAddr = "10.0.0.1:1002".parse().unwrap();
        let b1: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        let c1: SocketAddr = "10.0.0.3:1000".parse().unwrap();
        let taken = |t: Take| matches!(t, Take::Taken(_));
        let refused = |t: Take| match t {
            Take::Refused(r) => Some(r),
            _ => None,
        };
        assert!(taken(s.try_take(a1, &c)));
        assert!(matches!(s.try_take(a1, &c), Take::Repeated));
        // a1 is unacknowledged: one per address.
        assert_eq!(refused(s.try_take(a2, &c)), Some(Rejected::Unacknowledged));
        s.acknowledged(a1);
        assert!(taken(s.try_take(a2, &c)));
        s.acknowledged(a2);
        assert_eq!(refused(s.try_take(a3, &c)), Some(Rejected::Limit));
        assert!(taken(s.try_take(b1, &c)));
        assert_eq!(refused(s.try_take(c1, &c)), Some(Rejected::Limit));
        s.release(a1);
        s.release(a1);
        assert!(taken(s.try_take(a3, &c)));
        s.release(a2);
        s.release(a3);
        s.release(b1);
        assert!(s.peers.is_empty() && s.per_ip.is_empty());
        assert_eq!(s.unacknowledged, 0);
    }

    #[test]
    fn unacknowledged_slots_are_limited_overall_and_freed_on_release() {
        let c = Config {
            max_unacknowledged: 2,
            ..Config::default()
        };
        let mut s = Slots::default();
        let peers: Vec<SocketAddr> = (1..=3)
            .map(|i| SocketAddr::from(([10, 0, 0, i], 1000)))
            .collect();
        assert!(matches!(s.try_take(peers[0], &c), Take::Taken(_)));
        assert!(matches!(s.try_take(peers[1], &c), Take::Taken(_)));
        assert!(matches!(
            s.try_take(peers[2], &c),
            Take::Refused(Rejected::Unacknowledged)
        ));
        // A transfer that never got its acknowledgement frees its place when it ends.
        s.release(peers[0]);
        assert!(matches!(s.try_take(peers[2], &c), Take::Taken(_)));
    }
}
