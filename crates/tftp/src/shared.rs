//! What the listening loop and every transfer share: the settings, the counters, the file
//! source, the transfer slots (limits overall and per client address) and the token buckets
//! of ERROR replies and per-request logs.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::net::UdpSocket;

use crate::config::Config;
use crate::counters::{Counters, RateLimit, Rejected};
use crate::packet::{ErrorCode, encode_error};
use crate::source::FileSource;

/// Transfers in progress: per client address and port, and per client IP.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    peers: HashSet<SocketAddr>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Slots {
    pub(crate) fn try_take(&mut self, peer: SocketAddr, c: &Config) -> Result<(), Rejected> {
        if self.peers.contains(&peer) {
            return Err(Rejected::Unexpected);
        }
        let ip = self.per_ip.get(&peer.ip()).copied().unwrap_or(0);
        if self.peers.len() >= c.max_transfers || ip >= c.max_transfers_per_client {
            return Err(Rejected::Limit);
        }
        self.peers.insert(peer);
        *self.per_ip.entry(peer.ip()).or_insert(0) += 1;
        Ok(())
    }

    pub(crate) fn release(&mut self, peer: SocketAddr) {
        if self.peers.remove(&peer)
            && let Some(n) = self.per_ip.get_mut(&peer.ip())
        {
            *n -= 1;
            if *n == 0 {
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
}

impl Shared {
    /// `Some(suppressed)` when a per-request log line may be written now.
    pub(crate) fn log_allowed(&self) -> Option<u64> {
        let mut l = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        l.allow(Instant::now())
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
        assert_eq!(s.try_take(a1, &c), Ok(()));
        assert_eq!(s.try_take(a1, &c), Err(Rejected::Unexpected));
        assert_eq!(s.try_take(a2, &c), Ok(()));
        assert_eq!(s.try_take(a3, &c), Err(Rejected::Limit));
        assert_eq!(s.try_take(b1, &c), Ok(()));
        assert_eq!(s.try_take(c1, &c), Err(Rejected::Limit));
        s.release(a1);
        s.release(a1);
        assert_eq!(s.try_take(a3, &c), Ok(()));
        s.release(a2);
        s.release(a3);
        s.release(b1);
        assert!(s.peers.is_empty() && s.per_ip.is_empty());
    }
}
