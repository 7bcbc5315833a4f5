//! `ferry target` and its farm: device login (with the device secret an administrator
//! gave it, stored in its state directory at the first login), the agent's configuration and TLS from the login grant, logging in again when
//! the servers refuse the session, and the status reports to the farm API.

use std::path::{Path, PathBuf};

use ::agent::AgentConfig;
use ::agent::login::{self, LoginError, LoginGrant};
use anyhow::{Context, anyhow, bail};

use crate::target_args::{DEVICE_SECRET_ENV, RunArgs};

/// The NBD client's TLS from a certificate directory (`--tls-dir`, the layout of
/// `pki::CertDir`, which qemu, libnbd and nbdkit read too).
pub(crate) fn nbd_tls_from_dir(dir: &Path) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("--tls-dir: read {}", p.display()))
    };
    let ca = read(pki::CA_CERT)?;
    let (cert, key) = (dir.join(pki::CLIENT_CERT), dir.join(pki::CLIENT_KEY));
    let client = match (cert.exists(), key.exists()) {
        (true, true) => Some((read(pki::CLIENT_CERT)?, read(pki::CLIENT_KEY)?)),
        (false, false) => None,
        _ => bail!(
            "--tls-dir {}: {} and {} go together (give both or neither)",
            dir.display(),
            pki::CLIENT_CERT,
            pki::CLIENT_KEY
        ),
    };
    pki::client_config(&ca, client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())))
        .with_context(|| format!("--tls-dir {}", dir.display()))
}

pub(crate) use ::agent::report::start as start_reporter;

/// The directory of the device secret under --overflow unless --state-dir.
pub(crate) const STATE_DIR_NAME: &str = "ferry-state";

/// Logs in at the first reachable farm API of `--server` with the device secret from
/// `--device-secret` or [`DEVICE_SECRET_ENV`] (stored in the state directory once it logged
/// in), else the one stored there.
pub(crate) fn device_login(a: &RunArgs, mac: &str) -> anyhow::Result<(LoginGrant, String)> {
    let state = login::DeviceState::new(
        &a.state_dir
            .clone()
            .unwrap_or_else(|| a.overflow.join(STATE_DIR_NAME)),
    );
    let key_text = match &a.device_secret {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("read the device secret {}", f.display()))?,
        ),
        None => std::env::var(DEVICE_SECRET_ENV).ok(),
    };
    let key = key_text.map(|t| login::parse_secret(&t)).transpose()?;
    if key.is_none() && state.secret(login::parse_mac(mac)?)?.is_none() {
        bail!(
            "device login needs this device's secret (none in {}): an administrator makes one \
             with `ferry device credential {mac}`; give it with --device-secret FILE or \
             {DEVICE_SECRET_ENV}=HEX",
            state.path().display()
        );
    }
    let ca = match &a.farm_ca {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("read the farm CA {}", f.display()))?,
        ),
        None => None,
    };
    let mut unreachable = None;
    for url in &a.server {
        match login::login_device(url, mac, key.as_deref(), &state, ca.as_deref()) {
            Ok(g) => {
                tracing::info!(api = %url, mac = %g.mac, device = %g.device_name,
                    vdisk = %g.vdisk, version = g.version, cache = %g.cache_mode.cli_name(),
                    ram_bytes = g.ram_bytes, export = %g.export_name,
                    servers = %g.servers.join(","), "logged in to the farm");
                if let Some(tls) = &g.tls {
                    tracing::info!(
                        not_after_ms = tls.not_after_ms,
                        "the farm issued this device's client certificate"
                    );
                }
                if g.servers_defaulted {
                    tracing::warn!(server = %g.servers[0],
                        "the farm lists no NBD server for this device's site; using the API's \
                         host on the default NBD port");
                }
                return Ok((g, url.clone()));
            }
            Err(e @ LoginError::Unreachable { .. }) => {
                tracing::warn!(error = %e, "farm API unreachable");
                unreachable = Some(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(unreachable
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow!("--server names no farm API")))
}

/// The agent's configuration after device login ([`::agent::grant::config_from_grant`]).
pub(crate) fn config_from_grant(
    g: &LoginGrant,
    export_socket: PathBuf,
) -> anyhow::Result<AgentConfig> {
    ::agent::grant::config_from_grant(g, export_socket).context("the login grant's TLS certificate")
}

/// Device login again, for a failover whose servers all refuse the session (a farm that
/// lost or ended it): accepted only for the vDisk, version and cache mode attached now.
pub(crate) fn relogin(a: &RunArgs, first: &LoginGrant) -> ::agent::remote::Relogin {
    let a = a.clone();
    let mac = first.mac.to_string();
    ::agent::grant::relogin(first, move || {
        device_login(&a, &mac)
            .map(|(g, _)| g)
            .map_err(|e| format!("{e:#}"))
    })
}
