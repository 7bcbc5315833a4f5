//! The mapping: the cache file (or anonymous memory, for a private cache) mapped shared,
//! seen as a slice of `AtomicU64`. The only `unsafe` of the crate lives here.
//!
//! Every access to the mapping goes through atomics, so processes that share it race only
//! on atomics, which is defined. A process of the same user could still truncate the file
//! (SIGBUS on the next access) or write nonsense into it; the file is 0600, so only the
//! user running the agents can, and nonsense is caught by the slot checksums and bounds.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fs::File;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use rustix::mm::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

/// A read-write mapping of `len` bytes (a multiple of 8, page aligned by mmap).
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<AtomicU64>,
    len: usize,
    /// Keeps the file open while mapped (not needed by mmap, but names what is mapped).
    _file: Option<File>,
}

// SAFETY: the region is only accessed through `&[AtomicU64]`, which is `Sync`; the raw
// pointer is never handed out.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes of `file` shared.
    pub(crate) fn file(file: File, len: usize) -> std::io::Result<Region> {
        // SAFETY: a new mapping at an address the kernel picks: nothing of ours is
        // replaced. `len` is the file's size, which the caller set.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &file,
                0,
            )
        }?;
        Self::from_raw(p, len, Some(file))
    }

    /// Maps `len` bytes of zeroed anonymous memory, private to this process.
    pub(crate) fn anonymous(len: usize) -> std::io::Result<Region> {
        // SAFETY: a new anonymous mapping at an address the kernel picks.
        let p = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        Self::from_raw(p, len, None)
    }

    fn from_raw(p: *mut c_void, len: usize, file: Option<File>) -> std::io::Result<Region> {
        let ptr = NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        debug_assert_eq!(p as usize % 4096, 0, "mmap returns page-aligned memory");
        Ok(Region {
            ptr,
            len,
            _file: file,
        })
    }

    /// The mapping as words.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a live mapping of `len` bytes (unmapped only in `drop`),
        // page aligned (so aligned for `AtomicU64`, which has `u64`'s layout), readable and
        // writable; every access, ours and other processes', goes through atomics.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len / 8) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `file`/`anonymous`, unmapped once; no reference from
        // `words` outlives `self`.
        if let Err(e) = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(error = %e, "munmap of the host cache failed");
        }
    }
}
