//! The sending side of one read transfer as a pure state machine: which packets to (re)send
//! after an ACK or a timeout, windows of RFC 7440, block-number rollover, and a bounded
//! number of retries. It takes `now` as an argument and does no I/O; the server's transfer
//! task reads the blocks and sends them.
//!
//! Blocks are numbered from 1 as `u64` ("absolute"); on the wire a block carries the low 16
//! bits, so block 65536 goes out as 0 (the rollover tftp-hpa, curl and iPXE expect). An ACK's
//! 16-bit number is mapped back into the window in flight, `acked..=acked + windowsize`,
//! which holds at most 65536 numbers, so the mapping is unique.
//!
//! A file of `size` bytes has `size / blksize + 1` blocks: the last one is shorter than
//! `blksize`, empty when `size` is a multiple of it (RFC 1350 §6).
//!
//! # The first packet
//!
//! Until the client acknowledges the first packet (ACK 0 of the OACK, or ACK 1 of block 1
//! without options) its address is unproven: a UDP source can be forged, and everything sent
//! to it may hit a victim. So before that first ACK the sender
//! - sends the first packet alone: the OACK, or block 1 (never a window, RFC 7440's included);
//! - never retransmits it on a timer, only when the client repeats its request
//!   ([`Sender::on_repeated_request`], RFC 1350 §4: the requester retransmits on timeout), and
//!   at most [`FIRST_PACKET_SENDS_MAX`] times in all;
//! - gives up at `first_ack_timeout` after the start, whatever `timeout` the client asked
//!   for ([`GiveUp::FirstAckTimeout`]).
//!
//! After it, windows, retransmissions and the client's `timeout` apply as usual.

use std::time::{Duration, Instant};

pub use crate::config::FIRST_PACKET_SENDS_MAX;

/// What to put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit {
    /// The OACK (waiting for ACK 0).
    Oack,
    /// Blocks `first..=last` (absolute numbers).
    Blocks {
        /// First block.
        first: u64,
        /// Last block.
        last: u64,
    },
}

/// What an ACK leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Send these next.
    Send(Transmit),
    /// A duplicate or stray ACK: nothing to do (no retransmission on a duplicate ACK, which
    /// avoids the Sorcerer's Apprentice syndrome of RFC 1350 §4 / RFC 1123 §4.2.3.1).
    Ignored,
    /// The last block is acknowledged: the transfer is complete.
    Done,
}

/// Why the transfer gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GiveUp {
    /// The first packet (OACK or block 1) was not acknowledged within `first_ack_timeout`.
    #[error("first packet not acknowledged in time")]
    FirstAckTimeout,
    /// No progress after `max_retries` retransmissions in a row.
    #[error("no acknowledgement after {retries} retransmissions")]
    RetriesExhausted {
        /// Retransmissions made.
        retries: u32,
    },
}

/// The settings of one transfer's [`Sender`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// File size in bytes.
    pub size: u64,
    /// Block size (at least 1 is used).
    pub blksize: u16,
    /// Blocks per acknowledgement once the first packet is acknowledged (at least 1).
    pub window: u16,
    /// Whether the transfer starts with an OACK.
    pub oack: bool,
    /// Retransmission timeout once the first packet is acknowledged.
    pub timeout: Duration,
    /// Time from the start to the first acknowledgement.
    pub first_ack_timeout: Duration,
    /// Retransmissions in a row without progress before giving up.
    pub max_retries: u32,
}

/// The sender of one transfer.
#[derive(Debug, Clone)]
pub struct Sender {
    size: u64,
    blksize: u16,
    window: u16,
    total_blocks: u64,
    acked: u64,
    sent_to: u64,
    oack_pending: bool,
    /// No ACK of the first packet yet (see the module documentation).
    first_pending: bool,
    /// Times the first packet was sent.
    first_sends: u32,
    timeout: Duration,
    retries: u32,
    max_retries: u32,
    deadline: Instant,
}

/// The 16-bit block number of absolute block `abs`.
pub fn wire_block(abs: u64) -> u16 {
    let b = abs.to_le_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

impl Sender {
    /// A sender for `p`, starting at `now`. Returns the first transmission: the OACK when
    /// `p.oack`, else block 1.
    pub fn new(p: Params, now: Instant) -> (Sender, Transmit) {
        let blksize = p.blksize.max(1);
        let mut s = Sender {
            size: p.size,
            blksize,
            window: p.window.max(1),
            total_blocks: p.size / u64::from(blksize) + 1,
            acked: 0,
            sent_to: 0,
            oack_pending: p.oack,
            first_pending: true,
            first_sends: 1,
            timeout: p.timeout,
            retries: 0,
            max_retries: p.max_retries,
            deadline: now + p.first_ack_timeout,
        };
        let first = if p.oack {
            Transmit::Oack
        } else {
            s.sent_to = 1;
            Transmit::Blocks { first: 1, last: 1 }
        };
        (s, first)
    }

    /// Whether the client has acknowledged the first packet (its address is proven).
    pub fn first_acked(&self) -> bool {
        !self.first_pending
    }

    /// Blocks in the file.
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// The byte range of absolute block `abs` (1-based): offset and length.
    pub fn block_range(&self, abs: u64) -> (u64, usize) {
        let bs = u64::from(self.blksize);
        let offset = abs.saturating_sub(1).saturating_mul(bs);
        let len = self.size.saturating_sub(offset).min(bs);
        // len <= blksize <= u16::MAX.
        debug_assert!(
            (1..=self.total_blocks).contains(&abs),
            "block {abs} outside 1..={}",
            self.total_blocks
        );
        (offset, usize::from(u16::try_from(len).unwrap_or(u16::MAX)))
    }

    /// When [`Sender::on_timeout`] is due.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The highest block acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    fn next_window(&mut self, now: Instant) -> Transmit {
        debug_assert!(
            self.acked < self.total_blocks,
            "no window after the last block"
        );
        let first = self.acked + 1;
        let last = (self.acked + u64::from(self.window)).min(self.total_blocks);
        debug_assert!(first <= last, "a window holds at least one block");
        self.sent_to = last;
        self.deadline = now + self.timeout;
        Transmit::Blocks { first, last }
    }

    /// Handles ACK `block`.
    pub fn on_ack(&mut self, block: u16, now: Instant) -> AckOutcome {
        if self.oack_pending {
            if block != 0 {
                return AckOutcome::Ignored;
            }
            self.oack_pending = false;
            self.first_pending = false;
            self.retries = 0;
            return AckOutcome::Send(self.next_window(now));
        }
        let diff = u64::from(block.wrapping_sub(wire_block(self.acked)));
        let abs = self.acked + diff;
        if diff == 0 || abs > self.sent_to {
            return AckOutcome::Ignored;
        }
        self.acked = abs;
        self.first_pending = false;
        self.retries = 0;
        debug_assert!(
            self.acked <= self.sent_to && self.sent_to <= self.total_blocks,
            "acked {} <= sent {} <= total {}",
            self.acked,
            self.sent_to,
            self.total_blocks
        );
        if abs == self.total_blocks {
            return AckOutcome::Done;
        }
        // A full window, or a partial one (the client lost a block, RFC 7440 §4): the next
        // window starts after what it has.
        AckOutcome::Send(self.next_window(now))
    }

    /// The client sent its request again (it did not get the first packet): the first
    /// packet once more, while it is unacknowledged and sent fewer than
    /// [`FIRST_PACKET_SENDS_MAX`] times; `None` otherwise. The first-ACK deadline stays.
    pub fn on_repeated_request(&mut self) -> Option<Transmit> {
        if !self.first_pending || self.first_sends >= FIRST_PACKET_SENDS_MAX {
            return None;
        }
        self.first_sends += 1;
        Some(if self.oack_pending {
            Transmit::Oack
        } else {
            Transmit::Blocks { first: 1, last: 1 }
        })
    }

    /// The deadline passed with no progress: what to retransmit.
    ///
    /// # Errors
    /// [`GiveUp::FirstAckTimeout`] before the first ACK (nothing is retransmitted on a
    /// timer then); [`GiveUp::RetriesExhausted`] after `max_retries` retransmissions in a
    /// row.
    pub fn on_timeout(&mut self, now: Instant) -> Result<Transmit, GiveUp> {
        if self.first_pending {
            return Err(GiveUp::FirstAckTimeout);
        }
        if self.retries >= self.max_retries {
            return Err(GiveUp::RetriesExhausted {
                retries: self.retries,
            });
        }
        self.retries += 1;
        self.deadline = now + self.timeout;
        Ok(Transmit::Blocks {
            first: self.acked + 1,
            last: self.sent_to,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);
    /// A first-ACK deadline different from `T`, to tell them apart.
    const FIRST: Duration = Duration::from_secs(3);

    fn params(size: u64, blksize: u16, window: u16, oack: bool, max_retries: u32) -> Params {
        Params {
            size,
            blksize,
            window,
            oack,
            timeout: T,
            first_ack_timeout: FIRST,
            max_retries,
        }
    }

    /// Runs a lossless transfer; returns the blocks sent in order.
    fn run(size: u64, bs: u16, window: u16, oack: bool) -> Vec<u64> {
        let now = Instant::now();
        let (mut s, mut tx) = Sender::new(params(size, bs, window, oack, 3), now);
        let mut sent = Vec::new();
        loop {
            let ack = match tx {
                Transmit::Oack => 0,
                Transmit::Blocks { first, last } => {
                    sent.extend(first..=last);
                    wire_block(last)
                }
            };
            match s.on_ack(ack, now) {
                AckOutcome::Send(t) => tx = t,
                AckOutcome::Done => return sent,
                AckOutcome::Ignored => panic!("ignored ack {ack}"),
            }
        }
    }

    #[test]
    fn block_counts_and_ranges() {
        assert_eq!(run(0, 512, 1, false), [1]);
        assert_eq!(run(512, 512, 1, true), [1, 2]);
        assert_eq!(run(513, 512, 4, false), [1, 2]);
        assert_eq!(run(10 * 512, 512, 4, true), (1..=11).collect::<Vec<_>>());
        let (s, _) = Sender::new(params(1000, 512, 1, false, 1), Instant::now());
        assert_eq!(s.block_range(1), (0, 512));
        assert_eq!(s.block_range(2), (512, 488));
        assert_eq!(s.total_blocks(), 2);
    }

    #[test]
    fn rolls_over_past_65535_blocks() {
        let size = 70_000 * 8 + 3;
        let sent = run(size, 8, 7, false);
        assert_eq!(sent.len(), 70_001);
        assert_eq!(*sent.last().unwrap(), 70_001);
        assert_eq!(wire_block(65_536), 0);
        let single = run(size, 8, 1, true);
        assert_eq!(single.len(), 70_001);
    }

    #[test]
    fn a_partial_ack_restarts_the_window_after_it() {
        let now = Instant::now();
        let (mut s, tx) = Sender::new(params(100 * 512, 512, 8, true, 3), now);
        assert_eq!(tx, Transmit::Oack);
        assert_eq!(
            s.on_ack(0, now),
            AckOutcome::Send(Transmit::Blocks { first: 1, last: 8 })
        );
        // The client got 1..=5 only.
        assert_eq!(
            s.on_ack(5, now),
            AckOutcome::Send(Transmit::Blocks { first: 6, last: 13 })
        );
        // Duplicates and acks of unsent blocks change nothing.
        assert_eq!(s.on_ack(5, now), AckOutcome::Ignored);
        assert_eq!(s.on_ack(14, now), AckOutcome::Ignored);
        assert_eq!(s.on_ack(3, now), AckOutcome::Ignored);
        assert_eq!(s.acked(), 5);
    }

    #[test]
    fn timeouts_retransmit_then_give_up() {
        let now = Instant::now();
        let (mut s, tx) = Sender::new(params(5000, 512, 4, true, 2), now);
        assert_eq!(tx, Transmit::Oack);
        assert_eq!(
            s.on_ack(0, now),
            AckOutcome::Send(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(s.deadline(), now + T);
        assert_eq!(
            s.on_timeout(now + T),
            Ok(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(s.deadline(), now + 2 * T);
        assert_eq!(
            s.on_timeout(now),
            Ok(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(
            s.on_timeout(now),
            Err(GiveUp::RetriesExhausted { retries: 2 })
        );
    }

    #[test]
    fn an_unacknowledged_oack_is_not_resent_on_a_timer_and_gives_up_at_the_first_deadline() {
        let now = Instant::now();
        let (mut s, tx) = Sender::new(params(5000, 512, 4, true, 5), now);
        assert_eq!(tx, Transmit::Oack);
        assert_eq!(s.deadline(), now + FIRST);
        // An ACK of a block is not the OACK's.
        assert_eq!(s.on_ack(1, now), AckOutcome::Ignored);
        assert!(!s.first_acked());
        assert_eq!(s.on_timeout(now + FIRST), Err(GiveUp::FirstAckTimeout));
    }

    #[test]
    fn without_options_block_one_goes_alone_and_is_resent_only_on_a_repeated_request() {
        let now = Instant::now();
        // A window of 8 asked for, but nothing proves the address yet.
        let (mut s, tx) = Sender::new(params(100 * 512, 512, 8, false, 5), now);
        assert_eq!(tx, Transmit::Blocks { first: 1, last: 1 });
        assert_eq!(
            s.on_repeated_request(),
            Some(Transmit::Blocks { first: 1, last: 1 })
        );
        // FIRST_PACKET_SENDS_MAX (2) reached.
        assert_eq!(s.on_repeated_request(), None);
        assert_eq!(s.deadline(), now + FIRST);
        assert_eq!(
            s.on_ack(1, now),
            AckOutcome::Send(Transmit::Blocks { first: 2, last: 9 })
        );
        assert!(s.first_acked());
        assert_eq!(s.on_repeated_request(), None);
        assert_eq!(s.deadline(), now + T);
    }

    #[test]
    fn a_repeated_request_resends_the_oack() {
        let now = Instant::now();
        let (mut s, _) = Sender::new(params(5000, 512, 4, true, 5), now);
        assert_eq!(s.on_repeated_request(), Some(Transmit::Oack));
        assert_eq!(s.on_repeated_request(), None);
    }
}
