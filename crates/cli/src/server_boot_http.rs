//! `ferry server --farm DIR --boot-listen ADDR:PORT`: the HTTP boot service for iPXE.
//!
//! The listener serves [`api::boot::router`] alone, in plain HTTP (iPXE fetches without
//! credentials, as all PXE does): boot scripts by MAC and the versions' kernels and
//! initramfs images, nothing of the farm API. The scripts name the farm API the agent then
//! logs in at, over HTTPS: `--boot-api-url`, else `https://ADVERTISED-HOST:API-PORT`
//! ([`api_urls`]). Boot files are read through a version's chain by the `bootfiles` crate
//! (`api::boot_source::BootfilesSource`) and cached in `DATA/boot-cache/`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use api::boot::{BootConfig, BootState};
use api::boot_source::BootfilesSource;

/// The cache directory of boot files under the farm's data directory.
pub const BOOT_CACHE_DIR: &str = "boot-cache";

/// The boot service's settings from the flags.
#[derive(Debug, Clone)]
pub struct BootHttp {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The farm API URLs the scripts name.
    pub api_urls: Vec<String>,
    /// True unless `--boot-api-url` named them: the scripts add the site's other servers'.
    pub site_apis: bool,
    /// The boot file cache.
    pub cache_dir: PathBuf,
}

/// The API URLs the boot scripts name: `given` (comma-separated, each `https://…` or
/// `http://…`), else `https://HOST:PORT` with the host devices reach this server at (from
/// `advertise`, `HOST[:PORT]`) and the API's port.
///
/// # Errors
/// A given URL that is not http(s) or holds a character a kernel argument may not.
pub fn api_urls(
    given: Option<&str>,
    advertise: &str,
    api: SocketAddr,
) -> anyhow::Result<Vec<String>> {
    let urls: Vec<String> = match given {
        Some(g) => g
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| u.trim_end_matches('/').to_string())
            .collect(),
        None => vec![format!(
            "https://{}:{}",
            advertised_host(advertise),
            api.port()
        )],
    };
    if urls.is_empty() {
        anyhow::bail!("--boot-api-url: no URL given");
    }
    for u in &urls {
        let scheme_ok = u.starts_with("https://") || u.starts_with("http://");
        if !scheme_ok || !api::boot_script::arg_ok(u) {
            anyhow::bail!(
                "--boot-api-url {u:?}: give http(s)://HOST:PORT URLs, comma-separated, of \
                 letters, digits and ._:/[]-"
            );
        }
    }
    Ok(urls)
}

/// The host part of an advertised `HOST`, `HOST:PORT`, `IPv6` or `[IPv6]:PORT`, bracketed
/// when it is IPv6 (for a URL).
pub fn advertised_host(advertise: &str) -> String {
    if let Ok(ip) = advertise.parse::<std::net::Ipv6Addr>() {
        return format!("[{ip}]");
    }
    if let Ok(a) = advertise.parse::<SocketAddr>() {
        return match a {
            SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            SocketAddr::V4(v4) => v4.ip().to_string(),
        };
    }
    match advertise.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h.to_string(),
        _ => advertise.to_string(),
    }
}

/// Binds the boot listener (before anything is served, so a bad address fails early).
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(b: &BootHttp) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(b.listen)
        .await
        .with_context(|| format!("bind boot listener {}", b.listen))
}

/// The boot service of `farm` for the server `server_id`, about to serve on `listener`
/// (what [`serve`] runs; its counters go on `/metrics`).
///
/// # Errors
/// The listener's address cannot be read.
pub fn state(
    farm: Arc<farm::Farm>,
    server_id: i64,
    b: BootHttp,
    listener: &tokio::net::TcpListener,
) -> anyhow::Result<BootState> {
    let at = listener.local_addr()?;
    tracing::info!(
        boot = %format!("http://{at}/boot/ipxe"),
        api = %b.api_urls.join(","),
        cache = %b.cache_dir.display(),
        "serving network boot (plain HTTP: public boot data only)"
    );
    Ok(BootState::new(
        farm,
        Some(server_id),
        BootConfig {
            site_apis: b.site_apis,
            api_urls: b.api_urls,
            cache_dir: b.cache_dir,
            source: Arc::new(BootfilesSource),
        },
    ))
}

/// Serves the boot routes of `state` on `listener` behind `listen`'s gate (connections
/// per listener and per address) and timeouts (request head, stalled reads and writes)
/// until `stop` completes.
///
/// # Errors
/// None today (accept errors are counted and retried); kept for the caller's shape.
pub async fn serve(
    state: BootState,
    listener: tokio::net::TcpListener,
    listen: api::Listen,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = api::boot::router(state);
    budget::http::serve(listener, app, listen.gate, listen.limits, None, stop).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_url_from_the_advertised_host_and_the_api_port() {
        let api: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        for (adv, want) in [
            ("10.0.2.2", "https://10.0.2.2:8443"),
            ("10.0.2.2:10809", "https://10.0.2.2:8443"),
            ("[fd00::1]:10809", "https://[fd00::1]:8443"),
            ("fd00::1", "https://[fd00::1]:8443"),
            ("boot.example:10809", "https://boot.example:8443"),
        ] {
            assert_eq!(api_urls(None, adv, api).unwrap(), [want], "{adv}");
        }
        let given = api_urls(Some("https://a:1/, https://b:2"), "x", api).unwrap();
        assert_eq!(given, ["https://a:1", "https://b:2"]);
        assert!(api_urls(Some("ftp://a"), "x", api).is_err());
        assert!(api_urls(Some("https://a b"), "x", api).is_err());
    }
}
