//! Bucket stores: a store whose `bucket` is set publishes each version that leaves
//! maintenance to that bucket, as a write-once object beside its manifest of chunk hashes,
//! before the farm records the change. The farm does not speak S3 itself: the process that
//! runs the lifecycle gives it a [`Publisher`] (`publisher.rs`) (`ferry server` makes one from its `--s3-*`
//! flags with the `bucket` crate).
//!
//! # Design notes
//!
//! * The store's directory stays the lifecycle's working directory: versions are made
//!   there as in a directory store, maintenance versions live only there, and servers read
//!   published versions from the bucket through their tier.
//! * Publication happens where a version becomes immutable: version 0 when the vDisk is
//!   added (it is production), `promote` out of maintenance, `merge` into a version that is
//!   not in maintenance (automatic merges too). Each is done before the row changes, so a
//!   version the farm names as test or production is always in the bucket.
//! * A published version is never rewritten: `revert` to maintenance is refused in a bucket
//!   store (make a new version instead), `delete` leaves the objects in the bucket (servers
//!   may have pinned their manifests; expire old objects with the bucket's own lifecycle
//!   rules), and a new version takes the next number the bucket holds no file of, so a
//!   number is never reused for other bytes.
//! * Publishing again after a crash between the upload and the row is safe: an object that
//!   is already there with the same manifest counts as published; one with other bytes is
//!   a conflict naming the object.

use std::path::PathBuf;

use crate::db::Farm;
use crate::error::{FarmError, Kind, Result};
use crate::model::Store;
use crate::publisher::Publisher;

impl Farm {
    /// Sets the publisher used for the lifecycle of bucket stores (once per process; a
    /// second call replaces the first).
    pub fn set_publisher(&self, p: std::sync::Arc<dyn Publisher>) {
        *self.publisher.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    fn publisher_for(&self, store: &Store) -> Result<std::sync::Arc<dyn Publisher>> {
        self.publisher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                FarmError::new(
                    Kind::Bucket,
                    format!(
                        "store {:?} is a bucket store ({}), and this process has no S3 \
                         access configured (start it with the --s3-* flags)",
                        store.name, store.bucket
                    ),
                )
            })
    }

    /// Store `store_id` when it is a bucket store.
    pub(crate) async fn bucket_store(&self, store_id: i64) -> Result<Option<Store>> {
        let s = self.store(store_id).await?;
        Ok((!s.bucket.is_empty()).then_some(s))
    }

    /// Publishes `file` (a version of a vDisk of `store`) as `name`, when `store` is a
    /// bucket store; does nothing for a directory store.
    ///
    /// # Errors
    /// See [`Publisher::publish`]; [`Kind::Bucket`] without a publisher.
    pub(crate) async fn publish_file(
        &self,
        store: Option<&Store>,
        file: PathBuf,
        name: &str,
    ) -> Result<()> {
        let Some(store) = store else { return Ok(()) };
        let p = self.publisher_for(store)?;
        let (bucket, n) = (store.bucket.clone(), name.to_string());
        let fresh = run(move || p.publish(&bucket, &file, &n)).await?;
        tracing::info!(object = name, bucket = %store.bucket, fresh, "version published");
        Ok(())
    }

    /// The first version number from `from` that the bucket of `store` holds under no file
    /// name of vDisk `vdisk` (`NAME.N.avhdx` or `NAME.N.vhdx`); `from` for a directory store.
    ///
    /// # Errors
    /// [`Kind::Bucket`].
    pub(crate) async fn unused_number(
        &self,
        store: Option<&Store>,
        from: i64,
        vdisk: &str,
    ) -> Result<i64> {
        let Some(store) = store else { return Ok(from) };
        let p = self.publisher_for(store)?;
        let mut n = from;
        while n < crate::lifecycle::VERSIONS_MAX {
            let mut held = false;
            for ext in ["avhdx", "vhdx"] {
                let (p, bucket) = (p.clone(), store.bucket.clone());
                let name = format!("{vdisk}.{n}.{ext}");
                held |= run(move || p.exists(&bucket, &name)).await?;
            }
            if !held {
                return Ok(n);
            }
            n += 1;
        }
        Err(FarmError::conflict(format!(
            "a vdisk has at most {} versions",
            crate::lifecycle::VERSIONS_MAX
        )))
    }
}

async fn run<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| FarmError::new(Kind::Bucket, format!("bucket task: {e}")))?
}
