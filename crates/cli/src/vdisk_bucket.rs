//! `ferry vdisk push|fill|verify`: vDisks in an S3-compatible bucket (see docs/s3.md).
//!
//! `push` uploads a local file as a new, write-once object with its manifest of BLAKE3
//! chunk hashes; `fill` copies a bucket prefix into a local store, checking every chunk;
//! `verify` compares a local store with the bucket's manifests, chunk by chunk. Also the
//! flags `ferry server --store s3://…` shares with them.

use bucket::Keys as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use bucket::{BucketUrl, S3Config};
use clap::Args;
use disk::ops::Progress as _;

use crate::progress::Bar;
use crate::{Global, check_status, print_json};

/// How to reach a bucket: shared by `ferry vdisk push|fill|verify` and `ferry server`.
#[derive(Debug, Clone, Args)]
pub struct S3Args {
    /// The S3-compatible server's endpoint, e.g. http://127.0.0.1:9000 (AWS when absent).
    #[arg(long, value_name = "URL", env = "FERRY_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// The bucket's region (default us-east-1).
    #[arg(long, value_name = "REGION", env = "AWS_REGION")]
    pub s3_region: Option<String>,
    /// A credentials file (mode 0600: AWS_ACCESS_KEY_ID=… and AWS_SECRET_ACCESS_KEY=…
    /// lines, or the AWS CLI's form); default: the AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY variables.
    #[arg(long, value_name = "FILE")]
    pub s3_credentials: Option<PathBuf>,
}

impl S3Args {
    /// As the bucket crate's configuration.
    pub fn config(&self) -> S3Config {
        S3Config {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            credentials_file: self.s3_credentials.clone(),
        }
    }
}

/// Arguments of `push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The local vDisk file (NAME.vhdx or NAME.N.avhdx).
    pub file: PathBuf,
    /// The bucket store: s3://BUCKET[/PREFIX].
    pub store: String,
    /// The object's name in the store (default: the file's name).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub s3: S3Args,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `fill`.
#[derive(Debug, Args)]
pub struct FillArgs {
    /// The bucket store: s3://BUCKET[/PREFIX].
    pub store: String,
    /// The local store directory to fill (created if missing).
    pub dir: PathBuf,
    #[command(flatten)]
    pub s3: S3Args,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The bucket store: s3://BUCKET[/PREFIX].
    pub store: String,
    /// The local store directory to compare with it.
    pub dir: PathBuf,
    /// Also read every chunk of every object from the bucket and check it against its
    /// manifest (reads the whole bucket): proves the bucket's bytes, not only the local copy
    #[arg(long)]
    pub bytes: bool,
    #[command(flatten)]
    pub s3: S3Args,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start async runtime")
}

/// A bar fed by the bucket crate's (done, total) callback.
struct Feed {
    bar: Bar,
    total: AtomicU64,
    done: AtomicU64,
}

impl Feed {
    fn new(global: Global, json: bool, label: &str) -> Feed {
        Feed {
            bar: Bar::new(global.quiet || json, label),
            total: AtomicU64::new(u64::MAX),
            done: AtomicU64::new(0),
        }
    }

    fn update(&self, done: u64, total: u64) {
        if self.total.swap(total, Ordering::Relaxed) != total {
            self.bar.set_total(total);
            self.done.store(0, Ordering::Relaxed);
        }
        let before = self.done.swap(done, Ordering::Relaxed);
        self.bar.advance(done.saturating_sub(before));
    }
}

fn client(
    store: &str,
    s3: &S3Args,
) -> anyhow::Result<(BucketUrl, std::sync::Arc<dyn object_store::ObjectStore>)> {
    let url = bucket::parse_url(store)?;
    let client = bucket::location::connect(&url, &s3.config())?;
    Ok((url, client))
}

/// `ferry vdisk push`.
///
/// # Errors
/// Bad URL, credentials, an object that exists, store and file errors.
pub fn push(a: &PushArgs, global: Global) -> anyhow::Result<ExitCode> {
    let (url, store) = client(&a.store, &a.s3)?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => a
            .file
            .file_name()
            .and_then(|n| n.to_str())
            .context("the file has no name")?
            .to_string(),
    };
    let feed = Feed::new(global, a.json, "uploading");
    let m = runtime()?.block_on(bucket::transfer::push(
        store.as_ref(),
        &url,
        &a.file,
        &name,
        &|d, t| feed.update(d, t),
    ))?;
    feed.bar.finish();
    if a.json {
        print_json(&serde_json::json!({
            "object": url.url_of(&name),
            "manifest": url.url_of(&bucket::manifest_name(&name)),
            "size": m.size,
            "chunk_size": m.chunk_size,
            "chunks": m.chunks.len(),
            "digest": hex::encode(m.digest),
        }))?;
    } else {
        outln!(
            "pushed {} ({} bytes, {} chunks, blake3 {})",
            url.url_of(&name),
            m.size,
            m.chunks.len(),
            hex::encode(m.digest)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry vdisk fill`.
///
/// # Errors
/// Bad URL, credentials, store errors, a hash mismatch, local I/O.
pub fn fill(a: &FillArgs, global: Global) -> anyhow::Result<ExitCode> {
    let (url, store) = client(&a.store, &a.s3)?;
    let feed = Feed::new(global, a.json, "filling");
    let r = runtime()?.block_on(bucket::transfer::fill(
        store.as_ref(),
        &url,
        &a.dir,
        &|d, t| feed.update(d, t),
    ))?;
    feed.bar.finish();
    if a.json {
        print_json(&r)?;
    } else {
        outln!(
            "filled {} from {url}: {} copied ({} bytes, every chunk verified), {} unchanged",
            a.dir.display(),
            r.copied.len(),
            r.bytes,
            r.unchanged.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The first 20 of `chunks`, comma-separated (a verify line's list).
fn first_chunks(chunks: &[u64]) -> String {
    chunks
        .iter()
        .take(20)
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ferry vdisk verify`: exit status 2 when anything differs or is missing.
///
/// # Errors
/// Bad URL, credentials, store errors, local I/O.
pub fn verify(a: &VerifyArgs, global: Global) -> anyhow::Result<ExitCode> {
    let (url, store) = client(&a.store, &a.s3)?;
    let feed = Feed::new(global, a.json, "verifying");
    let r = runtime()?.block_on(bucket::transfer::verify(
        store.as_ref(),
        &url,
        &a.dir,
        if a.bytes {
            bucket::transfer::Depth::Bytes
        } else {
            bucket::transfer::Depth::Manifests
        },
        &|d, t| feed.update(d, t),
    ))?;
    feed.bar.finish();
    if a.json {
        print_json(&r)?;
    } else {
        for (name, state) in &r.objects {
            match state {
                bucket::transfer::ObjectState::Same => outln!("{name}: same"),
                bucket::transfer::ObjectState::Missing => outln!("{name}: missing"),
                bucket::transfer::ObjectState::BucketCorrupt { chunks, chunk_size } => outln!(
                    "{name}: the bucket's bytes of {} chunk(s) of {chunk_size} bytes do not match its manifest: {}",
                    chunks.len(),
                    first_chunks(chunks)
                ),
                bucket::transfer::ObjectState::Differs { chunks, chunk_size } => outln!(
                    "{name}: {} chunk(s) of {chunk_size} bytes differ: {}",
                    chunks.len(),
                    first_chunks(chunks)
                ),
            }
        }
        for name in &r.local_only {
            outln!("{name}: only in {}", a.dir.display());
        }
    }
    Ok(check_status(r.all_same()))
}
