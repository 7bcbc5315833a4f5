//! From a login grant to the agent's configuration: the grant's servers, vDisk, cache
//! mode and RAM, its session export (opened instead of the vDisk, on failover too), and
//! TLS with the client certificate the farm issued. Shared by `ferry target` and the
//! in-machine boot agent.

use std::path::PathBuf;
use std::sync::Arc;

use crate::daemon::{AgentConfig, VersionIdentity};
use crate::login::LoginGrant;
use crate::remote::{Relogin, Session};

/// The agent's configuration after device login, exporting on `export_socket`.
///
/// # Errors
/// The grant's certificate, key or CA do not make a TLS client.
pub fn config_from_grant(
    g: &LoginGrant,
    export_socket: PathBuf,
) -> Result<AgentConfig, pki::TlsError> {
    let mut cfg = AgentConfig::new(g.servers.clone(), &g.vdisk, g.cache_mode, export_socket);
    cfg.device = g.device_name.clone();
    cfg.export_name = Some(g.export_name.clone());
    cfg.mac = Some(g.mac);
    cfg.ram_bytes = g.ram_bytes;
    cfg.tls = grant_tls(g)?;
    // The host read cache's key: the vDisk id tells a vDisk recreated under the same
    // name apart, the version's creation time a version deleted and made again under its
    // number.
    cfg.version_identity = u64::try_from(g.version)
        .ok()
        .map(|version| VersionIdentity {
            vdisk: g.vdisk.clone(),
            version,
            extra: format!(
                "farm vdisk id {} version made at {}",
                g.vdisk_id, g.version_created_at_ms
            )
            .into_bytes(),
        });
    Ok(cfg)
}

/// TLS with the client certificate the farm issued at login (and its CA), if it issued one.
///
/// # Errors
/// The grant's certificate, key or CA do not make a TLS client.
pub fn grant_tls(g: &LoginGrant) -> Result<Option<Arc<rustls::ClientConfig>>, pki::TlsError> {
    g.tls
        .as_ref()
        .map(|t| pki::client_config(&t.ca_pem, Some((&t.cert_pem, &t.key_pem))))
        .transpose()
}

/// Logging in again for a failover whose servers all refuse the session (a farm that lost
/// or ended it): `login` runs on a thread of its own (the blocking HTTP client must not
/// run inside the runtime), and its grant is accepted only for the vDisk, version and
/// cache mode of `first`, the ones attached now.
pub fn relogin(
    first: &LoginGrant,
    login: impl Fn() -> Result<LoginGrant, String> + Send + Sync + 'static,
) -> Relogin {
    let want = (first.vdisk.clone(), first.version, first.cache_mode);
    let login = Arc::new(login);
    Relogin(Arc::new(move || {
        let (login, want) = (Arc::clone(&login), want.clone());
        std::thread::spawn(move || -> Result<Session, String> {
            let g = login()?;
            let got = (g.vdisk.clone(), g.version, g.cache_mode);
            if got != want {
                return Err(format!(
                    "the farm now grants {} version {} ({}); this device keeps {} version {} \
                     until it restarts",
                    got.0,
                    got.1,
                    got.2.cli_name(),
                    want.0,
                    want.1
                ));
            }
            Ok(Session {
                export: g.export_name.to_string(),
                tls: grant_tls(&g).map_err(|e| e.to_string())?,
            })
        })
        .join()
        .map_err(|_| "login thread panicked".to_string())?
    }))
}
