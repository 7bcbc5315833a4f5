//! Heap buffers aligned to [`disk::DIRECT_ALIGN`], so the store can read into them with
//! `O_DIRECT` (no page-cache copy, and the block is held in RAM once, by the cache).

// Aligned heap allocation: `Box<[u8]>` cannot ask for an alignment.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc, handle_alloc_error};
use std::ptr::NonNull;

use disk::DIRECT_ALIGN;

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

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = AlignedBuf::layout(len);
        // SAFETY: the layout's size is not zero.
        let p = unsafe { alloc_zeroed(layout) };
        AlignedBuf {
            ptr: NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout)),
            len,
        }
    }

    /// A copy of `src`.
    pub fn copy_of(src: &[u8]) -> AlignedBuf {
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
        for len in [0, 1, 4095, 4096, 65536, 100_000] {
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
