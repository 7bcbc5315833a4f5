//! The boot clock: when did this machine finish booting? A pure state machine over the
//! instants it is given (STYLE.md §5), driven by the agent's sampler tick and control socket.
//!
//! # Design notes
//!
//! A boot is a burst of reads (boot loader, kernel, then the system's files) followed by a
//! machine that mostly works from what it has read and from its write cache. The clock runs
//! from attach and ends at the first of:
//!
//! - **`mark-booted`** ([`BootClock::mark`]): the machine says so (e.g. a systemd unit after
//!   `multi-user.target`); ends at the call.
//! - **`--boot-bytes`** ([`BootClock::bytes_reached`]): that many bytes were read; ends at
//!   the read that crossed it.
//! - **The read burst is over** ([`BootClock::tick`]): at least [`BOOT_READS_MIN`] reads were
//!   seen and then none for the quiet period ([`BOOT_QUIET`] unless configured); ends at the
//!   *last read* of the burst, not when the silence was noticed.
//!
//! Whatever ends it first wins; later calls change nothing and get the recorded end back.
//!
//! Reads are observed by the sampler tick (every second), not on the read path: the tick
//! compares the read counter with the one it saw before, and remembers the tick at which it
//! last grew. So "the last read" is known to one tick: the boot time is the instant of the
//! first tick after the last read (at most one sample period late). Taking a timestamp on
//! every read would make it exact but adds a clock call to a path that runs 100 000+ times
//! a second, for a number people read in seconds.
//!
//! [`BOOT_READS_MIN`] keeps probes from ending the clock: the partition-table reads of a
//! kernel `nbd-client` attach, `blkid`, or an `nbdinfo` are tens of reads, while a boot reads
//! thousands. A machine that attaches and then waits (no reads yet, or a probe alone) keeps
//! booting until its burst comes. A boot that stops reading for longer than the quiet
//! period (a long wait for the network, say) ends at that pause: set a longer quiet period,
//! or none (then only `mark-booted` and `--boot-bytes` end it).

use std::time::{Duration, Instant};

/// How long no read must come before the first read burst counts as over.
pub const BOOT_QUIET: Duration = Duration::from_secs(10);
/// The fewest reads a burst must have to be the boot (probes read far fewer).
pub const BOOT_READS_MIN: u64 = 256;

/// How a boot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootEnd {
    /// `ferry target mark-booted`.
    Marked,
    /// `--boot-bytes` were read.
    BootBytes,
    /// The first read burst ended: no read came for the quiet period.
    ReadBurstOver,
}

impl BootEnd {
    /// How people read it (`ferry target status`).
    pub fn describe(self) -> &'static str {
        match self {
            BootEnd::Marked => "marked booted",
            BootEnd::BootBytes => "--boot-bytes read",
            BootEnd::ReadBurstOver => "read burst over",
        }
    }
}

/// The end of a boot: how long it took from attach, and what ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booted {
    /// From attach to the end.
    pub time: Duration,
    /// What ended it.
    pub by: BootEnd,
}

/// The boot clock's state (see the module documentation).
#[derive(Debug, Clone)]
pub struct BootClock {
    /// When the vDisk was attached: the clock's zero.
    attached: Instant,
    /// No read for this long ends the first burst; `None`: the burst never ends the boot.
    quiet: Option<Duration>,
    /// The read counter as the last tick saw it.
    reads_seen: u64,
    /// The tick at which the read counter last grew.
    last_read_at: Option<Instant>,
    /// The end, once there is one.
    booted: Option<Booted>,
}

impl BootClock {
    /// A clock started at `attached`; `quiet` is the read burst's quiet period (`None`: the
    /// burst does not end the boot).
    pub fn new(attached: Instant, quiet: Option<Duration>) -> BootClock {
        BootClock {
            attached,
            quiet,
            reads_seen: 0,
            last_read_at: None,
            booted: None,
        }
    }

    /// The end, once booted.
    pub fn booted(&self) -> Option<Booted> {
        self.booted
    }

    /// The sampler's tick at `now`, with `reads` read requests so far. Returns the end when
    /// this tick ended the boot.
    pub fn tick(&mut self, now: Instant, reads: u64) -> Option<Booted> {
        if self.booted.is_some() {
            return None;
        }
        if reads > self.reads_seen {
            self.reads_seen = reads;
            self.last_read_at = Some(now);
            return None;
        }
        let quiet = self.quiet?;
        let last = self.last_read_at?;
        if self.reads_seen < BOOT_READS_MIN || now.saturating_duration_since(last) < quiet {
            return None;
        }
        Some(self.end(last, BootEnd::ReadBurstOver))
    }

    /// `mark-booted` at `now`: ends the boot unless it already ended. Returns the end.
    pub fn mark(&mut self, now: Instant) -> Booted {
        self.end(now, BootEnd::Marked)
    }

    /// `--boot-bytes` were reached at `now`: ends the boot unless it already ended.
    pub fn bytes_reached(&mut self, now: Instant) -> Booted {
        self.end(now, BootEnd::BootBytes)
    }

    fn end(&mut self, at: Instant, by: BootEnd) -> Booted {
        *self.booted.get_or_insert(Booted {
            time: at.saturating_duration_since(self.attached),
            by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A clock attached at `t0` with the default quiet period.
    fn clock(t0: Instant) -> BootClock {
        BootClock::new(t0, Some(BOOT_QUIET))
    }

    #[test]
    fn burst_ends_at_its_last_read_after_the_quiet_period() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + S, 100);
        c.tick(t0 + 2 * S, BOOT_READS_MIN + 10);
        // Ten quiet seconds after the last read was seen (at 2 s): over, at 2 s.
        let end = c.tick(t0 + 12 * S, BOOT_READS_MIN + 10);
        assert_eq!(
            end,
            Some(Booted {
                time: 2 * S,
                by: BootEnd::ReadBurstOver
            })
        );
    }

    #[test]
    fn burst_is_not_over_before_the_quiet_period() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + S, BOOT_READS_MIN);
        // 9.9 s of quiet is short of the 10 s period.
        c.tick(
            t0 + S + BOOT_QUIET - Duration::from_millis(100),
            BOOT_READS_MIN,
        );
        assert_eq!(c.booted(), None);
    }

    #[test]
    fn a_probe_of_few_reads_does_not_end_the_boot() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        // A partition-table probe: a few reads, then a minute of nothing.
        c.tick(t0 + S, 12);
        c.tick(t0 + 60 * S, 12);
        assert_eq!(c.booted(), None);
    }

    #[test]
    fn the_boot_after_a_probe_ends_at_its_own_last_read() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + S, 12);
        c.tick(t0 + 60 * S, 12);
        c.tick(t0 + 61 * S, 12 + BOOT_READS_MIN);
        let end = c.tick(t0 + 71 * S, 12 + BOOT_READS_MIN);
        assert_eq!(end.map(|b| b.time), Some(61 * S));
    }

    #[test]
    fn no_reads_at_all_keep_it_booting() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + 3600 * S, 0);
        assert_eq!(c.booted(), None);
    }

    #[test]
    fn mark_before_the_burst_is_over_wins() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + S, BOOT_READS_MIN);
        c.mark(t0 + 5 * S);
        c.tick(t0 + 20 * S, BOOT_READS_MIN);
        assert_eq!(
            c.booted(),
            Some(Booted {
                time: 5 * S,
                by: BootEnd::Marked
            })
        );
    }

    #[test]
    fn mark_after_the_burst_is_over_returns_that_end() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.tick(t0 + S, BOOT_READS_MIN);
        c.tick(t0 + 11 * S, BOOT_READS_MIN);
        let end = c.mark(t0 + 30 * S);
        assert_eq!(end.by, BootEnd::ReadBurstOver);
    }

    #[test]
    fn a_second_mark_keeps_the_first() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.mark(t0 + 3 * S);
        assert_eq!(c.mark(t0 + 9 * S).time, 3 * S);
    }

    #[test]
    fn without_a_quiet_period_the_burst_never_ends_it() {
        let t0 = Instant::now();
        let mut c = BootClock::new(t0, None);
        c.tick(t0 + S, 10 * BOOT_READS_MIN);
        c.tick(t0 + 3600 * S, 10 * BOOT_READS_MIN);
        assert_eq!(c.booted(), None);
    }

    #[test]
    fn boot_bytes_end_it_at_that_read() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        let end = c.bytes_reached(t0 + 4 * S);
        assert_eq!(end.by, BootEnd::BootBytes);
        assert_eq!(end.time, 4 * S);
    }
}
