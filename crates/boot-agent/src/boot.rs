//! The boot agent's steps: read what it is told, log in, start the agent, attach the
//! kernel's NBD device, report ready or why not.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agent::login::{LoginError, LoginGrant};
use agent::{AgentConfig, CacheMode};
use anyhow::{Context, anyhow, bail};

use contract::boot_args::{BootArgs, TEXT_BYTES_MAX};

/// How long the farm's API may stay unreachable at boot (the network may still be settling
/// or a server restarting) before the machine says it cannot boot; `ferry.login_wait=`
/// sets another.
const LOGIN_PATIENCE: Duration = Duration::from_secs(60);
/// Pause between login rounds over the API URLs.
const LOGIN_RETRY: Duration = Duration::from_secs(2);
/// How long the agent may take to attach (connect to a server, open the export);
/// `ferry.attach_wait=` sets another.
const ATTACH_PATIENCE: Duration = Duration::from_secs(120);
/// The `argv[0]` the agent runs under: '@' tells systemd not to kill it at shutdown.
const ROOT_DAEMON_ARGV0: &str = "@ferry-boot";
/// The boot-set prefetch's private read cache: this share of the machine's RAM, within
/// the bounds below. It is the machine's own RAM (the kernel's page cache keeps what the
/// boot read as well), and it stays resident once filled, so it is kept small: it needs
/// to hold only the window ahead of the boot ([`PREFETCH_AHEAD_SHARE`] of it), not the
/// whole set.
const PREFETCH_CACHE_RAM_DIVISOR: u64 = 16;
const PREFETCH_CACHE_MIN: u64 = 16 << 20;
const PREFETCH_CACHE_MAX: u64 = 256 << 20;
/// The window ahead of the boot: a quarter of the private cache, so that the blocks
/// fetched ahead are not the ones the cache's LRU gives up.
const PREFETCH_AHEAD_SHARE: u64 = 4;

const HELP: &str = "\
ferry-boot: Ferry's agent in a diskless machine's initramfs.

Logs in to the farm by MAC with its boot's one-time ticket (ferry.api=, ferry.mac=,
ferry.ticket= on the kernel command line, which the farm's boot script writes; the farm's
CA from /etc/ferry/boot.conf), attaches the vDisk version with the machine's write
cache and gives the kernel /dev/nbd0. Keeps running after switch_root. Writes
RUN_DIR/ready (the device) or RUN_DIR/failed (why it cannot boot).

Usage: ferry-boot [--cmdline FILE] [--config FILE] [--run-dir DIR]

Options:
  --cmdline FILE   kernel command line to read [default: /proc/cmdline]
  --config FILE    boot configuration [default: /etc/ferry/boot.conf]
  --run-dir DIR    sockets and state [default: /run/ferry]
  -h, --help       this text

Example (what the initramfs script runs, in the background):
  ferry-boot &   # with: boot=ferry ferry.api=https://10.0.2.2:8443 ferry.mac=52:54:00:12:34:56
";

/// Command-line options.
#[derive(Debug)]
struct Opts {
    cmdline: PathBuf,
    config: PathBuf,
    run_dir: PathBuf,
}

fn parse_opts(mut args: impl Iterator<Item = OsString>) -> Result<Option<Opts>, String> {
    let mut o = Opts {
        cmdline: PathBuf::from("/proc/cmdline"),
        config: PathBuf::from("/etc/ferry/boot.conf"),
        run_dir: PathBuf::from("/run/ferry"),
    };
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .map(PathBuf::from)
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.to_str() {
            Some("-h" | "--help") => return Ok(None),
            Some("--cmdline") => o.cmdline = value("--cmdline")?,
            Some("--config") => o.config = value("--config")?,
            Some("--run-dir") => o.run_dir = value("--run-dir")?,
            _ => return Err(format!("unknown argument {a:?} (see --help)")),
        }
    }
    Ok(Some(o))
}

/// Runs the boot agent; returns only when it cannot boot (or for `--help`).
pub fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let argv0 = argv.next().unwrap_or_default();
    let opts = match parse_opts(argv) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ferry-boot: {e}");
            return ExitCode::from(2);
        }
    };
    if !argv0.to_string_lossy().starts_with('@') {
        // Once, at start: `exec` only returns on failure, and then the agent runs on
        // unmarked (systemd may stop it at shutdown, after the root is unmounted).
        let e = reexec_marked();
        eprintln!("ferry-boot: could not re-exec as {ROOT_DAEMON_ARGV0}: {e}");
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let failed = opts.run_dir.join("failed");
    match boot(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!("ferry-boot: cannot boot: {why}");
            if let Err(w) = std::fs::write(&failed, format!("{why}\n")) {
                eprintln!("ferry-boot: write {}: {w}", failed.display());
            }
            ExitCode::FAILURE
        }
    }
}

/// Where the overflow goes: the local disk (or directory) `named` (`ferry.overflow=`) when
/// this machine has it, else `run_dir` (the initramfs's RAM), with the line that says so: an
/// image made with `--overflow /dev/vda` boots on a machine without that disk, its
/// overflow in RAM, as docs/netboot.md says.
fn overflow_dir(named: Option<&Path>, run_dir: &Path) -> (PathBuf, Option<String>) {
    match named {
        Some(p) if p.exists() => (p.to_path_buf(), None),
        Some(p) => (
            run_dir.to_path_buf(),
            Some(format!(
                "the overflow disk {} (ferry.overflow=) is not in this machine: the overflow stays in RAM",
                p.display()
            )),
        ),
        None => (
            run_dir.to_path_buf(),
            Some("no local disk named for the overflow (ferry.overflow=): it stays in RAM".into()),
        ),
    }
}

fn reexec_marked() -> std::io::Error {
    use std::os::unix::process::CommandExt;
    match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe)
            .arg0(ROOT_DAEMON_ARGV0)
            .args(std::env::args_os().skip(1))
            .exec(),
        Err(e) => e,
    }
}

fn read_limited(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(TEXT_BYTES_MAX as u64).read_to_string(&mut text))
        .with_context(|| format!("read {}", path.display()))?;
    Ok(text)
}

fn boot(opts: &Opts) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.run_dir)
        .with_context(|| format!("create {}", opts.run_dir.display()))?;
    // The export socket there is the root disk: root only.
    std::fs::set_permissions(
        &opts.run_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .with_context(|| format!("chmod 0700 {}", opts.run_dir.display()))?;
    let _ = std::fs::remove_file(opts.run_dir.join("ready"));
    let _ = std::fs::remove_file(opts.run_dir.join("failed"));
    let _ = std::fs::remove_file(opts.run_dir.join(crate::shutdown::ASKED));
    let _ = std::fs::remove_file(opts.run_dir.join(crate::shutdown::DONE));
    let mut args = BootArgs::new();
    if opts.config.exists() {
        args.apply_config(
            &read_limited(&opts.config)?,
            &opts.config.display().to_string(),
        )?;
    }
    args.apply_cmdline(&read_limited(&opts.cmdline)?)?;
    if !args.unknown.is_empty() {
        tracing::info!(keys = %args.unknown.join(","), "unknown ferry.* settings skipped");
    }
    let socket = opts.run_dir.join("agent.sock");
    let (mut cfg, what) = if !args.api.is_empty() {
        farm_config(&args, socket.clone())?
    } else if !args.servers.is_empty() {
        plain_config(&args, socket.clone())?
    } else {
        bail!(
            "no farm and no server: give ferry.api=URL (the farm's boot script does) or \
             ferry.server=HOST:PORT with ferry.export=NAME on the kernel command line, or \
             api= in {}",
            opts.config.display()
        );
    };
    if matches!(cfg.mode, CacheMode::RamOverflow | CacheMode::Disk) {
        let (dir, why) = overflow_dir(args.overflow.as_deref(), &opts.run_dir);
        if let Some(why) = why {
            eprintln!("ferry-boot: {why}");
        }
        cfg.overflow_dir = Some(dir);
    }
    eprintln!("ferry-boot: attaching {what}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("ferry-boot")
        .build()
        .context("start the async runtime")?;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let agent_cfg = cfg.clone();
    runtime.spawn(async move {
        let r = agent::run(agent_cfg, std::future::pending::<()>()).await;
        let _ = done_tx.send(r);
    });
    wait_for_socket(
        &socket,
        &done_rx,
        args.attach_wait.unwrap_or(ATTACH_PATIENCE),
    )?;
    let disk = agent::kernel::attach(&socket, "", &args.device)?;
    // A clean shutdown ends the session (systemd's shutdown hook asks, once the root is
    // read-only): the run directory is opened now, before switch_root moves it.
    let end = cfg
        .export_name
        .as_ref()
        .map(|e| crate::shutdown::SessionEnd {
            apis: args.api.clone(),
            ca: args.ca.as_ref().and_then(|p| read_limited(p).ok()),
            export_name: e.to_string(),
            feed: cfg.status_feed.clone(),
        });
    if let Err(e) = crate::shutdown::watch(&opts.run_dir, end) {
        eprintln!("ferry-boot: a clean shutdown will not end the session: {e}");
    }
    std::fs::write(
        opts.run_dir.join("ready"),
        format!("{}\n", args.device.display()),
    )
    .context("write the ready file")?;
    eprintln!(
        "ferry-boot: {} is {what}, {} bytes ({} write cache)",
        args.device.display(),
        disk.info.size,
        cfg.mode.cli_name()
    );
    match disk.thread.map(std::thread::JoinHandle::join) {
        // Through netlink the driver holds the socket: nothing to wait for.
        None => {}
        Some(Ok(Ok(()))) => tracing::warn!("the kernel let go of the NBD device"),
        Some(Ok(Err(e))) => tracing::error!(error = %e, "the kernel's NBD device stopped"),
        Some(Err(_)) => tracing::error!("the NBD_DO_IT thread panicked"),
    }
    let _socket = disk.socket;
    // The export keeps running for anything still holding it; this process must not end
    // while the root file system may still be on it.
    loop {
        std::thread::park();
    }
}

/// Waits until the agent listens on `socket`, or says why it cannot.
fn wait_for_socket(
    socket: &Path,
    done: &std::sync::mpsc::Receiver<Result<(), agent::AgentError>>,
    patience: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while !socket.exists() {
        match done.recv_timeout(Duration::from_millis(100)) {
            Ok(Err(e)) => return Err(anyhow!(e).context("attach the vDisk")),
            Ok(Ok(())) => bail!("the agent stopped before it served the vDisk"),
            Err(_) if start.elapsed() > patience => {
                bail!("the vDisk was not attached within {patience:?}")
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// Without a farm: a plain export of the servers named.
fn plain_config(args: &BootArgs, socket: PathBuf) -> anyhow::Result<(AgentConfig, String)> {
    let export = args
        .export
        .as_deref()
        .context("ferry.server= needs ferry.export=NAME (the vDisk's export)")?;
    let mode = match &args.cache {
        Some(c) => c
            .parse::<CacheMode>()
            .map_err(|e| anyhow!("ferry.cache={c:?}: {e}"))?,
        None => CacheMode::Ram,
    };
    let mut cfg = AgentConfig::new(args.servers.clone(), export, mode, socket);
    cfg.device = args
        .mac
        .clone()
        .unwrap_or_else(|| "diskless".to_string())
        .replace(':', "-");
    Ok((
        cfg,
        format!("export {export} of {}", args.servers.join(",")),
    ))
}

/// With a farm: device login by MAC with the boot's one-time ticket (a diskless device
/// keeps no secret: the grant's new secret, kept in RAM, logs it in again this boot).
fn farm_config(args: &BootArgs, socket: PathBuf) -> anyhow::Result<(AgentConfig, String)> {
    let mac = match &args.mac {
        Some(m) => m.clone(),
        None => first_mac().context(
            "no ferry.mac= on the kernel command line and no network interface with a MAC",
        )?,
    };
    let ca = args
        .ca
        .as_ref()
        .map(|p| read_limited(p).context("the farm's CA certificate"))
        .transpose()?;
    let patience = args.login_wait.unwrap_or(LOGIN_PATIENCE);
    let (grant, key) = identity_login(args, &mac, ca.as_deref(), patience)?;
    if let Some(want) = args.version
        && grant.version != want
    {
        tracing::warn!(
            booted = want,
            granted = grant.version,
            "the farm grants another version than the boot script named (promoted meanwhile?); \
             the kernel is the boot script's, the root the grant's"
        );
    }
    let mut cfg = agent::grant::config_from_grant(&grant, socket)
        .context("the login grant's TLS certificate")?;
    cfg.relogin = key.map(|key| {
        relogin(
            args.api.clone(),
            mac.clone(),
            key,
            ca.clone(),
            &grant,
            patience,
        )
    });
    let what = format!(
        "vDisk {} version {} of device {} from {}",
        grant.vdisk,
        grant.version,
        grant.device_name,
        grant.servers.join(",")
    );
    if cfg.mode.is_local() && args.prefetch != Some(false) {
        // The version's boot set, read ahead of the kernel's reads (issue 21): fetched
        // from the farm once the agent runs, checked against the granted version.
        cfg.boot_set = Some(std::sync::Arc::new(
            agent::boot_set_fetch::FarmBootSet::for_grant(args.api[0].clone(), ca.clone(), &grant),
        ));
        let cache = prefetch_cache_bytes(mem_total_bytes());
        cfg.prefetch_cache_bytes = cache;
        cfg.prefetch.ahead_bytes = cache / PREFETCH_AHEAD_SHARE;
        cfg.prefetch.inflight_bytes = cfg.prefetch.inflight_bytes.min(cfg.prefetch.ahead_bytes);
        tracing::info!(
            cache_bytes = cache,
            ahead_bytes = cfg.prefetch.ahead_bytes,
            "the boot set is prefetched into a private read cache"
        );
    }
    let refresh = std::sync::Arc::new(agent::remote::ServerRefresh::default());
    cfg.refresh = Some(std::sync::Arc::clone(&refresh));
    let feed = std::sync::Arc::new(agent::report::StatusFeed::default());
    cfg.status_feed = Some(std::sync::Arc::clone(&feed));
    agent::report::start(
        &args.api,
        ca,
        grant.export_name.to_string(),
        feed,
        Some(refresh),
    );
    Ok((cfg, what))
}

/// The machine's TPM, unless `ferry.tpm=0` or it has none.
fn open_tpm(args: &BootArgs) -> Option<agent::tpm::Tpm<std::fs::File>> {
    if args.tpm == Some(false) {
        return None;
    }
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(agent::tpm::TPM_DEVICE)
        .ok()?;
    Some(agent::tpm::Tpm::new(f))
}

/// The device login of this boot: with the key kept in the machine's TPM when there is
/// one (and the farm takes it), else with the boot's one-time ticket, whose grant's new key
/// then goes into the TPM (and the farm is told, so that it takes no ticket for this device
/// any more). Returns the grant and the key later logins of this boot prove with.
fn identity_login(
    args: &BootArgs,
    mac: &str,
    ca: Option<&str>,
    patience: Duration,
) -> anyhow::Result<(LoginGrant, Option<Vec<u8>>)> {
    let mut tpm = open_tpm(args);
    let sealed = tpm.as_mut().and_then(|t| match t.load_key() {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %anyhow!(e), "the TPM's Ferry index cannot be read");
            None
        }
    });
    if let Some(key) = sealed {
        match login_patiently(&args.api, mac, &Proof::Key(key.clone()), ca, patience) {
            Ok(g) => {
                tracing::info!("logged in with the key kept in this machine's TPM");
                return Ok((g, Some(key)));
            }
            Err(e) if args.ticket.is_some() => {
                tracing::warn!(error = %format!("{e:#}"),
                    "the farm refused the TPM's key (a reset credential?): the boot's ticket next");
            }
            Err(e) => return Err(e),
        }
    }
    let ticket = args.ticket.clone().context(
        "no login ticket on the kernel command line (ferry.ticket=) and no key in a TPM: the \
         farm's boot script gives a ticket to a diskless device only (ferry device set ID \
         --diskless)",
    )?;
    let grant = login_patiently(&args.api, mac, &Proof::Ticket(ticket), ca, patience)?;
    let key = grant
        .device_secret
        .as_deref()
        .map(agent::login::parse_secret)
        .transpose()
        .context("the grant's device secret")?;
    if let (Some(t), Some(k)) = (tpm.as_mut(), &key) {
        match t.store_key(k) {
            Ok(()) => match agent::login::bind_tpm(&args.api[0], mac, k, ca) {
                Ok(()) => tracing::info!("the device key is kept in this machine's TPM now"),
                Err(e) => tracing::warn!(error = %e, "the farm was not told of the TPM's key"),
            },
            Err(e) => tracing::warn!(error = %anyhow!(e), "the device key cannot go into the TPM"),
        }
    }
    Ok((grant, key))
}

/// The prefetch's private cache for a machine of `mem` bytes of RAM (`None`: unknown).
fn prefetch_cache_bytes(mem: Option<u64>) -> u64 {
    mem.map_or(PREFETCH_CACHE_MIN, |m| {
        (m / PREFETCH_CACHE_RAM_DIVISOR).clamp(PREFETCH_CACHE_MIN, PREFETCH_CACHE_MAX)
    })
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// What a login proves with.
enum Proof {
    /// The boot's one-time ticket (the first login).
    Ticket(String),
    /// The device secret the ticket login's grant carried (a login again, this boot).
    Key(Vec<u8>),
}

/// Login at each API URL in turn until one answers, for up to `patience`
/// ([`LOGIN_PATIENCE`] unless `ferry.login_wait=`); a refusal (used or expired ticket,
/// unknown device…) ends it at once.
fn login_patiently(
    apis: &[String],
    mac: &str,
    proof: &Proof,
    ca: Option<&str>,
    patience: Duration,
) -> anyhow::Result<LoginGrant> {
    let start = Instant::now();
    loop {
        let mut last = None;
        for api in apis {
            let r = match proof {
                Proof::Ticket(t) => agent::login::login_ticket(api, mac, t, ca),
                Proof::Key(k) => agent::login::login_as(api, mac, k, ca, true),
            };
            match r {
                Ok(g) => {
                    tracing::info!(%api, device = %g.device_name, vdisk = %g.vdisk,
                        version = g.version, "logged in to the farm");
                    return Ok(g);
                }
                Err(e @ LoginError::Unreachable { .. }) => last = Some(e),
                Err(e) => return Err(anyhow!(e).context(format!("device login as {mac}"))),
            }
        }
        if start.elapsed() > patience {
            let e = last.map_or_else(|| anyhow!("no farm API named"), |e| anyhow!(e));
            return Err(e.context(format!(
                "the farm's API did not answer within {patience:?} (server unreachable)"
            )));
        }
        std::thread::sleep(LOGIN_RETRY);
    }
}

/// Logging in again for a failover whose servers refuse the session
/// ([`agent::grant::relogin`]: the same vDisk, version and cache mode only).
fn relogin(
    apis: Vec<String>,
    mac: String,
    key: Vec<u8>,
    ca: Option<String>,
    first: &LoginGrant,
    patience: Duration,
) -> agent::remote::Relogin {
    let proof = Proof::Key(key);
    agent::grant::relogin(first, move || {
        login_patiently(&apis, &mac, &proof, ca.as_deref(), patience).map_err(|e| format!("{e:#}"))
    })
}

/// The MAC of the first network interface that has one (not loopback).
fn first_mac() -> Option<String> {
    let mut names: Vec<_> = std::fs::read_dir("/sys/class/net")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n != "lo")
        .collect();
    names.sort();
    names.iter().find_map(|n| {
        let text =
            std::fs::read_to_string(Path::new("/sys/class/net").join(n).join("address")).ok()?;
        let mac = text.trim();
        (mac.parse::<contract::Mac>().is_ok() && mac != "00:00:00:00:00:00")
            .then(|| mac.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_unknown_ones() {
        let o = parse_opts(
            ["--cmdline", "/tmp/c", "--run-dir", "/tmp/r"]
                .into_iter()
                .map(OsString::from),
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.cmdline, PathBuf::from("/tmp/c"));
        assert_eq!(o.run_dir, PathBuf::from("/tmp/r"));
        assert!(
            parse_opts(["--help"].into_iter().map(OsString::from))
                .unwrap()
                .is_none()
        );
        let e = parse_opts(["--bogus"].into_iter().map(OsString::from)).unwrap_err();
        assert!(e.contains("--bogus"), "{e}");
        let e = parse_opts(["--config"].into_iter().map(OsString::from)).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
    }

    #[test]
    fn the_prefetch_cache_is_a_bounded_share_of_ram() {
        assert_eq!(prefetch_cache_bytes(None), PREFETCH_CACHE_MIN);
        assert_eq!(prefetch_cache_bytes(Some(768 << 20)), 48 << 20);
        assert_eq!(prefetch_cache_bytes(Some(64 << 20)), PREFETCH_CACHE_MIN);
        assert_eq!(prefetch_cache_bytes(Some(64 << 30)), PREFETCH_CACHE_MAX);
        let mem = mem_total_bytes().expect("this machine's MemTotal");
        assert!(mem > PREFETCH_CACHE_MIN, "{mem}");
    }

    #[test]
    fn an_overflow_disk_this_machine_lacks_leaves_the_overflow_in_ram() {
        let run = Path::new("/run/ferry");
        let (dir, why) = overflow_dir(Some(Path::new("/dev/ferry-no-such-disk")), run);
        assert_eq!(dir, run);
        let why = why.expect("a line that says so");
        assert!(
            why.contains("/dev/ferry-no-such-disk") && why.contains("stays in RAM"),
            "{why}"
        );
        let here = std::env::temp_dir();
        assert_eq!(overflow_dir(Some(&here), run), (here.clone(), None));
        let (dir, why) = overflow_dir(None, run);
        assert_eq!(dir, run);
        assert!(why.unwrap().contains("stays in RAM"));
    }
}
