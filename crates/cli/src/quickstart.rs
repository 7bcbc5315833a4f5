//! `ferry quickstart`: a whole farm on one machine, from embedded defaults.
//!
//! In `--data-dir` (default `./ferry-data`) it
//! 1. creates a farm (SQLite; the admin token is kept in `admin.token`, mode 0600, so a
//!    second run can print it again; the farm key and CA in `secrets/`, 0700);
//! 2. creates a store `demo`, the vDisk `demo` (1 GiB dynamic, a boot-sector-like first
//!    sector and a marked block), and version 1 (one sector changed) promoted to production;
//! 3. creates a site, a collection that adds unknown devices automatically (booting
//!    `demo`), and the device `02:00:00:00:00:01`, whose device secret it puts into the
//!    target's state directory (`ferry-state/`, 0700) as `ferry device credential` would;
//! 4. starts `ferry server --farm` (NBD, farm API and web console) and `ferry target` for
//!    that device through device login, exporting its disk on `target.sock`;
//! 5. prints the console's URL, the token, what to try next and, when qemu-system-x86_64 is
//!    installed, the command that boots a demo machine from the target's disk
//!    (`quickstart_machine`), and runs until Ctrl-C (`--check`: checks the console and the
//!    target answer and, with QEMU, that the demo machine boots version 1; then stops both).
//!
//! It is idempotent: what exists is kept (writing the base again would change its identity
//! and break the version above it).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use disk::open::{self, OpenOptions};
use disk::vhdx::CreateOptions;
use farm::model::{CacheMode, DeviceType};

use crate::quickstart_machine;
use crate::vdisk::create_vhdx;
use crate::{Global, print_json};

/// The demo vDisk's virtual size: 1 GiB.
const DEMO_SIZE_BYTES: u64 = 1 << 30;
/// The demo's store, vDisk, site and collection name.
const DEMO: &str = "demo";
/// The demo device.
const DEMO_MAC: &str = "02:00:00:00:00:01";
/// Where the base's marked block starts (1 MiB, where a first partition usually starts).
const BASE_BLOCK_OFFSET: u64 = 1 << 20;
/// Where the version writes its marker: the second sector.
const VERSION_MARK_OFFSET: u64 = 512;
/// How long the server and the target get to come up.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Who the farm's audit log says made the demo.
pub(crate) const ACTOR: &str = "quickstart";

/// Arguments of `quickstart`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Directory for the farm, its store and the target's socket (created if missing).
    #[arg(long, default_value = "ferry-data")]
    pub data_dir: PathBuf,
    /// Where the farm API and web console listen.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub api_listen: SocketAddr,
    /// Where the NBD server listens.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:10809")]
    pub nbd_listen: SocketAddr,
    /// Check that the console and the target answer and, when qemu-system-x86_64 is
    /// installed, that the demo machine boots version 1 from the target; then stop and exit
    /// (for tests and CI).
    #[arg(long)]
    pub check: bool,
    /// Print the URLs, token and paths as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Network-boot a Debian 12 machine (QEMU, no root disk) from the farm instead of the
    /// demo target: build the image once (cached), capture it as vDisk debian, serve it with
    /// the boot service and boot the machine through iPXE; with --check, headless, failing
    /// unless the machine reaches multi-user.
    #[arg(long)]
    pub linux: bool,
    /// Where the boot service listens (with --linux); the machine reaches it, the farm API
    /// and NBD at 10.0.2.2, QEMU's name for this host's loopback.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "127.0.0.1:8067",
        requires = "linux"
    )]
    pub boot_listen: SocketAddr,
    /// The static boot agent the image gets (with --linux) [default: the boot-agent
    /// profile's ferry-boot in this ferry's target directory, else ferry-boot beside ferry].
    #[arg(long, value_name = "FILE", requires = "linux")]
    pub agent: Option<PathBuf>,
    /// Where the built image is kept between runs (with --linux) [default: DATA-DIR/cache].
    #[arg(long, value_name = "DIR", requires = "linux")]
    pub cache_dir: Option<PathBuf>,
}

/// The farm's secrets as quickstart keeps them.
pub(crate) struct Secrets {
    /// The admin token (kept in `DATA/admin.token`).
    pub(crate) admin_token: String,
}

/// Runs `ferry quickstart`.
///
/// # Errors
/// Directory, farm, image, server and target errors.
pub fn run(a: &Args, global: Global) -> anyhow::Result<ExitCode> {
    let say = |msg: String| {
        if !global.quiet {
            eprintln!("{msg}");
        }
    };
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("create data directory {}", a.data_dir.display()))?;
    let data = a
        .data_dir
        .canonicalize()
        .with_context(|| format!("resolve {}", a.data_dir.display()))?;
    for addr in [a.api_listen, a.nbd_listen] {
        if TcpListener::bind(addr).is_err() {
            bail!("{addr} is in use: pass --api-listen/--nbd-listen with free ports");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start async runtime")?;
    let secrets = runtime.block_on(setup_farm(&data, &say))?;
    drop(runtime);
    let exe = std::env::current_exe().context("find the ferry binary")?;
    let log = |name: &str| -> anyhow::Result<Stdio> {
        let f = create_log(&data.join(name)).with_context(|| format!("create {name}"))?;
        Ok(Stdio::from(f))
    };
    let mut server = Guard(
        Command::new(&exe)
            .arg("server")
            .arg("--farm")
            .arg(&data)
            .arg("--api-listen")
            .arg(a.api_listen.to_string())
            .arg("--nbd-listen")
            .arg(a.nbd_listen.to_string())
            .arg("--metrics-listen")
            .arg("")
            .stdout(Stdio::null())
            .stderr(log("server.log")?)
            .spawn()
            .context("start ferry server")?,
    );
    let api = format!("http://{}", a.api_listen);
    wait_for(
        START_TIMEOUT,
        "the farm API",
        &mut server.0,
        &data.join("server.log"),
        || http_ok(&format!("{api}/api/v1/openapi.json")),
    )?;
    say(format!(
        "server up: NBD on {}, API and console on {api}/",
        a.nbd_listen
    ));
    let socket = data.join("target.sock");
    let _ = std::fs::remove_file(&socket);
    let mut target = Guard(
        Command::new(&exe)
            .arg("target")
            .arg("--server")
            .arg(&api)
            .arg("--device")
            .arg(DEMO_MAC)
            .arg("--overflow")
            .arg(&data)
            .arg("--export")
            .arg(format!("unix:{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(log("target.log")?)
            .spawn()
            .context("start ferry target")?,
    );
    wait_for(
        START_TIMEOUT,
        "the target's export",
        &mut target.0,
        &data.join("target.log"),
        || socket.exists(),
    )?;
    say(format!(
        "target {DEMO_MAC} logged in; its disk is {}",
        socket.display()
    ));
    let console = format!("{api}/");
    let qemu = quickstart_machine::qemu_installed();
    let machine = quickstart_machine::command_line(&socket);
    if a.json {
        print_json(&serde_json::json!({
            "console": console,
            "api": format!("{api}/api/v1"),
            "admin_token": secrets.admin_token,
            "nbd": a.nbd_listen.to_string(),
            "target_socket": socket,
            "data_dir": data,
            "demo_machine": qemu.then_some(&machine),
        }))?;
    } else {
        outln!();
        outln!("Ferry is running: one server, one farm, one diskless target.");
        outln!();
        outln!("  web console   {console}   (log in with the token below)");
        outln!("  admin token   {}", secrets.admin_token);
        outln!("  target disk   nbd+unix:///?socket={}", socket.display());
        outln!();
        outln!("Try:");
        outln!("  nbdinfo 'nbd+unix:///?socket={}'", socket.display());
        outln!(
            "  qemu-io -f raw 'nbd+unix:///?socket={}' -c 'read -v 512 128'",
            socket.display()
        );
        outln!(
            "  export FERRY_API={api} FERRY_TOKEN={}",
            secrets.admin_token
        );
        outln!("  ferry version list --vdisk {DEMO}");
        outln!("  ferry target status --export unix:{}", socket.display());
        outln!();
        if qemu {
            outln!("Boot a demo machine from the target's disk (it prints the version it read):");
            outln!("  {machine}");
        } else {
            outln!(
                "Install {} (Debian: qemu-system-x86) to boot a demo machine from the target's disk.",
                quickstart_machine::QEMU
            );
        }
        outln!();
        outln!(
            "Logs: {}/server.log, {}/target.log",
            data.display(),
            data.display()
        );
        if !a.check {
            outln!("Ctrl-C stops the target and the server.");
        }
    }
    if a.check {
        let ok = http_ok(&console) && http_ok(&format!("{api}/api/v1/openapi.json"));
        if !ok {
            bail!("the console at {console} did not answer");
        }
        let status = Command::new(&exe)
            .args(["target", "status", "--export"])
            .arg(format!("unix:{}", socket.display()))
            .stdout(Stdio::null())
            .status()
            .context("run ferry target status")?;
        if !status.success() {
            bail!("ferry target status failed ({status})");
        }
        if qemu {
            quickstart_machine::boot_check(&socket, quickstart_machine::VERSION_MARK)?;
            say(
                "check passed: the console answers, the target is attached, and the demo \
                 machine booted version 1 through it"
                    .into(),
            );
            return Ok(ExitCode::SUCCESS);
        }
        say("check passed: the console answers and the target is attached".into());
        return Ok(ExitCode::SUCCESS);
    }
    wait_for_ctrl_c(&mut server.0, &mut target.0)?;
    Ok(ExitCode::SUCCESS)
}

/// A child process stopped (SIGTERM, then SIGKILL) when dropped.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = self.0.id();
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `ready`, failing with the end of `log` when `child` exits first.
pub(crate) fn wait_for(
    timeout: Duration,
    what: &str,
    child: &mut Child,
    log: &Path,
    ready: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "{what} did not come up ({st}); last lines of {}:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "{what} did not come up within {timeout:?}; see {}",
        log.display()
    )
}

fn http_ok(url: &str) -> bool {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .ok()
        .and_then(|c| c.get(url).send().ok())
        .is_some_and(|r| r.status().is_success())
}

fn wait_for_ctrl_c(server: &mut Child, target: &mut Child) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tick.tick() => {
                    if let Ok(Some(st)) = server.try_wait() {
                        bail!("ferry server exited ({st}); see server.log");
                    }
                    if let Ok(Some(st)) = target.try_wait() {
                        bail!("ferry target exited ({st}); see target.log");
                    }
                }
            }
        }
        eprintln!("stopping the target and the server");
        anyhow::Ok(())
    })
}

/// Creates (or finds) the farm and its demo objects in `data`; returns the admin token.
pub(crate) async fn setup_farm(data: &Path, say: &impl Fn(String)) -> anyhow::Result<Secrets> {
    let config = farm::FarmConfig {
        data_dir: data.to_path_buf(),
        db_url: None,
        store_root: None,
    };
    let f = farm::Farm::open(&config)
        .await
        .context("open farm database")?;
    let token_file = data.join("admin.token");
    let admin_token = if f.is_initialized().await? {
        std::fs::read_to_string(&token_file)
            .map(|s| s.trim().to_string())
            .with_context(|| {
                format!(
                    "read {} (made by an earlier quickstart)",
                    token_file.display()
                )
            })?
    } else {
        let s = f.init("quickstart").await.context("initialize farm")?;
        crate::farm::write_private(&token_file, &s.admin_token)?;
        say(format!("created a farm in {}", data.display()));
        s.admin_token
    };
    let site = match f.list_sites(Some(1), Some(0)).await?.items.first() {
        Some(s) => s.id,
        None => {
            let n = farm::input::NewSite {
                name: DEMO.into(),
                description: "made by ferry quickstart".into(),
            };
            f.create_site(&n, ACTOR).await?.id
        }
    };
    let store = match f.list_stores(Some(1), Some(0)).await?.items.first() {
        Some(s) => s.id,
        None => {
            let n = farm::input::NewStore {
                name: DEMO.into(),
                path: DEMO.into(),
                bucket: String::new(),
            };
            f.create_store(&n, ACTOR).await?.id
        }
    };
    let store_dir = f.store_dir(store, None).await?;
    std::fs::create_dir_all(&store_dir)
        .with_context(|| format!("create store {}", store_dir.display()))?;
    let vdisk = match f.vdisk_by_name(DEMO).await {
        Ok(v) => v,
        Err(_) => {
            let base = store_dir.join(format!("{DEMO}.vhdx"));
            if !base.exists() {
                make_base(&base)?;
            }
            let n = farm::input::NewVDisk {
                store_id: store,
                name: DEMO.into(),
                size_bytes: None,
                cache_mode: Some(CacheMode::RamOverflow),
                ram_bytes: Some(256 << 20),
                description: "the quickstart's demo vDisk".into(),
            };
            let v = f
                .create_vdisk(&n, ACTOR)
                .await
                .context("add the demo vDisk")?;
            let ver = f.new_version(v.id, ACTOR).await?;
            let path = f.version_path(&v, &ver).await?;
            write_at(&path, &version_mark(), VERSION_MARK_OFFSET)?;
            f.promote(v.id, ver.number, ACTOR).await?;
            f.promote(v.id, ver.number, ACTOR).await?;
            say(format!(
                "created vDisk {DEMO} in {} with version {} in production",
                store_dir.display(),
                ver.number
            ));
            v
        }
    };
    if f.list_collections(Some(1), Some(0)).await?.items.is_empty() {
        let n = farm::input::NewCollection {
            site_id: site,
            name: DEMO.into(),
            auto_add: true,
            default_vdisk_id: Some(vdisk.id),
            auto_add_max: None,
            auto_add_per_minute: None,
        };
        let c = f.create_collection(&n, ACTOR).await?;
        let d = farm::input::NewDevice {
            collection_id: c.id,
            mac: DEMO_MAC.into(),
            name: "demo-target".into(),
            device_type: Some(DeviceType::Production),
            vdisk_id: Some(vdisk.id),
            cache_mode: None,
            ram_bytes: None,
            pinned_version: None,
            diskless: false,
        };
        f.create_device(&d, ACTOR).await?;
    }
    demo_secret(&f, data).await?;
    Ok(Secrets { admin_token })
}

/// Gives the demo device a device secret in the target's state directory (under the
/// `--overflow` directory, `data`), unless it has one.
async fn demo_secret(f: &farm::Farm, data: &Path) -> anyhow::Result<()> {
    let state = ::agent::login::DeviceState::new(&data.join(crate::target_farm::STATE_DIR_NAME));
    let mac = ::agent::login::parse_mac(DEMO_MAC)?;
    if state.secret(mac)?.is_some() {
        return Ok(());
    }
    let device = f
        .device_by_mac(DEMO_MAC)
        .await?
        .context("the demo device is gone: remove the data directory and run again")?;
    let c = f.reset_device_credential(device.id, ACTOR).await?;
    state.store(mac, &c.device_secret)?;
    Ok(())
}

fn make_base(path: &Path) -> anyhow::Result<()> {
    let opts = CreateOptions {
        size: DEMO_SIZE_BYTES,
        ..CreateOptions::default()
    };
    create_vhdx(path, &opts)?;
    write_at(path, &crate::quickstart_machine::boot_sector(), 0)?;
    write_at(path, &base_block(), BASE_BLOCK_OFFSET)
}

/// Writes `data` at `offset` of the image at `path` and closes it cleanly.
/// The mode of the logs quickstart writes: they name session exports and paths, so only
/// the owner reads them.
pub const LOG_FILE_MODE: u32 = 0o600;

/// Creates (or truncates) a log file with [`LOG_FILE_MODE`], tightening one an older run
/// left readable by others.
pub(crate) fn create_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(LOG_FILE_MODE)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(LOG_FILE_MODE))?;
    Ok(f)
}

fn write_at(path: &Path, data: &[u8], offset: u64) -> anyhow::Result<()> {
    let chain = open::open(
        path,
        OpenOptions {
            writable: true,
            format: None,
        },
    )?;
    let written = chain.top().write_at(data, offset);
    let closed = chain.close();
    written?;
    closed?;
    Ok(())
}

/// 64 KiB of a repeating, numbered line, so that a dump shows where the block starts.
fn base_block() -> Vec<u8> {
    let mut b = Vec::with_capacity(64 << 10);
    let mut line = 0u32;
    while b.len() < 64 << 10 {
        b.extend_from_slice(format!("ferry demo base block, line {line:06}\n").as_bytes());
        line += 1;
    }
    b.truncate(64 << 10);
    b
}

/// The second sector as version 1 writes it: [`VERSION_MARK`], a line feed, spaces, and a
/// line feed at its end.
fn version_mark() -> Vec<u8> {
    use crate::quickstart_machine::VERSION_MARK;
    let mut s = vec![b' '; 512];
    s[..VERSION_MARK.len()].copy_from_slice(VERSION_MARK.as_bytes());
    s[VERSION_MARK.len()] = b'\n';
    s[511] = b'\n';
    s
}
