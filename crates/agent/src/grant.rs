//! From a login grant to the agent's configuration: the grant's servers, vDisk, cache
//! mode and RAM, its session export (opened instead of the vDisk, on failover too), and
//! TLS with the client certificate the farm issued. Shared by `ferry target` and the
//! in-machine boot agent.

use std::path::PathBuf;
use std::sync::Arc;

use crate::daemon::AgentConfig;
use crate::login::LoginGrant;

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
