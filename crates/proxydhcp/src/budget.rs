//! How many replies the proxy sends, so that no client (or flood of made-up MACs) turns it
//! into a broadcast storm. Pure: the caller passes `now`.
//!
//! Time is cut into fixed windows of [`Limits::window`]. Within one, a MAC gets
//! [`Limits::per_mac`] replies and all MACs together [`Limits::total`]; the table of MACs
//! holds at most [`Limits::macs_max`] (a MAC past it in a window gets nothing until the next).
//! A PXE boot needs two or three replies (an offer per DISCOVER it repeats, an ACK on 4011),
//! so the defaults leave a booting machine room for several tries while a flood of one MAC
//! gets 8 replies a window, and a flood of many MACs at most 1,000 in all: the broadcast
//! domain sees at most 100 proxy replies a second. Addresses are not counted: a DHCPDISCOVER
//! comes from 0.0.0.0.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The budget's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The window.
    pub window: Duration,
    /// Replies to one MAC per window.
    pub per_mac: u32,
    /// Replies in all per window.
    pub total: u32,
    /// MACs counted per window.
    pub macs_max: usize,
}

/// Default window: 10 s.
pub const WINDOW_DEFAULT: Duration = Duration::from_secs(10);
/// Default replies to one MAC per window.
pub const PER_MAC_DEFAULT: u32 = 8;
/// Default replies in all per window.
pub const TOTAL_DEFAULT: u32 = 1000;
/// Default MACs counted per window.
pub const MACS_MAX_DEFAULT: usize = 4096;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            window: WINDOW_DEFAULT,
            per_mac: PER_MAC_DEFAULT,
            total: TOTAL_DEFAULT,
            macs_max: MACS_MAX_DEFAULT,
        }
    }
}

/// The reply budget (see the module documentation).
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    started: Option<Instant>,
    sent: u32,
    macs: HashMap<[u8; 6], u32>,
}

impl Budget {
    /// A budget with `limits`.
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            started: None,
            sent: 0,
            macs: HashMap::new(),
        }
    }

    /// Takes one reply for `mac` at `now`: true when it may be sent.
    pub fn take(&mut self, mac: [u8; 6], now: Instant) -> bool {
        let fresh = self
            .started
            .is_none_or(|s| now.saturating_duration_since(s) >= self.limits.window);
        if fresh {
            self.started = Some(now);
            self.sent = 0;
            self.macs.clear();
        }
        if self.sent >= self.limits.total {
            return false;
        }
        let known = self.macs.contains_key(&mac);
        if !known && self.macs.len() >= self.limits.macs_max {
            return false;
        }
        let n = self.macs.entry(mac).or_insert(0);
        if *n >= self.limits.per_mac {
            return false;
        }
        *n += 1;
        self.sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            window: Duration::from_secs(10),
            per_mac: 3,
            total: 5,
            macs_max: 3,
        }
    }

    #[test]
    fn one_mac_gets_its_share_a_window_and_again_the_next() {
        let mut b = Budget::new(limits());
        let t0 = Instant::now();
        let m = [2, 0, 0, 0, 0, 1];
        assert_eq!((0..5).filter(|_| b.take(m, t0)).count(), 3);
        assert!(b.take(m, t0 + Duration::from_secs(10)));
    }

    #[test]
    fn the_total_and_the_mac_table_are_bounded() {
        let mut b = Budget::new(limits());
        let t0 = Instant::now();
        let mac = |i: u8| [2, 0, 0, 0, 0, i];
        assert!(b.take(mac(1), t0) && b.take(mac(2), t0) && b.take(mac(3), t0));
        // A fourth MAC finds the table full; known ones go on to the total.
        assert!(!b.take(mac(4), t0));
        assert!(b.take(mac(1), t0) && b.take(mac(2), t0));
        assert!(!b.take(mac(3), t0), "past the total");
        assert!(b.take(mac(4), t0 + Duration::from_secs(11)));
    }
}
