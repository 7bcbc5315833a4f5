//! `ferry server --store s3://BUCKET/PREFIX`: a bucket served as a store, through a local
//! tier directory (see the `bucket` crate's `tier_store` and docs/s3.md). The tier directory
//! becomes the store directory the registry scans, and every layer's bytes are read through
//! the bucket's hash-checked tiered objects.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bucket::BucketUrl;
use bucket::tier_store::TierStore;
use clap::Args;

use crate::vdisk_bucket::S3Args;

/// How often the server lists the bucket again for versions pushed since.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// The bucket flags of `ferry server`.
#[derive(Debug, Clone, Args)]
pub struct BucketArgs {
    #[command(flatten)]
    pub s3: S3Args,
    /// With --store s3://…: the local tier directory where fetched chunks are kept across
    /// restarts (created 0700; default: ~/.cache/ferry/tier/BUCKET/PREFIX).
    #[arg(long, value_name = "DIR")]
    pub tier_dir: Option<PathBuf>,
}

fn default_tier_dir(url: &BucketUrl) -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/var/cache"), PathBuf::from);
    let mut p = home.join(".cache/ferry/tier").join(&url.bucket);
    if !url.prefix.is_empty() {
        p = p.join(url.prefix.replace('/', "_"));
    }
    p
}

/// The bucket store `store` names, laid out in its tier directory, or `None` for a
/// directory store. Relists the bucket every [`RESCAN_INTERVAL`] in the background.
///
/// # Errors
/// A bad URL, credentials, an unreachable bucket with an empty tier, local errors.
pub fn open(store: Option<&Path>, a: &BucketArgs) -> anyhow::Result<Option<Arc<TierStore>>> {
    let Some(text) = store.and_then(Path::to_str) else {
        return Ok(None);
    };
    if !BucketUrl::is_bucket(text) {
        return Ok(None);
    }
    let url = BucketUrl::parse(text)?;
    let dir = a.tier_dir.clone().unwrap_or_else(|| default_tier_dir(&url));
    let (tier, report) = TierStore::open(url.clone(), &a.s3.config(), &dir)
        .with_context(|| format!("serve bucket store {url}"))?;
    tracing::info!(
        bucket = %url,
        tier = %tier.dir().display(),
        objects = report.objects.len(),
        skipped = ?report.skipped,
        manifest_changed = ?report.changed,
        offline = report.offline.as_deref().unwrap_or(""),
        "bucket store"
    );
    let tier = Arc::new(tier);
    let weak = Arc::downgrade(&tier);
    std::thread::Builder::new()
        .name("ferry-bucket-rescan".into())
        .spawn(move || {
            loop {
                std::thread::sleep(RESCAN_INTERVAL);
                let Some(t) = weak.upgrade() else { return };
                match t.sync() {
                    Ok(r) => tracing::debug!(objects = r.objects.len(), "bucket relisted"),
                    Err(e) => tracing::warn!(error = %e, "bucket relist failed"),
                }
            }
        })
        .context("start the bucket rescan thread")?;
    Ok(Some(tier))
}
