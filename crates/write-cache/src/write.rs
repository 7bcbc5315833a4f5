//! The write paths: a write to a block in RAM or (in place) in the overflow store, an
//! insert of a block the cache does not hold (into a new RAM slot, or a new overflow slot
//! in `Disk` mode, filling the rest of a partial block from where its bytes are), and
//! trims and write-zeroes, which free a block's storage.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use disk::Result;
use parking_lot::Mutex;

use crate::arena::FREE;
use crate::cache::{STRIPES, WriteCache};
use crate::config::Mode;
use crate::index::{Entry, Place};

/// Whether a write to a block in the overflow file moves it back to RAM (evicting another)
/// rather than updating it in place. In place: one `pwrite` and no eviction, where moving
/// back costs the victim's `pwrite` plus, for a partial write, a `pread`; CLOCK already
/// keeps rewritten (hot) blocks in RAM, so a block in the file was cold when it left. The
/// two measured alike within the noise of a shared machine (docs/target.md).
const PROMOTE_ON_WRITE: bool = false;

thread_local! {
    /// A block-sized buffer per thread for disk-mode read-modify-write (no allocation per
    /// write once a thread has one).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl WriteCache {
    /// The insert lock of block `b` (see `write_piece`).
    #[inline]
    pub(crate) fn insert_lock(&self, b: u64) -> &Mutex<()> {
        let h = b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        // h < 2^10 = STRIPES.
        &self.inserts[h as usize % STRIPES]
    }

    /// Writes `src` into block `b` at byte `o`, wherever the block is (inserting it when
    /// the cache does not hold it).
    pub(crate) fn write_piece(&self, b: u64, o: usize, src: &[u8]) -> Result<()> {
        loop {
            let cur = self.index.get(b);
            let done = match cur.map(|e| e.place) {
                Some(Place::Ram(r)) => {
                    let mut g = self.arena.slot(r).write();
                    // As in `copy_from_slot`: the owner and the entry agree under the lock.
                    debug_assert_eq!(
                        g.owner == b,
                        self.index.get(b).map(|e| e.place) == Some(Place::Ram(r)),
                        "owner {} of RAM slot {r} disagrees with block {b}'s entry",
                        g.owner
                    );
                    if g.owner != b {
                        continue;
                    }
                    crate::copy::copy_into_slot(&mut g.data[o..o + src.len()], src);
                    drop(g);
                    self.clock.touch(r);
                    true
                }
                Some(Place::Disk(s)) if self.mode == Mode::Disk || !PROMOTE_ON_WRITE => {
                    let _shared = self.stripe(s).read();
                    if self.index.get(b) != cur {
                        continue;
                    }
                    self.store_write(src, (s << self.shift) + o as u64)?;
                    true
                }
                _ => {
                    // One insert per block at a time: a second writer of the same new block
                    // waits, then writes in place, instead of filling a slot it would lose.
                    let _insert = self.insert_lock(b).lock();
                    if self.index.get(b) != cur {
                        continue;
                    }
                    if self.mode == Mode::Disk {
                        self.insert_disk(b, o, src, cur)?
                    } else {
                        self.insert_ram(b, o, src, cur)?
                    }
                }
            };
            if done {
                return Ok(());
            }
        }
    }

    /// Fills `dst` (block `b`'s bytes) from where `cur` says they are. False when `cur`
    /// changed under a read of the overflow slot.
    fn fill_base(&self, b: u64, cur: Option<Entry>, dst: &mut [u8]) -> Result<bool> {
        self.counters.rmw.fetch_add(1, Ordering::Relaxed);
        match cur.map(|e| e.place) {
            None => self.next.read_at(dst, b << self.shift)?,
            Some(Place::Zero) => dst.fill(0),
            Some(Place::Disk(s)) => {
                let _shared = self.stripe(s).read();
                if self.index.get(b) != cur {
                    return Ok(false);
                }
                self.store_read(dst, s << self.shift)?;
            }
            Some(Place::Ram(_)) => unreachable!("a RAM block is written in place, not refilled"),
        }
        Ok(true)
    }

    /// Writes into a new RAM slot and publishes it in place of `cur` (absent, zero or an
    /// overflow slot). False when `cur` changed meanwhile (the caller retries).
    fn insert_ram(&self, b: u64, o: usize, src: &[u8], cur: Option<Entry>) -> Result<bool> {
        let r = self.ram_alloc()?;
        self.insert_into(r, b, o, src, cur, true)
    }

    /// [`Self::insert_ram`] with slot `r` already taken (and counted in `filling`). When
    /// `cur` is an overflow slot, `free_disk` frees it after the publish (false: the caller
    /// holds its stripe exclusively and frees it).
    pub(crate) fn insert_into(
        &self,
        r: u32,
        b: u64,
        o: usize,
        src: &[u8],
        cur: Option<Entry>,
        free_disk: bool,
    ) -> Result<bool> {
        let mut g = self.arena.slot(r).write();
        debug_assert_eq!(g.owner, FREE, "a slot handed out is free");
        let blen = self.block_len(b);
        let full = o == 0 && src.len() == blen;
        let based = if full {
            Ok(true)
        } else {
            self.fill_base(b, cur, &mut g.data[..blen])
        };
        if !matches!(based, Ok(true)) {
            drop(g);
            self.arena.release(r);
            self.filled();
            return based;
        }
        crate::copy::copy_into_slot(&mut g.data[o..o + src.len()], src);
        g.owner = b;
        let new = self.index.entry(Place::Ram(r));
        if !self.index.replace(b, cur, Some(new)) {
            g.owner = FREE;
            drop(g);
            self.arena.release(r);
            self.filled();
            return Ok(false);
        }
        // Published: the entry names `r`, and only a holder of `r`'s write lock (us, until
        // the drop) can change that.
        debug_assert_eq!(
            self.index.get(b),
            Some(new),
            "block {b} published in slot {r}"
        );
        drop(g);
        self.filled();
        self.clock.touch(r);
        if let Some(Place::Disk(s)) = cur.map(|e| e.place) {
            self.counters.promotions.fetch_add(1, Ordering::Relaxed);
            if free_disk {
                self.disk_free(s);
            }
        }
        Ok(true)
    }

    /// Disk mode: writes block `b` whole into a new overflow slot and publishes it in place
    /// of `cur` (absent or zero).
    fn insert_disk(&self, b: u64, o: usize, src: &[u8], cur: Option<Entry>) -> Result<bool> {
        let s = self.disk_alloc()?;
        let blen = self.block_len(b);
        let written = if o == 0 && src.len() == blen {
            self.store_write(src, s << self.shift)
        } else {
            SCRATCH.with(|cell| {
                let mut buf = cell.borrow_mut();
                if buf.len() < blen {
                    buf.resize(self.block as usize, 0);
                }
                let buf = &mut buf[..blen];
                // Disk mode has no RAM entries and overflow entries are written in place,
                // so the base is the layer below or zeros: it cannot change under us.
                self.fill_base(b, cur, buf)?;
                buf[o..o + src.len()].copy_from_slice(src);
                self.store_write(buf, s << self.shift)
            })
        };
        if let Err(e) = written {
            self.disk.release(s);
            return Err(e);
        }
        let new = self.index.entry(Place::Disk(s));
        if self.index.replace(b, cur, Some(new)) {
            return Ok(true);
        }
        self.disk_free(s);
        Ok(false)
    }

    /// Sets block `b`'s entry to `target` (absent or zero), freeing its storage.
    fn set_entry(&self, b: u64, zero: bool) {
        loop {
            let cur = self.index.get(b);
            let target = zero.then(|| self.index.entry(Place::Zero));
            match cur.map(|e| e.place) {
                None if !zero => return,
                Some(Place::Zero) if zero => return,
                None | Some(Place::Zero) => {
                    if self.index.replace(b, cur, target) {
                        return;
                    }
                }
                Some(Place::Ram(r)) => {
                    let mut g = self.arena.slot(r).write();
                    if g.owner != b || !self.index.replace(b, cur, target) {
                        continue;
                    }
                    debug_assert_ne!(
                        self.index.get(b).map(|e| e.place),
                        Some(Place::Ram(r)),
                        "cleared block {b} still names RAM slot {r}"
                    );
                    g.owner = FREE;
                    drop(g);
                    self.clock.forget(r);
                    self.arena.release(r);
                    return;
                }
                Some(Place::Disk(s)) => {
                    let excl = self.stripe(s).write();
                    if !self.index.replace(b, cur, target) {
                        continue;
                    }
                    drop(excl);
                    self.disk.release(s);
                    return;
                }
            }
        }
    }

    /// Whole blocks of `[offset, offset+len)` get `set_entry(zero)`; partial ones get
    /// zeros written (`zero`) or are left alone (trim is advisory).
    pub(crate) fn clear(&self, offset: u64, len: u64, zero: bool) -> Result<()> {
        self.check(offset, len)?;
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let b = at >> self.shift;
            let o = (at & (self.block - 1)) as usize;
            let blen = self.block_len(b);
            let n = ((blen - o) as u64).min(end - at) as usize;
            if o == 0 && n == blen {
                self.set_entry(b, zero);
            } else if zero {
                self.write_piece(b, o, &self.zeros[..n])?;
            }
            at += n as u64;
        }
        Ok(())
    }
}
