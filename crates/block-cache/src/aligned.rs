//! Buffers aligned to [`disk::DIRECT_ALIGN`], so the store can read into them with
//! `O_DIRECT` (no page-cache copy, and the block is held in RAM once, by the cache).
//!
//! Buffers of [`MAPPED_MIN_BYTES`] or more are anonymous mappings rather than heap
//! allocations: the kernel hands their pages out zeroed without anyone writing them, so a
//! direct read into a new buffer is the first touch of its memory (the read's page pinning
//! faults the pages in, with no zero-fill by us and no trap per page). A heap allocation
//! would be zero-filled by `alloc_zeroed` first, one page-fault trap per 4 KiB.
//!
//! *Huge* buffers ([`AlignedBuf::map_huge`]) are mappings aligned to [`HUGE_PAGE_BYTES`] and
//! advised `MADV_HUGEPAGE`, so where the kernel has transparent huge pages each 2 MiB of the
//! buffer is one physically contiguous page. That decides how large a direct read's
//! requests to the device are: the block layer puts one segment per physically contiguous
//! range into a request, and a device takes a bounded number of segments (254 on this
//! machine's virtio disk), so a read into 4 KiB pages is cut into requests of about 1 MiB,
//! while a read into a huge page goes out as one request of up to `max_sectors_kb`. Reading
//! a 2 GiB file with `O_DIRECT`, 2 MiB per read, four threads: 1.39-1.73 GB/s into 4 KiB
//! pages (0.8-1.1 MiB requests), 3.3-3.6 GB/s into huge pages (2 MiB requests), three runs
//! each, same machine, 2026-11-25. Where huge pages are off the advice is ignored and the buffer works
//! as any other.

// Aligned heap allocation: `Box<[u8]>` cannot ask for an alignment.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc, handle_alloc_error};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use disk::DIRECT_ALIGN;

/// Buffers of at least this many bytes are mapped (see the module notes).
pub(crate) const MAPPED_MIN_BYTES: usize = 128 << 10;
/// The size and alignment of a transparent huge page (x86-64 and arm64 with 4 KiB pages).
pub(crate) const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An owned, initialized byte buffer whose address is a multiple of [`DIRECT_ALIGN`].
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The pool a mapped buffer goes back to when dropped, if it has room.
    pool: Option<Arc<BufPool>>,
}

// SAFETY: the buffer owns its allocation alone, like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` only reads the bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> Layout {
        // DIRECT_ALIGN is a power of two and a buffer is at most a few MiB: never fails.
        Layout::from_size_align(len.max(1), DIRECT_ALIGN).expect("valid buffer layout")
    }

    fn mapped(len: usize) -> bool {
        len >= MAPPED_MIN_BYTES
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        if AlignedBuf::mapped(len) {
            return AlignedBuf::map(len);
        }
        let layout = AlignedBuf::layout(len);
        // SAFETY: the layout's size is not zero.
        let p = unsafe { alloc_zeroed(layout) };
        AlignedBuf {
            ptr: NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout)),
            len,
            pool: None,
        }
    }

    /// `len` zero bytes in a new anonymous mapping (page-aligned, so `DIRECT_ALIGN`-aligned).
    fn map(len: usize) -> AlignedBuf {
        AlignedBuf {
            ptr: map_anonymous(len).cast::<u8>(),
            len,
            pool: None,
        }
    }

    /// `len` zero bytes (a multiple of [`HUGE_PAGE_BYTES`]) in a new anonymous mapping
    /// aligned to [`HUGE_PAGE_BYTES`] and advised `MADV_HUGEPAGE` (see the module notes).
    pub fn map_huge(len: usize) -> AlignedBuf {
        use rustix::mm::{Advice, madvise, munmap};
        debug_assert!(len > 0 && len.is_multiple_of(HUGE_PAGE_BYTES));
        let span = len + HUGE_PAGE_BYTES;
        let p = map_anonymous(span).as_ptr();
        let base = p as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let (head, tail) = (start - base, base + span - (start + len));
        // SAFETY: `[base, start)` and `[start + len, base + span)` are the unaligned ends of
        // the mapping just made, which nothing refers to; `[start, start + len)` stays mapped
        // and is the buffer, unmapped once by `drop` (same length).
        unsafe {
            if head > 0 {
                let _ = munmap(p, head);
            }
            if tail > 0 {
                let _ = munmap((start + len) as *mut std::ffi::c_void, tail);
            }
            // Only advice: without transparent huge pages the buffer is made of 4 KiB pages.
            let _ = madvise(start as *mut std::ffi::c_void, len, Advice::LinuxHugepage);
        }
        AlignedBuf {
            ptr: NonNull::new(start as *mut u8)
                .unwrap_or_else(|| handle_alloc_error(AlignedBuf::layout(len))),
            len,
            pool: None,
        }
    }

    /// A copy of `src`.
    pub fn copy_of(src: &[u8]) -> AlignedBuf {
        if AlignedBuf::mapped(src.len()) {
            let mut b = AlignedBuf::map(src.len());
            b.copy_from_slice(src);
            return b;
        }
        let layout = AlignedBuf::layout(src.len());
        // SAFETY: the layout's size is not zero.
        let p = unsafe { alloc(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout));
        // SAFETY: `ptr` is a fresh allocation of at least `src.len()` bytes, disjoint from
        // `src`; after the copy every byte of the buffer is initialized.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), src.len()) };
        AlignedBuf {
            ptr,
            len: src.len(),
            pool: None,
        }
    }
}

/// A new private anonymous read-write mapping of `len` (> 0) bytes, which read as zero;
/// aborts like a failed allocation when the kernel refuses.
fn map_anonymous(len: usize) -> NonNull<std::ffi::c_void> {
    use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous};
    // SAFETY: a new private anonymous mapping at an address the kernel chooses aliases no
    // existing memory.
    let p = unsafe {
        mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    };
    match p.ok().and_then(NonNull::new) {
        Some(p) => p,
        None => handle_alloc_error(AlignedBuf::layout(len)),
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialized bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            // The mapping moves into a pooled buffer, which owns it from here on; this one
            // then frees nothing.
            let kept = AlignedBuf {
                ptr: self.ptr,
                len: self.len,
                pool: None,
            };
            match pool.put(kept) {
                Ok(()) => return,
                Err(kept) => {
                    // The pool is full: the mapping is unmapped by `kept`'s drop.
                    drop(kept);
                    return;
                }
            }
        }
        if AlignedBuf::mapped(self.len) {
            // SAFETY: `ptr` is the start of a mapping of `len` bytes made by `map` (the same
            // length decides both), unmapped once; nothing borrows the buffer any more.
            if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
                tracing::error!(error = %e, len = self.len, "munmap of a cache buffer failed");
            }
            return;
        }
        // SAFETY: `ptr` was allocated with this same layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), AlignedBuf::layout(self.len)) };
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Mapped buffers of one size kept for reuse: a buffer taken from the pool goes back to it
/// when dropped, up to `max` idle buffers (the rest are unmapped). A reused buffer's pages
/// are resident already, so a direct read into it faults nothing in: on a cold sequential
/// scan, faulting fresh anonymous pages in cost about as much CPU as everything else the
/// server did (see the crate's notes on scans).
#[derive(Debug)]
pub(crate) struct BufPool {
    len: usize,
    max: usize,
    /// New buffers are huge ([`AlignedBuf::map_huge`]).
    huge: bool,
    idle: Mutex<Vec<AlignedBuf>>,
}

impl BufPool {
    /// A pool of buffers of `len` bytes (at least [`MAPPED_MIN_BYTES`]) keeping at most
    /// `max` idle.
    pub fn new(len: usize, max: usize) -> Arc<BufPool> {
        debug_assert!(AlignedBuf::mapped(len));
        Arc::new(BufPool {
            len,
            max,
            huge: false,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// A pool of huge buffers ([`AlignedBuf::map_huge`]) of `len` bytes, a multiple of
    /// [`HUGE_PAGE_BYTES`], keeping at most `max` idle.
    pub fn new_huge(len: usize, max: usize) -> Arc<BufPool> {
        debug_assert!(len > 0 && len.is_multiple_of(HUGE_PAGE_BYTES));
        Arc::new(BufPool {
            len,
            max,
            huge: true,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The buffers' length.
    pub fn buf_len(&self) -> usize {
        self.len
    }

    /// Idle buffers held.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// A buffer of the pool's length whose bytes are unspecified (a reused buffer holds
    /// what its last user left; a new one is zero): for a read that overwrites all of it.
    /// It returns to the pool when dropped.
    pub fn take(self: &Arc<Self>) -> (AlignedBuf, bool) {
        let reused = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let (mut buf, was_reused) = match reused {
            Some(b) => (b, true),
            None if self.huge => (AlignedBuf::map_huge(self.len), false),
            None => (AlignedBuf::map(self.len), false),
        };
        buf.pool = Some(Arc::clone(self));
        (buf, was_reused)
    }

    /// Keeps `buf` (not pooled itself) if there is room; else hands it back.
    fn put(&self, buf: AlignedBuf) -> Result<(), AlignedBuf> {
        debug_assert!(buf.pool.is_none() && buf.len == self.len);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= self.max {
            return Err(buf);
        }
        idle.push(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_hold_their_bytes() {
        for len in [0, 1, 4095, 4096, 65536, 100_000, MAPPED_MIN_BYTES, 300_001] {
            let z = AlignedBuf::zeroed(len);
            assert_eq!(z.as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(z.len(), len);
            assert!(z.iter().all(|&b| b == 0));
            let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let c = AlignedBuf::copy_of(&src);
            assert_eq!(c.as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(&c[..], &src[..]);
        }
    }

    #[test]
    fn huge_buffers_are_aligned_to_a_huge_page_and_come_back_to_their_pool() {
        let pool = BufPool::new_huge(2 * HUGE_PAGE_BYTES, 1);
        let (mut a, reused) = pool.take();
        assert!(!reused);
        assert_eq!(a.len(), 2 * HUGE_PAGE_BYTES);
        assert_eq!(a.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        assert!(a.iter().all(|&b| b == 0));
        a.fill(0x5A);
        let at = a.as_ptr();
        drop(a);
        let (b, reused) = pool.take();
        assert!(reused);
        assert_eq!(b.as_ptr(), at);
        assert!(b.iter().all(|&x| x == 0x5A));
        // A huge buffer outside a pool is unmapped by its drop (its whole length).
        let c = AlignedBuf::map_huge(HUGE_PAGE_BYTES);
        assert_eq!(c.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        drop(c);
    }

    #[test]
    fn a_pooled_buffer_comes_back_with_its_pages_up_to_the_pool_size() {
        let pool = BufPool::new(MAPPED_MIN_BYTES, 1);
        let (mut a, reused) = pool.take();
        assert!(!reused);
        assert_eq!(a.len(), MAPPED_MIN_BYTES);
        assert_eq!(a.as_ptr() as usize % DIRECT_ALIGN, 0);
        a.fill(0xAB);
        let at = a.as_ptr();
        let (b, _) = pool.take();
        drop(a);
        drop(b);
        // Only one idle buffer is kept: the second drop unmapped its buffer.
        assert_eq!(pool.idle(), 1);
        let (c, reused) = pool.take();
        assert!(reused);
        assert_eq!(c.as_ptr(), at);
        assert!(
            c.iter().all(|&x| x == 0xAB),
            "a reused buffer keeps its bytes"
        );
        assert_eq!(pool.idle(), 0);
        drop(c);
        assert_eq!(pool.idle(), 1);
    }
}
