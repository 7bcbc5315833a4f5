//! `ferry server --farm DIR`: the server as a member of a farm.
//!
//! On top of the store's NBD exports, the server then
//! * serves the farm's REST API and web console (`--api-listen`, default 0.0.0.0:8080);
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
use farm::model::CacheMode;
use farm::sessions::{SessionLookup, SessionTable};
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

/// A device's MAC as a write-cache device name (`aa-bb-cc-dd-ee-ff`).
pub fn device_name(mac: &str) -> String {
    mac.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The registry export name a grant stands for.
pub fn export_for(vdisk: &str, version: i64, mode: CacheMode, mac: &str) -> String {
    let dev = device_name(mac);
    match mode {
        CacheMode::Private => format!("{vdisk}+private"),
        CacheMode::Server => format!("{vdisk}@{version}+{dev}"),
        CacheMode::ServerPersistent => format!("{vdisk}@{version}+{dev}+persistent"),
        CacheMode::Ram | CacheMode::RamOverflow | CacheMode::Disk => format!("{vdisk}@{version}"),
    }
}

impl server::exports::SessionResolver for FarmSessions {
    fn resolve(&self, export_name: &str) -> Option<String> {
        let g = self.table.lookup(export_name, SystemClock.now_ms())?;
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
        let mode = if g.writable {
            CacheMode::Private
        } else {
            g.cache_mode
        };
        Some(export_for(&g.vdisk_name, g.version, mode, &g.mac))
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

/// Serves the farm API and console on `listener` and heartbeats until `stop` completes.
pub async fn serve_api(
    handle: &FarmHandle,
    listener: tokio::net::TcpListener,
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
    let r = api::serve(listener, state, stop).await;
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
        let mac = "AA:bb:CC:00:00:01";
        let got = [
            export_for("golden", 3, CacheMode::Ram, mac),
            export_for("golden", 3, CacheMode::Server, mac),
            export_for("golden", 3, CacheMode::ServerPersistent, mac),
            export_for("golden", 3, CacheMode::Private, mac),
        ];
        assert_eq!(
            got,
            [
                "golden@3",
                "golden@3+aa-bb-cc-00-00-01",
                "golden@3+aa-bb-cc-00-00-01+persistent",
                "golden+private"
            ]
        );
        for e in &got {
            assert!(server::exports::parse_export_name(e).is_ok(), "{e}");
        }
    }
}
