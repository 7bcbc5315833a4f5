//! Demand reads through the cache and read-ahead prefetches: the walk over a request's
//! blocks that hands each ready entry to the caller, claims and fills what is missing
//! (`fill.rs`), and waits on fills in flight (`flight.rs`); and the read-ahead workers.
//!
//! The hit path is `try_read_shared` and the `Found::Ready` arm of `read_with`: a lookup
//! under a shard's read lock (see `shard.rs`), no allocation beyond the request's piece
//! list, and no store read.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Mutex, PoisonError};

use disk::Result;
use disk::device::Piece;

use crate::chain::scattered;
use crate::entry::{Cached, Data};
use crate::flight::Found;
use crate::shard::{Key, Lookup};
use crate::shared::{ChainHandle, Job, Shared};

impl Shared {
    /// A demand read through the cache (bounds already checked, `buf` not empty).
    #[inline]
    pub(crate) fn read(
        &self,
        chain: &ChainHandle,
        buf: &mut [u8],
        offset: u64,
        scan: bool,
    ) -> Result<()> {
        let bs = self.block_bytes;
        let end = offset + buf.len() as u64;
        self.read_with(chain, offset, end, scan, |blk, c| {
            copy_block(buf, offset, blk, bs, c)
        })
    }

    /// A demand read of `[offset, end)` as pieces of the cache's buffers (no copy of the
    /// bytes), filling what is missing first (bounds already checked, not empty).
    #[inline]
    pub(crate) fn read_shared(
        &self,
        chain: &ChainHandle,
        offset: u64,
        end: u64,
        scan: bool,
    ) -> Result<Vec<Piece>> {
        let bs = self.block_bytes;
        let mut pieces = Vec::with_capacity(((end - 1) / bs - offset / bs + 1) as usize);
        self.read_with(chain, offset, end, scan, |blk, c| {
            push_piece(&mut pieces, blk, bs, offset, end, c);
        })?;
        Ok(pieces)
    }

    /// The walk of a demand read of `[offset, end)`: hands each block's entry to `sink`, in
    /// block order, once it holds the pages the read needs (filling them first). `scan`:
    /// the read is part of a scan.
    #[inline]
    fn read_with(
        &self,
        chain: &ChainHandle,
        offset: u64,
        end: u64,
        scan: bool,
        mut sink: impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let bs = self.block_bytes;
        let last = (end - 1) / bs;
        let mut b = offset / bs;
        // The last lookup waited for a fill of block `b` (counted as a wait, not a hit).
        let mut waited = false;
        while b <= last {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let need = self.need_mask(b, offset, end);
            match self.find_or_claim(key, need) {
                Found::Ready(c, first_use) => {
                    if !std::mem::take(&mut waited) {
                        self.counters.hits.add(1);
                    }
                    if first_use {
                        chain.score.used.fetch_add(1, Ordering::Relaxed);
                        self.counters.read_ahead_used.add(1);
                    }
                    sink(b, &c);
                    b += 1;
                }
                Found::Wait(f) => {
                    self.counters.inflight_waits.add(1);
                    // Then look again: the entry is found ready (a prefetched one counted as
                    // used, so read-ahead that readers wait on is not judged wasted), or, if
                    // the fill was of other pages of the block, the rest is claimed.
                    f.wait()?;
                    waited = true;
                }
                Found::Claimed(c) => {
                    waited = false;
                    let have = c.old.as_ref().map_or(0, |o| o.valid);
                    // A second miss in a block, apart from the pages it holds, reads the
                    // rest of the block: the block is being read at scattered places.
                    let spread = scattered(have, need);
                    let fetch = if self.config.complete_blocks && chain.score.completes(spread) {
                        self.counters.completions.add(1);
                        self.block_mask(chain, b) & !have
                    } else {
                        need & !have
                    };
                    let mut run = vec![c];
                    if fetch == need & !have {
                        // A scan's miss reads on past the request (its next requests are
                        // already on their way): a large store read, as the kernel's
                        // read-ahead makes for a file read through the page cache.
                        let (until, max) = if scan && have == 0 {
                            (chain.blocks, self.scan_fill_blocks)
                        } else {
                            (last + 1, u64::from(self.config.fill_blocks_max))
                        };
                        self.extend_run(chain, &mut run, until, max);
                    }
                    let n = run.len() as u64;
                    let bl = b + n - 1;
                    let ahead = bl.saturating_sub(last);
                    self.counters.misses.add(n - ahead);
                    if ahead > 0 {
                        self.counters.read_ahead_blocks.add(ahead);
                        chain.score.issued.fetch_add(ahead, Ordering::Relaxed);
                    }
                    let lo = b * bs + u64::from(fetch.trailing_zeros()) * self.page_bytes;
                    let need_last = if n == 1 {
                        fetch
                    } else if bl > last {
                        self.block_mask(chain, bl)
                    } else {
                        self.need_mask(bl, offset, end)
                    };
                    let end_page = 64 - u64::from(need_last.leading_zeros());
                    let hi = (bl * bs + end_page * self.page_bytes)
                        .min(bl * bs + self.block_len(chain, bl));
                    // Blocks past the request are published as prefetched and not handed
                    // to the sink.
                    let mut sink_req = |blk: u64, c: &Cached| {
                        if blk <= last {
                            sink(blk, c);
                        }
                    };
                    self.fill(chain, run, (lo, hi), last + 1, scan, &mut sink_req)?;
                    b += n;
                }
            }
        }
        Ok(())
    }

    /// The pieces of `[offset, offset + len)` if every page is ready (hits counted), else
    /// `None`. Never waits, never reads the store, never copies block bytes.
    #[inline]
    pub(crate) fn try_read_shared(
        &self,
        chain: &ChainHandle,
        offset: u64,
        len: u64,
    ) -> Option<Vec<Piece>> {
        self.counters.probes.add(1);
        let bs = self.block_bytes;
        let end = offset + len;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let mut pieces = Vec::with_capacity((last - first + 1) as usize);
        for b in first..=last {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let found = self
                .shard_of(key)
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .lookup(key);
            let (Lookup::Ready(c, first_use) | Lookup::Refilling(c, first_use, _)) = found else {
                return None;
            };
            if !c.covers(self.need_mask(b, offset, end)) {
                return None;
            }
            if first_use {
                chain.score.used.fetch_add(1, Ordering::Relaxed);
                self.counters.read_ahead_used.add(1);
            }
            push_piece(&mut pieces, b, bs, offset, end, &c);
        }
        self.counters.hits.add(last - first + 1);
        Some(pieces)
    }

    /// Prefetches the absent blocks of `blocks` (a read-ahead job). Errors are counted and
    /// dropped: the demand read that needs the block retries and reports.
    #[inline]
    fn prefetch(&self, chain: &ChainHandle, blocks: Range<u64>) {
        let mut b = blocks.start.max(chain.scan_end.load(Ordering::Relaxed));
        while b < blocks.end {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let present = self
                .shard_of(key)
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(key);
            if present {
                b += 1;
                continue;
            }
            let c = match self.claim(key, 0) {
                Found::Claimed(c) if c.old.is_none() => c,
                Found::Claimed(c) => {
                    // Cannot happen with an empty need; put the entry back regardless.
                    if let Some(old) = c.old.clone() {
                        self.publish(c, old, false);
                    }
                    b += 1;
                    continue;
                }
                Found::Ready(..) | Found::Wait(_) => {
                    b += 1;
                    continue;
                }
            };
            let mut run = vec![c];
            let max = u64::from(self.config.fill_blocks_max);
            self.extend_run(chain, &mut run, blocks.end, max);
            let n = run.len() as u64;
            self.counters.read_ahead_blocks.add(n);
            chain.score.issued.fetch_add(n, Ordering::Relaxed);
            let lo = b * self.block_bytes;
            let hi = ((b + n) * self.block_bytes).min(chain.size);
            if let Err(e) = self.fill(chain, run, (lo, hi), 0, false, |_, _| {}) {
                self.counters.read_ahead_errors.add(1);
                tracing::debug!(chain = ?chain.key, block = b, error = %e, "read-ahead failed");
                return;
            }
            b += n;
        }
    }
}

/// Appends the part of block `blk` (of `bs` bytes) that overlaps `[offset, end)` to
/// `pieces`, as a piece of the entry's buffer (zeros merge with a zero piece before them).
fn push_piece(pieces: &mut Vec<Piece>, blk: u64, bs: u64, offset: u64, end: u64, c: &Cached) {
    let base = blk * bs;
    let (lo, hi) = (offset.max(base), end.min(base + bs));
    let n = (hi - lo) as usize;
    match &c.data {
        Data::Zero => match pieces.last_mut() {
            Some(Piece::Zero(z)) => *z += n,
            _ => pieces.push(Piece::Zero(n)),
        },
        Data::Bytes {
            block,
            lo: at,
            start,
            len,
        } => {
            // As in `Cached::copy_to`: a piece lies within the bytes the entry holds.
            debug_assert!(
                lo - base >= u64::from(*at) && hi - base <= u64::from(*at + *len),
                "piece {lo:#x}..{hi:#x} of block {blk} outside the entry's {at}+{len}"
            );
            pieces.push(Piece::Shared {
                buf: block.clone(),
                start: (lo - base) as usize - *at as usize + *start as usize,
                len: n,
            });
        }
    }
}

/// Copies the part of block `blk` (of `bs` bytes) that overlaps the request into `buf`.
#[inline]
fn copy_block(buf: &mut [u8], offset: u64, blk: u64, bs: u64, c: &Cached) {
    let block_start = blk * bs;
    let lo = block_start.max(offset);
    let hi = (block_start + bs).min(offset + buf.len() as u64);
    let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
    c.copy_to(dst, (lo - block_start) as usize);
}

/// A read-ahead worker: runs jobs from the queue until the cache drops its sender.
pub(crate) fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(job) => job.chain.shared.prefetch(&job.chain, job.blocks),
            Err(_) => return,
        }
    }
}
