//! How every listener logs what it refuses, so that no client can flood the log: a per-client
//! budget of log lines per interval, an overall budget, and one summary per interval naming
//! each client whose lines were suppressed and how many. Pure: the caller passes `now` and
//! writes the lines (NBD option refusals, TFTP refusals).
//!
//! # Design notes
//!
//! Time is cut into fixed intervals shared by every client (the first refusal starts one).
//! Within an interval a client gets [`Limits::lines_per_client`] lines and all clients
//! together [`Limits::lines_total`]; every other refusal is counted as suppressed. The first
//! call at or after the interval's end closes it: it returns the interval's [`Summary`]s and
//! forgets every client, so the table holds only the clients of the current interval and
//! never more than [`Limits::clients_max`] (later ones share one "other clients" entry).
//! Summaries are bounded too: the [`SUMMARY_CLIENTS_MAX`] clients that lost the most lines
//! get a summary each, the rest one together.
//!
//! A summary is due only when the next call comes: a caller with a timer calls
//! [`RefusalLog::flush`] every interval so that the last burst's summary is not held back.
//! A per-client token bucket was not chosen: it would need a refill per client and a sweep
//! to forget idle ones, and it would report suppression only when that same client returns.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use contract::refusal_log::{Limits, RefusalLog};
//!
//! let mut log = RefusalLog::new(Limits { lines_per_client: 1, ..Limits::default() });
//! let t0 = Instant::now();
//! assert!(log.record("10.0.0.9", t0).log);
//! assert!(!log.record("10.0.0.9", t0).log);
//! let next = log.record("10.0.0.9", t0 + Limits::default().interval);
//! assert!(next.log);
//! assert_eq!(next.summaries[0].client, Some("10.0.0.9"));
//! assert_eq!(next.summaries[0].suppressed, 1);
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Default length of an interval: the period of summary lines.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// Default log lines about one client's refusals per interval.
pub const LINES_PER_CLIENT_DEFAULT: u32 = 5;
/// Default log lines about refusals per interval, all clients together.
pub const LINES_TOTAL_DEFAULT: u32 = 50;
/// Default clients tracked one by one in an interval; later ones are counted together.
pub const CLIENTS_MAX_DEFAULT: usize = 1024;
/// Clients named in the summaries of one interval (the ones that lost the most lines); the
/// rest are reported in one summary with `client: None`.
pub const SUMMARY_CLIENTS_MAX: usize = 8;

/// The budgets of a [`RefusalLog`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Length of an interval (at least 1 ms is used).
    pub interval: Duration,
    /// Lines about one client's refusals per interval.
    pub lines_per_client: u32,
    /// Lines per interval, all clients together.
    pub lines_total: u32,
    /// Clients tracked one by one per interval.
    pub clients_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            interval: INTERVAL_DEFAULT,
            lines_per_client: LINES_PER_CLIENT_DEFAULT,
            lines_total: LINES_TOTAL_DEFAULT,
            clients_max: CLIENTS_MAX_DEFAULT,
        }
    }
}

/// What one client (or, with `client: None`, several) was refused in an interval whose
/// lines were partly suppressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary<K> {
    /// The client; `None` for clients beyond the table or beyond [`SUMMARY_CLIENTS_MAX`].
    pub client: Option<K>,
    /// Refusals in the interval.
    pub refused: u64,
    /// Of those, how many were not logged.
    pub suppressed: u64,
}

/// The answer to [`RefusalLog::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Record<K> {
    /// Whether to write this refusal's line.
    pub log: bool,
    /// Summaries of the interval this call closed (write them first); usually empty.
    pub summaries: Vec<Summary<K>>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Count {
    refused: u64,
    logged: u32,
    suppressed: u64,
}

/// Per-client rate limit of refusal log lines; see the module documentation.
#[derive(Debug, Clone)]
pub struct RefusalLog<K> {
    limits: Limits,
    /// Start of the current interval; `None` before the first refusal.
    started: Option<Instant>,
    /// Lines written in the current interval, all clients.
    logged: u32,
    /// The current interval's clients (a `BTreeMap` so summaries come in a fixed order).
    clients: BTreeMap<K, Count>,
    /// Clients of the current interval that did not fit in `clients`, counted together.
    others: Count,
    /// Refusals and suppressed lines since creation, for metrics.
    totals: Totals,
}

/// Counts since a [`RefusalLog`] was made, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Refusals recorded.
    pub refused: u64,
    /// Lines not written.
    pub suppressed: u64,
}

impl<K: Ord + Clone> RefusalLog<K> {
    /// An empty log with these budgets.
    pub fn new(limits: Limits) -> RefusalLog<K> {
        RefusalLog {
            limits,
            started: None,
            logged: 0,
            clients: BTreeMap::new(),
            others: Count::default(),
            totals: Totals::default(),
        }
    }

    /// The budgets.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Counts since creation.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Records one refusal of `client` at `now`: whether to log it, and the summaries of the
    /// interval that ended before `now`, if one did.
    pub fn record(&mut self, client: K, now: Instant) -> Record<K> {
        let summaries = self.flush(now);
        if self.started.is_none() {
            self.started = Some(now);
        }
        self.totals.refused += 1;
        let count =
            if self.clients.len() < self.limits.clients_max || self.clients.contains_key(&client) {
                self.clients.entry(client).or_default()
            } else {
                &mut self.others
            };
        count.refused += 1;
        let log =
            count.logged < self.limits.lines_per_client && self.logged < self.limits.lines_total;
        if log {
            count.logged += 1;
            self.logged += 1;
        } else {
            count.suppressed += 1;
            self.totals.suppressed += 1;
        }
        Record { log, summaries }
    }

    /// Closes the current interval if it ended before `now`: its summaries (only clients
    /// with suppressed lines, the biggest first, at most [`SUMMARY_CLIENTS_MAX`] named).
    pub fn flush(&mut self, now: Instant) -> Vec<Summary<K>> {
        let interval = self.limits.interval.max(Duration::from_millis(1));
        match self.started {
            Some(s) if now.saturating_duration_since(s) >= interval => {}
            _ => return Vec::new(),
        }
        self.started = None;
        self.logged = 0;
        let mut lost: Vec<(K, Count)> = std::mem::take(&mut self.clients)
            .into_iter()
            .filter(|(_, c)| c.suppressed > 0)
            .collect();
        // Stable: equal counts keep the map's order.
        lost.sort_by_key(|(_, c)| std::cmp::Reverse(c.suppressed));
        let rest = lost.split_off(lost.len().min(SUMMARY_CLIENTS_MAX));
        let mut out: Vec<Summary<K>> = lost
            .into_iter()
            .map(|(k, c)| Summary {
                client: Some(k),
                refused: c.refused,
                suppressed: c.suppressed,
            })
            .collect();
        let others = std::mem::take(&mut self.others);
        let mut grouped = Summary {
            client: None,
            refused: others.refused,
            suppressed: others.suppressed,
        };
        for (_, c) in rest {
            grouped.refused += c.refused;
            grouped.suppressed += c.suppressed;
        }
        if grouped.suppressed > 0 {
            out.push(grouped);
        }
        debug_assert!(
            out.len() <= SUMMARY_CLIENTS_MAX + 1,
            "{} summaries in one interval",
            out.len()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn limits() -> Limits {
        Limits {
            interval: SECOND,
            lines_per_client: 2,
            lines_total: 5,
            clients_max: 3,
        }
    }

    fn logged(l: &mut RefusalLog<u32>, client: u32, n: usize, now: Instant) -> usize {
        (0..n).filter(|_| l.record(client, now).log).count()
    }

    #[test]
    fn one_client_gets_its_budget_then_one_summary() {
        let mut l = RefusalLog::new(limits());
        let t0 = Instant::now();
        // 20,000 refusals in one interval: two lines.
        assert_eq!(logged(&mut l, 7, 20_000, t0), 2);
        let r = l.record(7, t0 + SECOND);
        assert!(r.log);
        assert_eq!(
            r.summaries,
            [Summary {
                client: Some(7),
                refused: 20_000,
                suppressed: 19_998
            }]
        );
        assert_eq!(
            l.totals(),
            Totals {
                refused: 20_001,
                suppressed: 19_998
            }
        );
    }

    #[test]
    fn a_flooding_client_does_not_take_another_clients_lines() {
        let mut l = RefusalLog::new(limits());
        let t0 = Instant::now();
        assert_eq!(logged(&mut l, 1, 1000, t0), 2);
        assert_eq!(logged(&mut l, 2, 1, t0), 1);
    }

    #[test]
    fn the_total_budget_caps_many_clients() {
        let mut l = RefusalLog::new(limits());
        let t0 = Instant::now();
        let lines: usize = (0..10).map(|c| logged(&mut l, c, 2, t0)).sum();
        assert_eq!(lines, 5);
    }

    #[test]
    fn clients_beyond_the_table_share_one_summary() {
        let mut l = RefusalLog::new(Limits {
            lines_total: 100,
            ..limits()
        });
        let t0 = Instant::now();
        for c in 0..6 {
            let _ = logged(&mut l, c, 3, t0);
        }
        let s = l.flush(t0 + SECOND);
        // Clients 0..3 in the table, named; 3..6 counted together (3 refusals each), and
        // together they had one client's budget of 2 lines.
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].client, Some(0));
        assert_eq!(
            s[3],
            Summary {
                client: None,
                refused: 9,
                suppressed: 7
            }
        );
    }

    #[test]
    fn summaries_name_at_most_the_biggest_clients() {
        let mut l = RefusalLog::new(Limits {
            lines_per_client: 0,
            clients_max: 100,
            ..limits()
        });
        let t0 = Instant::now();
        for c in 0..20u32 {
            let _ = logged(&mut l, c, usize::try_from(c).unwrap() + 1, t0);
        }
        let s = l.flush(t0 + SECOND);
        assert_eq!(s.len(), SUMMARY_CLIENTS_MAX + 1);
        assert_eq!(s[0].client, Some(19));
        assert_eq!(s[0].suppressed, 20);
        // Clients 0..=11 (1..=12 refusals each) together.
        assert_eq!(s[SUMMARY_CLIENTS_MAX].client, None);
        assert_eq!(s[SUMMARY_CLIENTS_MAX].suppressed, (1..=12).sum::<u64>());
    }

    #[test]
    fn a_quiet_interval_has_no_summary_and_forgets_clients() {
        let mut l = RefusalLog::new(limits());
        let t0 = Instant::now();
        assert_eq!(logged(&mut l, 1, 2, t0), 2);
        assert!(l.flush(t0 + SECOND / 2).is_empty());
        assert!(l.flush(t0 + SECOND).is_empty());
        assert_eq!(logged(&mut l, 1, 2, t0 + SECOND), 2);
    }
}
