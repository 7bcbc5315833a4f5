//! The data path: mapping a range to file extents, reads, writes with block allocation,
//! trim and write-zeroes.

use std::sync::atomic::Ordering;

use vhdx::bat::{self, Entry};
use vhdx::{MIB, bitmap};

use super::{State, VhdxImage};
use crate::device::{LayerRun, Source, check_bounds};
use crate::{Error, ErrorKind, Result};

/// Where the bytes of one run of a block's range are: the result of a BAT (and sector bitmap)
/// lookup. (Unrelated to [`crate::device::Piece`], a part of a shared read's answer.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    /// At this file offset.
    File(u64),
    /// Zeros decided by this layer.
    Zero,
    /// The parent's bytes.
    Parent,
}

/// A lookup that could not finish because a sector bitmap is not loaded yet.
struct NeedBitmap(u64);

impl VhdxImage {
    fn block_size(&self) -> u64 {
        u64::from(self.meta.block_size)
    }

    fn sector(&self) -> u64 {
        u64::from(self.meta.logical_sector_size)
    }

    /// Maps `[off, off+len)` inside block `block` (len > 0, not crossing the block end).
    fn map_block(
        &self,
        st: &State,
        block: u64,
        off: u64,
        len: u64,
    ) -> std::result::Result<Vec<(u64, Location)>, NeedBitmap> {
        let e = st.bat[self.layout.payload_index(block) as usize];
        let absent = if self.meta.has_parent {
            Location::Parent
        } else {
            Location::Zero
        };
        let whole = |p| Ok(vec![(len, p)]);
        match e.state() {
            bat::PAYLOAD_BLOCK_FULLY_PRESENT => whole(Location::File(e.file_offset() + off)),
            bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT => {
                let chunk = block / self.layout.chunk_ratio();
                let bm = st.bitmaps.get(&chunk).ok_or(NeedBitmap(chunk))?;
                let ss = self.sector();
                let first = (block % self.layout.chunk_ratio()) * self.layout.sectors_per_block();
                let (s0, s1) = (off / ss, (off + len).div_ceil(ss));
                let mut out = Vec::new();
                let mut pos = off;
                for (n, bit) in bitmap::runs(bm, first + s0, s1 - s0) {
                    let run_end = ((pos / ss) + n) * ss;
                    let run_end = run_end.min(off + len);
                    let p = if bit {
                        Location::File(e.file_offset() + pos)
                    } else {
                        Location::Parent
                    };
                    out.push((run_end - pos, p));
                    pos = run_end;
                }
                Ok(out)
            }
            bat::PAYLOAD_BLOCK_NOT_PRESENT | bat::PAYLOAD_BLOCK_UNDEFINED => whole(absent),
            _ => whole(Location::Zero),
        }
    }

    /// Loads the sector bitmap of `chunk` into memory (zeros if its block is absent).
    fn load_bitmap(&self, chunk: u64) -> Result<()> {
        let sb = {
            let st = self.read_state();
            if st.bitmaps.contains_key(&chunk) {
                return Ok(());
            }
            st.bat[self.layout.bitmap_index(chunk) as usize]
        };
        let mut buf = vec![0u8; bat::SECTOR_BITMAP_BLOCK_LEN as usize].into_boxed_slice();
        if sb.state() == bat::SB_BLOCK_PRESENT {
            self.storage.read_at(&mut buf, sb.file_offset())?;
        }
        self.write_state().bitmaps.entry(chunk).or_insert(buf);
        Ok(())
    }

    /// Maps a range inside one block, loading bitmaps as needed.
    fn map_block_loading(&self, block: u64, off: u64, len: u64) -> Result<Vec<(u64, Location)>> {
        loop {
            let r = self.map_block(&self.read_state(), block, off, len);
            match r {
                Ok(v) => return Ok(v),
                Err(NeedBitmap(chunk)) => self.load_bitmap(chunk)?,
            }
        }
    }

    /// Splits `[offset, offset+len)` at block boundaries: (block, offset in block, len).
    fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + use<> {
        let bs = self.block_size();
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            (pos < end).then(|| {
                let block = pos / bs;
                let in_block = pos % bs;
                let n = (bs - in_block).min(end - pos);
                pos += n;
                (block, in_block, n)
            })
        })
    }

    pub(super) fn read_impl(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check_poisoned()?;
        check_bounds(self.meta.virtual_size, offset, buf.len() as u64)?;
        let mut done = 0usize;
        for (block, in_block, n) in self.split(offset, buf.len() as u64) {
            for (len, loc) in self.map_block_loading(block, in_block, n)? {
                let dst = &mut buf[done..done + len as usize];
                let virt = offset + done as u64;
                match loc {
                    Location::File(at) => self.storage.read_at(dst, at)?,
                    Location::Zero => dst.fill(0),
                    Location::Parent => self.read_parent(dst, virt)?,
                }
                done += len as usize;
            }
        }
        Ok(())
    }

    /// [`FastPath::read_vectored_at`]: one vectored store read when the range lies in
    /// one payload block held in this file as a whole; otherwise buffer by buffer.
    ///
    /// [`FastPath::read_vectored_at`]: crate::FastPath::read_vectored_at
    pub(super) fn read_vectored_impl(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        self.check_poisoned()?;
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_bounds(self.meta.virtual_size, offset, total)?;
        let bs = self.block_size();
        if total > 0 && offset / bs == (offset + total - 1) / bs {
            let runs = self.map_block_loading(offset / bs, offset % bs, total)?;
            if let [(len, Location::File(at))] = runs[..]
                && len == total
            {
                return self.storage.read_vectored_at(bufs, at);
            }
        }
        let mut at = offset;
        for b in bufs.iter_mut() {
            self.read_impl(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }

    fn read_parent(&self, dst: &mut [u8], offset: u64) -> Result<()> {
        let Some(parent) = self.parent.get() else {
            return Err(Error::new(
                ErrorKind::ChainBroken,
                format!(
                    "differencing image {:?} read at {offset:#x} needs its parent, which is not attached",
                    self.path
                ),
            ));
        };
        let psize = parent.size();
        let avail = psize.saturating_sub(offset).min(dst.len() as u64) as usize;
        parent.read_at(&mut dst[..avail], offset)?;
        dst[avail..].fill(0);
        Ok(())
    }

    pub(super) fn map_layer_impl(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        check_bounds(self.meta.virtual_size, offset, len)?;
        let mut out: Vec<LayerRun> = Vec::new();
        for (block, in_block, n) in self.split(offset, len) {
            for (len, loc) in self.map_block_loading(block, in_block, n)? {
                let source = match loc {
                    Location::File(_) => Source::Data,
                    Location::Zero => Source::Zero,
                    Location::Parent => Source::Parent,
                };
                match out.last_mut() {
                    Some(last) if last.source == source => last.len += len,
                    _ => out.push(LayerRun { len, source }),
                }
            }
        }
        Ok(out)
    }

    fn check_writable(&self) -> Result<()> {
        self.check_poisoned()?;
        if !self.writable {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                "vhdx image opened read-only",
            ));
        }
        Ok(())
    }

    pub(super) fn write_impl(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_writable()?;
        check_bounds(self.meta.virtual_size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let ss = self.sector();
        if !offset.is_multiple_of(ss) || !(buf.len() as u64).is_multiple_of(ss) {
            // Read-modify-write of the partial sectors at either end.
            let start = offset / ss * ss;
            let end = (offset + buf.len() as u64).div_ceil(ss) * ss;
            let mut whole = vec![0u8; (end - start) as usize];
            self.read_impl(&mut whole, start)?;
            let at = (offset - start) as usize;
            whole[at..at + buf.len()].copy_from_slice(buf);
            return self.write_impl(&whole, start);
        }
        self.start_session()?;
        let mut done = 0usize;
        for (block, in_block, n) in self.split(offset, buf.len() as u64) {
            self.write_block(block, in_block, &buf[done..done + n as usize])?;
            done += n as usize;
        }
        Ok(())
    }

    /// [`Self::write_impl`] on the caller's thread when it is a plain overwrite: whole
    /// pages, inside one block, every sector of the range already this file's (no
    /// allocation, no bitmap to change or load), in a session already started, on storage
    /// that takes inline overwrites, while the inline gate is open. `None`, with nothing
    /// written, otherwise (the caller then makes the ordinary call). The write is the
    /// ordinary path's first step, made without the allocation lock there too.
    pub(super) fn try_write_impl(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        const PAGE: u64 = 4096;
        let len = buf.len() as u64;
        if !self.writable
            || self.poisoned.load(Ordering::Acquire)
            || len == 0
            || !offset.is_multiple_of(PAGE)
            || !len.is_multiple_of(PAGE)
            || offset.checked_add(len)? > self.meta.virtual_size
            || !self.storage.inline_overwrites()
        {
            return None;
        }
        let bs = self.block_size();
        let (block, off) = (offset / bs, offset % bs);
        if off + len > bs {
            return None;
        }
        let at = {
            let st = self.read_state();
            if !st.session_started {
                return None;
            }
            // A bitmap not in memory would need a read: declined like any other miss.
            self.own_target(&st, block, off, len).ok()??
        };
        // Blocks start on 1 MiB boundaries: `at` is page-aligned like `offset`.
        self.inline
            .run("vhdx overwrite", || self.storage.write_at(buf, at))
    }

    /// True when every sector of the range is already this file's.
    fn fast_target(&self, block: u64, off: u64, len: u64) -> Result<Option<u64>> {
        loop {
            let r = self.own_target(&self.read_state(), block, off, len);
            match r {
                Ok(at) => return Ok(at),
                Err(NeedBitmap(chunk)) => self.load_bitmap(chunk)?,
            }
        }
    }

    /// The file offset of `[off, off+len)` of `block` when every sector of it is this
    /// file's, as `st` knows it; `NeedBitmap` when that takes a bitmap not in memory.
    fn own_target(
        &self,
        st: &State,
        block: u64,
        off: u64,
        len: u64,
    ) -> std::result::Result<Option<u64>, NeedBitmap> {
        let e = st.bat[self.layout.payload_index(block) as usize];
        match e.state() {
            // The common case needs no map: the whole block is in this file.
            bat::PAYLOAD_BLOCK_FULLY_PRESENT => Ok(Some(e.file_offset() + off)),
            bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT => {
                let runs = self.map_block(st, block, off, len)?;
                let all_here = runs.len() == 1 && matches!(runs[0].1, Location::File(_));
                Ok(all_here.then(|| e.file_offset() + off))
            }
            _ => Ok(None),
        }
    }

    fn write_block(&self, block: u64, off: u64, data: &[u8]) -> Result<()> {
        if let Some(at) = self.fast_target(block, off, data.len() as u64)? {
            return self.storage.write_at(data, at);
        }
        let pi = self.layout.payload_index(block) as usize;
        let len = data.len() as u64;
        let before = self.read_state().bat[pi];
        if before.state() == bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT {
            // The data goes in place outside the allocation lock; only the bitmap update
            // needs it. Data before bits: a crash can only leave the old bits.
            self.storage.write_at(data, before.file_offset() + off)?;
            let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            if self.read_state().bat[pi] == before {
                return self.set_bits(block, off, len);
            }
            // A concurrent trim changed the block: fall through and write again under lock.
        }
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = self.fast_target(block, off, data.len() as u64)? {
            return self.storage.write_at(data, at);
        }
        let e = self.read_state().bat[pi];
        let whole_block = off == 0 && len == self.block_size();
        match e.state() {
            bat::PAYLOAD_BLOCK_FULLY_PRESENT => self.storage.write_at(data, e.file_offset() + off),
            bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT => {
                self.storage.write_at(data, e.file_offset() + off)?;
                self.set_bits(block, off, len)
            }
            bat::PAYLOAD_BLOCK_NOT_PRESENT | bat::PAYLOAD_BLOCK_UNDEFINED
                if self.meta.has_parent && !whole_block =>
            {
                let chunk = block / self.layout.chunk_ratio();
                self.ensure_bitmap_block(chunk)?;
                let at = self.reserve(self.block_size())?;
                self.storage.write_at(data, at + off)?;
                self.set_entry(
                    pi as u64,
                    Entry::new(bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT, at),
                );
                self.debug_assert_allocated(pi as u64, bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT, at);
                self.set_bits(block, off, len)
            }
            _ => {
                let at = self.reserve(self.block_size())?;
                self.storage.write_at(data, at + off)?;
                self.set_entry(pi as u64, Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, at));
                self.debug_assert_allocated(pi as u64, bat::PAYLOAD_BLOCK_FULLY_PRESENT, at);
                Ok(())
            }
        }
    }

    /// Reserves `len` bytes (a multiple of 1 MiB) at the end of the file. Caller holds `alloc`.
    fn reserve(&self, len: u64) -> Result<u64> {
        let at = {
            let mut st = self.write_state();
            let at = st.file_end;
            // Paired with `debug_assert_allocated`: blocks go at 1 MiB-aligned offsets.
            debug_assert!(
                at.is_multiple_of(MIB) && len.is_multiple_of(MIB),
                "reserve {len:#x} bytes at {at:#x}: both must be 1 MiB multiples"
            );
            st.file_end += len;
            at
        };
        let r = self.storage.set_len(at + len);
        self.durable(r)?;
        Ok(at)
    }

    /// Updates a BAT entry in memory and marks its page dirty. Caller holds `alloc`.
    fn set_entry(&self, index: u64, e: Entry) {
        let mut st = self.write_state();
        st.bat[index as usize] = e;
        st.dirty_bat.insert(index * 8 / 4096);
    }

    /// Makes sure chunk `chunk` has a sector bitmap block in the file and in memory.
    fn ensure_bitmap_block(&self, chunk: u64) -> Result<()> {
        self.load_bitmap(chunk)?;
        let si = self.layout.bitmap_index(chunk);
        if self.read_state().bat[si as usize].state() == bat::SB_BLOCK_PRESENT {
            return Ok(());
        }
        let at = self.reserve(bat::SECTOR_BITMAP_BLOCK_LEN)?;
        // The new block reads as zeros, like the in-memory bitmap of an absent block; only
        // pages whose bits get set are logged.
        self.set_entry(si, Entry::new(bat::SB_BLOCK_PRESENT, at));
        self.debug_assert_allocated(si, bat::SB_BLOCK_PRESENT, at);
        Ok(())
    }

    /// Debug builds only: after an allocation, BAT entry `index` decodes to `state` at `at`,
    /// what was allocated, and satisfies what the open-time checks (`bat::parse`,
    /// `validate_placement`) require of it in the file: 1 MiB aligned, inside the file length
    /// `reserve` set, clear of the headers, the regions and the log; a PARTIALLY_PRESENT block
    /// or a sector bitmap block only in a differencing image, and a PARTIALLY_PRESENT block's
    /// chunk with its sector bitmap block present (MS-VHDX 2.5.1). Caller holds `alloc`.
    fn debug_assert_allocated(&self, index: u64, state: u8, at: u64) {
        if !cfg!(debug_assertions) {
            return;
        }
        let st = self.read_state();
        let e = st.bat[index as usize];
        assert_eq!(
            (e.state(), e.file_offset()),
            (state, at),
            "bat entry {index}"
        );
        assert!(at.is_multiple_of(MIB), "bat entry {index} at {at:#x}");
        let is_bitmap = bat::is_bitmap_index(&self.layout, index);
        let len = if is_bitmap {
            bat::SECTOR_BITMAP_BLOCK_LEN
        } else {
            self.block_size()
        };
        assert!(
            at + len <= st.file_end,
            "bat entry {index}: {at:#x}+{len:#x} ends past the file length {:#x}",
            st.file_end
        );
        for (start, end, what) in super::fixed_structures(&self.regions, &st.header) {
            assert!(
                at + len <= start || end <= at,
                "bat entry {index} at {at:#x} overlaps the {what}"
            );
        }
        if is_bitmap || state == bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT {
            assert!(
                self.meta.has_parent,
                "bat entry {index}: state {state} needs a parent"
            );
        }
        if !is_bitmap && state == bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT {
            let chunk = index / (self.layout.chunk_ratio() + 1);
            let sb = st.bat[self.layout.bitmap_index(chunk) as usize];
            assert_eq!(
                sb.state(),
                bat::SB_BLOCK_PRESENT,
                "bat entry {index}: the sector bitmap block of chunk {chunk}"
            );
        }
    }

    /// Sets the sector bits of `[off, off+len)` of `block`. Caller holds `alloc`.
    fn set_bits(&self, block: u64, off: u64, len: u64) -> Result<()> {
        let chunk = block / self.layout.chunk_ratio();
        // Not just `load_bitmap`: a PARTIALLY_PRESENT block may sit in a chunk without a
        // bitmap block (a foreign writer, or a crash inside a multi-entry commit), and its
        // dirty pages would then be committed at file offset 0.
        self.ensure_bitmap_block(chunk)?;
        let ss = self.sector();
        let first =
            (block % self.layout.chunk_ratio()) * self.layout.sectors_per_block() + off / ss;
        let count = len.div_ceil(ss);
        let mut st = self.write_state();
        let bm = st
            .bitmaps
            .get_mut(&chunk)
            .expect("bitmap loaded above under the alloc lock");
        bitmap::set_range(bm, first, count, true);
        let (p0, p1) = (first / 8 / 4096, (first + count - 1) / 8 / 4096);
        for page in p0..=p1 {
            st.dirty_bitmap.insert((chunk, page));
        }
        Ok(())
    }

    /// Trim (`trim == true`) or write-zeroes.
    pub(super) fn discard_impl(&self, offset: u64, len: u64, trim: bool) -> Result<()> {
        self.check_writable()?;
        check_bounds(self.meta.virtual_size, offset, len)?;
        let ss = self.sector();
        let (start, end) = (offset.div_ceil(ss) * ss, (offset + len) / ss * ss);
        if !trim {
            // Partial sectors at either end are written as zeros.
            let head_end = start.min(offset + len);
            if head_end > offset {
                self.write_impl(&vec![0u8; (head_end - offset) as usize], offset)?;
            }
            if end >= start && offset + len > end && end >= head_end {
                self.write_impl(&vec![0u8; (offset + len - end) as usize], end)?;
            }
        }
        if end <= start {
            return Ok(());
        }
        self.start_session()?;
        for (block, in_block, n) in self.split(start, end - start) {
            self.discard_block(block, in_block, n, trim)?;
        }
        Ok(())
    }

    fn discard_block(&self, block: u64, off: u64, len: u64, trim: bool) -> Result<()> {
        let _g = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let pi = self.layout.payload_index(block);
        let e = self.read_state().bat[pi as usize];
        let whole = off == 0 && len == self.block_size();
        let present = matches!(
            e.state(),
            bat::PAYLOAD_BLOCK_FULLY_PRESENT | bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT
        );
        if whole && !self.meta.leave_blocks_allocated {
            if present {
                self.storage
                    .punch_hole(e.file_offset(), self.block_size())?;
            }
            if e.state() != bat::PAYLOAD_BLOCK_ZERO {
                self.set_entry(pi, Entry::new(bat::PAYLOAD_BLOCK_ZERO, 0));
            }
            return Ok(());
        }
        match e.state() {
            bat::PAYLOAD_BLOCK_FULLY_PRESENT => self.storage.punch_hole(e.file_offset() + off, len),
            bat::PAYLOAD_BLOCK_PARTIALLY_PRESENT if !trim => {
                self.storage.punch_hole(e.file_offset() + off, len)?;
                self.set_bits(block, off, len)
            }
            bat::PAYLOAD_BLOCK_NOT_PRESENT | bat::PAYLOAD_BLOCK_UNDEFINED
                if !trim && self.meta.has_parent =>
            {
                drop(_g);
                self.write_impl(&vec![0u8; len as usize], block * self.block_size() + off)
            }
            _ => Ok(()),
        }
    }
}
