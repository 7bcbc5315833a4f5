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
//! ```
//!
//! [`FerryConfig`] is what the file says (every field optional); [`FerryConfig::resolve`]
//! fills in the defaults and checks the limits, giving the [`Resolved`] settings the server
//! runs with. Unknown keys are errors that name the key, so a typo never silently falls back
//! to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
        FerryConfig::parse(&text, path)
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
        let nbd = ServerConfig {
            nbd_listen,
            nbd_socket: self.nbd.socket.clone(),
            max_connections,
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
        })
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
    fn zero_connections_is_invalid() {
        let e = parse("[store]\ndir = \"/s\"\n[nbd]\nmax_connections = 0\n")
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("nbd.max_connections"), "{e}");
    }
}
