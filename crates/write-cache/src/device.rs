//! The decorator: `impl BlockDevice for WriteCache`, over the read, write, trim and
//! eviction paths of the other files. Reads merge the cache's blocks with runs read from
//! the device below; the `try_*` methods run inline on the NBD server's reactor and never
//! wait for a lock held across I/O.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use disk::device::{Geometry, LayerRun, Source, Submitted, check_bounds};
use disk::{BlockDevice, Error, Result};

use crate::cache::WriteCache;
use crate::config::Mode;
use crate::index::Place;
use crate::read::Holds;

impl BlockDevice for WriteCache {
    fn geometry(&self) -> Geometry {
        self.next.geometry()
    }

    fn format(&self) -> &'static str {
        "write-cache"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        // Runs of blocks the cache does not hold are read from below in one call each.
        let len = buf.len();
        let mut below: Option<std::ops::Range<usize>> = None;
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let b = at >> self.shift;
            // Below `block` (≤ 1 MiB).
            let o = (at & (self.block - 1)) as usize;
            let n = (self.block as usize - o).min(len - pos);
            let held = self.read_piece(b, o, &mut buf[pos..pos + n])?;
            match (&mut below, held) {
                (Some(run), false) => run.end = pos + n,
                (None, false) => below = Some(pos..pos + n),
                (Some(_), true) => {
                    let run = below.take().unwrap_or_default();
                    self.next
                        .read_at(&mut buf[run.clone()], offset + run.start as u64)?;
                }
                (None, true) => {}
            }
            pos += n;
        }
        if let Some(run) = below {
            self.next
                .read_at(&mut buf[run.clone()], offset + run.start as u64)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.pieces(offset, buf.len(), |b, o, range| {
            self.write_piece(b, o, &buf[range])
        })
    }

    fn flush(&self) -> Result<()> {
        self.check(0, 0)?;
        if self.mode != Mode::Disk {
            // RAM and RAM-with-overflow caches are discarded at restart: nothing to make
            // durable.
            return Ok(());
        }
        self.store().flush().map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "overflow flush failed: write cache poisoned");
            Error::io("flush overflow file", e)
        })
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.clear(offset, len, false)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.clear(offset, len, true)
    }

    fn can_write(&self) -> bool {
        true
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        check_bounds(self.size, offset, len)?;
        let mut runs: Vec<LayerRun> = Vec::new();
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let b = at >> self.shift;
            let n = ((b + 1) << self.shift).min(end) - at;
            let source = match self.index.get(b).map(|e| e.place) {
                None => Source::Parent,
                Some(Place::Zero) => Source::Zero,
                Some(_) => Source::Data,
            };
            match runs.last_mut() {
                Some(last) if last.source == source => last.len += n,
                _ => runs.push(LayerRun { len: n, source }),
            }
            at += n;
        }
        Ok(runs)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        Some(Arc::clone(&self.next))
    }

    fn allocated_bytes(&self) -> Result<u64> {
        let u = self.usage();
        Ok(u.ram_bytes + u.overflow_bytes)
    }

    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        Some(self)
    }
}

/// Reads and writes of blocks held in RAM complete in place; reads of blocks the cache does not hold are submitted below.
impl disk::FastPath for WriteCache {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        // Only when the cache holds every block: the others are read from the server.
        if self.holds(offset, buf.len()) != Holds::All {
            return None;
        }
        let len = buf.len();
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let b = at >> self.shift;
            // Below `block` (≤ 1 MiB).
            let o = (at & (self.block - 1)) as usize;
            let n = (self.block as usize - o).min(len - pos);
            // `None`: trimmed meanwhile, or the overflow file would wait for the disk; the
            // blocking path reads it all again.
            if let Err(e) = self.try_read_piece(b, o, &mut buf[pos..pos + n])? {
                return Some(Err(e));
            }
            pos += n;
        }
        Some(Ok(()))
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return None;
        }
        // This runs on the NBD server's reactor: it must never wait for a lock held across
        // I/O (insert locks are held during a read from the server), evict (overflow I/O),
        // read below, or spin for a slot. `None` must mean nothing was written.
        let b = offset >> self.shift;
        let o = (offset & (self.block - 1)) as usize;
        if o + buf.len() > self.block_len(b) {
            // Several blocks: only when all are in RAM, so every piece is an in-place copy
            // (a block evicted between this check and its copy costs one page-cache write).
            let mut in_ram = true;
            let _ = self.pieces(offset, buf.len(), |b, _, _| {
                in_ram &= matches!(self.index.get(b).map(|e| e.place), Some(Place::Ram(_)));
                Ok(())
            });
            return in_ram.then(|| self.write_at(buf, offset));
        }
        let cur = self.index.get(b);
        match cur.map(|e| e.place) {
            Some(Place::Ram(_)) => Some(self.write_piece(b, o, buf)),
            Some(Place::Zero) | None if self.mode == Mode::Disk => None,
            Some(Place::Zero) | None => {
                let whole = o == 0 && buf.len() == self.block_len(b);
                if cur.is_none() && !whole {
                    // A partial new block reads the rest of the block from the server.
                    return None;
                }
                let _insert = self.insert_lock(b).try_lock()?;
                if self.index.get(b) != cur {
                    return None;
                }
                let r = self.arena.alloc()?;
                self.filling.fetch_add(1, Ordering::AcqRel);
                match self.insert_into(r, b, o, buf, cur, true) {
                    Ok(true) => Some(Ok(())),
                    // The entry changed (a trim) after all: the slot was given back and
                    // nothing was written.
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            Some(Place::Disk(s)) => {
                if let Some(r) = self.try_write_in_place(b, s, o, buf, cur) {
                    return Some(r);
                }
                if self.mode == Mode::Disk {
                    return None;
                }
                // A whole-block rewrite of a block in the overflow file moves it back to a
                // free RAM slot: no read is needed, and freeing its overflow slot needs the
                // slot's stripe, taken only if no reader holds it.
                if o != 0 || buf.len() != self.block_len(b) {
                    return None;
                }
                let _insert = self.insert_lock(b).try_lock()?;
                if self.index.get(b) != cur {
                    return None;
                }
                let excl = self.stripe(s).try_write()?;
                let r = self.arena.alloc()?;
                self.filling.fetch_add(1, Ordering::AcqRel);
                match self.insert_into(r, b, o, buf, cur, false) {
                    Ok(true) => {
                        drop(excl);
                        self.disk.release(s);
                        Some(Ok(()))
                    }
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            }
        }
    }

    /// A read of blocks none of which the cache holds goes to the device below as it is,
    /// so a device below that submits reads (the target's remote vDisk) answers it without
    /// a blocking thread. A block written meanwhile is a concurrent write: either answer is
    /// right.
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        self.check(offset, len as u64).ok()?;
        if self.holds(offset, len) != Holds::None {
            return None;
        }
        self.next.submit_read(offset, len)
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
        None
    }
}
