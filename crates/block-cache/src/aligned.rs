//! Buffers aligned to [`disk::DIRECT_ALIGN`], so the store can read into them with
//! `O_DIRECT` (no page-cache copy, and the block is held in RAM once, by the cache).
//!
//! Buffers of [`MAPPED_MIN_BYTES`] or more are anonymous mappings rather than heap
//! allocations: the kernel hands their pages out zeroed without anyone writing them, so a
//! direct read into a new buffer is the first touch of its memory (the read's page pinning
//! faults the pages in, with no zero-fill by us and no trap per page). A heap allocation
//! would be zero-filled by `alloc_zeroed` first, one page-fault trap per 4 KiB.

// Aligned heap allocation: `Box<[u8]>` cannot ask for an alignment.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc, handle_alloc_error};
use std::ptr::NonNull;

use disk::DIRECT_ALIGN;

/// Buffers of at least this many bytes are mapped (see the module notes).
pub(crate) const MAPPED_MIN_BYTES: usize = 128 << 10;

/// An owned, initialized byte buffer whose address is a multiple of [`DIRECT_ALIGN`].
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
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
        }
    }

    /// `len` zero bytes in a new anonymous mapping (page-aligned, so `DIRECT_ALIGN`-aligned).
    fn map(len: usize) -> AlignedBuf {
        use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous};
        // SAFETY: a new private anonymous mapping of `len` (> 0) bytes at an address the
        // kernel chooses aliases no existing memory; its bytes read as zero.
        let p = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        };
        match p {
            Ok(p) => AlignedBuf {
                ptr: NonNull::new(p.cast::<u8>())
                    .unwrap_or_else(|| handle_alloc_error(AlignedBuf::layout(len))),
                len,
            },
            Err(_) => handle_alloc_error(AlignedBuf::layout(len)),
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
        }
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
}
