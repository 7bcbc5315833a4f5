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

use std::time::{Duration, Instant};

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

/// The transfer gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no acknowledgement after {retries} retransmissions")]
pub struct RetriesExhausted {
    /// Retransmissions made.
    pub retries: u32,
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
    /// A sender for `size` bytes in blocks of `blksize` (at least 1), `window` blocks per
    /// ACK (at least 1), retransmitting after `timeout` at most `max_retries` times in a
    /// row. Returns the first transmission: the OACK when `oack`, else the first window.
    pub fn new(
        size: u64,
        blksize: u16,
        window: u16,
        oack: bool,
        timeout: Duration,
        max_retries: u32,
        now: Instant,
    ) -> (Sender, Transmit) {
        let blksize = blksize.max(1);
        let mut s = Sender {
            size,
            blksize,
            window: window.max(1),
            total_blocks: size / u64::from(blksize) + 1,
            acked: 0,
            sent_to: 0,
            oack_pending: oack,
            timeout,
            retries: 0,
            max_retries,
            deadline: now + timeout,
        };
        let first = if oack {
            Transmit::Oack
        } else {
            s.next_window(now)
        };
        (s, first)
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
            self.retries = 0;
            return AckOutcome::Send(self.next_window(now));
        }
        let diff = u64::from(block.wrapping_sub(wire_block(self.acked)));
        let abs = self.acked + diff;
        if diff == 0 || abs > self.sent_to {
            return AckOutcome::Ignored;
        }
        self.acked = abs;
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

    /// The deadline passed with no progress: what to retransmit.
    ///
    /// # Errors
    /// [`RetriesExhausted`] after `max_retries` retransmissions in a row.
    pub fn on_timeout(&mut self, now: Instant) -> Result<Transmit, RetriesExhausted> {
        if self.retries >= self.max_retries {
            return Err(RetriesExhausted {
                retries: self.retries,
            });
        }
        self.retries += 1;
        self.deadline = now + self.timeout;
        Ok(if self.oack_pending {
            Transmit::Oack
        } else {
            Transmit::Blocks {
                first: self.acked + 1,
                last: self.sent_to,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);

    /// Runs a lossless transfer; returns the blocks sent in order.
    fn run(size: u64, bs: u16, window: u16, oack: bool) -> Vec<u64> {
        let now = Instant::now();
        let (mut s, mut tx) = Sender::new(size, bs, window, oack, T, 3, now);
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
        let (s, _) = Sender::new(1000, 512, 1, false, T, 1, Instant::now());
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
        let (mut s, tx) = Sender::new(100 * 512, 512, 8, false, T, 3, now);
        assert_eq!(tx, Transmit::Blocks { first: 1, last: 8 });
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
        let (mut s, tx) = Sender::new(5000, 512, 4, true, T, 2, now);
        assert_eq!(tx, Transmit::Oack);
        assert_eq!(s.deadline(), now + T);
        assert_eq!(s.on_ack(1, now), AckOutcome::Ignored);
        assert_eq!(s.on_timeout(now + T), Ok(Transmit::Oack));
        assert_eq!(s.deadline(), now + 2 * T);
        assert_eq!(
            s.on_ack(0, now),
            AckOutcome::Send(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(
            s.on_timeout(now),
            Ok(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(
            s.on_timeout(now),
            Ok(Transmit::Blocks { first: 1, last: 4 })
        );
        assert_eq!(s.on_timeout(now), Err(RetriesExhausted { retries: 2 }));
    }
}
