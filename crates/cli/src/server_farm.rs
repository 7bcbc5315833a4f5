//! `ferry server --farm DIR`: the server as a member of a farm.
//!
//! On top of the store's NBD exports, the server then
//! * serves the farm's REST API and web console (`--api-listen`, default 0.0.0.0:8080),
//!   over HTTPS with `--api-tls-dir` ([`api_tls`]); plain HTTP only on a loopback address;
//! * registers itself in the farm (a site, a name and the NBD address devices reach) and
//!   runs the farm-member runtime (`member`: session resolution, heartbeat, drain,
//!   rebalancing, promotion prefetch), whose intervals the hidden `--member-*` flags
//!   ([`TimingArgs`]) shorten for tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args as ClapArgs;
pub use member::FarmHandle;

/// The site a server joins when the farm has none and `--site` is not given.
pub const DEFAULT_SITE: &str = "default";

/// The farm-member runtime's intervals (`member::Timing`), hidden: a farm keeps the
/// defaults, and tests shorten them so that process-level runs need not wait for them.
#[derive(Debug, Clone, ClapArgs)]
pub struct TimingArgs {
    /// How often this server records its heartbeat (default 10s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_heartbeat_every: Option<Duration>,
    /// How often open sessions are checked against the farm database (default 10s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_session_recheck_every: Option<Duration>,
    /// How often the draining flag is read, the drain's pace (default 1s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_drain_check_every: Option<Duration>,
    /// The least time between two drain moves of one session (default 15s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_drain_move_again_after: Option<Duration>,
    /// The mean pause between rebalance checks (default 5s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_rebalance_every: Option<Duration>,
    /// How long an excess lasts before sessions move (default 25s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_rebalance_settle: Option<Duration>,
    /// How long a session moved for balance is not moved again (default 60s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_rebalance_forget: Option<Duration>,
    /// How often production versions are listed for prefetch (default 10s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_promotion_check_every: Option<Duration>,
    /// How often the farm snapshot (boots and failovers while the database is away) is
    /// read (default 15s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_snapshot_every: Option<Duration>,
    /// How often held sessions are marked and vanished ones ended (default 60s).
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub member_vanish_check_every: Option<Duration>,
}

impl TimingArgs {
    /// The defaults with the flags given applied over them.
    pub fn timing(&self) -> member::Timing {
        let d = member::Timing::default();
        member::Timing {
            heartbeat_every: self.member_heartbeat_every.unwrap_or(d.heartbeat_every),
            session_recheck_every: self
                .member_session_recheck_every
                .unwrap_or(d.session_recheck_every),
            drain_check_every: self.member_drain_check_every.unwrap_or(d.drain_check_every),
            drain_move_again_after: self
                .member_drain_move_again_after
                .unwrap_or(d.drain_move_again_after),
            rebalance_every: self.member_rebalance_every.unwrap_or(d.rebalance_every),
            rebalance_settle: self.member_rebalance_settle.unwrap_or(d.rebalance_settle),
            rebalance_forget: self.member_rebalance_forget.unwrap_or(d.rebalance_forget),
            promotion_check_every: self
                .member_promotion_check_every
                .unwrap_or(d.promotion_check_every),
            snapshot_every: self.member_snapshot_every.unwrap_or(d.snapshot_every),
            vanish_check_every: self
                .member_vanish_check_every
                .unwrap_or(d.vanish_check_every),
        }
    }
}

/// A positive duration with its unit: `250ms`, `2s`, `1m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (ms, s, m)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{s:?}: the unit must be ms, s or m")),
    };
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than zero"));
    }
    Ok(d)
}

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

/// The file in a server's state directory that holds its identity.
const IDENTITY_FILE: &str = "server-id";
/// The file in a server's state directory that a running server holds locked.
const LOCK_FILE: &str = "lock";

/// This server's identity in the farm, kept in `state` (made 0700): the uid in
/// [`IDENTITY_FILE`] (16 random bytes in hex, made at the first start, 0600). The state's
/// [`LOCK_FILE`] is locked for the life of the process (the kernel lets it go at exit, a
/// SIGKILL too), so two servers never run on one identity.
///
/// # Errors
/// Another server holds the lock, or the state cannot be made or read.
pub fn identity(state: &Path, name: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // A private directory: 0700, its files written atomically 0600.
    let dir = pki::CertDir::create(state)
        .with_context(|| format!("make the server's state directory {}", state.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.file(LOCK_FILE))
        .with_context(|| format!("open {}", dir.file(LOCK_FILE).display()))?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => anyhow::bail!(
            "another `ferry server` runs with the state directory {} (server name {name:?}): \
             give this one its own --server-name, or its own --state-dir",
            state.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| format!("lock {}", dir.file(LOCK_FILE).display()));
        }
    }
    // Held until the process exits.
    std::mem::forget(lock);
    let path = dir.file(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let uid = text.trim().to_string();
            farm::servers::check_uid(&uid)
                .with_context(|| format!("{} is not a server identity", path.display()))?;
            Ok(uid)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let uid = hex::encode(rand::random::<[u8; 16]>());
            dir.write(IDENTITY_FILE, &format!("{uid}\n"))
                .with_context(|| format!("keep the identity in {}", path.display()))?;
            Ok(uid)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Who this server is in the farm.
#[derive(Debug, Clone, Copy)]
pub struct Me<'a> {
    /// Its name, a label (`--server-name`).
    pub name: &'a str,
    /// Its identity, kept in its state directory ([`identity`]).
    pub uid: &'a str,
    /// Where devices reach its NBD service.
    pub advertise: &'a str,
    /// Where devices reach its API, as its boot scripts name it.
    pub api_url: Option<&'a str>,
}

/// Opens the farm in `data` (SQLite there, or `db`), finds the store to serve (`store`, or
/// the farm's first store), and registers this server (`me`) in `site`.
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
    me: &Me<'_>,
) -> anyhow::Result<(FarmHandle, PathBuf, Option<String>)> {
    let Me {
        name,
        uid,
        advertise,
        api_url,
    } = *me;
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
    // Before anything is made in the farm (a site, this server's row): a server needs a
    // store to serve, and a new farm has none until one is added over the API.
    let first_store = match store {
        Some(_) => None,
        None => farm
            .list_stores(Some(1), Some(0))
            .await?
            .items
            .into_iter()
            .next(),
    };
    if store.is_none() && first_store.is_none() {
        anyhow::bail!(
            "the farm in {} has no store yet: start its API alone (`ferry farm serve --data \
             {0}`), add a store (`ferry store add NAME --path DIR`), then start this server; \
             or pass --store DIR",
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
                uid: Some(uid.to_string()),
                api_url: api_url.map(str::to_string),
            },
            "ferry-server",
        )
        .await
        .context("register this server in the farm")?;
    let (store_dir, bucket) = match (store, first_store) {
        (Some(dir), _) => (dir.to_path_buf(), bucket_of_dir(&farm, dir, me.id).await?),
        (None, Some(first)) => {
            let bucket = (!first.bucket.is_empty()).then(|| first.bucket.clone());
            (farm.store_dir(first.id, Some(me.id)).await?, bucket)
        }
        (None, None) => unreachable!("refused above: no --store and no store in the farm"),
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
/// only a loopback listener allows) until `stop` completes.
pub async fn serve_api(
    handle: &FarmHandle,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    listen: api::Listen,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = api::AppState {
        farm: Arc::clone(&handle.farm),
        server_id: Some(handle.server_id),
    };
    api::serve_in(listener, state, tls, listen, stop)
        .await
        .context("serve farm API")
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

/// Appends the farm database's state as this server sees it (`farm::offline`) to a
/// Prometheus text exposition: whether it answers, the snapshot's age, the logins waiting.
pub fn render_database_metrics(farm: &farm::Farm, out: &mut String) {
    use std::fmt::Write as _;
    let d = farm.database_state();
    let age = d
        .snapshot_taken_at_ms
        .map_or(-1.0, |t| (farm.now_ms() - t).max(0) as f64 / 1000.0);
    let series = [
        (
            "ferry_farm_database_up",
            "1 while the farm database answers this server, 0 while it cannot be reached",
            f64::from(u8::from(d.up)),
        ),
        (
            "ferry_farm_snapshot_age_seconds",
            "Age of the farm snapshot boots and failovers read while the database is away (-1: none yet)",
            age,
        ),
        (
            "ferry_farm_offline_logins",
            "Logins made while the database was away, not yet written to it",
            d.pending_logins as f64,
        ),
    ];
    for (name, help, v) in series {
        let _ = writeln!(out, "# HELP {name} {help}.");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_and_are_positive() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn an_advertised_host_alone_gets_the_nbd_port() {
        let nbd = Some("0.0.0.0:10900".parse().unwrap());
        assert_eq!(advertised(Some("10.0.2.2"), nbd), "10.0.2.2:10900");
        assert_eq!(advertised(Some("fd00::1"), nbd), "[fd00::1]:10900");
        assert_eq!(advertised(Some("boot.example"), nbd), "boot.example:10900");
        assert_eq!(advertised(Some("10.0.2.2:10809"), nbd), "10.0.2.2:10809");
    }
}
