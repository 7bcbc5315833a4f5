//! The network boot service: plain HTTP routes for iPXE, apart from the authenticated API.
//!
//! ```text
//!   iPXE ── GET /boot/ipxe ─────────────► chain /boot/ipxe/${netX/mac:hexhyp}
//!        ── GET /boot/ipxe/{mac} ───────► Farm::boot_plan ─► kernel/initrd/boot script,
//!                                         or a refusal script (reason, exit to firmware)
//!        ── GET /boot/files/{mac}/{vdisk}/{version}/kernel|initrd
//!                                    ───► Farm::boot_plan(mac) names that version?
//!                                         no ─► 404
//!                                         yes ─► DATA/boot-cache/ (filled once per version
//!                                         file state, through the version's chain) ─► bytes
//! ```
//!
//! It exposes boot data only (what any PXE server serves: scripts, kernels, initramfs
//! images) and nothing of the API: no route under `/api`, no farm secret, no file but a
//! version's boot files. The device logs in over the API's HTTPS afterwards, with its key
//! or, diskless, with the one-time ticket its own script carries (`farm::tickets`).
//!
//! **What is served to whom.** A machine gets the kernel and initramfs of the version its
//! login would be granted, and nothing else: the file URLs its script names carry its MAC,
//! and a file is served only when the farm's boot decision for that MAC
//! ([`farm::Farm::boot_plan`], login's own rules) names that vDisk and version, so a
//! maintenance version goes to the maintenance device only, and an unknown MAC gets at
//! most the auto-add collection's production version. The files are the ones the version's
//! boot configuration names (found in `/boot`, or the vDisk's `boot_kernel`/`boot_initrd`,
//! which must lie under `/boot`), read in the version's own filesystem with symlinks
//! resolved inside it, and refused when they lead out of `/boot` (`bootfiles::read`). A MAC
//! that is not one is shown bounded ([`boot_script::mac_shown`]).
//!
//! The boot files come from a [`BootSource`] (the `bootfiles` crate, bound by the server),
//! called on the blocking pool. A version's boot files are searched for once per version
//! file state and kept (`boot_versions.rs`, at most [`VERSIONS_MAX`] versions): the script,
//! the kernel and the initramfs of a boot, and every boot of a storm, share that search.
//! Requests are bounded ([`REQUESTS_MAX`] at once, more get 503) and searches and cache
//! fills more so ([`FILLS_MAX`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use farm::boot::{BootPlan, BootTarget};
use tokio::sync::Semaphore;

use crate::boot_cache::{self, CacheKey};
use crate::boot_script::{self, DeviceScript};
pub use crate::boot_source::{BootFileKind, BootInfo, BootOverrides, BootSource, Located};
pub use crate::boot_versions::VERSIONS_MAX;
use crate::boot_versions::{Search, Versions};

/// The most boot requests served at once; more are answered 503 at once.
pub const REQUESTS_MAX: usize = 64;
/// The most boot file reads through a chain (cache fills, boot file searches) at once.
pub const FILLS_MAX: usize = 2;
/// The largest kernel or initramfs served.
pub const BOOT_FILE_BYTES_MAX: u64 = 512 << 20;
/// The most farm API URLs a boot script names (each is tried in turn at login and by the
/// status reports; the kernel's command line is short).
pub const SCRIPT_API_URLS_MAX: usize = 4;
/// Refusals are logged at most once per this many milliseconds (the rest are counted).
pub const REFUSAL_LOG_EVERY_MS: i64 = 10_000;

/// How the boot service is set up.
#[derive(Debug, Clone)]
pub struct BootConfig {
    /// The farm API URLs the scripts tell the agent (`https://HOST:PORT`).
    pub api_urls: Vec<String>,
    /// True: after those, the scripts name the API URLs the other live servers of the
    /// device's site registered (at most [`SCRIPT_API_URLS_MAX`] in all), so that the
    /// device logs in and reports through another when this one goes away. False when the
    /// administrator named the URLs (`--boot-api-url`).
    pub site_apis: bool,
    /// The directory of cached boot files (made 0700 when missing).
    pub cache_dir: PathBuf,
    /// Where boot files come from.
    pub source: Arc<dyn BootSource>,
}

/// What the boot service has served, since it started.
#[derive(Debug, Default)]
pub struct BootCounters {
    /// Device scripts that boot a version.
    pub scripts: AtomicU64,
    /// Refusal scripts.
    pub refusals: AtomicU64,
    /// Boot files served.
    pub files: AtomicU64,
    /// Boot file bytes served.
    pub file_bytes: AtomicU64,
    /// Requests answered 404.
    pub not_found: AtomicU64,
    /// Requests answered 503 (too many at once).
    pub busy: AtomicU64,
    /// Cache fills (boot files read through a chain).
    pub fills: AtomicU64,
    /// Boot file searches (a version's chain opened and its filesystems searched): one per
    /// version file state while it stays among the [`VERSIONS_MAX`] kept.
    pub searches: AtomicU64,
}

impl BootCounters {
    /// The counters as (name, value) pairs, for a metrics page or a log line.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("scripts", g(&self.scripts)),
            ("refusals", g(&self.refusals)),
            ("files", g(&self.files)),
            ("file_bytes", g(&self.file_bytes)),
            ("not_found", g(&self.not_found)),
            ("busy", g(&self.busy)),
            ("fills", g(&self.fills)),
            ("searches", g(&self.searches)),
        ]
    }
}

/// What the boot handlers see.
#[derive(Debug, Clone)]
pub struct BootState {
    farm: Arc<farm::Farm>,
    server_id: Option<i64>,
    config: Arc<BootConfig>,
    counters: Arc<BootCounters>,
    requests: Arc<Semaphore>,
    fills: Arc<Semaphore>,
    versions: Arc<Versions>,
    refusal_logged_ms: Arc<AtomicI64>,
    refusals_unlogged: Arc<AtomicU64>,
}

impl BootState {
    /// The boot service of `farm` on the server `server_id` (its store paths apply).
    pub fn new(farm: Arc<farm::Farm>, server_id: Option<i64>, config: BootConfig) -> BootState {
        BootState {
            farm,
            server_id,
            config: Arc::new(config),
            counters: Arc::default(),
            requests: Arc::new(Semaphore::new(REQUESTS_MAX)),
            fills: Arc::new(Semaphore::new(FILLS_MAX)),
            versions: Arc::default(),
            refusal_logged_ms: Arc::new(AtomicI64::new(i64::MIN)),
            refusals_unlogged: Arc::default(),
        }
    }

    /// Its counters.
    pub fn counters(&self) -> Arc<BootCounters> {
        Arc::clone(&self.counters)
    }

    /// The API URLs a script for a device of `collection_id` names: this server's, then
    /// (with [`BootConfig::site_apis`]) those of its site's other live servers, at most
    /// [`SCRIPT_API_URLS_MAX`]. A database error leaves this server's alone.
    async fn api_urls(&self, collection_id: i64) -> Vec<String> {
        let mut urls = self.config.api_urls.clone();
        if self.config.site_apis {
            match self.farm.site_api_urls(collection_id).await {
                Ok(more) => {
                    for u in more {
                        if !urls.contains(&u) {
                            urls.push(u);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "the site's API URLs were not read"),
            }
        }
        urls.truncate(SCRIPT_API_URLS_MAX.max(self.config.api_urls.len()));
        urls
    }
}

/// The boot routes alone (mount nothing else beside them on the boot listener).
pub fn router(state: BootState) -> Router {
    Router::new()
        .route("/boot/ipxe", get(chain))
        .route("/boot/ipxe/{mac}", get(device))
        .route("/boot/files/{mac}/{vdisk_id}/{version}/{name}", get(file))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), bounded))
        .with_state(state)
}

/// Answers 503 when [`REQUESTS_MAX`] requests are under way.
async fn bounded(State(s): State<BootState>, req: Request, next: Next) -> Response {
    let Ok(_permit) = Arc::clone(&s.requests).try_acquire_owned() else {
        s.counters.busy.fetch_add(1, Ordering::Relaxed);
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "boot service busy; try again\n",
        );
    };
    next.run(req).await
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn ipxe(body: String) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn not_found(State(s): State<BootState>) -> Response {
    s.counters.not_found.fetch_add(1, Ordering::Relaxed);
    text(StatusCode::NOT_FOUND, "not a boot file of this farm\n")
}

async fn chain() -> Response {
    ipxe(boot_script::chain_script())
}

impl BootState {
    fn refuse(&self, mac: &str, reason: &str) -> Response {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        let now = self.farm.now_ms();
        let last = self.refusal_logged_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= REFUSAL_LOG_EVERY_MS
            && self
                .refusal_logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let unlogged = self.refusals_unlogged.swap(0, Ordering::Relaxed);
            let mac = boot_script::mac_shown(mac);
            tracing::warn!(mac, reason, unlogged, "boot refused");
        } else {
            self.refusals_unlogged.fetch_add(1, Ordering::Relaxed);
        }
        ipxe(boot_script::refusal_script(reason))
    }

    /// The located boot files of version `key` (file `image`): kept, or searched for now.
    async fn located(
        &self,
        key: &CacheKey,
        image: &std::path::Path,
    ) -> Result<Arc<dyn Located>, String> {
        let search = Search {
            source: &self.config.source,
            fills: &self.fills,
            searches: &self.counters.searches,
        };
        self.versions.located(key, image, search).await
    }

    /// What the version of `t` offers.
    async fn info(&self, t: &BootTarget) -> Result<BootInfo, String> {
        let overrides = overrides_of(&t.vdisk);
        let key = boot_cache::key_of(&t.path, t.vdisk.id, t.version.number, &overrides)
            .await
            .map_err(|e| format!("version file {}: {e}", t.version.file_name))?;
        Ok(self.located(&key, &t.path).await?.info(&overrides))
    }
}

fn overrides_of(v: &farm::model::VDisk) -> BootOverrides {
    BootOverrides {
        kernel: v.boot_kernel.clone(),
        initrd: v.boot_initrd.clone(),
    }
}

async fn device(State(s): State<BootState>, UrlPath(mac): UrlPath<String>) -> Response {
    let plan = match s.farm.boot_plan(&mac, s.server_id).await {
        Ok(p) => p,
        Err(e) if e.kind() == farm::Kind::InvalidInput => {
            let shown = boot_script::mac_shown(&mac);
            return s.refuse(&mac, &format!("{shown} is not a MAC address"));
        }
        Err(e) => {
            tracing::error!(mac = boot_script::mac_shown(&mac), error = %e, "boot plan failed");
            return s.refuse(
                &mac,
                "the farm could not decide (server error: see its log)",
            );
        }
    };
    let t = match plan {
        BootPlan::Boot(t) => t,
        BootPlan::Refuse(r) => return s.refuse(&mac, &r.reason),
    };
    let info = match s.info(&t).await {
        Ok(i) => i,
        Err(e) => {
            let why = format!(
                "version {} of vDisk {} has no kernel to boot: {e}",
                t.version.number, t.vdisk.name
            );
            return s.refuse(&mac, &why);
        }
    };
    let name = if t.auto_add {
        "(new, added at login)".to_string()
    } else {
        t.device.name.clone()
    };
    // A diskless device's one-time login ticket for this boot (farm::tickets).
    let ticket = match s.farm.issue_boot_ticket(&t.device.mac).await {
        Ok(t) => t,
        Err(e) => return s.refuse(&mac, &format!("no login ticket for this boot: {e}")),
    };
    let api_urls = s.api_urls(t.device.collection_id).await;
    let d = DeviceScript {
        mac: &t.device.mac,
        device: &name,
        vdisk_id: t.vdisk.id,
        vdisk: &t.vdisk.name,
        version: t.version.number,
        api_urls: &api_urls,
        root: info.root,
        initrd: info.initrd,
        image_cmdline: info.cmdline.as_deref(),
        vdisk_cmdline: &t.vdisk.boot_cmdline,
        ticket: ticket.as_deref(),
    };
    match boot_script::device_script(&d) {
        Ok(script) => {
            s.counters.scripts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                mac = %t.device.mac, vdisk = %t.vdisk.name, version = t.version.number,
                auto_add = t.auto_add, "boot script served"
            );
            script_response(script)
        }
        Err(e) => s.refuse(&mac, &e.to_string()),
    }
}

fn script_response(script: String) -> Response {
    ipxe(script)
}

async fn file(
    State(s): State<BootState>,
    UrlPath((mac, vdisk_id, version, name)): UrlPath<(String, i64, i64, String)>,
) -> Response {
    let kind = match name.as_str() {
        "kernel" => BootFileKind::Kernel,
        "initrd" => BootFileKind::Initrd,
        _ => return not_found(State(s)).await,
    };
    let what = format!("no {} for that machine", kind.as_str());
    let served = match s.granted(&mac, vdisk_id, version).await {
        Some(t) => serve_file(&s, &t, kind, &what).await,
        None => Err(what),
    };
    match served {
        Ok(r) => r,
        Err(why) => {
            s.counters.not_found.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::NOT_FOUND, format!("{why}\n"))
        }
    }
}

impl BootState {
    /// What `mac` boots, when the farm's boot decision for it names version `number` of
    /// vDisk `vdisk_id` (the version its login would be granted); `None` otherwise, alike
    /// for a malformed MAC, an unknown one, another version and an error.
    async fn granted(&self, mac: &str, vdisk_id: i64, number: i64) -> Option<BootTarget> {
        match self.farm.boot_plan(mac, self.server_id).await {
            Ok(BootPlan::Boot(t)) if t.vdisk.id == vdisk_id && t.version.number == number => {
                Some(*t)
            }
            Ok(_) => None,
            Err(e) => {
                if e.kind() != farm::Kind::InvalidInput {
                    tracing::error!(mac = boot_script::mac_shown(mac), error = %e, "boot plan failed");
                }
                None
            }
        }
    }
}

/// Serves `kind` of the version `t` boots (cached, or read through its chain now).
async fn serve_file(
    s: &BootState,
    t: &BootTarget,
    kind: BootFileKind,
    what: &str,
) -> Result<Response, String> {
    let (vdisk_id, number, path) = (t.vdisk.id, t.version.number, &t.path);
    let overrides = overrides_of(&t.vdisk);
    let key = boot_cache::key_of(path, vdisk_id, number, &overrides)
        .await
        .map_err(|_| format!("{what}: the version's file is missing"))?;
    let dir = s.config.cache_dir.clone();
    let cached = boot_cache::path_of(&dir, &key, kind);
    if !tokio::fs::try_exists(&cached).await.unwrap_or(false) {
        // Found before taking a fill permit: a search takes one of its own.
        let located = s
            .located(&key, path)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        let _fill = s.fills.acquire().await.map_err(|e| e.to_string())?;
        if !tokio::fs::try_exists(&cached).await.unwrap_or(false) {
            s.counters.fills.fetch_add(1, Ordering::Relaxed);
            let k = key.clone();
            tokio::task::spawn_blocking(move || {
                let bytes = located.read(kind, &overrides, BOOT_FILE_BYTES_MAX)?;
                boot_cache::store(&dir, &k, kind, &bytes).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| format!("boot file read stopped: {e}"))?
            .map_err(|e| {
                tracing::warn!(vdisk_id, number, kind = kind.as_str(), error = %e, "boot file");
                format!("{what}: {e}")
            })?;
        }
    }
    let f = tokio::fs::File::open(&cached)
        .await
        .map_err(|e| format!("{what}: cache: {e}"))?;
    let len = f
        .metadata()
        .await
        .map_err(|e| format!("{what}: cache: {e}"))?
        .len();
    s.counters.files.fetch_add(1, Ordering::Relaxed);
    s.counters.file_bytes.fetch_add(len, Ordering::Relaxed);
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(f));
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        body,
    )
        .into_response())
}
