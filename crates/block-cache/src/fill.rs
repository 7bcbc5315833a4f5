//! Fills: reading claimed blocks from the store and publishing them.
//!
//! A fill gets a *run* of claimed consecutive blocks (see `flight.rs`) and one byte range
//! to read, and publishes every block of the run (or fails every claim with the store's
//! error, so waiters see it too). Three shapes:
//!
//! * one new block: read straight into the buffer its entry keeps;
//! * whole new blocks, groups on: one vectored read into a buffer per group, shared by the
//!   group's entries (`fill_groups`); a scan's run is one read into one huge buffer from
//!   the scan pool, shared by its groups (`fill_scan`), and the scan window then retires
//!   the scan's older groups (`scanned`, `rehome`);
//! * anything else (partial blocks, refills): one read into this thread's scratch buffer,
//!   copied into a right-sized buffer per block or merged into the block's old entry.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use disk::bytes::is_zero;
use disk::{Error, Result};

use crate::aligned::{AlignedBuf, BufPool};
use crate::entry::{Block, Cached, Data};
use crate::flight::{Claimed, Found};
use crate::shard::{Group, Key, Retired};
use crate::shared::{ChainHandle, Shared};

/// The largest scratch buffer a thread keeps between store reads (bigger runs allocate).
const SCRATCH_KEEP_BYTES: usize = 4 << 20;

thread_local! {
    /// Each thread's buffer for multi-block store reads, reused so a read-ahead window is
    /// not zero-filled and faulted in again every time.
    static SCRATCH: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl Shared {
    /// Claims the absent blocks after the run's last, up to `end` and at most `max` in all,
    /// stopping at the first block that is present.
    pub(crate) fn extend_run<'a>(
        &'a self,
        chain: &ChainHandle,
        run: &mut Vec<Claimed<'a>>,
        end: u64,
        max: u64,
    ) {
        let first = run[0].key.block;
        while (run.len() as u64) < max && first + (run.len() as u64) < end {
            let key = Key {
                chain: chain.id,
                block: first + run.len() as u64,
            };
            match self.claim(key, self.block_mask(chain, key.block)) {
                Found::Claimed(c) if c.old.is_none() => run.push(c),
                // A partial entry (refused by an all-pages need) is put back as it was.
                Found::Claimed(c) => {
                    let old = c.old.clone();
                    if let Some(old) = old {
                        self.publish(c, old, false);
                    }
                    break;
                }
                Found::Ready(..) | Found::Wait(_) => break,
            }
        }
    }

    /// Reads `[lo, hi)` (page-aligned, or ending at the device's end) from the store in one
    /// read, merges it into the claimed run's blocks (the first block's and the last block's
    /// entries may be partial), publishes each, and calls `each(block, entry)`.
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it, so waiters see it too.
    #[inline]
    pub(crate) fn fill(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        (lo, hi): (u64, u64),
        prefetched_from: u64,
        scan: bool,
        mut each: impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let first = run[0].key.block;
        let n = run.len() as u64;
        // Each entry below is made of the piece of [lo, hi) in its block: the run must be
        // consecutive blocks of the chain, with `lo` in the first and `hi` in the last.
        debug_assert!(
            run.iter().enumerate().all(|(i, c)| c.key
                == Key {
                    chain: chain.id,
                    block: first + i as u64,
                }),
            "a run is consecutive claimed blocks of its chain"
        );
        debug_assert!(
            lo < hi
                && lo / self.block_bytes == first
                && (hi - 1) / self.block_bytes == first + n - 1
                && hi <= chain.size,
            "a fill of blocks {first}+{n} reads {lo:#x}..{hi:#x}"
        );
        // At most RUN_BLOCKS_LIMIT x BLOCK_BYTES_MAX = 1 GiB, which fits a usize.
        let len = (hi - lo) as usize;
        if n == 1 && run[0].old.is_none() {
            // One block, new: read straight into the buffer the entry keeps.
            let mut buf = Block::zeroed(len, &self.counters);
            if let Err(e) = chain.inner.read_at(&mut buf.bytes, lo) {
                return Err(self.fail_run(run, lo, hi, e));
            }
            self.counters.store_reads.add(1);
            self.counters.store_read_bytes.add(len as u64);
            let base = first * self.block_bytes;
            let valid = self.piece_mask(base, lo, hi);
            let data = if is_zero(&buf.bytes) {
                Data::Zero
            } else {
                Data::bytes(buf, (lo - base) as u32)
            };
            let entry = Cached {
                data,
                valid,
                group: None,
            };
            each(first, &entry);
            for c in run {
                self.publish(c, entry.clone(), first >= prefetched_from);
            }
            return Ok(());
        }
        let whole = lo == first * self.block_bytes
            && hi == (first + n - 1) * self.block_bytes + self.block_len(chain, first + n - 1);
        if self.group_blocks > 1 && whole && run.iter().all(|c| c.old.is_none()) {
            return self.fill_groups(chain, run, prefetched_from, scan, &mut each);
        }
        // Several blocks (or a refill to merge): read into this thread's scratch buffer,
        // then copy each block's piece into its own right-sized buffer.
        let scratch = SCRATCH.with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.take()));
        let mut scratch = match scratch {
            Some(s) if s.len() >= len => s,
            _ => AlignedBuf::zeroed(len),
        };
        let r = chain.inner.read_at(&mut scratch[..len], lo);
        let out = match r {
            Err(e) => Err(self.fail_run(run, lo, hi, e)),
            Ok(()) => {
                self.counters.store_reads.add(1);
                self.counters.store_read_bytes.add(len as u64);
                self.publish_run(
                    chain,
                    run,
                    lo,
                    hi,
                    prefetched_from,
                    &scratch[..len],
                    &mut each,
                )
            }
        };
        if scratch.len() <= SCRATCH_KEEP_BYTES {
            SCRATCH.with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    *s = Some(scratch);
                }
            });
        }
        out
    }

    /// Fills a run of whole new blocks group by group: one store read for the whole run,
    /// into a buffer per group (one vectored read, so the device sees one request however
    /// many groups it spans), which the group's entries share (no copy, and a new buffer's
    /// pages are first touched by the read itself; a pooled one's are resident already).
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it.
    fn fill_groups(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        prefetched_from: u64,
        scan: bool,
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let (bs, g) = (self.block_bytes, self.group_blocks);
        let start = run[0].key.block;
        let end = start + run.len() as u64;
        if scan {
            chain.scan_end.fetch_max(end, Ordering::Relaxed);
        }
        if let Some(pool) = self
            .scan_pool
            .as_ref()
            .filter(|p| scan && (end - start) * bs <= p.buf_len() as u64)
        {
            return self.fill_scan(chain, run, prefetched_from, pool, each);
        }
        // (first block, end block, buffer) of each group's part of the run.
        let mut parts = Vec::new();
        let mut first = start;
        while first < end {
            let stop = ((first / g + 1) * g).min(end);
            let len = ((stop - 1 - first) * bs + self.block_len(chain, stop - 1)) as usize;
            let buf = match &self.pool {
                Some(pool) if pool.buf_len() == len => Block::pooled(pool, &self.counters),
                _ => Block::zeroed(len, &self.counters),
            };
            parts.push((first, stop, buf));
            first = stop;
        }
        let (lo, hi) = (start * bs, (end - 1) * bs + self.block_len(chain, end - 1));
        let read = {
            let mut bufs: Vec<&mut [u8]> = parts.iter_mut().map(|p| &mut *p.2.bytes).collect();
            chain.inner.read_vectored_at(&mut bufs, lo)
        };
        if let Err(e) = read {
            return Err(self.fail_run(run, lo, hi, e));
        }
        self.counters.store_reads.add(1);
        self.counters.store_read_bytes.add(hi - lo);
        let mut claims = run.into_iter();
        for (first, stop, buf) in parts {
            let part: Vec<Claimed<'_>> = claims.by_ref().take((stop - first) as usize).collect();
            let bytes = buf.bytes.len() as u64;
            let zero = is_zero(&buf.bytes);
            let id = buf.bytes.as_ptr() as usize;
            let buf = Arc::new(buf);
            let group = ((part.len() > 1 || scan) && !zero).then_some(Group {
                id,
                first,
                blocks: stop - first,
            });
            let src = (!zero).then_some((&buf, first));
            self.publish_group(chain, part, src, group, prefetched_from, each);
            if scan && !zero {
                let key = Key {
                    chain: chain.id,
                    block: first,
                };
                self.scanned(key, id, bytes);
            }
        }
        debug_assert!(
            claims.next().is_none(),
            "every claim of the run is published"
        );
        Ok(())
    }

    /// Publishes a fill's claimed whole blocks `part` with `group` and hands each to `each`:
    /// as entries sharing `src`'s buffer, whose bytes start with block `src.1`'s, or as `Zero`
    /// entries when `src` is `None` (the part read all zeros).
    fn publish_group(
        &self,
        chain: &ChainHandle,
        part: Vec<Claimed<'_>>,
        src: Option<(&Arc<Block>, u64)>,
        group: Option<Group>,
        prefetched_from: u64,
        each: &mut impl FnMut(u64, &Cached),
    ) {
        for c in part {
            let b = c.key.block;
            debug_assert!(
                group.is_none_or(|g| (g.first..g.first + g.blocks).contains(&b)),
                "block {b} published into group {group:?}, which it is not in"
            );
            let data = match src {
                None => Data::Zero,
                // Within a buffer of a few MiB: fits a u32.
                Some((buf, base)) => Data::Bytes {
                    block: Arc::clone(buf),
                    lo: 0,
                    start: ((b - base) * self.block_bytes) as u32,
                    len: self.block_len(chain, b) as u32,
                },
            };
            let entry = Cached {
                data,
                valid: self.block_mask(chain, b),
                group,
            };
            each(b, &entry);
            self.publish(c, entry, b >= prefetched_from);
        }
    }

    /// Fills a scan's run of whole new blocks (at most
    /// [`SCAN_FILL_BYTES`](crate::config::SCAN_FILL_BYTES)) with one store read into one
    /// huge buffer from the scan pool, which the run's groups share: the device gets the
    /// run as one request instead of one per MiB (see `aligned.rs`). Each group
    /// still leaves the cache on its own (`scanned`); the buffer goes back to the pool when
    /// the last one has, and a group read again before the window passes it is copied into
    /// a buffer of its own then, so a kept group never holds a whole huge buffer.
    ///
    /// # Errors
    /// The store read's error; every claim of the run fails with it.
    fn fill_scan(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        prefetched_from: u64,
        pool: &Arc<BufPool>,
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let (bs, g) = (self.block_bytes, self.group_blocks);
        let start = run[0].key.block;
        let end = start + run.len() as u64;
        let (lo, hi) = (start * bs, (end - 1) * bs + self.block_len(chain, end - 1));
        let mut buf = Block::pooled(pool, &self.counters);
        // The caller checked that the run fits the pool's buffers.
        if let Err(e) = chain
            .inner
            .read_at(&mut buf.bytes[..(hi - lo) as usize], lo)
        {
            return Err(self.fail_run(run, lo, hi, e));
        }
        self.counters.store_reads.add(1);
        self.counters.store_read_bytes.add(hi - lo);
        let base = buf.bytes.as_ptr() as usize;
        let buf = Arc::new(buf);
        let mut claims = run.into_iter();
        let mut first = start;
        while first < end {
            let stop = ((first / g + 1) * g).min(end);
            let part: Vec<Claimed<'_>> = claims.by_ref().take((stop - first) as usize).collect();
            // Within the buffer: below its length, which is a few MiB.
            let at = ((first - start) * bs) as usize;
            let len = ((stop - 1 - first) * bs + self.block_len(chain, stop - 1)) as usize;
            let zero = is_zero(&buf.bytes[at..at + len]);
            let group = (!zero).then_some(Group {
                id: base + at,
                first,
                blocks: stop - first,
            });
            let src = (!zero).then_some((&buf, start));
            self.publish_group(chain, part, src, group, prefetched_from, each);
            if !zero {
                let key = Key {
                    chain: chain.id,
                    block: first,
                };
                self.scanned(key, base + at, len as u64);
            }
            first = stop;
        }
        debug_assert!(
            claims.next().is_none(),
            "every claim of the run is published"
        );
        Ok(())
    }

    /// Records a group a scan filled (`key` one of its blocks, `id` the group's id) and
    /// retires the scan's groups past the window: evicted if no second read touched them,
    /// else copied out of the scan's shared buffer (`rehome`).
    fn scanned(&self, key: Key, id: usize, bytes: u64) {
        let mut old = Vec::new();
        {
            let mut w = self.scans.lock().unwrap_or_else(PoisonError::into_inner);
            w.groups.push_back((key, id, bytes));
            w.bytes += bytes;
            while w.bytes > self.scan_window_bytes {
                let Some(g) = w.groups.pop_front() else { break };
                w.bytes -= g.2;
                old.push(g);
            }
            debug_assert!(
                w.bytes <= self.scan_window_bytes
                    && w.bytes == w.groups.iter().map(|g| g.2).sum::<u64>(),
                "the scan window's bytes ({}) are its groups' and within {}",
                w.bytes,
                self.scan_window_bytes
            );
        }
        for (key, id, _) in old {
            let r = self
                .shard_of(key)
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .retire_scanned(key, id, |members| self.rehome(members));
            if let Retired::Evicted(n, _) = r {
                self.counters.scan_evictions.add(n);
                self.counters.evictions.add(n);
            }
        }
    }

    /// Copies a kept scan group's entries (`members`, in block order, sharing one buffer)
    /// into a buffer of their own: their new data and group. `None` (nothing to copy) when
    /// no member holds bytes, which a scan's group, all data, never is.
    fn rehome(&self, members: &[(u64, &Cached)]) -> Option<(Vec<Cached>, Group)> {
        let spans = members.iter().filter_map(|(_, c)| match &c.data {
            Data::Bytes {
                block, start, len, ..
            } => Some((block, *start as usize, (*start + *len) as usize)),
            Data::Zero => None,
        });
        let (mut src, mut lo, mut hi) = (None, usize::MAX, 0);
        for (block, s, e) in spans {
            src.get_or_insert(block);
            (lo, hi) = (lo.min(s), hi.max(e));
        }
        let copy = Block::copy_of(&src?.bytes[lo..hi], &self.counters);
        let first = members.first()?.0;
        let group = Group {
            id: copy.bytes.as_ptr() as usize,
            first,
            blocks: members.last()?.0 + 1 - first,
        };
        let copy = Arc::new(copy);
        let data: Vec<Cached> = members
            .iter()
            .map(|(_, c)| Cached {
                data: match &c.data {
                    Data::Bytes {
                        lo: l, start, len, ..
                    } => Data::Bytes {
                        block: Arc::clone(&copy),
                        lo: *l,
                        start: (*start as usize - lo) as u32,
                        len: *len,
                    },
                    Data::Zero => Data::Zero,
                },
                valid: c.valid,
                group: Some(group),
            })
            .collect();
        // The copy must read as what it replaces: same pages, same bytes.
        debug_assert!(
            members
                .iter()
                .zip(&data)
                .all(|((_, old), new)| old.valid == new.valid
                    && old.held_bytes() == new.held_bytes()),
            "a rehomed group reads as it did"
        );
        self.counters.scan_copies.add(1);
        Some((data, group))
    }

    /// Fails every claim of a run whose store read of `[lo, hi)` failed; returns the error.
    fn fail_run(&self, run: Vec<Claimed<'_>>, lo: u64, hi: u64, e: Error) -> Error {
        let msg = format!("store read of {lo:#x}..{hi:#x} failed: {e}");
        for c in run {
            c.fail(e.kind(), msg.clone());
        }
        e
    }

    /// Publishes the blocks of a run whose bytes `[lo, hi)` were read into `src_all`, each
    /// into its own right-sized buffer (or merged into its old entry).
    #[allow(clippy::too_many_arguments)]
    fn publish_run(
        &self,
        chain: &ChainHandle,
        run: Vec<Claimed<'_>>,
        lo: u64,
        hi: u64,
        prefetched_from: u64,
        src_all: &[u8],
        each: &mut impl FnMut(u64, &Cached),
    ) -> Result<()> {
        let first = run[0].key.block;
        for (i, mut c) in run.into_iter().enumerate() {
            let b = first + i as u64;
            let base = b * self.block_bytes;
            let (p_lo, p_hi) = (lo.max(base), hi.min(base + self.block_len(chain, b)));
            let piece_mask = self.piece_mask(base, p_lo, p_hi);
            let src = &src_all[(p_lo - lo) as usize..(p_hi - lo) as usize];
            let entry = match c.old.take() {
                None if is_zero(src) => Cached {
                    data: Data::Zero,
                    valid: piece_mask,
                    group: None,
                },
                None => Cached {
                    data: Data::bytes(Block::copy_of(src, &self.counters), (p_lo - base) as u32),
                    valid: piece_mask,
                    group: None,
                },
                Some(old) => self.merge(chain, b, old, src, p_lo - base, piece_mask),
            };
            each(b, &entry);
            self.publish(c, entry, b >= prefetched_from);
        }
        Ok(())
    }

    /// An entry holding `old`'s valid pages and `src` at byte `at` of block `b`.
    fn merge(
        &self,
        chain: &ChainHandle,
        b: u64,
        old: Cached,
        src: &[u8],
        at: u64,
        piece_mask: u64,
    ) -> Cached {
        let valid = old.valid | piece_mask;
        if matches!(old.data, Data::Zero) && is_zero(src) {
            return Cached {
                data: Data::Zero,
                valid,
                group: None,
            };
        }
        let first_page = u64::from(valid.trailing_zeros());
        let end_page = 64 - u64::from(valid.leading_zeros());
        let lo = first_page * self.page_bytes;
        let hi = (end_page * self.page_bytes).min(self.block_len(chain, b));
        let mut own = Block::zeroed((hi - lo) as usize, &self.counters);
        if let Data::Bytes {
            block,
            lo: old_lo,
            start,
            len,
        } = &old.data
        {
            let from = (u64::from(*old_lo) - lo) as usize;
            let (start, len) = (*start as usize, *len as usize);
            own.bytes[from..from + len].copy_from_slice(&block.bytes[start..start + len]);
        }
        let from = (at - lo) as usize;
        own.bytes[from..from + src.len()].copy_from_slice(src);
        Cached {
            data: Data::bytes(own, lo as u32),
            valid,
            group: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection_sees_a_late_nonzero_byte() {
        let mut b = vec![0u8; 4096];
        b[4095] = 1;
        assert!(!is_zero(&b));
    }
}
