//! Ferry's image library: virtual block devices over VHDX, VHD and raw files.
//!
//! ```text
//!            BlockDevice (read/write/flush/trim/zero/extents, &self, positional)
//!      ┌───────────┬──────────────┬─────────────┐
//!   RawDisk     VhdxImage      VhdImage      (later: caches, remote)
//!      │        │  parent ─────► Arc<dyn BlockDevice>  (differencing chain)
//!      └────────┴──── Storage (read_at/write_at/flush/len/set_len/punch_hole)
//!                      ├── std::fs::File
//!                      └── testkit::SimDisk (crash / torn-write simulation)
//! ```
//!
//! The format codecs live in the pure `vhdx` crate; this crate performs the I/O they describe.
//! Images open through [`open::open`] (by magic, with the parent chain resolved), and the
//! operations (`convert`, `capture`, `merge`, `check`, `compact`) are built on [`BlockDevice`].
//! A decorator that changes some calls of the device below and passes the rest on (a
//! counter, a watch) is a [`Filter`], which names only the calls it changes.

#![warn(missing_docs)]

pub mod bytes;
pub mod device;
pub mod error;
pub mod file;
pub mod filter;
pub mod inline;
pub mod open;
pub mod ops;
pub mod overlay;
pub mod raw;
pub mod storage;
pub mod version;
pub mod vhd;
pub mod vhdx;
pub use overlay::OverlayStorage;

pub use device::{BlockDevice, Extent, ExtentKind, FastPath};
pub use error::{Error, ErrorKind, Result};
pub use filter::Filter;
pub use storage::{DIRECT_ALIGN, FileStorage, Storage};
