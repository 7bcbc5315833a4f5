//! Image operations built on [`crate::BlockDevice`]: convert, capture, merge, compact, check
//! and info. Each long operation reports progress through [`Progress`] so the CLI can draw a
//! bar; the library itself prints nothing.

pub mod capture;
pub mod check;
pub mod compact;
pub mod convert;
pub mod copy;
pub mod info;
pub mod merge;

/// Progress reporting for long operations (implemented by the CLI with indicatif).
pub trait Progress: Sync {
    /// The total amount of work, in bytes.
    fn set_total(&self, bytes: u64);
    /// `bytes` more are done.
    fn advance(&self, bytes: u64);
    /// A phase name ("copying", "verifying", ...).
    fn phase(&self, name: &str);
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn set_total(&self, _bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn phase(&self, _name: &str) {}
}

/// What a copy-like operation did, for `--json` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyStats {
    /// Virtual size of the output.
    pub virtual_size: u64,
    /// Bytes read from the source(s).
    pub bytes_read: u64,
    /// Bytes of data written to the output.
    pub bytes_written: u64,
    /// Blocks skipped because they were unallocated or all zero.
    pub blocks_skipped: u64,
    /// Blocks written.
    pub blocks_written: u64,
    /// Output file size after the operation.
    pub output_file_size: u64,
}
