//! The [`Publisher`] a process gives the farm to upload versions of bucket stores (see
//! [`crate::publish`]); kept apart so that the farm's state (`db.rs`) can hold one.

use std::path::Path;

use crate::error::Result;

/// Uploads versions of bucket stores. Implemented outside the farm (by the CLI, with the `bucket` crate).
/// Calls block: the farm runs them on the blocking pool.
pub trait Publisher: Send + Sync + std::fmt::Debug {
    /// Publishes `file` as object `name` of `bucket` (`s3://BUCKET[/PREFIX]`) with its
    /// manifest, write-once. Already published with the same bytes: `Ok(false)`.
    ///
    /// # Errors
    /// [`crate::Kind::Conflict`] when the bucket holds other bytes under `name`;
    /// [`crate::Kind::Bucket`] when the bucket cannot be reached or refuses; [`crate::Kind::Image`] for
    /// a local file that cannot be read.
    fn publish(&self, bucket: &str, file: &Path, name: &str) -> Result<bool>;

    /// True when `bucket` holds an object (or a manifest) named `name`.
    ///
    /// # Errors
    /// [`crate::Kind::Bucket`].
    fn exists(&self, bucket: &str, name: &str) -> Result<bool>;
}
