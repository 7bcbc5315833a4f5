//! Sequential-stream detection for read-ahead, one detector per wrapper (per connection).
//!
//! Pure: it sees byte ranges and answers which blocks to prefetch. A stream is a run of
//! reads each starting within [`REORDER_REQUESTS`] request lengths of where the stream
//! ended (clients with a queue depth above one complete slightly out of order), so a file
//! read front to back is one stream and the next file a few KiB further on is another. A
//! stream earns read-ahead once it spans [`EARN_BYTES`]; its window starts at [`WINDOW_INITIAL_BLOCKS`] and
//! doubles each time it is refilled, up to the configured maximum, and it is refilled when
//! the blocks already requested ahead of the reader fall to half a window. At most
//! [`STREAMS_MAX`] streams are tracked; a read that continues none replaces the least
//! recently used, so a random reader costs a fixed few bytes and never prefetches.

use std::ops::Range;

/// Streams tracked per wrapper (a guest reading several files at once).
pub(crate) const STREAMS_MAX: usize = 8;
/// The first read-ahead of a stream, in blocks.
pub(crate) const WINDOW_INITIAL_BLOCKS: u64 = 2;
/// How many request lengths a read may start before or after where its stream ended and
/// still continue it: a client with several requests in flight completes them slightly out
/// of order, and they reach the detector out of order too.
pub(crate) const REORDER_REQUESTS: u64 = 16;
/// Bytes a stream must span before it earns read-ahead. Boot reads come in short runs of
/// small reads; prefetching from the first block boundary on read several times a boot
/// trace's unique bytes from the store (the design notes in lib.rs and docs/BENCHMARKS.md
/// give the figures), so only runs that look like a file being streamed get a window.
pub(crate) const EARN_BYTES: u64 = 256 << 10;

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    live: bool,
    /// First byte of the stream.
    start: u64,
    /// End of the furthest read so far.
    next: u64,
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
    /// Bytes spanned by the stream the last read belonged to (its own length when it
    /// started a new one).
    last_span: u64,
}

impl Streams {
    /// Records a read of `[offset, offset + len)` (`len > 0`) of a device of `blocks_total`
    /// blocks of `block_bytes`, and returns the blocks to prefetch, if any. `window_max` of
    /// 0 turns read-ahead off.
    pub fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        block_bytes: u64,
        blocks_total: u64,
        window_max: u64,
    ) -> Option<Range<u64>> {
        debug_assert!(len > 0);
        self.tick += 1;
        let end = offset + len;
        let slack = len.saturating_mul(REORDER_REQUESTS);
        let continues = |s: &Stream| {
            s.live && offset.saturating_add(slack) >= s.next && offset <= s.next + slack
        };
        let Some(i) = self.slots.iter().position(continues) else {
            self.start_stream(offset, end, block_bytes, window_max);
            self.last_span = len;
            return None;
        };
        let s = &mut self.slots[i];
        s.used_tick = self.tick;
        s.next = s.next.max(end);
        s.start = s.start.min(offset);
        self.last_span = s.next - s.start;
        if window_max == 0 || s.next - s.start < EARN_BYTES {
            return None;
        }
        let last = (s.next - 1) / block_bytes;
        let from = s.issued_until.max(last + 1);
        if from - (last + 1) > s.window / 2 {
            return None;
        }
        let to = (last + 1 + s.window).min(blocks_total);
        s.window = (s.window * 2).min(window_max);
        if from >= to {
            return None;
        }
        s.issued_until = to;
        Some(from..to)
    }

    /// Bytes spanned by the stream the last [`Streams::on_read`] belonged to: how long a
    /// scan has been going on.
    pub fn last_span(&self) -> u64 {
        self.last_span
    }

    fn start_stream(&mut self, offset: u64, end: u64, block_bytes: u64, window_max: u64) {
        let lru = self
            .slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| (s.live, s.used_tick))
            .map_or(0, |(i, _)| i);
        self.slots[lru] = Stream {
            live: true,
            start: offset,
            next: end,
            issued_until: (end - 1) / block_bytes + 1,
            window: WINDOW_INITIAL_BLOCKS.min(window_max),
            used_tick: self.tick,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64 KiB blocks; a device of 1000 blocks; read-ahead of at most 16 blocks.
    const BS: u64 = 64 << 10;
    const TOTAL: u64 = 1000;
    const MAX: u64 = 16;

    /// A read of whole blocks `first..=last`.
    fn blocks(s: &mut Streams, first: u64, last: u64) -> Option<Range<u64>> {
        s.on_read(first * BS, (last - first + 1) * BS, BS, TOTAL, MAX)
    }

    #[test]
    fn reads_inside_one_block_do_not_prefetch() {
        let mut s = Streams::default();
        blocks(&mut s, 5, 5);
        assert_eq!(blocks(&mut s, 5, 5), None);
    }

    #[test]
    fn a_stream_spanning_earn_bytes_prefetches_the_initial_window() {
        let mut s = Streams::default();
        let short: Vec<_> = (5..8).map(|b| blocks(&mut s, b, b)).collect();
        assert_eq!(short, vec![None, None, None]);
        assert_eq!(blocks(&mut s, 8, 8), Some(9..11));
    }

    #[test]
    fn small_contiguous_reads_earn_read_ahead_only_after_earn_bytes() {
        let mut s = Streams::default();
        let page = 4096;
        let n = EARN_BYTES / page;
        let got: Vec<_> = (0..n)
            .map(|i| s.on_read(i * page, page, BS, TOTAL, MAX))
            .collect();
        assert!(got[..got.len() - 1].iter().all(Option::is_none));
        assert_eq!(got.last().cloned().flatten(), Some(4..6));
    }

    #[test]
    fn a_gap_wider_than_the_reorder_slack_starts_a_new_stream() {
        let mut s = Streams::default();
        let page = 4096;
        // Three short "files" 100 KiB apart: never one stream, never read-ahead.
        let mut at = 0;
        for _ in 0..40 {
            for _ in 0..4 {
                assert_eq!(s.on_read(at, page, BS, TOTAL, MAX), None);
                at += page;
            }
            at += 100 << 10;
        }
    }

    #[test]
    fn window_grows_to_the_maximum_and_no_further() {
        let mut s = Streams::default();
        let leads: Vec<u64> = (0..100)
            .filter_map(|b| blocks(&mut s, b, b).map(|r| r.end - (b + 1)))
            .collect();
        assert_eq!(leads[0], WINDOW_INITIAL_BLOCKS);
        assert_eq!(leads.iter().max(), Some(&MAX));
    }

    #[test]
    fn prefetched_ranges_never_overlap() {
        let mut s = Streams::default();
        let issued: Vec<_> = (0..200).filter_map(|b| blocks(&mut s, b, b)).collect();
        assert!(issued.windows(2).all(|w| w[0].end <= w[1].start));
    }

    #[test]
    fn random_reads_never_prefetch() {
        let mut s = Streams::default();
        let pages = [
            50_000, 1_700, 90_000, 25_000, 300, 77_700, 4_200, 61_000, 12_000, 88_000,
        ];
        assert!(
            pages
                .iter()
                .all(|&p| s.on_read(p * 4096, 4096, BS, TOTAL, MAX).is_none())
        );
    }

    #[test]
    fn prefetch_stops_at_the_end_of_the_device() {
        let mut s = Streams::default();
        for b in 995..998 {
            blocks(&mut s, b, b);
        }
        assert_eq!(blocks(&mut s, 998, 998), Some(999..1000));
    }

    #[test]
    fn two_interleaved_streams_are_both_detected() {
        let mut s = Streams::default();
        for k in 0..3 {
            blocks(&mut s, 10 + k, 10 + k);
            blocks(&mut s, 500 + k, 500 + k);
        }
        let a = blocks(&mut s, 13, 13);
        let b = blocks(&mut s, 503, 503);
        assert_eq!((a, b), (Some(14..16), Some(504..506)));
    }

    #[test]
    fn slightly_reordered_reads_continue_the_stream() {
        let mut s = Streams::default();
        blocks(&mut s, 10, 10);
        blocks(&mut s, 11, 11);
        let early = blocks(&mut s, 13, 13);
        let late = blocks(&mut s, 12, 12);
        assert_eq!((early, late), (Some(14..16), Some(16..18)));
    }

    #[test]
    fn the_span_of_the_last_reads_stream_grows_with_the_stream_and_resets_on_a_jump() {
        let mut s = Streams::default();
        for b in 0..10 {
            blocks(&mut s, b, b);
            assert_eq!(s.last_span(), (b + 1) * BS);
        }
        // Read-ahead off: streams are still followed.
        s.on_read(10 * BS, BS, BS, TOTAL, 0);
        assert_eq!(s.last_span(), 11 * BS);
        blocks(&mut s, 500, 500);
        assert_eq!(s.last_span(), BS);
        blocks(&mut s, 11, 11);
        assert_eq!(s.last_span(), 12 * BS);
    }

    #[test]
    fn zero_window_turns_read_ahead_off() {
        let mut s = Streams::default();
        s.on_read(BS, BS, BS, TOTAL, 0);
        assert_eq!(s.on_read(2 * BS, BS, BS, TOTAL, 0), None);
    }
}
