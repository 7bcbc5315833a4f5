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
use farm::sessions::{SessionGrant, SessionLookup, SessionTable};
use farm::{Clock as _, SystemClock};

/// How often a farm server records its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// The site a server joins when the farm has none and `--site` is not given.
pub const DEFAULT_SITE: &str = "default";

/// Maps the farm's session grants to the export names of [`server::exports::Registry`].
#[derive(Debug)]
pub struct FarmSessions {
    table: Arc<SessionTable>,
    store_dir: PathBuf,
}

impl FarmSessions {
    /// Grants of `table` whose store is `store_dir` (the one this registry serves).
    pub fn new(table: Arc<SessionTable>, store_dir: &Path) -> FarmSessions {
        let store_dir = store_dir
            .canonicalize()
            .unwrap_or_else(|_| store_dir.to_path_buf());
        FarmSessions { table, store_dir }
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
    fn resolve(&self, key: &SessionKey) -> Option<ExportName> {
        let export_name = ExportName::Session(key.clone()).to_string();
        let g = self.table.lookup(&export_name, SystemClock.now_ms())?;
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
        export_for(&g)
            .inspect_err(|why| {
                tracing::warn!(session = export_name, why, "session names no export");
            })
            .ok()
    }
}

/// What `ferry server` needs of its farm.
#[derive(Debug)]
pub struct FarmHandle {
    /// The farm.
    pub farm: Arc<farm::Farm>,
    /// This server's id in the farm.
    pub server_id: i64,
}

/// Opens the farm in `data` (SQLite there, or `db`), finds the store to serve (`store`, or
/// the farm's first store), and registers this server as `name` at `advertise` in `site`.
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
) -> anyhow::Result<(FarmHandle, PathBuf)> {
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
    let store_dir = match store {
        Some(dir) => dir.to_path_buf(),
        None => {
            let stores = farm.list_stores(Some(1), Some(0)).await?;
            let first = stores.items.first().with_context(|| {
                "the farm has no store yet: add one (`ferry store add NAME --path DIR`) or pass --store"
            })?;
            farm.store_dir(first.id, Some(me.id)).await?
        }
    };
    Ok((
        FarmHandle {
            farm: Arc::new(farm),
            server_id: me.id,
        },
        store_dir,
    ))
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

/// The address devices reach this server's NBD listener at: `advertise`, or the listen
/// address with an unspecified IP replaced by loopback (a single-host farm).
pub fn advertised(advertise: Option<&str>, nbd: Option<SocketAddr>) -> String {
    if let Some(a) = advertise {
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
