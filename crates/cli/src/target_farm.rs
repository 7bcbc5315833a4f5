//! `ferry target` and its farm: device login (enrolment with the farm key, then the device
//! secret), the agent's configuration and TLS from the login grant, logging in again when
//! the servers refuse the session, and the status reports to the farm API.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ::agent::AgentConfig;
use ::agent::login::{self, LoginError, LoginGrant};
use anyhow::{Context, anyhow, bail};

use crate::target_args::{FARM_KEY_ENV, RunArgs};

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

/// How often a logged-in target reports its counters to the farm (the console's live status).
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(2);

/// Reports this device's counters to the farm API every [`REPORT_EVERY`] for the console's
/// live status: bytes read and written, retries and the write cache's use, read from the
/// agent's own control socket and posted to `/api/v1/status/report` with the session export
/// as the credential, with the address of the server in use (the console's Server column). Failures are logged, never fatal: status is not the data path.
pub(crate) fn start_reporter(api: &str, ca: Option<String>, export_name: String, control: PathBuf) {
    let url = match login::parse_api_url(api).and_then(|u| {
        u.join("api/v1/status/report")
            .map_err(|e| LoginError::BadUrl {
                url: api.to_string(),
                reason: e.to_string(),
            })
    }) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "no status reports to the farm");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("ferry-target-report".into())
        .spawn(move || {
            let client = match login::api_client(&url, ca.as_deref())
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(b.timeout(Duration::from_secs(5)).build()?))
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no status reports to the farm");
                    return;
                }
            };
            let mut failures = 0u64;
            loop {
                std::thread::sleep(REPORT_EVERY);
                let Ok(v) = ::agent::control::request(&control, "status") else {
                    continue;
                };
                let body = report_body(&export_name, &v);
                let ok = client
                    .post(url.clone())
                    .json(&body)
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if !ok {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(failures, %url, "status report to the farm failed");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no status reports to the farm");
    }
}

/// The body of a status report (`POST /api/v1/status/report`) from the agent's status `v`:
/// the counters, and the NBD server it streams from now (its address, as login gave it;
/// the farm names the server registered there).
pub(crate) fn report_body(export_name: &str, v: &serde_json::Value) -> serde_json::Value {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    serde_json::json!({
        "export_name": export_name,
        "server_address": v["server"].as_str(),
        "bytes_read": n("bytes_read"),
        "bytes_written": n("bytes_written"),
        "retries": n("retries"),
        "cache_used_bytes": n("ram_bytes") + n("overflow_bytes"),
    })
}

/// The directory of the device secret under --overflow unless --state-dir.
pub(crate) const STATE_DIR_NAME: &str = "ferry-state";

/// Logs in at the first reachable farm API of `--server` with the device secret in the
/// state directory, or (to enrol) the farm key from `--farm-key` or [`FARM_KEY_ENV`].
pub(crate) fn device_login(a: &RunArgs, mac: &str) -> anyhow::Result<(LoginGrant, String)> {
    let state = login::DeviceState::new(
        &a.state_dir
            .clone()
            .unwrap_or_else(|| a.overflow.join(STATE_DIR_NAME)),
    );
    let enrolled = state.secret(login::parse_mac(mac)?)?.is_some();
    let key = if enrolled {
        None
    } else {
        let key_text = match &a.farm_key {
            Some(f) => std::fs::read_to_string(f)
                .with_context(|| format!("read the farm key {}", f.display()))?,
            None => std::env::var(FARM_KEY_ENV).map_err(|_| {
                anyhow!(
                    "device login needs the farm key to enrol (no device secret in {}): \
                     --farm-key FILE (DATA/secrets/farm.key of ferry farm init) or \
                     {FARM_KEY_ENV}=HEX",
                    state.path().display()
                )
            })?,
        };
        Some(login::parse_farm_key(&key_text)?)
    };
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

/// The agent's configuration after device login: the grant's servers, vDisk, cache mode
/// and RAM, and its session export (opened instead of the vDisk, on failover too).
pub(crate) fn config_from_grant(
    g: &LoginGrant,
    export_socket: PathBuf,
) -> anyhow::Result<AgentConfig> {
    let mut cfg = AgentConfig::new(g.servers.clone(), &g.vdisk, g.cache_mode, export_socket);
    cfg.device = g.device_name.clone();
    cfg.export_name = Some(g.export_name.clone());
    cfg.mac = Some(g.mac);
    cfg.ram_bytes = g.ram_bytes;
    cfg.tls = grant_tls(g)?;
    Ok(cfg)
}

/// TLS with the client certificate the farm issued at login (and its CA), if it issued one.
pub(crate) fn grant_tls(
    g: &LoginGrant,
) -> anyhow::Result<Option<std::sync::Arc<rustls::ClientConfig>>> {
    g.tls
        .as_ref()
        .map(|t| pki::client_config(&t.ca_pem, Some((&t.cert_pem, &t.key_pem))))
        .transpose()
        .context("the login grant's TLS certificate")
}

/// Device login again, for a failover whose servers all refuse the session (a farm that
/// lost or ended it): accepted only for the vDisk, version and cache mode attached now.
pub(crate) fn relogin(a: &RunArgs, first: &LoginGrant) -> ::agent::remote::Relogin {
    let a = a.clone();
    let mac = first.mac.to_string();
    let want = (first.vdisk.clone(), first.version, first.cache_mode);
    ::agent::remote::Relogin(std::sync::Arc::new(move || {
        let (a, mac, want) = (a.clone(), mac.clone(), want.clone());
        // Its own thread: the blocking HTTP client must not run inside the runtime.
        let login = std::thread::spawn(move || -> Result<::agent::remote::Session, String> {
            let (g, _) = device_login(&a, &mac).map_err(|e| format!("{e:#}"))?;
            let got = (g.vdisk.clone(), g.version, g.cache_mode);
            if got != want {
                return Err(format!(
                    "the farm now grants {} version {} ({}); this device keeps {} version {} until it restarts",
                    got.0,
                    got.1,
                    got.2.cli_name(),
                    want.0,
                    want.1
                ));
            }
            Ok(::agent::remote::Session {
                export: g.export_name.to_string(),
                tls: grant_tls(&g).map_err(|e| format!("{e:#}"))?,
            })
        });
        login
            .join()
            .map_err(|_| "login thread panicked".to_string())?
    }))
}
