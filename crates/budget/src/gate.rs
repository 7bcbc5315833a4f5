//! The gate of one listener: how many connections it holds at once, how many of them one
//! client address holds, and what it refused.
//!
//! [`Gate::try_admit`] never waits: a connection past either cap is refused at once (the
//! caller closes it), so a flood costs the process one file for the instant of the accept,
//! never a file per waiting client. An admitted connection holds a [`Ticket`] that gives
//! its place back when dropped.
//!
//! A full listener with `evict_for_newcomers` (the HTTP listeners) makes room for an
//! address that holds fewer connections than another: the address holding the most (of
//! several, the one with the oldest connection) loses its oldest connection, whose holder
//! awaits [`Ticket::evicted`] and closes it. So a flood from many addresses fills the
//! listener but cannot keep a new client out (a device's request is then the newest, the
//! last one a tie evicts), and a flooder never holds more than a newcomer can take from it.
//! At most
//! [`EVICTIONS_PENDING_MAX`] evicted connections may be closing at once, so the listener
//! holds at most that many over its cap, for the moment a close takes.
//!
//! A loopback address counts like any other client unless the gate is built with
//! `loopback_exempt` (the NBD listener's `trust_loopback`: a kernel or qemu client on the
//! server itself). A unix-socket client (no address) counts against the listener's cap
//! only.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

use crate::throttle::Throttle;

/// Most evicted connections a gate waits on at once (see the module docs).
pub const EVICTIONS_PENDING_MAX: usize = 16;

/// Default per-address cap of the farm API: a device needs one or two connections (its
/// login, its reports), an operator's console a few more.
pub const API_PER_ADDRESS_MAX: usize = 32;
/// Default per-address cap of the HTTP boot port: iPXE fetches a script, a kernel and an
/// initramfs, one connection at a time.
pub const BOOT_PER_ADDRESS_MAX: usize = 16;
/// Default per-address cap of the metrics endpoint (a scraper or two).
pub const METRICS_PER_ADDRESS_MAX: usize = 4;

/// What one listener may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateConfig {
    /// The listener's name in logs and metrics (`nbd`, `api`, `boot`, `metrics`).
    pub name: &'static str,
    /// Most connections open at once.
    pub connections_max: usize,
    /// Most connections open at once from one IP address.
    pub per_address_max: usize,
    /// Whether a loopback address is exempt from `per_address_max`.
    pub loopback_exempt: bool,
    /// Whether a full listener closes the oldest connection of the address holding the
    /// most to admit one from an address holding fewer (see the module docs). Only for a
    /// listener whose connections await [`Ticket::evicted`], until they [`Ticket::settle`]
    /// (NBD: once negotiated, a device's connection is never closed for another).
    pub evict_for_newcomers: bool,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The client's address holds its cap.
    #[error("{ip} holds {max} connections, its cap")]
    AddressFull {
        /// The address.
        ip: IpAddr,
        /// Its cap.
        max: usize,
    },
    /// The listener holds its cap.
    #[error("the listener holds {max} connections, its cap")]
    ListenerFull {
        /// The cap.
        max: usize,
    },
}

/// What a gate has done since it was made, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Connections open now.
    pub open: u64,
    /// Connections admitted.
    pub admitted: u64,
    /// Connections refused because their address held its cap.
    pub refused_address: u64,
    /// Connections refused because the listener held its cap.
    pub refused_full: u64,
    /// Connections closed by a timeout of the accept path (TLS handshake, request head,
    /// a stalled read or write).
    pub timed_out: u64,
    /// Failed `accept` calls (out of files, ...).
    pub accept_errors: u64,
    /// Connections closed to make room for an address holding fewer.
    pub evicted: u64,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
    /// The evictable connections of each address, oldest first: ticket id and its signal.
    queues: HashMap<IpAddr, VecDeque<(u64, Arc<Notify>)>>,
    /// Tickets told to go and not yet dropped.
    evicting: HashSet<u64>,
    next_id: u64,
}

impl Open {
    /// Tells the oldest connection of the address holding the most evictable ones (of
    /// several, the one whose oldest is oldest) to go, when that is more than `newcomer`
    /// holds; false when nothing may go.
    fn evict_for(&mut self, newcomer: IpAddr) -> bool {
        if self.evicting.len() >= EVICTIONS_PENDING_MAX {
            return false;
        }
        let have = self.by_addr.get(&newcomer).copied().unwrap_or(0);
        let heaviest = self
            .queues
            .iter()
            .filter_map(|(ip, q)| {
                q.front()
                    .map(|(oldest, _)| (q.len(), Reverse(*oldest), *ip))
            })
            .max();
        let Some((held, _, heaviest)) = heaviest else {
            return false;
        };
        if held <= have {
            return false;
        }
        let queue = self.queues.get_mut(&heaviest).expect("chosen from the map");
        let (id, signal) = queue.pop_front().expect("held > 0");
        if queue.is_empty() {
            self.queues.remove(&heaviest);
        }
        signal.notify_one();
        self.evicting.insert(id);
        true
    }
}

/// One listener's connection budget. See the module docs.
pub struct Gate {
    config: GateConfig,
    open: Mutex<Open>,
    admitted: AtomicU64,
    refused_address: AtomicU64,
    refused_full: AtomicU64,
    timed_out: AtomicU64,
    accept_errors: AtomicU64,
    evicted: AtomicU64,
    /// One refusal line per window, the rest counted into the next.
    refusal_log: Throttle,
    /// One accept-error line per window.
    error_log: Throttle,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Gate {
    /// A gate with `config` (caps of 0 are raised to 1).
    pub fn new(mut config: GateConfig) -> Arc<Gate> {
        config.connections_max = config.connections_max.max(1);
        config.per_address_max = config.per_address_max.max(1);
        Arc::new(Gate {
            config,
            open: Mutex::new(Open::default()),
            admitted: AtomicU64::new(0),
            refused_address: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            refusal_log: Throttle::default(),
            error_log: Throttle::default(),
        })
    }

    /// The gate's caps.
    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// Admits a connection from `ip` (`None`: a unix socket) or says why not; a refusal
    /// is counted and logged (rate-limited).
    ///
    /// # Errors
    /// [`Refusal`]: the caller closes the connection at once.
    pub fn try_admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Ticket, Refusal> {
        let r = self.take(ip);
        match &r {
            Ok(_) => {
                self.admitted.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let counter = match e {
                    Refusal::AddressFull { .. } => &self.refused_address,
                    Refusal::ListenerFull { .. } => &self.refused_full,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = self.refusal_log.allow(Instant::now()) {
                    tracing::warn!(
                        listener = self.config.name,
                        why = %e,
                        suppressed,
                        "closing connection at once"
                    );
                }
            }
        }
        r
    }

    fn take(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Ticket, Refusal> {
        let counted =
            ip.filter(|ip| !(self.config.loopback_exempt && ip.to_canonical().is_loopback()));
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ip) = counted {
            let n = open.by_addr.get(&ip).copied().unwrap_or(0);
            if n >= self.config.per_address_max {
                return Err(Refusal::AddressFull {
                    ip,
                    max: self.config.per_address_max,
                });
            }
        }
        if open.total >= self.config.connections_max {
            let room =
                self.config.evict_for_newcomers && counted.is_some_and(|ip| open.evict_for(ip));
            if !room {
                return Err(Refusal::ListenerFull {
                    max: self.config.connections_max,
                });
            }
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        open.total += 1;
        let id = open.next_id;
        open.next_id += 1;
        let mut evicted = None;
        if let Some(ip) = counted {
            *open.by_addr.entry(ip).or_insert(0) += 1;
            if self.config.evict_for_newcomers {
                let signal = Arc::new(Notify::new());
                open.queues
                    .entry(ip)
                    .or_default()
                    .push_back((id, Arc::clone(&signal)));
                evicted = Some(signal);
            }
        }
        Ok(Ticket {
            gate: Arc::clone(self),
            ip: counted,
            id,
            evicted,
        })
    }

    /// Counts a connection closed by a timeout of its accept path.
    pub fn note_timeout(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts and logs (rate-limited) a failed `accept`.
    pub fn note_accept_error(&self, e: &std::io::Error) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.error_log.allow(Instant::now()) {
            tracing::warn!(listener = self.config.name, error = %e, suppressed, "accept failed");
        }
    }

    /// The counters now.
    pub fn stats(&self) -> GateStats {
        let open = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total;
        GateStats {
            open: open as u64,
            admitted: self.admitted.load(Ordering::Relaxed),
            refused_address: self.refused_address.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            accept_errors: self.accept_errors.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    fn give_back(&self, ip: Option<IpAddr>, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if !open.evicting.remove(&id)
            && let Some(ip) = ip
            && let Some(q) = open.queues.get_mut(&ip)
        {
            q.retain(|(t, _)| *t != id);
            if q.is_empty() {
                open.queues.remove(&ip);
            }
        }
        if let Some(ip) = ip
            && let Some(n) = open.by_addr.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                open.by_addr.remove(&ip);
            }
        }
    }
}

/// One admitted connection's place in its gate, given back on drop.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    /// The address it counts against, if any.
    ip: Option<IpAddr>,
    id: u64,
    /// Signalled when the gate wants the place back (`evict_for_newcomers`).
    evicted: Option<Arc<Notify>>,
}

impl Ticket {
    /// The gate that admitted it.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Takes this connection out of the gate's choice for eviction for good (an NBD
    /// connection that finished its handshake). False when the gate chose it already: the
    /// caller closes it as [`Ticket::evicted`] says.
    pub fn settle(&mut self) -> bool {
        if self.evicted.is_none() {
            return true;
        }
        let mut open = self
            .gate
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if open.evicting.contains(&self.id) {
            return false;
        }
        if let Some(ip) = self.ip
            && let Some(q) = open.queues.get_mut(&ip)
        {
            q.retain(|(t, _)| *t != self.id);
            if q.is_empty() {
                open.queues.remove(&ip);
            }
        }
        self.evicted = None;
        true
    }

    /// Completes when the gate has chosen this connection to make room for a newcomer
    /// (see the module docs): its holder then closes it. Never completes on a gate without
    /// `evict_for_newcomers`.
    pub async fn evicted(&self) {
        match &self.evicted {
            Some(signal) => signal.notified().await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.give_back(self.ip, self.id);
    }
}

/// One `/metrics` family: name, type, help, and its value in a gate's counters.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&GateStats) -> u64,
);

/// Appends the counters of `gates` to a Prometheus text page, one series per listener.
pub fn render_metrics(gates: &[&Gate], out: &mut String) {
    use std::fmt::Write as _;
    let series: [Family; 7] = [
        (
            "ferry_listener_connections",
            "gauge",
            "Connections open, per listener.",
            |s| s.open,
        ),
        (
            "ferry_listener_admitted_total",
            "counter",
            "Connections admitted, per listener.",
            |s| s.admitted,
        ),
        (
            "ferry_listener_refused_address_total",
            "counter",
            "Connections closed at once: their address held its cap.",
            |s| s.refused_address,
        ),
        (
            "ferry_listener_refused_full_total",
            "counter",
            "Connections closed at once: the listener held its share of the process's files.",
            |s| s.refused_full,
        ),
        (
            "ferry_listener_timeouts_total",
            "counter",
            "Connections closed by a handshake, request-head, read or write timeout.",
            |s| s.timed_out,
        ),
        (
            "ferry_listener_accept_errors_total",
            "counter",
            "Failed accept calls (out of open files, ...).",
            |s| s.accept_errors,
        ),
        (
            "ferry_listener_evicted_total",
            "counter",
            "Connections closed to admit an address holding fewer (a full listener).",
            |s| s.evicted,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for g in gates {
            let v = value(&g.stats());
            let _ = writeln!(out, "{name}{{listener=\"{}\"}} {v}", g.config.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(connections_max: usize, per_address_max: usize, loopback_exempt: bool) -> Arc<Gate> {
        Gate::new(GateConfig {
            name: "test",
            connections_max,
            per_address_max,
            loopback_exempt,
            evict_for_newcomers: false,
        })
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_address_past_its_cap_is_refused_and_others_are_not() {
        let g = gate(10, 2, false);
        let _a = g.try_admit(ip("192.0.2.1")).unwrap();
        let _b = g.try_admit(ip("192.0.2.1")).unwrap();
        let third = g.try_admit(ip("192.0.2.1")).unwrap_err();
        assert!(matches!(third, Refusal::AddressFull { max: 2, .. }));
        assert!(g.try_admit(ip("192.0.2.2")).is_ok());
    }

    #[test]
    fn loopback_counts_like_any_address_unless_exempt() {
        let counted = gate(10, 1, false);
        let _a = counted.try_admit(ip("127.0.0.1")).unwrap();
        assert!(counted.try_admit(ip("127.0.0.1")).is_err());
        // 127.0.0.2 is another address.
        assert!(counted.try_admit(ip("127.0.0.2")).is_ok());
        let exempt = gate(10, 1, true);
        let _b = exempt.try_admit(ip("127.0.0.1")).unwrap();
        assert!(exempt.try_admit(ip("::ffff:127.0.0.1")).is_ok());
    }

    #[test]
    fn a_full_listener_refuses_every_address_and_takes_one_back() {
        let g = gate(2, 5, false);
        let a = g.try_admit(ip("192.0.2.1")).unwrap();
        let _b = g.try_admit(None).unwrap();
        assert_eq!(
            g.try_admit(ip("192.0.2.3")).unwrap_err(),
            Refusal::ListenerFull { max: 2 }
        );
        drop(a);
        assert!(g.try_admit(ip("192.0.2.3")).is_ok());
        let s = g.stats();
        assert_eq!((s.admitted, s.refused_full, s.refused_address), (3, 1, 0));
    }

    #[test]
    fn a_refusal_by_address_leaves_the_listener_count_alone() {
        let g = gate(2, 1, false);
        let _a = g.try_admit(ip("192.0.2.1")).unwrap();
        assert!(g.try_admit(ip("192.0.2.1")).is_err());
        assert_eq!(g.stats().open, 1);
        assert!(g.try_admit(ip("192.0.2.2")).is_ok());
    }

    #[test]
    fn metrics_name_each_listener() {
        let g = gate(2, 1, false);
        let _a = g.try_admit(ip("192.0.2.1")).unwrap();
        let _ = g.try_admit(ip("192.0.2.1"));
        let mut text = String::new();
        render_metrics(&[&g], &mut text);
        assert!(text.contains("ferry_listener_connections{listener=\"test\"} 1\n"));
        assert!(text.contains("ferry_listener_refused_address_total{listener=\"test\"} 1\n"));
    }

    fn evicting(connections_max: usize, per_address_max: usize) -> Arc<Gate> {
        Gate::new(GateConfig {
            name: "test",
            connections_max,
            per_address_max,
            loopback_exempt: false,
            evict_for_newcomers: true,
        })
    }

    /// Whether `t` has been told to go (the signal is a stored permit: no wait needed).
    async fn told(t: &Ticket) -> bool {
        tokio::select! {
            biased;
            () = t.evicted() => true,
            () = std::future::ready(()) => false,
        }
    }

    #[tokio::test]
    async fn a_full_listener_closes_the_heaviest_address_s_oldest_for_a_newcomer() {
        let g = evicting(4, 8);
        let a: Vec<Ticket> = (0..4)
            .map(|_| g.try_admit(ip("192.0.2.1")).unwrap())
            .collect();
        // A newcomer gets in; the flooder's oldest connection is told to go, no other.
        let b = g.try_admit(ip("192.0.2.2")).unwrap();
        assert!(told(&a[0]).await);
        for t in &a[1..] {
            assert!(!told(t).await);
        }
        assert!(!told(&b).await);
        // The flooder gains nothing by it: it still holds the most.
        assert_eq!(
            g.try_admit(ip("192.0.2.1")).unwrap_err(),
            Refusal::ListenerFull { max: 4 }
        );
        // The newcomer's second connection evicts again (3 evictable against its 1 + 1).
        let b2 = g.try_admit(ip("192.0.2.2")).unwrap();
        assert!(told(&a[1]).await);
        // Two each: nobody holds more than a newcomer plus one.
        let mut a = a;
        drop(a.drain(..2));
        assert_eq!(
            g.try_admit(ip("192.0.2.2")).unwrap_err(),
            Refusal::ListenerFull { max: 4 }
        );
        let s = g.stats();
        assert_eq!((s.open, s.evicted, s.refused_full), (4, 2, 2));
        drop((a, b, b2));
        assert_eq!(g.stats().open, 0);
        assert!(g.open.lock().unwrap().queues.is_empty());
    }

    #[tokio::test]
    async fn evictions_waiting_to_close_are_bounded() {
        let n = EVICTIONS_PENDING_MAX * 2 + 2;
        let g = evicting(n, n);
        let held: Vec<Ticket> = (0..n)
            .map(|_| g.try_admit(ip("192.0.2.1")).unwrap())
            .collect();
        // Newcomers from fresh addresses, while no evicted connection has closed yet.
        let mut admitted = Vec::new();
        for i in 0..EVICTIONS_PENDING_MAX + 5 {
            if let Ok(t) = g.try_admit(Some(IpAddr::from([198, 51, 100, i as u8]))) {
                admitted.push(t);
            }
        }
        assert_eq!(admitted.len(), EVICTIONS_PENDING_MAX);
        assert_eq!(g.stats().open as usize, n + EVICTIONS_PENDING_MAX);
        // Once they close, room is made again.
        drop(held);
        assert!(g.try_admit(ip("203.0.113.1")).is_ok());
        assert_eq!(g.open.lock().unwrap().evicting.len(), 0);
    }

    #[test]
    fn a_gate_without_eviction_never_evicts() {
        let g = gate(1, 1, false);
        let _a = g.try_admit(ip("192.0.2.1")).unwrap();
        assert!(g.try_admit(ip("192.0.2.2")).is_err());
        assert_eq!(g.stats().evicted, 0);
    }

    #[tokio::test]
    async fn when_every_address_holds_one_a_newcomer_takes_the_oldest_place() {
        let g = evicting(3, 4);
        let held: Vec<Ticket> = (1..=3)
            .map(|i| g.try_admit(Some(IpAddr::from([192, 0, 2, i]))).unwrap())
            .collect();
        let device = g.try_admit(ip("198.51.100.7")).unwrap();
        assert!(told(&held[0]).await);
        assert!(!told(&held[1]).await && !told(&held[2]).await);
        // Another newcomer takes the next oldest, never the device's newer place.
        let _other = g.try_admit(ip("198.51.100.8")).unwrap();
        assert!(told(&held[1]).await);
        assert!(!told(&device).await);
    }

    #[tokio::test]
    async fn a_settled_connection_is_never_evicted() {
        let g = evicting(2, 4);
        let mut device = g.try_admit(ip("192.0.2.1")).unwrap();
        assert!(device.settle());
        let _half = g.try_admit(ip("192.0.2.1")).unwrap();
        // The address's settled connection is not a candidate: the newcomer takes the other.
        let _newcomer = g.try_admit(ip("198.51.100.1")).unwrap();
        assert!(!told(&device).await);
        // Chosen before it settled: settling says so.
        let g = evicting(1, 4);
        let mut late = g.try_admit(ip("192.0.2.1")).unwrap();
        let _n = g.try_admit(ip("198.51.100.1")).unwrap();
        assert!(!late.settle());
        assert!(told(&late).await);
    }
}
