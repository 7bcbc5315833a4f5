//! The server's counters (atomics, read with [`Counters::snapshot`] for metrics) and the
//! token bucket that rate-limits logs and error replies caused by hostile traffic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why a datagram did not start or continue a transfer. A fixed set, so the metric's
/// series are bounded whatever peers send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Too short for its opcode.
    Short,
    /// An opcode TFTP does not define.
    UnknownOpcode,
    /// A malformed request or packet (bad string, option, mode, length).
    BadRequest,
    /// A request in a mode other than octet.
    Mode,
    /// A write request (the server is read-only).
    Write,
    /// A path outside the root, a symlink out of it, or not a regular file.
    PathRefused,
    /// No such file, permission denied or an I/O error on open.
    NotFound,
    /// The file is larger than the server's limit.
    TooLarge,
    /// Over the limit of transfers overall or per client address.
    Limit,
    /// Over the limit of transfers whose first packet is not acknowledged yet, per client
    /// address or overall: dropped without a reply, so a forged source draws nothing.
    Unacknowledged,
    /// A packet from another address or port than the transfer's client (ERROR 5).
    WrongTid,
    /// DATA, ACK, OACK or ERROR at the listening port, or a second request from a client
    /// address and port that already has a transfer (which then sends its first packet
    /// again if that is not acknowledged yet, see [`crate::sender`]).
    Unexpected,
}

impl Rejected {
    /// Every reason, in exposition order.
    pub const ALL: [Rejected; 12] = [
        Rejected::Short,
        Rejected::UnknownOpcode,
        Rejected::BadRequest,
        Rejected::Mode,
        Rejected::Write,
        Rejected::PathRefused,
        Rejected::NotFound,
        Rejected::TooLarge,
        Rejected::Limit,
        Rejected::Unacknowledged,
        Rejected::WrongTid,
        Rejected::Unexpected,
    ];

    /// The reason's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejected::Short => "short",
            Rejected::UnknownOpcode => "unknown_opcode",
            Rejected::BadRequest => "bad_request",
            Rejected::Mode => "mode",
            Rejected::Write => "write_request",
            Rejected::PathRefused => "path_refused",
            Rejected::NotFound => "not_found",
            Rejected::TooLarge => "too_large",
            Rejected::Limit => "limit",
            Rejected::Unacknowledged => "unacknowledged",
            Rejected::WrongTid => "wrong_tid",
            Rejected::Unexpected => "unexpected",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Live counters, shared by the listener and every transfer.
#[derive(Debug, Default)]
pub struct Counters {
    /// Datagrams received on the listening port.
    pub datagrams: AtomicU64,
    /// Well-formed read requests.
    pub requests: AtomicU64,
    /// Transfers started (file opened, first packet sent).
    pub transfers_started: AtomicU64,
    /// Transfers whose last block was acknowledged.
    pub transfers_completed: AtomicU64,
    /// Transfers ended early (timeout, client error, read error).
    pub transfers_failed: AtomicU64,
    /// Of those, transfers whose first packet was not acknowledged in time.
    pub first_ack_timeouts: AtomicU64,
    /// Transfers running now.
    pub transfers_active: AtomicU64,
    /// File bytes sent in DATA packets, retransmissions included.
    pub bytes_sent: AtomicU64,
    /// DATA and OACK packets sent again after a timeout or a partial window.
    pub retransmits: AtomicU64,
    /// ERROR packets sent.
    pub errors_sent: AtomicU64,
    /// ERROR replies not sent because of the reply rate limit.
    pub errors_suppressed: AtomicU64,
    /// Log lines about refusals left out by the per-client log limit (each client's count
    /// is in a summary line per interval).
    pub logs_suppressed: AtomicU64,
    rejected: [AtomicU64; Rejected::ALL.len()],
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// See [`Counters::datagrams`].
    pub datagrams: u64,
    /// See [`Counters::requests`].
    pub requests: u64,
    /// See [`Counters::transfers_started`].
    pub transfers_started: u64,
    /// See [`Counters::transfers_completed`].
    pub transfers_completed: u64,
    /// See [`Counters::transfers_failed`].
    pub transfers_failed: u64,
    /// See [`Counters::first_ack_timeouts`].
    pub first_ack_timeouts: u64,
    /// See [`Counters::transfers_active`].
    pub transfers_active: u64,
    /// See [`Counters::bytes_sent`].
    pub bytes_sent: u64,
    /// See [`Counters::retransmits`].
    pub retransmits: u64,
    /// See [`Counters::errors_sent`].
    pub errors_sent: u64,
    /// See [`Counters::errors_suppressed`].
    pub errors_suppressed: u64,
    /// See [`Counters::logs_suppressed`].
    pub logs_suppressed: u64,
    /// Rejected datagrams per reason, in [`Rejected::ALL`] order.
    pub rejected: [u64; Rejected::ALL.len()],
}

impl Snapshot {
    /// Rejections for one reason.
    pub fn rejected(&self, r: Rejected) -> u64 {
        self.rejected[r.index()]
    }

    /// `(label, count)` per reason, in [`Rejected::ALL`] order.
    pub fn rejected_by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Rejected::ALL
            .iter()
            .map(|r| (r.as_str(), self.rejected[r.index()]))
    }
}

impl Counters {
    /// Adds one to `c`.
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reject(&self, r: Rejected) {
        Counters::inc(&self.rejected[r.index()]);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            datagrams: l(&self.datagrams),
            requests: l(&self.requests),
            transfers_started: l(&self.transfers_started),
            transfers_completed: l(&self.transfers_completed),
            transfers_failed: l(&self.transfers_failed),
            first_ack_timeouts: l(&self.first_ack_timeouts),
            transfers_active: l(&self.transfers_active),
            bytes_sent: l(&self.bytes_sent),
            retransmits: l(&self.retransmits),
            errors_sent: l(&self.errors_sent),
            errors_suppressed: l(&self.errors_suppressed),
            logs_suppressed: l(&self.logs_suppressed),
            rejected: std::array::from_fn(|i| l(&self.rejected[i])),
        }
    }
}

/// A token bucket: `burst` events at once, refilled at `per_second`. Pure: takes `now`.
#[derive(Debug, Clone)]
pub struct RateLimit {
    per_second: u32,
    burst: u32,
    tokens: f64,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// A bucket that starts full.
    pub fn new(per_second: u32, burst: u32) -> RateLimit {
        RateLimit {
            per_second,
            burst,
            tokens: f64::from(burst),
            last: None,
            suppressed: 0,
        }
    }

    /// Takes a token if there is one. Returns `Some(n)` when allowed, `n` being the events
    /// refused since the last allowed one (to log "n suppressed"); `None` when refused.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        self.last = Some(now);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * f64::from(self.per_second))
            .min(f64::from(self.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_refills_over_time() {
        let t = Instant::now();
        let mut r = RateLimit::new(10, 2);
        assert_eq!(r.allow(t), Some(0));
        assert_eq!(r.allow(t), Some(0));
        assert_eq!(r.allow(t), None);
        assert_eq!(r.allow(t), None);
        assert_eq!(r.allow(t + Duration::from_millis(100)), Some(2));
        assert_eq!(r.allow(t + Duration::from_secs(100)), Some(0));
        assert_eq!(r.allow(t + Duration::from_secs(100)), Some(0));
        assert_eq!(r.allow(t + Duration::from_secs(100)), None);
    }

    #[test]
    fn snapshot_reads_every_reason() {
        let c = Counters::default();
        c.reject(Rejected::Limit);
        c.reject(Rejected::Limit);
        c.reject(Rejected::Unexpected);
        Counters::inc(&c.requests);
        let s = c.snapshot();
        assert_eq!(s.rejected(Rejected::Limit), 2);
        assert_eq!(s.rejected(Rejected::Unexpected), 1);
        assert_eq!(s.requests, 1);
        let labels: Vec<_> = s.rejected_by_reason().map(|(l, _)| l).collect();
        assert_eq!(labels.len(), Rejected::ALL.len());
        assert_eq!(labels[0], "short");
    }
}
