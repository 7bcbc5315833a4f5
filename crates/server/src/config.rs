//! The server's configuration file (`ferry.toml`), as documented in docs/config.md.
//!
//! ```toml
//! [store]
//! dir = "/srv/ferry"             # the only required setting
//!
//! [nbd]
//! listen = "0.0.0.0:10809"       # "" turns TCP off
//! socket = "/run/ferry/nbd.sock" # optional unix socket
//! max_connections = 1024
//!
//! [cache]
//! ram_bytes = 4294967296         # default: a quarter of RAM
//! block_bytes = 65536
//! scan_window_bytes = 67108864   # 0: long sequential reads are cached like any other
//!
//! [write_cache]
//! dir = "/var/lib/ferry/write-cache"   # default: <store>/.write-cache
//!
//! [metrics]
//! listen = "127.0.0.1:9810"      # "" turns the metrics endpoint off
//!
//! [tls]
//! dir = "/etc/ferry/tls"         # ca-cert.pem, server-cert.pem, server-key.pem
//! required = false               # true: nothing but STARTTLS before TLS
//!
//! [access]
//! plain_reads = "local"          # who reads without a certificate: none, local, any
//! plain_writes = "local"         # standalone default local; a farm server's is none
//!
//! [limits]
//! trust_loopback = true          # false: loopback clients count as remote (tests)
//! nbd_per_address = 64           # connections per client address, per listener
//! api_per_address = 32
//! boot_per_address = 16
//! metrics_per_address = 4
//! nbd_handshake_timeout_ms = 30000
//! tls_handshake_timeout_ms = 10000     # the API's TLS handshake
//! http_header_timeout_ms = 30000       # a request head; a kept-alive connection's idle
//! http_stall_timeout_ms = 30000        # a body read or response write moving nothing
//! ```
//!
//! [`FerryConfig`] is what the file says (every field optional); [`FerryConfig::resolve`]
//! fills in the defaults and checks the limits, giving the [`Resolved`] settings the server
//! runs with. Unknown keys are errors that name the key, so a typo never silently falls back
//! to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use block_cache::{BlockCache, CacheConfig};
use serde::Deserialize;

use crate::access::{AccessPolicy, Scope};
use crate::exports::RegistryConfig;
use nbd_server::ServerConfig;

/// The default NBD TCP address (10809 is NBD's IANA port).
pub const DEFAULT_NBD_LISTEN: &str = "0.0.0.0:10809";
/// The default metrics HTTP address: loopback only, since metrics name exports and devices.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9810";
/// The write-cache directory used when none is configured, relative to the store.
pub const DEFAULT_WRITE_CACHE_SUBDIR: &str = ".write-cache";
/// The largest `nbd.max_connections` accepted.
pub const MAX_CONNECTIONS_LIMIT: usize = 65_536;
/// The largest configuration file read, in bytes.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;
/// The default of `[limits] tls_handshake_timeout_ms`.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of `[limits] http_header_timeout_ms`.
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of `[limits] http_stall_timeout_ms`.
pub const DEFAULT_HTTP_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The configuration file, as written. Every section and key is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FerryConfig {
    /// `[store]`.
    #[serde(default)]
    pub store: StoreSection,
    /// `[nbd]`.
    #[serde(default)]
    pub nbd: NbdSection,
    /// `[cache]`.
    #[serde(default)]
    pub cache: CacheSection,
    /// `[write_cache]`.
    #[serde(default)]
    pub write_cache: WriteCacheSection,
    /// `[metrics]`.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[tls]`.
    #[serde(default)]
    pub tls: TlsSection,
    /// `[access]`.
    #[serde(default)]
    pub access: AccessSection,
    /// `[limits]`.
    #[serde(default)]
    pub limits: LimitsSection,
}

/// `[limits]`: what each listener lets one client hold, and how long it waits for one.
/// Connections per listener are not set here: they are planned from the process's open
/// files at start (`budget::files::plan`), and `[nbd] max_connections` is their ceiling.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Whether a loopback client is local (default true): exempt from the NBD per-address
    /// cap and idle timeout, and `local` for `[access]`. False makes 127.0.0.1 count as a
    /// remote client everywhere, which tests use to exercise the caps on loopback.
    pub trust_loopback: Option<bool>,
    /// NBD connections per client address (default 64).
    pub nbd_per_address: Option<usize>,
    /// API connections per client address (default `budget::API_PER_ADDRESS_MAX`).
    pub api_per_address: Option<usize>,
    /// Boot-port connections per client address (default `budget::BOOT_PER_ADDRESS_MAX`).
    pub boot_per_address: Option<usize>,
    /// Metrics connections per client address (default `budget::METRICS_PER_ADDRESS_MAX`).
    pub metrics_per_address: Option<usize>,
    /// How long an NBD client may take from connecting to transmission, STARTTLS included
    /// (default 30000).
    pub nbd_handshake_timeout_ms: Option<u64>,
    /// How long an API client may take over its TLS handshake (default 10000).
    pub tls_handshake_timeout_ms: Option<u64>,
    /// How long an HTTP client (API, boot port) may take to send a request head, and may
    /// keep a connection idle between requests (default 30000).
    pub http_header_timeout_ms: Option<u64>,
    /// How long an HTTP body read or response write may wait with no byte moving (default
    /// 30000).
    pub http_stall_timeout_ms: Option<u64>,
}

/// `[limits]` resolved, for the listeners beside NBD (NBD's are in [`Resolved::nbd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenLimits {
    /// API connections per client address.
    pub api_per_address: usize,
    /// Boot-port connections per client address.
    pub boot_per_address: usize,
    /// Metrics connections per client address.
    pub metrics_per_address: usize,
    /// Whether a loopback client is local.
    pub trust_loopback: bool,
    /// The API's TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// An HTTP request head, and a kept-alive connection's idle time.
    pub http_header_timeout: Duration,
    /// An HTTP body read or response write with no byte moving.
    pub http_stall_timeout: Duration,
}

/// `[tls]`: NBD over TLS (`NBD_OPT_STARTTLS`, X.509).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// A certificate directory: `ca-cert.pem` (the CA whose client certificates are
    /// accepted), `server-cert.pem`, `server-key.pem` (default: none; a farm server takes
    /// its certificate from the farm).
    pub dir: Option<PathBuf>,
    /// Refuse every option before STARTTLS (default false: each export decides, by
    /// `[access]`).
    pub required: Option<bool>,
}

/// `[access]`: who may open exports without a certificate (see `server::access`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSection {
    /// `none`, `local` (unix socket and loopback: the default) or `any`.
    pub plain_reads: Option<Scope>,
    /// `none`, `local` or `any` (default `local` for a standalone server, `none` for a farm
    /// server).
    pub plain_writes: Option<Scope>,
}

/// `[store]`: where the vDisks are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// The store directory (`NAME.vhdx`, `NAME.N.avhdx`). Required, here or on the command line.
    pub dir: Option<PathBuf>,
}

/// `[nbd]`: the NBD listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdSection {
    /// TCP address (default [`DEFAULT_NBD_LISTEN`]); an empty string turns TCP off.
    pub listen: Option<String>,
    /// Unix socket path (default: none).
    pub socket: Option<PathBuf>,
    /// Most connections served at once (default 1024).
    pub max_connections: Option<usize>,
}

/// `[cache]`: the shared block cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// RAM budget in bytes (default: a quarter of `MemTotal`; 0 caches nothing).
    pub ram_bytes: Option<u64>,
    /// Cache granule in bytes, a power of two from 4 KiB to 4 MiB (default 64 KiB).
    pub block_bytes: Option<u32>,
    /// Bytes of what scans (long sequential reads of a large vDisk) filled that stay cached
    /// whatever else happens (default 64 MiB; 0 turns scans off).
    pub scan_window_bytes: Option<u64>,
}

/// `[write_cache]`: the per-device write caches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteCacheSection {
    /// Directory of the write-cache files (default `<store>/.write-cache`).
    pub dir: Option<PathBuf>,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// HTTP address of `GET /metrics` (default [`DEFAULT_METRICS_LISTEN`]); an empty string
    /// turns it off.
    pub listen: Option<String>,
}

/// Errors of reading or resolving a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`CONFIG_FILE_BYTES_MAX`].
    #[error("config file {path} is {len} bytes; the limit is {CONFIG_FILE_BYTES_MAX}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The file is not valid TOML or has an unknown key or a value of the wrong type. The
    /// message names the key and the line.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message (for unknown keys: "unknown field `KEY`, expected ...").
        message: String,
    },
    /// No store directory was given.
    #[error("no store directory: set [store] dir in the config file or pass --store DIR")]
    MissingStore,
    /// A value is out of range or does not parse.
    #[error("invalid value for {key}: {why}")]
    InvalidValue {
        /// The key, as `section.key`.
        key: &'static str,
        /// Why.
        why: String,
    },
}

/// The settings the server runs with, defaults filled in and limits checked.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The NBD listeners and their limits.
    pub nbd: ServerConfig,
    /// The block cache.
    pub cache: CacheConfig,
    /// The store and write-cache directories.
    pub registry: RegistryConfig,
    /// The metrics endpoint, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// The certificate directory of `[tls] dir`, if any.
    pub tls_dir: Option<PathBuf>,
    /// `[tls] required`.
    pub tls_required: bool,
    /// `[access]` as written (a farm server fills the rest with its own defaults).
    pub access: AccessSection,
    /// `[limits]` of the listeners beside NBD.
    pub limits: ListenLimits,
}

impl Resolved {
    /// The access rule: `[access]` over `base` (`AccessPolicy::STANDALONE` or `FARM`).
    pub fn access_policy(&self, base: AccessPolicy) -> AccessPolicy {
        AccessPolicy {
            plain_reads: self.access.plain_reads.unwrap_or(base.plain_reads),
            plain_writes: self.access.plain_writes.unwrap_or(base.plain_writes),
        }
    }
}

impl Resolved {
    /// Builds the block cache these settings describe.
    ///
    /// # Errors
    /// [`block_cache::CacheError`].
    pub fn block_cache(&self) -> Result<BlockCache, block_cache::CacheError> {
        BlockCache::with_config(self.cache.clone())
    }
}

impl FerryConfig {
    /// Parses the text of a configuration file; `path` only names it in errors.
    ///
    /// # Errors
    /// [`ConfigError::Parse`].
    pub fn parse(text: &str, path: &Path) -> Result<FerryConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::TooLarge`], [`ConfigError::Parse`].
    pub fn load(path: &Path) -> Result<FerryConfig, ConfigError> {
        let read_err = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read_err)?.len();
        if len > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                path: path.to_path_buf(),
                len,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(FerryConfig::parse(&text, path)?.anchored(base))
    }

    /// The file's relative paths (`[store] dir`, `[write_cache] dir`, `[tls] dir`, `[nbd]
    /// socket`) taken from `base`, the file's directory, as a reader of the file expects,
    /// not from the working directory of whoever starts the server. Paths given on the
    /// command line stay as given.
    fn anchored(mut self, base: &Path) -> FerryConfig {
        for p in [
            &mut self.store.dir,
            &mut self.write_cache.dir,
            &mut self.tls.dir,
            &mut self.nbd.socket,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        self
    }

    /// Fills in the defaults and checks every value.
    ///
    /// # Errors
    /// [`ConfigError::MissingStore`], [`ConfigError::InvalidValue`].
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        let store_dir = self.store.dir.clone().ok_or(ConfigError::MissingStore)?;
        let write_cache_dir = self
            .write_cache
            .dir
            .clone()
            .unwrap_or_else(|| store_dir.join(DEFAULT_WRITE_CACHE_SUBDIR));
        let defaults = ServerConfig::default();
        let max_connections = self.nbd.max_connections.unwrap_or(defaults.max_connections);
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&max_connections) {
            return Err(ConfigError::InvalidValue {
                key: "nbd.max_connections",
                why: format!("{max_connections} must be 1 to {MAX_CONNECTIONS_LIMIT}"),
            });
        }
        let nbd_listen = address("nbd.listen", self.nbd.listen.as_deref(), DEFAULT_NBD_LISTEN)?;
        if nbd_listen.is_none() && self.nbd.socket.is_none() {
            return Err(ConfigError::InvalidValue {
                key: "nbd.listen",
                why: "TCP is off and no nbd.socket is set: nothing would be served".into(),
            });
        }
        let limits = self.limits.resolve()?;
        let nbd = ServerConfig {
            nbd_listen,
            nbd_socket: self.nbd.socket.clone(),
            max_connections,
            max_connections_per_address: positive(
                "limits.nbd_per_address",
                self.limits.nbd_per_address,
                defaults.max_connections_per_address,
            )?,
            handshake_timeout: millis(
                "limits.nbd_handshake_timeout_ms",
                self.limits.nbd_handshake_timeout_ms,
                defaults.handshake_timeout,
            )?,
            trust_loopback: limits.trust_loopback,
            ..defaults
        };
        let cache = CacheConfig {
            budget_bytes: self
                .cache
                .ram_bytes
                .unwrap_or_else(block_cache::default_budget_bytes),
            block_bytes: self
                .cache
                .block_bytes
                .unwrap_or(block_cache::DEFAULT_BLOCK_BYTES),
            scan_window_bytes: self
                .cache
                .scan_window_bytes
                .unwrap_or(CacheConfig::default().scan_window_bytes),
            ..CacheConfig::default()
        };
        cache.validate().map_err(|e| ConfigError::InvalidValue {
            key: "cache.block_bytes",
            why: e.to_string(),
        })?;
        let metrics_listen = address(
            "metrics.listen",
            self.metrics.listen.as_deref(),
            DEFAULT_METRICS_LISTEN,
        )?;
        Ok(Resolved {
            nbd,
            cache,
            registry: RegistryConfig {
                store_dir,
                write_cache_dir,
            },
            metrics_listen,
            tls_dir: self.tls.dir.clone(),
            tls_required: self.tls.required.unwrap_or(false),
            access: self.access.clone(),
            limits,
        })
    }
}

impl LimitsSection {
    /// Fills in the defaults and checks every value.
    ///
    /// # Errors
    /// [`ConfigError::InvalidValue`].
    pub fn resolve(&self) -> Result<ListenLimits, ConfigError> {
        Ok(ListenLimits {
            api_per_address: positive(
                "limits.api_per_address",
                self.api_per_address,
                budget::API_PER_ADDRESS_MAX,
            )?,
            boot_per_address: positive(
                "limits.boot_per_address",
                self.boot_per_address,
                budget::BOOT_PER_ADDRESS_MAX,
            )?,
            metrics_per_address: positive(
                "limits.metrics_per_address",
                self.metrics_per_address,
                budget::METRICS_PER_ADDRESS_MAX,
            )?,
            trust_loopback: self.trust_loopback.unwrap_or(true),
            tls_handshake_timeout: millis(
                "limits.tls_handshake_timeout_ms",
                self.tls_handshake_timeout_ms,
                DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            )?,
            http_header_timeout: millis(
                "limits.http_header_timeout_ms",
                self.http_header_timeout_ms,
                DEFAULT_HTTP_HEADER_TIMEOUT,
            )?,
            http_stall_timeout: millis(
                "limits.http_stall_timeout_ms",
                self.http_stall_timeout_ms,
                DEFAULT_HTTP_STALL_TIMEOUT,
            )?,
        })
    }
}

/// A count that must be at least 1.
fn positive(key: &'static str, value: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::InvalidValue {
            key,
            why: "0 would refuse every connection; give at least 1".into(),
        }),
        Some(n) => Ok(n),
    }
}

/// A timeout in milliseconds, at least 1.
fn millis(
    key: &'static str,
    value: Option<u64>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::InvalidValue {
            key,
            why: "a timeout of 0 ms would close every connection; give at least 1".into(),
        }),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

/// Parses an `ADDR:PORT` setting: `None` takes `default`, an empty string turns it off.
fn address(
    key: &'static str,
    value: Option<&str>,
    default: &str,
) -> Result<Option<SocketAddr>, ConfigError> {
    let text = value.unwrap_or(default).trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|e| ConfigError::InvalidValue {
            key,
            why: format!("{text:?} is not ADDR:PORT ({e})"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FerryConfig, ConfigError> {
        FerryConfig::parse(text, Path::new("ferry.toml"))
    }

    #[test]
    fn store_alone_resolves_with_defaults() {
        let r = parse("[store]\ndir = \"/srv/ferry\"\n")
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(r.nbd.nbd_listen, Some(DEFAULT_NBD_LISTEN.parse().unwrap()));
        assert_eq!(r.nbd.nbd_socket, None);
        assert_eq!(
            r.registry.write_cache_dir,
            PathBuf::from("/srv/ferry/.write-cache")
        );
        assert_eq!(
            r.metrics_listen,
            Some(DEFAULT_METRICS_LISTEN.parse().unwrap())
        );
        assert_eq!(r.cache.block_bytes, block_cache::DEFAULT_BLOCK_BYTES);
    }

    #[test]
    fn every_key_is_read() {
        let text = r#"
            [store]
            dir = "/s"
            [nbd]
            listen = "127.0.0.1:1234"
            socket = "/run/nbd.sock"
            max_connections = 7
            [cache]
            ram_bytes = 1048576
            block_bytes = 4096
            scan_window_bytes = 0
            [write_cache]
            dir = "/wc"
            [metrics]
            listen = ""
        "#;
        let r = parse(text).unwrap().resolve().unwrap();
        assert_eq!(r.nbd.nbd_listen, Some("127.0.0.1:1234".parse().unwrap()));
        assert_eq!(r.nbd.nbd_socket, Some(PathBuf::from("/run/nbd.sock")));
        assert_eq!(r.nbd.max_connections, 7);
        assert_eq!(r.cache.budget_bytes, 1 << 20);
        assert_eq!(r.cache.block_bytes, 4096);
        assert_eq!(r.cache.scan_window_bytes, 0);
        assert_eq!(r.registry.write_cache_dir, PathBuf::from("/wc"));
        assert_eq!(r.metrics_listen, None);
    }

    #[test]
    fn unknown_key_error_names_the_key() {
        let e = parse("[nbd]\nlisten_addr = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("listen_addr"), "{e}");
    }

    #[test]
    fn unknown_section_error_names_the_section() {
        let e = parse("[stor]\ndir = \"/s\"\n").unwrap_err();
        assert!(e.to_string().contains("stor"), "{e}");
    }

    #[test]
    fn missing_store_is_an_error() {
        let e = parse("").unwrap().resolve().unwrap_err();
        assert!(matches!(e, ConfigError::MissingStore), "{e}");
    }

    #[test]
    fn bad_address_names_the_key() {
        let e = parse("[store]\ndir = \"/s\"\n[metrics]\nlisten = \"nowhere\"\n")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("metrics.listen"), "{e}");
    }

    #[test]
    fn block_bytes_not_power_of_two_is_invalid() {
        let e = parse("[store]\ndir = \"/s\"\n[cache]\nblock_bytes = 5000\n")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("block_bytes"), "{e}");
    }

    #[test]
    fn limits_are_read_and_zero_is_refused() {
        let text = "[store]\ndir = \"/s\"\n[limits]\ntrust_loopback = false\n\
                    nbd_per_address = 3\nboot_per_address = 2\nhttp_header_timeout_ms = 250\n";
        let r = parse(text).unwrap().resolve().unwrap();
        assert!(!r.nbd.trust_loopback && !r.limits.trust_loopback);
        assert_eq!(r.nbd.max_connections_per_address, 3);
        assert_eq!(r.limits.boot_per_address, 2);
        assert_eq!(r.limits.http_header_timeout, Duration::from_millis(250));
        let e = parse("[store]\ndir = \"/s\"\n[limits]\napi_per_address = 0\n")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("limits.api_per_address"), "{e}");
    }

    #[test]
    fn zero_connections_is_invalid() {
        let e = parse("[store]\ndir = \"/s\"\n[nbd]\nmax_connections = 0\n")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("nbd.max_connections"), "{e}");
    }

    #[test]
    fn relative_paths_in_a_file_are_taken_from_the_file_s_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(
            &path,
            "[store]\ndir = \"store\"\n[write_cache]\ndir = \"../wc\"\n\
             [tls]\ndir = \"/etc/ferry/tls\"\n[nbd]\nsocket = \"run/nbd.sock\"\n",
        )
        .unwrap();
        let c = FerryConfig::load(&path).unwrap();
        assert_eq!(c.store.dir, Some(dir.path().join("store")));
        assert_eq!(c.write_cache.dir, Some(dir.path().join("../wc")));
        assert_eq!(c.tls.dir, Some(PathBuf::from("/etc/ferry/tls")));
        assert_eq!(c.nbd.socket, Some(dir.path().join("run/nbd.sock")));
    }
}
