//! The read paths: which blocks of a range the cache holds, and copying a block's bytes
//! out of RAM, zeros or the overflow store, blocking (`read_piece`) or only when nothing
//! would wait (`try_read_piece`, for the NBD server's reactor).

use disk::{Error, Result};

use crate::cache::WriteCache;
use crate::index::Place;

/// Which of a range's blocks the cache holds ([`WriteCache::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holds {
    /// Every one (a range of no blocks too).
    All,
    /// Some but not all.
    Some,
    /// None.
    None,
}

impl WriteCache {
    /// Whether the cache holds all, some or none of the blocks `[offset, offset+len)`
    /// touches.
    #[inline]
    pub(crate) fn holds(&self, offset: u64, len: usize) -> Holds {
        let (mut any, mut all) = (false, true);
        let _ = self.pieces(offset, len, |b, _, _| {
            let held = self.index.get(b).is_some();
            any |= held;
            all &= held;
            Ok(())
        });
        match (any, all) {
            (_, true) => Holds::All,
            (true, false) => Holds::Some,
            (false, false) => Holds::None,
        }
    }

    /// Copies block `b`'s bytes `[o, o+dst.len())` into `dst`; false when the cache does
    /// not hold the block (the caller reads the layer below).
    #[inline]
    pub(crate) fn read_piece(&self, b: u64, o: usize, dst: &mut [u8]) -> Result<bool> {
        loop {
            let Some(e) = self.index.get(b) else {
                return Ok(false);
            };
            match e.place {
                Place::Zero => {
                    dst.fill(0);
                    return Ok(true);
                }
                Place::Ram(r) => {
                    if !self.copy_from_slot(r, b, o, dst) {
                        continue;
                    }
                    return Ok(true);
                }
                Place::Disk(s) => {
                    let _shared = self.stripe(s).read();
                    if self.index.get(b) != Some(e) {
                        continue;
                    }
                    self.store_read(dst, (s << self.shift) + o as u64)?;
                    return Ok(true);
                }
            }
        }
    }

    /// Copies block `b`'s bytes from `o` out of RAM slot `r` into `dst`; false (nothing
    /// copied) when the slot no longer holds `b`.
    fn copy_from_slot(&self, r: u32, b: u64, o: usize, dst: &mut [u8]) -> bool {
        let g = self.arena.slot(r).read();
        // Under any lock of slot `r`, `r` belongs to `b` exactly when `b`'s entry names
        // `r`: both change together, under the slot's write lock.
        debug_assert_eq!(
            g.owner == b,
            self.index.get(b).map(|e| e.place) == Some(Place::Ram(r)),
            "owner {} of RAM slot {r} disagrees with block {b}'s entry",
            g.owner
        );
        if g.owner != b {
            return false;
        }
        dst.copy_from_slice(&g.data[o..o + dst.len()]);
        drop(g);
        self.clock.touch(r);
        true
    }

    /// [`Self::read_piece`] when it needs no lock held across I/O and no wait for a device;
    /// `None` otherwise (also when the cache does not hold the block).
    #[inline]
    pub(crate) fn try_read_piece(&self, b: u64, o: usize, dst: &mut [u8]) -> Option<Result<()>> {
        loop {
            let e = self.index.get(b)?;
            match e.place {
                Place::Zero => {
                    dst.fill(0);
                    return Some(Ok(()));
                }
                Place::Ram(r) => {
                    if !self.copy_from_slot(r, b, o, dst) {
                        continue;
                    }
                    return Some(Ok(()));
                }
                Place::Disk(s) => {
                    let _shared = self.stripe(s).try_read()?;
                    if self.index.get(b) != Some(e) {
                        continue;
                    }
                    let r = self
                        .store()
                        .try_read_at(dst, (s << self.shift) + o as u64)?;
                    return Some(r.map_err(|e| Error::io("read overflow file", e)));
                }
            }
        }
    }
}
