//! `ferry server --farm DIR`: the server as a member of a farm.
//!
//! On top of the store's NBD exports, the server then
//! * serves the farm's REST API and web console (`--api-listen`, default 0.0.0.0:8080),
//!   over HTTPS with `--api-tls-dir` ([`api_tls`]); plain HTTP only on a loopback address;
//! * resolves the session-scoped export names of device login (`ferry-s-…`) through the
//!   farm's session table ([`FarmSessions`]), so a logged-in target reads exactly the version
//!   its device type boots, in its cache mode;
//! * registers itself in the farm (a site, a name and the NBD address devices reach) and
//!   heartbeats every [`HEARTBEAT_EVERY`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use contract::{CacheMode, DeviceName, ExportName, Mac, SessionKey, VdiskName};
use farm::sessions::{SessionGrant, SessionLookup as _, SessionTable};
use farm::{Clock as _, SystemClock};

/// How often a farm server records its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// The site a server joins when the farm has none and `--site` is not given.
pub const DEFAULT_SITE: &str = "default";

/// Maps the farm's session grants to the export names of [`server::exports::Registry`].
///
/// A session this process does not hold (granted by another server of the farm, or by
/// this one before a restart) is looked up in the farm database and remembered: the
/// database is the source of truth, the table a cache of it.
#[derive(Debug)]
pub struct FarmSessions {
    table: Arc<SessionTable>,
    farm: Arc<farm::Farm>,
    server_id: i64,
    runtime: tokio::runtime::Handle,
    store_dir: PathBuf,
}

impl FarmSessions {
    /// Grants of `handle`'s farm whose store is `store_dir` (the one this registry
    /// serves); database lookups run on `runtime` (the resolver is called on its blocking
    /// pool).
    pub fn new(
        handle: &FarmHandle,
        runtime: tokio::runtime::Handle,
        store_dir: &Path,
    ) -> FarmSessions {
        let store_dir = store_dir
            .canonicalize()
            .unwrap_or_else(|_| store_dir.to_path_buf());
        FarmSessions {
            table: handle.farm.session_table(),
            farm: Arc::clone(&handle.farm),
            server_id: handle.server_id,
            runtime,
            store_dir,
        }
    }

    /// The live grant of `export_name`: the table's, else the database's.
    fn grant(&self, export_name: &str) -> Option<SessionGrant> {
        if let Some(g) = self.table.lookup(export_name, SystemClock.now_ms()) {
            return Some(g);
        }
        let found = self
            .runtime
            .block_on(self.farm.session_grant(export_name, Some(self.server_id)));
        match found {
            Ok(g) => {
                if g.is_some() {
                    tracing::info!(
                        session = export_name,
                        "session found in the farm database (granted by another server or before a restart)"
                    );
                }
                g
            }
            Err(e) => {
                tracing::warn!(session = export_name, error = %e, "farm database lookup of a session failed");
                None
            }
        }
    }
}

/// The registry export a grant stands for (`NAME@V`, `NAME@V+aa-bb-cc-dd-ee-ff`,
/// `...+persistent`, or `NAME+private` when it writes the version itself), or why there is
/// none.
pub fn export_for(g: &SessionGrant) -> Result<ExportName, String> {
    let vdisk = VdiskName::new(&g.vdisk_name).map_err(|e| format!("vdisk name: {e}"))?;
    let mac: Mac = g.mac.parse().map_err(|e| format!("mac {:?}: {e}", g.mac))?;
    let device = DeviceName::of_mac(mac);
    if g.writable || g.cache_mode == CacheMode::Private {
        return Ok(ExportName::Private { vdisk });
    }
    let version = u32::try_from(g.version).map_err(|_| format!("version {}", g.version))?;
    ExportName::for_cache_mode(g.cache_mode, vdisk, Some(version), device.as_str())
        .map_err(|e| e.to_string())
}

impl server::exports::SessionResolver for FarmSessions {
    fn resolve(&self, key: &SessionKey) -> Option<server::access::SessionExport> {
        let export_name = ExportName::Session(key.clone()).to_string();
        let g = self.grant(&export_name)?;
        let dir = g.store_dir.canonicalize().unwrap_or(g.store_dir.clone());
        if dir != self.store_dir {
            tracing::warn!(
                session = export_name,
                store = %g.store_dir.display(),
                served = %self.store_dir.display(),
                "session's vDisk lives in a store this server does not serve"
            );
            return None;
        }
        let device: Mac = g
            .mac
            .parse()
            .inspect_err(|e| tracing::warn!(session = export_name, error = %e, "session's MAC"))
            .ok()?;
        export_for(&g)
            .inspect_err(|why| {
                tracing::warn!(session = export_name, why, "session names no export");
            })
            .ok()
            .map(|export| server::access::SessionExport { export, device })
    }
}

/// What `ferry server` needs of its farm.
#[derive(Debug)]
pub struct FarmHandle {
    /// The farm.
    pub farm: Arc<farm::Farm>,
    /// This server's id in the farm.
    pub server_id: i64,
    /// This server's name in the farm.
    pub name: String,
    /// The NBD address devices are told to use.
    pub advertise: String,
}

/// How often a farm server checks that the sessions open on it still exist in the farm
/// database (ended by another server's API, or expired), closing those that do not.
pub const SESSION_RECHECK_EVERY: Duration = Duration::from_secs(10);

/// This server's certificate from the farm's authority, for the host it is advertised at
/// and the local names (issued once and kept in the farm's secrets directory).
///
/// # Errors
/// The farm has no authority (an old farm: `ferry farm init` made none), or issuing failed.
pub async fn tls_material(handle: &FarmHandle) -> anyhow::Result<crate::server_tls::TlsMaterial> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    let host = handle
        .advertise
        .rsplit_once(':')
        .map_or(handle.advertise.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if !host.is_empty() && !hosts.contains(&host) {
        hosts.push(host);
    }
    let (ca_pem, issued) = handle
        .farm
        .server_tls(&handle.name, &hosts)
        .context("this server's certificate from the farm's authority")?;
    Ok(crate::server_tls::TlsMaterial {
        ca_pem,
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    })
}

/// Closes the connections of every session that ends: at once for sessions this process's
/// farm API ends (the session table tells), and within [`SESSION_RECHECK_EVERY`] for
/// sessions ended elsewhere (another server's API, expiry), checked against the database.
pub fn close_ended_sessions(
    handle: &FarmHandle,
    registry: &server::exports::Registry,
    runtime: &tokio::runtime::Handle,
) {
    let reg = registry.clone();
    handle.farm.session_table().on_end(move |name| {
        reg.revoke_session(name);
    });
    let reg = registry.clone();
    let farm = Arc::clone(&handle.farm);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(SESSION_RECHECK_EVERY);
        loop {
            tick.tick().await;
            for name in reg.open_session_names() {
                match farm.session_by_export(&name).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        farm.session_table().remove(&name);
                        reg.revoke_session(&name);
                    }
                    Err(e) => tracing::warn!(error = %e, "session recheck failed"),
                }
            }
        }
    });
}

/// Opens the farm in `data` (SQLite there, or `db`), finds the store to serve (`store`, or
/// the farm's first store), and registers this server as `name` at `advertise` in `site`.
/// Returns the handle, the store's directory and, for a bucket store, its bucket URL (the
/// directory is then the server's tier of it).
///
/// # Errors
/// No farm there, no store, or database errors.
pub async fn open(
    data: &Path,
    db: Option<String>,
    store: Option<&Path>,
    site: Option<i64>,
    name: &str,
    advertise: &str,
) -> anyhow::Result<(FarmHandle, PathBuf, Option<String>)> {
    let config = farm::FarmConfig {
        data_dir: data.to_path_buf(),
        db_url: db,
        store_root: None,
    };
    let farm = farm::Farm::open(&config)
        .await
        .context("open farm database")?;
    if !farm.is_initialized().await? {
        anyhow::bail!(
            "no farm in {}; run `ferry farm init --data {0}` first",
            data.display()
        );
    }
    let site_id = match site {
        Some(id) => id,
        None => {
            let sites = farm.list_sites(Some(1), Some(0)).await?;
            match sites.items.first() {
                Some(s) => s.id,
                None => {
                    let new = farm::input::NewSite {
                        name: DEFAULT_SITE.into(),
                        description: "created by ferry server".into(),
                    };
                    farm.create_site(&new, "ferry-server").await?.id
                }
            }
        }
    };
    let me = farm
        .register_server(
            &farm::input::NewServer {
                site_id,
                name: name.to_string(),
                address: advertise.to_string(),
            },
            "ferry-server",
        )
        .await
        .context("register this server in the farm")?;
    let (store_dir, bucket) = match store {
        Some(dir) => (dir.to_path_buf(), bucket_of_dir(&farm, dir, me.id).await?),
        None => {
            let stores = farm.list_stores(Some(1), Some(0)).await?;
            let first = stores.items.first().with_context(|| {
                "the farm has no store yet: add one (`ferry store add NAME --path DIR`) or pass --store"
            })?;
            let bucket = (!first.bucket.is_empty()).then(|| first.bucket.clone());
            (farm.store_dir(first.id, Some(me.id)).await?, bucket)
        }
    };
    Ok((
        FarmHandle {
            farm: Arc::new(farm),
            server_id: me.id,
            name: name.to_string(),
            advertise: advertise.to_string(),
        },
        store_dir,
        bucket,
    ))
}

/// The bucket of the farm's store whose directory (for server `me`) is `dir`, if it is a
/// bucket store.
async fn bucket_of_dir(farm: &farm::Farm, dir: &Path, me: i64) -> anyhow::Result<Option<String>> {
    let want = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let stores = farm
        .list_stores(Some(farm::validate::PAGE_LIMIT_MAX), Some(0))
        .await?;
    for s in stores.items.iter().filter(|s| !s.bucket.is_empty()) {
        if let Ok(d) = farm.store_dir(s.id, Some(me)).await
            && d.canonicalize().unwrap_or(d) == want
        {
            return Ok(Some(s.bucket.clone()));
        }
    }
    Ok(None)
}

/// The API's TLS from the three PEMs: the farm CA's certificate (client certificates, when
/// presented, must chain to it), this server's certificate and its key.
///
/// # Errors
/// A PEM that does not parse, or a key that does not match its certificate.
pub fn api_tls(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    pki::server_config(ca_pem, cert_pem, key_pem).context("farm API TLS")
}

/// [`api_tls`] from a certificate directory: `ca-cert.pem`, `server-cert.pem` and
/// `server-key.pem` (`--api-tls-dir`).
///
/// # Errors
/// A file cannot be read, or as [`api_tls`].
pub fn api_tls_from_dir(dir: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("--api-tls-dir: read {}", p.display()))
    };
    api_tls(
        &read(pki::CA_CERT)?,
        &read(pki::SERVER_CERT)?,
        &read(pki::SERVER_KEY)?,
    )
    .with_context(|| format!("--api-tls-dir {}", dir.display()))
}

/// Serves the farm API and console on `listener` (HTTPS with `tls`, else plain HTTP, which
/// only a loopback listener allows) and heartbeats until `stop` completes.
pub async fn serve_api(
    handle: &FarmHandle,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = api::AppState {
        farm: Arc::clone(&handle.farm),
        server_id: Some(handle.server_id),
    };
    let farm = Arc::clone(&handle.farm);
    let id = handle.server_id;
    let beat = tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        loop {
            tick.tick().await;
            if let Err(e) = farm.heartbeat(id).await {
                tracing::warn!(error = %e, "farm heartbeat failed");
            }
        }
    });
    let r = api::serve_with(listener, state, tls, stop).await;
    beat.abort();
    r.context("serve farm API")
}

/// The address devices reach this server's NBD listener at: `advertise` (a host alone gets
/// the NBD listen port), or the listen address with an unspecified IP replaced by loopback
/// (a single-host farm).
pub fn advertised(advertise: Option<&str>, nbd: Option<SocketAddr>) -> String {
    if let Some(a) = advertise {
        let port = nbd.map_or(10809, |n| n.port());
        if let Ok(ip) = a.parse::<std::net::IpAddr>() {
            return SocketAddr::new(ip, port).to_string();
        }
        if !a.contains(':') {
            return format!("{a}:{port}");
        }
        return a.to_string();
    }
    match nbd {
        Some(a) if a.ip().is_unspecified() => {
            tracing::warn!(
                "advertising 127.0.0.1:{} to devices; pass --advertise HOST:PORT for a farm of several hosts",
                a.port()
            );
            format!("127.0.0.1:{}", a.port())
        }
        Some(a) => a.to_string(),
        None => "127.0.0.1:10809".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertised_host_alone_gets_the_nbd_port() {
        let nbd = Some("0.0.0.0:10900".parse().unwrap());
        assert_eq!(advertised(Some("10.0.2.2"), nbd), "10.0.2.2:10900");
        assert_eq!(advertised(Some("fd00::1"), nbd), "[fd00::1]:10900");
        assert_eq!(advertised(Some("boot.example"), nbd), "boot.example:10900");
        assert_eq!(advertised(Some("10.0.2.2:10809"), nbd), "10.0.2.2:10809");
    }

    #[test]
    fn grants_map_to_registry_exports() {
        let grant = |cache_mode, writable| SessionGrant {
            session_id: "s".into(),
            export_name: "ferry-s-00".into(),
            device_id: 1,
            mac: "aa:bb:cc:00:00:01".into(),
            device_type: farm::model::DeviceType::Production,
            vdisk_id: 1,
            vdisk_name: "golden".into(),
            version: 3,
            store_dir: PathBuf::from("/s"),
            path: PathBuf::from("/s/golden.3.avhdx"),
            cache_mode,
            ram_bytes: 0,
            writable,
            expires_at_ms: 0,
        };
        let got = [
            grant(CacheMode::Ram, false),
            grant(CacheMode::Server, false),
            grant(CacheMode::ServerPersistent, false),
            grant(CacheMode::Private, true),
        ]
        .map(|g| export_for(&g).unwrap().to_string());
        assert_eq!(
            got,
            [
                "golden@3",
                "golden@3+aa-bb-cc-00-00-01",
                "golden@3+aa-bb-cc-00-00-01+persistent",
                "golden+private"
            ]
        );
    }
}

/// Keeps the boot sets this server records in the farm database, and reads those other
/// servers recorded (`server::boot_sets::BootSetMirror`): a set follows its version to
/// every server and goes with it.
#[derive(Debug)]
pub struct FarmBootSets {
    farm: Arc<farm::Farm>,
    runtime: tokio::runtime::Handle,
}

impl FarmBootSets {
    /// The boot sets of `handle`'s farm; database calls run on `runtime` (the mirror is
    /// called from the blocking pool and the server's own threads).
    pub fn new(handle: &FarmHandle, runtime: tokio::runtime::Handle) -> FarmBootSets {
        FarmBootSets {
            farm: Arc::clone(&handle.farm),
            runtime,
        }
    }
}

impl server::boot_sets::BootSetMirror for FarmBootSets {
    fn load(&self, vdisk: &str, version: u32) -> Result<Option<Vec<u8>>, String> {
        self.runtime
            .block_on(self.farm.boot_set_by_name(vdisk, i64::from(version)))
            .map_err(|e| contract::ErrorChain(&e).to_string())
    }

    fn save(&self, vdisk: &str, version: u32, encoded: &[u8]) -> Result<(), String> {
        let set = bootset::BootSet::decode(encoded).map_err(|e| e.to_string())?;
        let summary = (
            i64::from(set.boots),
            i64::try_from(set.extents.len()).unwrap_or(i64::MAX),
            i64::try_from(set.bytes()).unwrap_or(i64::MAX),
        );
        self.runtime
            .block_on(
                self.farm
                    .save_boot_set(vdisk, i64::from(version), encoded, summary),
            )
            .map_err(|e| contract::ErrorChain(&e).to_string())
    }
}

/// How often a farm server asks which versions are in production (to prefetch a promoted
/// version's boot set before its devices boot it).
pub const PROMOTION_CHECK_EVERY: Duration = Duration::from_secs(10);

/// Prefetches the boot set of each vDisk's newest production version into this server's
/// block cache: those in production when the server starts, then each version promoted
/// (seen within [`PROMOTION_CHECK_EVERY`]). Once per version per process: a version
/// already prefetched is not read again by this task (a boot's own open still starts a run
/// if the cache lost it). Versions this server's store does not hold are skipped.
pub fn prefetch_promoted(
    handle: &FarmHandle,
    registry: &server::exports::Registry,
    runtime: &tokio::runtime::Handle,
) {
    let reg = registry.clone();
    let farm = Arc::clone(&handle.farm);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(PROMOTION_CHECK_EVERY);
        let mut done: std::collections::HashSet<(String, i64)> = Default::default();
        loop {
            tick.tick().await;
            let now = match farm.production_boot_sets().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %contract::ErrorChain(&e), "production versions not listed");
                    continue;
                }
            };
            let new: Vec<_> = now.iter().filter(|v| !done.contains(*v)).cloned().collect();
            // Only the current list is remembered: bounded by the farm's vDisks.
            done = now.into_iter().collect();
            if new.is_empty() {
                continue;
            }
            let reg = reg.clone();
            let ran = tokio::task::spawn_blocking(move || {
                for (vdisk, number) in new {
                    let Ok(version) = u32::try_from(number) else {
                        continue;
                    };
                    match reg.prefetch_boot_set(&vdisk, version) {
                        Ok(true) => tracing::info!(%vdisk, version,
                            "prefetching the boot set of a production version"),
                        Ok(false) => {}
                        Err(e) => tracing::debug!(%vdisk, version, error = %e, "not prefetched here"),
                    }
                }
            })
            .await;
            if let Err(e) = ran {
                tracing::warn!(error = %e, "the promoted versions' prefetch failed");
            }
        }
    });
}
