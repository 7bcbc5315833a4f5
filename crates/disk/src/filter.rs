//! [`Filter`]: a decorator that names only the calls it changes. Every call of
//! [`BlockDevice`] and [`FastPath`] it does not define goes to the device below,
//! [`Filter::next`], as a filter hook an nbdkit filter does not define goes to the next
//! layer (nbdkit's `server/filters.c`).
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use disk::{BlockDevice, Filter, Result};
//!
//! /// Counts the bytes written; every other call, fast paths included, is the device's.
//! #[derive(Debug)]
//! struct Written {
//!     next: Arc<dyn BlockDevice>,
//!     bytes: AtomicU64,
//! }
//!
//! impl Filter for Written {
//!     fn next(&self) -> &dyn BlockDevice {
//!         &*self.next
//!     }
//!
//!     fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
//!         self.next.write_at(buf, offset)?;
//!         self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! A new fast path cannot be lost on the way down: [`FastPath`]'s methods have no defaults,
//! and the blanket `impl<T: Filter> FastPath for T` below does not compile until `Filter`
//! has the method too, with a default that passes it on. So every filter passes it on
//! unless it says otherwise. A layer that keeps data of its own (the block cache, the
//! write cache, the host read cache) is not a `Filter`: a call it does not know must not
//! go past its data, so it implements [`BlockDevice`] and [`FastPath`] itself, and a new
//! fast path does not compile there until it decides.
//!
//! The forwarding is static: the blanket impls call the filter's own methods (inlined),
//! which make one dynamic call on `next`, as a hand-written decorator does.

use std::sync::Arc;

use vhdx::Guid;

use crate::Result;
use crate::device::{BlockDevice, FastPath, Geometry, LayerRun, ParentRef, Piece, Submitted};

/// A [`BlockDevice`] over another, [`Filter::next`], that passes every call it does not
/// define on to it (see the module docs). Each method has the name, signature and meaning
/// of the [`BlockDevice`] or [`FastPath`] method it stands for; a filter is a
/// `BlockDevice` whose fast paths are these methods.
///
/// Name the trait by its path (`impl disk::Filter for …`) or import it where no
/// `BlockDevice` method is called on a filter: both traits have methods of the same names.
pub trait Filter: Send + Sync + std::fmt::Debug {
    /// The device below, which every call not defined here goes to.
    fn next(&self) -> &dyn BlockDevice;

    /// [`BlockDevice::geometry`].
    #[inline]
    fn geometry(&self) -> Geometry {
        self.next().geometry()
    }

    /// [`BlockDevice::size`] (a filter that changes the geometry changes this too).
    #[inline]
    fn size(&self) -> u64 {
        self.next().size()
    }

    /// [`BlockDevice::format`].
    #[inline]
    fn format(&self) -> &'static str {
        self.next().format()
    }

    /// [`BlockDevice::read_at`].
    ///
    /// # Errors
    /// As [`BlockDevice::read_at`].
    #[inline]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.next().read_at(buf, offset)
    }

    /// [`BlockDevice::write_at`].
    ///
    /// # Errors
    /// As [`BlockDevice::write_at`].
    #[inline]
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.next().write_at(buf, offset)
    }

    /// [`BlockDevice::flush`].
    ///
    /// # Errors
    /// As [`BlockDevice::flush`].
    #[inline]
    fn flush(&self) -> Result<()> {
        self.next().flush()
    }

    /// [`BlockDevice::trim`].
    ///
    /// # Errors
    /// As [`BlockDevice::trim`].
    #[inline]
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.next().trim(offset, len)
    }

    /// [`BlockDevice::write_zeroes`].
    ///
    /// # Errors
    /// As [`BlockDevice::write_zeroes`].
    #[inline]
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.next().write_zeroes(offset, len)
    }

    /// [`BlockDevice::can_write`].
    #[inline]
    fn can_write(&self) -> bool {
        self.next().can_write()
    }

    /// [`BlockDevice::map_layer`].
    ///
    /// # Errors
    /// As [`BlockDevice::map_layer`].
    #[inline]
    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        self.next().map_layer(offset, len)
    }

    /// [`BlockDevice::parent`].
    #[inline]
    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        self.next().parent()
    }

    /// [`BlockDevice::parent_ref`].
    #[inline]
    fn parent_ref(&self) -> Option<ParentRef> {
        self.next().parent_ref()
    }

    /// [`BlockDevice::linkage_id`].
    #[inline]
    fn linkage_id(&self) -> Option<Guid> {
        self.next().linkage_id()
    }

    /// [`BlockDevice::allocated_bytes`].
    ///
    /// # Errors
    /// As [`BlockDevice::allocated_bytes`].
    #[inline]
    fn allocated_bytes(&self) -> Result<u64> {
        self.next().allocated_bytes()
    }

    /// [`BlockDevice::warnings`].
    #[inline]
    fn warnings(&self) -> Vec<String> {
        self.next().warnings()
    }

    /// [`FastPath::read_vectored_at`].
    ///
    /// # Errors
    /// As [`BlockDevice::read_at`].
    #[inline]
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        self.next().read_vectored_at(bufs, offset)
    }

    /// [`FastPath::try_read_at`].
    #[inline]
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        self.next().try_read_at(buf, offset)
    }

    /// [`FastPath::try_read_shared`].
    #[inline]
    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.next().try_read_shared(offset, len)
    }

    /// [`FastPath::shares_reads`].
    #[inline]
    fn shares_reads(&self) -> bool {
        self.next().shares_reads()
    }

    /// [`FastPath::read_shared`].
    #[inline]
    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.next().read_shared(offset, len)
    }

    /// [`FastPath::try_write_at`].
    #[inline]
    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        self.next().try_write_at(buf, offset)
    }

    /// [`FastPath::submit_read`].
    #[inline]
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        self.next().submit_read(offset, len)
    }

    /// [`FastPath::submit_write`].
    #[inline]
    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        self.next().submit_write(buf, offset)
    }
}

/// Every filter is a device: each call is the filter's method of the same name.
impl<T: Filter> BlockDevice for T {
    #[inline]
    fn geometry(&self) -> Geometry {
        Filter::geometry(self)
    }

    #[inline]
    fn size(&self) -> u64 {
        Filter::size(self)
    }

    #[inline]
    fn format(&self) -> &'static str {
        Filter::format(self)
    }

    #[inline]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        Filter::read_at(self, buf, offset)
    }

    #[inline]
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        Filter::write_at(self, buf, offset)
    }

    #[inline]
    fn flush(&self) -> Result<()> {
        Filter::flush(self)
    }

    #[inline]
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        Filter::trim(self, offset, len)
    }

    #[inline]
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        Filter::write_zeroes(self, offset, len)
    }

    #[inline]
    fn can_write(&self) -> bool {
        Filter::can_write(self)
    }

    #[inline]
    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        Filter::map_layer(self, offset, len)
    }

    #[inline]
    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        Filter::parent(self)
    }

    #[inline]
    fn parent_ref(&self) -> Option<ParentRef> {
        Filter::parent_ref(self)
    }

    #[inline]
    fn linkage_id(&self) -> Option<Guid> {
        Filter::linkage_id(self)
    }

    #[inline]
    fn allocated_bytes(&self) -> Result<u64> {
        Filter::allocated_bytes(self)
    }

    #[inline]
    fn warnings(&self) -> Vec<String> {
        Filter::warnings(self)
    }

    #[inline]
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// A filter's fast paths are its methods of the same names.
impl<T: Filter> FastPath for T {
    #[inline]
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        Filter::read_vectored_at(self, bufs, offset)
    }

    #[inline]
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        Filter::try_read_at(self, buf, offset)
    }

    #[inline]
    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        Filter::try_read_shared(self, offset, len)
    }

    #[inline]
    fn shares_reads(&self) -> bool {
        Filter::shares_reads(self)
    }

    #[inline]
    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        Filter::read_shared(self, offset, len)
    }

    #[inline]
    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        Filter::try_write_at(self, buf, offset)
    }

    #[inline]
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        Filter::submit_read(self, offset, len)
    }

    #[inline]
    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        Filter::submit_write(self, buf, offset)
    }
}

#[cfg(test)]
mod tests {
    /// The names of the methods of the item of `src` that starts with `header`.
    fn methods(src: &str, header: &str) -> Vec<String> {
        let body = src.split_once(header).expect(header).1;
        let body = &body[..body.find("\n}\n").expect("the end of the item")];
        let mut names: Vec<String> = body
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("fn "))
            .map(|l| l[..l.find(['(', '<']).expect("a method")].to_string())
            .collect();
        names.sort();
        names
    }

    /// A method added to `BlockDevice` with a default would otherwise answer with that
    /// default for every filter instead of passing the call on.
    #[test]
    fn every_call_of_a_device_has_a_filter_method_that_the_blanket_impls_call() {
        let (device, filter) = (include_str!("device.rs"), include_str!("filter.rs"));
        let block = methods(device, "pub trait BlockDevice:");
        let fast = methods(device, "pub trait FastPath:");
        assert_eq!(
            methods(filter, "impl<T: Filter> BlockDevice for T {"),
            block
        );
        assert_eq!(methods(filter, "impl<T: Filter> FastPath for T {"), fast);
        let mut calls: Vec<String> = block.into_iter().filter(|m| m != "fast_path").collect();
        calls.extend(fast);
        calls.push("next".to_string());
        calls.sort();
        assert_eq!(methods(filter, "pub trait Filter:"), calls);
    }
}
