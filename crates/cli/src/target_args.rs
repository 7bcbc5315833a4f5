//! The flags of the `ferry target` agent itself (`RunArgs`) and their parsers.

use std::path::PathBuf;

use ::agent::CacheMode;
use ::agent::boot::BOOT_QUIET;
use clap::Args as ClapArgs;

use crate::size::{parse_block_size, parse_nonzero_size, parse_size};

/// The export socket when `--export` is not given.
pub(crate) const DEFAULT_EXPORT: &str = "unix:/run/ferry/target.sock";
/// The environment variable that may hold the device secret (hex) for the first device
/// login.
pub(crate) const DEVICE_SECRET_ENV: &str = "FERRY_DEVICE_SECRET";

/// Arguments of the agent itself.
#[derive(Debug, Clone, ClapArgs)]
pub struct RunArgs {
    /// With --vdisk: NBD servers in failover order, HOST[:PORT][,HOST2[:PORT]...] (port 10809
    /// by default). With --device MAC alone: the farm's API, http://HOST:PORT[,...] (tried in
    /// order for the login; the farm then names the NBD servers).
    #[arg(
        long,
        value_name = "HOST[:PORT],...|URL,...",
        value_delimiter = ',',
        required = true
    )]
    pub server: Vec<String>,
    /// The vDisk to attach (without it, --device MAC logs in to the farm).
    #[arg(long, value_name = "NAME", required_unless_present = "device")]
    pub vdisk: Option<String>,
    /// Write-cache mode: ram, ram-overflow, disk, server, server-persistent, private
    /// (default ram-overflow; after device login the farm decides).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub cache: Option<CacheMode>,
    /// RAM budget of the ram and ram-overflow caches (default 1G; after device login the
    /// farm decides).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub ram: Option<u64>,
    /// Directory of the overflow file (ram-overflow, disk); the file is unlinked from the start.
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub overflow: PathBuf,
    /// Most bytes the overflow file may hold (the filesystem may fill first).
    #[arg(long, value_name = "SIZE", default_value = "1T", value_parser = parse_nonzero_size)]
    pub overflow_max: u64,
    /// With --vdisk: this device's name, for the server cache modes (default: the host
    /// name). Without --vdisk: this device's MAC, which logs in to the farm at --server.
    #[arg(long, value_name = "NAME|MAC")]
    pub device: Option<String>,
    /// Device login: the file holding this device's secret, as `ferry device credential`
    /// printed it (else its hex text from FERRY_DEVICE_SECRET). Needed only at the first
    /// login, which stores it in --state-dir; later logins prove with the stored one.
    #[arg(long, value_name = "FILE", conflicts_with = "vdisk")]
    pub device_secret: Option<PathBuf>,
    /// Device login: where the device secret is kept (0700; the file 0600), written at the
    /// first login (default: ferry-state under --overflow).
    #[arg(long, value_name = "DIR", conflicts_with = "vdisk")]
    pub state_dir: Option<PathBuf>,
    /// Device login: the farm's CA certificate (DATA/secrets/ca-cert.pem), which an
    /// https:// farm API's certificate must chain to (http:// only to loopback).
    #[arg(long, value_name = "FILE", conflicts_with = "vdisk")]
    pub farm_ca: Option<PathBuf>,
    /// Where to export the disk: unix:PATH.
    #[arg(long, value_name = "unix:PATH", default_value = DEFAULT_EXPORT)]
    pub export: String,
    /// The control socket (default: EXPORT.ctl).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Cache block size (a power of two, 512..1M).
    #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = parse_block_size)]
    pub cache_block: u32,
    /// The boot ends after this many bytes were read (or earlier: see --boot-quiet and
    /// `ferry target mark-booted`).
    #[arg(long, value_name = "SIZE", value_parser = parse_nonzero_size)]
    pub boot_bytes: Option<u64>,
    /// The boot ends at the last read of its first read burst (256 reads or more) once no
    /// read came for this many seconds; 0: only mark-booted and --boot-bytes end it.
    #[arg(long, value_name = "SECONDS", default_value_t = BOOT_QUIET.as_secs())]
    pub boot_quiet: u64,
    /// Seconds a server may take to answer one request before the target fails over.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = parse_seconds)]
    pub timeout: u64,
    /// Seconds one failover may look for a server before the request fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = parse_seconds)]
    pub failover_timeout: u64,
    /// Server modes: most bytes of writes kept to replay after a failover (server-persistent
    /// and private flush past it; in `server` mode a failover past it fails I/O).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub replay_max: u64,
    /// Local cache modes: read the vDisk version through the host read cache in DIR, shared
    /// by every agent of this user on the host, so machines booting one version fetch each
    /// block from the servers once per host (a 0600 file ferry-host-cache-UID; /dev/shm
    /// keeps it in RAM). A cache file of another user, or open to others, is refused.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = host_cache::DEFAULT_DIR)]
    pub host_cache: Option<PathBuf>,
    /// The host read cache's size (RAM, with /dev/shm), when this agent creates it; an
    /// existing cache keeps its size.
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = parse_nonzero_size)]
    pub host_cache_size: u64,
    /// After device login, do not read the version's boot set (from the farm) ahead of the
    /// machine's reads. By default a local cache mode with --host-cache prefetches it into
    /// the host read cache.
    #[arg(long)]
    pub no_prefetch: bool,
    /// NBD over TLS with the certificates in DIR: ca-cert.pem (the farm's CA, which the
    /// servers' certificates must chain to) and this device's client-cert.pem and
    /// client-key.pem (without them the connection is encrypted but anonymous). A server
    /// that does not offer TLS is then refused.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
}

/// A timeout in whole seconds, at least 1 (0 would fail every request at once).
pub(crate) fn parse_seconds(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err(format!("{s:?}: a timeout must be at least 1 second")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number of seconds")),
    }
}

/// A cache mode in either spelling (`ram-overflow` or the farm's `ram_overflow`).
pub(crate) fn parse_mode(s: &str) -> Result<CacheMode, String> {
    s.parse().map_err(|_| {
        let names: Vec<_> = CacheMode::ALL.iter().map(|m| m.cli_name()).collect();
        format!("unknown cache mode {s:?} (one of {})", names.join(", "))
    })
}
