//! S3-compatible vDisk stores. A store may be a bucket plus a prefix holding the same files
//! as a local store (`NAME.vhdx`, `NAME.N.avhdx`), each with a manifest object beside it
//! (`NAME.vhdx.manifest`, see the `manifest` crate) that lists a BLAKE3 hash per chunk.
//!
//! - [`location`]: `s3://BUCKET/PREFIX` URLs, endpoint, region and credentials, and the
//!   `object_store` client built from them.
//! - [`objects`]: what a bucket prefix holds (listing, existence) and an object's manifest,
//!   fetched and checked; the tier store and the transfers both read the bucket through it.
//! - [`bridge`]: runs the client's futures from the synchronous [`disk::Storage`] calls.
//! - [`tier`]: [`tier::TieredObject`], a read-only `Storage` over one object: chunk-sized
//!   ranged GETs, each chunk checked against the manifest before it is used, kept in a local
//!   sparse tier file with a persisted map of the chunks present.
//! - [`tier_store`]: a tier directory laid out as a local store (empty placeholder files
//!   the store scan finds) and the [`disk::open::StorageOpener`] that reads them through
//!   their tiered objects.
//! - [`transfer`]: write-once upload of a local file with its manifest, fill of a local
//!   store from a bucket, and verify of a local store against the bucket's manifests.

#![warn(missing_docs)]

pub mod bridge;
pub mod error;
pub mod location;
pub mod objects;
pub mod tier;
pub mod tier_store;
pub mod transfer;

pub use error::BucketError;
pub use location::{BucketUrl, Keys, S3Config, parse_url};

/// The suffix of a manifest object or file: `NAME.vhdx` has `NAME.vhdx.manifest`.
pub const MANIFEST_SUFFIX: &str = ".manifest";

/// The manifest key or file name of object `name`.
pub fn manifest_name(name: &str) -> String {
    format!("{name}{MANIFEST_SUFFIX}")
}

/// True for the file names a store serves: `NAME.vhdx` and `NAME.N.avhdx` (checked as the
/// local store does, with no hidden or oddly named files).
pub fn is_vdisk_file(name: &str) -> bool {
    manifest::check_name(name).is_ok() && (name.ends_with(".vhdx") || name.ends_with(".avhdx"))
}
