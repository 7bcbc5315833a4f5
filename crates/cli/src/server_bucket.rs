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
    let url = bucket::parse_url(text)?;
    let dir = a.tier_dir.clone().unwrap_or_else(|| default_tier_dir(&url));
    open_tier(url, &dir, a).map(Some)
}

/// The farm's bucket store `url`, with `dir` (the store's directory on this server) as its
/// tier: published versions are read from the bucket, the others from `dir` itself.
///
/// # Errors
/// As [`open`].
pub fn open_at(url: &str, dir: &Path, a: &BucketArgs) -> anyhow::Result<Arc<TierStore>> {
    if a.tier_dir.is_some() {
        anyhow::bail!(
            "--tier-dir: a farm's bucket store is tiered in the store's directory on this \
             server (set another with `ferry store path`)"
        );
    }
    open_tier(bucket::parse_url(url)?, dir, a)
}

fn open_tier(url: BucketUrl, dir: &Path, a: &BucketArgs) -> anyhow::Result<Arc<TierStore>> {
    let (tier, report) = TierStore::open(url.clone(), &a.s3.config(), dir)
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
    Ok(tier)
}

/// Appends the bucket tier's counters to a `/metrics` exposition.
pub fn render_metrics(t: &bucket::tier::TierStats, out: &mut String) {
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering::Relaxed;
    let counters: [(&str, &str, u64); 4] = [
        (
            "gets",
            "Ranged GETs made to the bucket",
            t.gets.load(Relaxed),
        ),
        (
            "fetched_bytes",
            "Bytes fetched from the bucket",
            t.fetched_bytes.load(Relaxed),
        ),
        (
            "chunks_read",
            "Chunks read from the local tier instead of the bucket (first use in this process)",
            t.tier_chunks.load(Relaxed),
        ),
        (
            "hash_mismatches",
            "Chunks refused because their bytes did not hash to the manifest's",
            t.mismatches.load(Relaxed),
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(out, "# HELP ferry_tier_{name}_total {help}.");
        let _ = writeln!(out, "# TYPE ferry_tier_{name}_total counter");
        let _ = writeln!(out, "ferry_tier_{name}_total {v}");
    }
}

/// The farm's [`farm::Publisher`] for bucket stores, from the process's `--s3-*` flags:
/// write-once uploads with [`bucket::transfer::publish`], one client per bucket URL.
#[derive(Debug)]
pub struct FarmPublisher {
    config: bucket::S3Config,
    bridge: std::sync::OnceLock<bucket::bridge::Bridge>,
    stores: std::sync::Mutex<std::collections::HashMap<String, Arc<dyn object_store::ObjectStore>>>,
}

impl FarmPublisher {
    /// A publisher reaching buckets with `config` (the runtime starts at the first upload).
    pub fn new(config: bucket::S3Config) -> FarmPublisher {
        FarmPublisher {
            config,
            bridge: std::sync::OnceLock::new(),
            stores: std::sync::Mutex::default(),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        bucket_url: &str,
        f: impl FnOnce(Arc<dyn object_store::ObjectStore>, BucketUrl) -> BoxFut<T>,
    ) -> farm::Result<T> {
        let url = bucket::parse_url(bucket_url).map_err(to_farm)?;
        let store = {
            let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
            match stores.get(bucket_url) {
                Some(s) => s.clone(),
                None => {
                    let s = bucket::location::connect(&url, &self.config).map_err(to_farm)?;
                    stores.insert(bucket_url.to_string(), s.clone());
                    s
                }
            }
        };
        if self.bridge.get().is_none() {
            let b = bucket::bridge::Bridge::new().map_err(to_farm)?;
            let _ = self.bridge.set(b);
        }
        let bridge = self.bridge.get().ok_or_else(|| {
            farm::FarmError::new(farm::Kind::Bucket, "bucket runtime did not start")
        })?;
        bridge.run(f(store, url)).map_err(to_farm)?.map_err(to_farm)
    }
}

/// A request's future, run on the publisher's bridge.
type BoxFut<T> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<T, bucket::BucketError>> + Send + 'static>,
>;

fn to_farm(e: bucket::BucketError) -> farm::FarmError {
    let kind = match &e {
        bucket::BucketError::Exists(_) => farm::Kind::Conflict,
        bucket::BucketError::Io { .. } => farm::Kind::Image,
        _ => farm::Kind::Bucket,
    };
    farm::FarmError::new(kind, contract::ErrorChain(&e).to_string())
}

impl farm::Publisher for FarmPublisher {
    fn publish(&self, bucket_url: &str, file: &Path, name: &str) -> farm::Result<bool> {
        let (file, name) = (file.to_path_buf(), name.to_string());
        let done = self.run(bucket_url, move |store, url| {
            Box::pin(
                async move { bucket::transfer::publish(store.as_ref(), &url, &file, &name).await },
            )
        })?;
        Ok(done == bucket::transfer::Published::Uploaded)
    }

    fn exists(&self, bucket_url: &str, name: &str) -> farm::Result<bool> {
        let name = name.to_string();
        self.run(bucket_url, move |store, url| {
            Box::pin(async move { bucket::transfer::holds(store.as_ref(), &url, &name).await })
        })
    }
}
