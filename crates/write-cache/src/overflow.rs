//! The overflow path: I/O on overflow slots through the `OverflowStore`, the slot locks
//! (stripes) that keep a slot from being reused under a reader or writer, allocation and
//! freeing of slots, and what a failed overflow write means (ENOSPC or poison).

use std::sync::atomic::Ordering;

use disk::{Error, Result};
use parking_lot::RwLock;

use crate::cache::{STRIPES, WriteCache};
use crate::index::Entry;
use crate::store::OverflowStore;

impl WriteCache {
    /// The lock of overflow slot `s`.
    #[inline]
    pub(crate) fn stripe(&self, s: u64) -> &RwLock<()> {
        &self.stripes[(s % STRIPES as u64) as usize]
    }

    /// The overflow store (only modes that have one place blocks in overflow slots).
    #[inline]
    pub(crate) fn store(&self) -> &dyn OverflowStore {
        // `new` refuses RamOverflow and Disk without a store, and only they place blocks in
        // overflow slots.
        self.store
            .as_deref()
            .expect("overflow slots exist only in modes that have a store")
    }

    /// Writes `buf` to overflow slot bytes at `offset`. A full store is ENOSPC (the caller
    /// still holds the data); any other failure poisons the cache.
    pub(crate) fn store_write(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.store()
            .write_at(buf, offset)
            .map_err(|e| self.store_write_error(e))
    }

    /// What a failed overflow write means: ENOSPC when the store is full, else the cache is
    /// poisoned.
    fn store_write_error(&self, e: std::io::Error) -> Error {
        if is_full(&e) {
            self.enospc("overflow file", Some(e))
        } else {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "overflow write failed: write cache poisoned");
            Error::io("write overflow file", e)
        }
    }

    /// Reads overflow slot bytes at `offset` into `buf`.
    #[inline]
    pub(crate) fn store_read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.store()
            .read_at(buf, offset)
            .map_err(|e| Error::io("read overflow file", e))
    }

    /// A free overflow slot, or ENOSPC when the overflow budget is used up.
    pub(crate) fn disk_alloc(&self) -> Result<u64> {
        self.disk
            .alloc()
            .ok_or_else(|| self.enospc("overflow budget", None))
    }

    /// Frees overflow slot `s`, whose entry no longer names it.
    pub(crate) fn disk_free(&self, s: u64) {
        let _excl = self.stripe(s).write();
        self.disk.release(s);
    }

    /// Writes `src` into block `b`'s overflow slot `s` in place if the store can do it
    /// without waiting; `None` (nothing written) otherwise or when the entry is no longer
    /// `cur`.
    #[inline]
    pub(crate) fn try_write_in_place(
        &self,
        b: u64,
        s: u64,
        o: usize,
        src: &[u8],
        cur: Option<Entry>,
    ) -> Option<Result<()>> {
        let _shared = self.stripe(s).try_read()?;
        if self.index.get(b) != cur {
            return None;
        }
        let r = self
            .store()
            .try_write_at(src, (s << self.shift) + o as u64)?;
        Some(r.map_err(|e| self.store_write_error(e)))
    }
}

fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull
            | std::io::ErrorKind::QuotaExceeded
            | std::io::ErrorKind::FileTooLarge
    )
}
