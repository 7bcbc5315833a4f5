//! Warming: reading a byte range into the cache ahead of any reader, for a prefetcher that
//! knows what a boot will read (a version's boot set, see the `bootset` crate).
//!
//! A warm reads exactly the pages of the range that are not cached (as a demand read
//! would: partial blocks stay partial), in runs of up to `fill_blocks_max` blocks. A block
//! another reader (or warm) is filling is waited for and then looked at again, since that
//! fill may bring other pages of it than the warm's.
//! Entries are published as demand-read (not as read-ahead), so a warm neither feeds nor
//! spends the chain's read-ahead score, and the boot's first read of a warmed block
//! earns it its CLOCK bit.

use disk::Result;

use crate::flight::Found;
use crate::shard::Key;
use crate::shared::{ChainHandle, Shared};

impl Shared {
    /// Fills the pages of `[offset, end)` that are not cached (bounds checked, not empty);
    /// returns the bytes read from the store.
    ///
    /// # Errors
    /// The store's error; the claims of the failed run fail with it.
    pub(crate) fn warm(&self, chain: &ChainHandle, offset: u64, end: u64) -> Result<u64> {
        let bs = self.block_bytes;
        let last = (end - 1) / bs;
        let mut b = offset / bs;
        let mut read = 0;
        while b <= last {
            let key = Key {
                chain: chain.id,
                block: b,
            };
            let need = self.need_mask(b, offset, end);
            let c = match self.find_or_claim(key, need) {
                Found::Ready(..) => {
                    b += 1;
                    continue;
                }
                // Another fill of the block (a reader's, or another warm's of other pages):
                // wait for it, then look again for the pages it did not bring.
                Found::Wait(f) => {
                    if f.wait().is_err() {
                        b += 1;
                    }
                    continue;
                }
                Found::Claimed(c) => c,
            };
            let have = c.old.as_ref().map_or(0, |o| o.valid);
            let fetch = need & !have;
            let mut run = vec![c];
            if have == 0 {
                let max = u64::from(self.config.fill_blocks_max);
                self.extend_run(chain, &mut run, last + 1, max);
            }
            let n = run.len() as u64;
            let bl = b + n - 1;
            let need_last = if n == 1 {
                fetch
            } else {
                self.need_mask(bl, offset, end)
            };
            let lo = b * bs + u64::from(fetch.trailing_zeros()) * self.page_bytes;
            let end_page = 64 - u64::from(need_last.leading_zeros());
            let hi =
                (bl * bs + end_page * self.page_bytes).min(bl * bs + self.block_len(chain, bl));
            self.fill(chain, run, (lo, hi), u64::MAX, false, |_, _| {})?;
            self.counters.warm_bytes.add(hi - lo);
            read += hi - lo;
            b += n;
        }
        Ok(read)
    }
}
