//! Sequential-stream detection for read-ahead, one detector per wrapper (per connection).
//!
//! Pure: it sees block ranges and answers which blocks to prefetch. A stream is a run of
//! reads each starting within [`REORDER_BLOCKS`] of where the previous one ended (clients
//! with a queue depth above one complete slightly out of order). A stream earns read-ahead
//! once it spans [`EARN_BLOCKS`] blocks; its window starts at [`WINDOW_INITIAL_BLOCKS`] and
//! doubles each time it is refilled, up to the configured maximum, and it is refilled when
//! the blocks already requested ahead of the reader fall to half a window. At most
//! [`STREAMS_MAX`] streams are tracked; a read that continues none replaces the least
//! recently used, so a random reader costs a fixed few bytes and never prefetches.

use std::ops::Range;

/// Streams tracked per wrapper (a guest reading several files at once).
pub(crate) const STREAMS_MAX: usize = 8;
/// The first read-ahead of a stream, in blocks.
pub(crate) const WINDOW_INITIAL_BLOCKS: u64 = 2;
/// How far (in blocks) a read may start from a stream's last block and still continue it.
pub(crate) const REORDER_BLOCKS: u64 = 2;
/// Blocks a stream must span before it earns read-ahead. Boot reads come in short runs of
/// small reads; prefetching from the first block boundary on read 4.1× a boot trace's unique
/// bytes from the store (docs/BENCHMARKS.md), so only runs that look like a file being
/// streamed (256 KiB with the default 64 KiB blocks) get a window.
pub(crate) const EARN_BLOCKS: u64 = 4;

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    live: bool,
    /// First block of the stream.
    start: u64,
    /// Highest block read so far.
    last: u64,
    /// Blocks below this were already handed out for prefetch.
    issued_until: u64,
    /// The current window in blocks.
    window: u64,
    /// For LRU replacement.
    used_tick: u64,
}

/// The streams of one wrapper.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    slots: [Stream; STREAMS_MAX],
    tick: u64,
}

impl Streams {
    /// Records a read of blocks `first..=last` of a device of `blocks_total` blocks and
    /// returns the blocks to prefetch, if any. `window_max` of 0 turns read-ahead off.
    pub fn on_read(
        &mut self,
        first: u64,
        last: u64,
        blocks_total: u64,
        window_max: u64,
    ) -> Option<Range<u64>> {
        debug_assert!(first <= last && last < blocks_total);
        self.tick += 1;
        if window_max == 0 {
            return None;
        }
        let continues = |s: &Stream| {
            s.live && first + REORDER_BLOCKS >= s.last && first <= s.last + REORDER_BLOCKS
        };
        let Some(i) = self.slots.iter().position(continues) else {
            self.start_stream(first, last, window_max);
            return None;
        };
        let s = &mut self.slots[i];
        s.used_tick = self.tick;
        s.last = s.last.max(last);
        if s.last - s.start + 1 < EARN_BLOCKS {
            return None;
        }
        let from = s.issued_until.max(s.last + 1);
        if from - (s.last + 1) > s.window / 2 {
            return None;
        }
        let to = (s.last + 1 + s.window).min(blocks_total);
        s.window = (s.window * 2).min(window_max);
        if from >= to {
            return None;
        }
        s.issued_until = to;
        Some(from..to)
    }

    fn start_stream(&mut self, first: u64, last: u64, window_max: u64) {
        let lru = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| (s.live, s.used_tick))
            .map_or(0, |(i, _)| i);
        self.slots[lru] = Stream {
            live: true,
            start: first,
            last,
            issued_until: last + 1,
            window: WINDOW_INITIAL_BLOCKS.min(window_max),
            used_tick: self.tick,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of 1000 blocks, read-ahead of at most 16 blocks.
    const TOTAL: u64 = 1000;
    const MAX: u64 = 16;

    #[test]
    fn reads_inside_one_block_do_not_prefetch() {
        let mut s = Streams::default();
        s.on_read(5, 5, TOTAL, MAX);
        assert_eq!(s.on_read(5, 5, TOTAL, MAX), None);
    }

    #[test]
    fn a_run_of_earn_blocks_prefetches_the_initial_window() {
        let mut s = Streams::default();
        let short: Vec<_> = (5..8).map(|b| s.on_read(b, b, TOTAL, MAX)).collect();
        assert_eq!(short, vec![None, None, None]);
        assert_eq!(s.on_read(8, 8, TOTAL, MAX), Some(9..11));
    }

    #[test]
    fn window_grows_to_the_maximum_and_no_further() {
        let mut s = Streams::default();
        let leads: Vec<u64> = (0..100)
            .filter_map(|b| s.on_read(b, b, TOTAL, MAX).map(|r| r.end - (b + 1)))
            .collect();
        assert_eq!(leads[0], WINDOW_INITIAL_BLOCKS);
        assert_eq!(leads.iter().max(), Some(&MAX));
    }

    #[test]
    fn prefetched_ranges_never_overlap() {
        let mut s = Streams::default();
        let issued: Vec<_> = (0..200)
            .filter_map(|b| s.on_read(b, b, TOTAL, MAX))
            .collect();
        assert!(issued.windows(2).all(|w| w[0].end <= w[1].start));
    }

    #[test]
    fn random_reads_never_prefetch() {
        let mut s = Streams::default();
        let blocks = [500, 17, 900, 250, 3, 777, 42, 610, 120, 880];
        assert!(
            blocks
                .iter()
                .all(|&b| s.on_read(b, b, TOTAL, MAX).is_none())
        );
    }

    #[test]
    fn prefetch_stops_at_the_end_of_the_device() {
        let mut s = Streams::default();
        for b in 995..998 {
            s.on_read(b, b, TOTAL, MAX);
        }
        assert_eq!(s.on_read(998, 998, TOTAL, MAX), Some(999..1000));
    }

    #[test]
    fn two_interleaved_streams_are_both_detected() {
        let mut s = Streams::default();
        for k in 0..3 {
            s.on_read(10 + k, 10 + k, TOTAL, MAX);
            s.on_read(500 + k, 500 + k, TOTAL, MAX);
        }
        let a = s.on_read(13, 13, TOTAL, MAX);
        let b = s.on_read(503, 503, TOTAL, MAX);
        assert_eq!((a, b), (Some(14..16), Some(504..506)));
    }

    #[test]
    fn slightly_reordered_reads_continue_the_stream() {
        let mut s = Streams::default();
        s.on_read(10, 10, TOTAL, MAX);
        s.on_read(11, 11, TOTAL, MAX);
        let early = s.on_read(13, 13, TOTAL, MAX);
        let late = s.on_read(12, 12, TOTAL, MAX);
        assert_eq!((early, late), (Some(14..16), Some(16..18)));
    }

    #[test]
    fn zero_window_turns_read_ahead_off() {
        let mut s = Streams::default();
        s.on_read(1, 1, TOTAL, 0);
        assert_eq!(s.on_read(2, 2, TOTAL, 0), None);
    }
}
