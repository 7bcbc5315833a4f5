//! `ferry quickstart --linux`: a machine network-boots Linux from the farm.
//!
//! In `--data-dir` (the quickstart's farm) it
//! 1. checks what this machine lacks (QEMU, its iPXE ROM, the static boot agent and, when the
//!    image must be built, root, debootstrap and the build's tools) and stops with one error
//!    naming all of it;
//! 2. makes or finds the farm, as the demo does (`quickstart::setup_farm`);
//! 3. finds the Debian 12 image with the boot agent installed in its cache, or builds it
//!    (`quickstart_image`);
//! 4. adds the vDisk `debian` (its base is that image; `console=ttyS0` on the kernel's
//!    command line) and the diskless production device `linux-1` (`52:54:00:fe:00:01`);
//! 5. starts `ferry server --farm --boot-listen --advertise 10.0.2.2` (the API is HTTPS);
//! 6. powers on a QEMU machine with no root disk (a blank scratch disk for the write cache's
//!    overflow) that boots from its NIC: iPXE, the farm's boot script, the version's own
//!    kernel and initramfs, the boot agent's login with the boot's ticket, the root over NBD,
//!    systemd; each step is printed as its console shows it, until `FERRY-BOOT-OK` says
//!    multi-user is reached;
//! 7. waits until the farm's status shows the device's session and counters, prints the
//!    console's URL where it shows, and runs until Ctrl-C (`--check`: stops there).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use farm::model::{CacheMode, DeviceType};
use serde_json::{Value, json};

use crate::quickstart::{ACTOR, Args, Guard, START_TIMEOUT, create_log, setup_farm, wait_for};
use crate::quickstart_image::{self as image, Inputs};
use crate::{Global, print_json};

/// The vDisk of the machine.
const VDISK: &str = "debian";
/// The machine's MAC (QEMU's locally administered prefix) and its device's name.
const MAC: &str = "52:54:00:fe:00:01";
const DEVICE: &str = "linux-1";
/// The vDisk's write cache: RAM, overflowing to the machine's scratch disk.
const CACHE_RAM_BYTES: i64 = 256 << 20;
/// The scratch disk the write cache overflows to (sparse; `/dev/vda` in the machine).
const OVERFLOW_BYTES: u64 = 1 << 30;
/// The machine's memory.
const MACHINE_MIB: u32 = 768;
/// This host as QEMU's user network shows it to the machine.
const HOST_FROM_GUEST: &str = "10.0.2.2";
/// The shortest life of a boot's login ticket the quickstart leaves the farm: an emulated
/// machine takes far longer from its boot script to its login than a real one (the
/// default is 120 s).
const TICKET_SECS_MIN: i64 = 600;
/// A hang guard for the whole boot (TCG on a busy host), not a measure.
const BOOT_WAIT: Duration = Duration::from_secs(900);
/// A hang guard for the farm's status to show the booted device (reports every 2 s).
const STATUS_WAIT: Duration = Duration::from_secs(60);
/// How often the console and the status are read.
const POLL: Duration = Duration::from_millis(250);
/// Lines of the console an error carries.
const CONSOLE_TAIL_LINES: usize = 30;

/// The boot's steps as its console shows them: a line holding the needle, and what to say
/// (`None`: the console's line itself, which is the farm's or the agent's own words).
const MILESTONES: [(&str, Option<&str>); 6] = [
    (
        "iPXE",
        Some("its NIC's firmware (iPXE) asks DHCP and the boot service"),
    ),
    ("Ferry: device", None),
    (
        "Linux version",
        Some("the version's own kernel and initramfs started"),
    ),
    ("ferry-boot: attaching", None),
    ("ferry-boot: /dev/nbd0 is", None),
    (guest::BOOT_MARKER, Some("systemd reached multi-user")),
];

/// Console lines that end a boot.
const FAILURES: [&str; 3] = [
    "Ferry: this machine cannot boot",
    "ferry-boot: cannot boot",
    "Kernel panic",
];

/// Runs `ferry quickstart --linux`.
///
/// # Errors
/// What is missing on this machine, and farm, image, server and machine errors.
pub fn run(a: &Args, global: Global) -> anyhow::Result<ExitCode> {
    let quiet = global.quiet;
    let say = |msg: String| {
        if !quiet {
            eprintln!("{msg}");
        }
    };
    let setup = prepare(a)?;
    let made = make(&setup, &say, quiet)?;
    let data = &setup.data;

    say("4. ferry server with the boot service".into());
    let api = format!("https://{}", loopback(a.api_listen));
    let boot_url = format!(
        "http://{HOST_FROM_GUEST}:{}/boot/ipxe",
        a.boot_listen.port()
    );
    let client = api_client(&setup.ca)?;
    let mut server = start_server(a, data, &made.exe, &api, &client)?;
    say(format!(
        "   NBD on {}, API and console on {api}/, boot service on {} ({boot_url} to the machine)",
        a.nbd_listen, a.boot_listen
    ));

    say(format!(
        "5. a machine with no root disk boots from its NIC (QEMU, {MAC}); its console: {}",
        data.join("linux").join("console.log").display()
    ));
    let powered_on_ms = unix_ms();
    let (mut vm, console_log) = start_machine(data, &boot_url)?;
    let booted = watch_boot(&mut vm, &console_log, &say)?;
    say(format!(
        "6. the farm's status shows {DEVICE} booted (session and counters)"
    ));
    let token = made.secrets.admin_token.as_str();
    let status = device_status((&client, &api, token), powered_on_ms, &mut vm)?;

    let console = format!("{api}/#/devices");
    if a.json {
        let machine = Machine {
            boot_url: &boot_url,
            console_log: &console_log,
            booted,
            status,
        };
        print_json(&report(a, &setup, &made, (&api, &console), &machine))?;
    } else {
        let shown = (console.as_str(), api.as_str(), token);
        summary(shown, &setup.ca, &console_log, a.check);
    }
    if a.check {
        say(format!(
            "check passed: {DEVICE} network-booted vDisk {VDISK} to multi-user in {:.0} s, and \
             the farm shows its session",
            booted.as_secs_f64()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    wait_until_stopped(&mut server, &mut vm)?;
    Ok(ExitCode::SUCCESS)
}

/// Where things are, once this machine was found to have what the mode needs.
struct Setup {
    /// The data directory (absolute).
    data: PathBuf,
    /// The image cache.
    cache: PathBuf,
    /// The guest root's cache.
    guest_cache: PathBuf,
    /// The farm's CA certificate (made with the farm when missing).
    ca: PathBuf,
    /// The static boot agent.
    agent: PathBuf,
}

/// Makes the data directory, checks the ports, and checks what this machine lacks (what
/// an image build needs too, unless the image of this agent and farm is in the cache):
/// one error naming all of it.
fn prepare(a: &Args) -> anyhow::Result<Setup> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("create data directory {}", a.data_dir.display()))?;
    let data = a
        .data_dir
        .canonicalize()
        .with_context(|| format!("resolve {}", a.data_dir.display()))?;
    for addr in [a.api_listen, a.nbd_listen, a.boot_listen] {
        if TcpListener::bind(addr).is_err() {
            bail!("{addr} is in use: pass --api-listen/--nbd-listen/--boot-listen with free ports");
        }
    }
    let guest_cache = guest::default_cache();
    let cache = a.cache_dir.clone().unwrap_or_else(|| data.join("cache"));
    let ca = data
        .join(farm::secrets::SECRETS_DIR)
        .join(farm::secrets::CA_CERT_FILE);
    let agent = image::find_agent(a.agent.as_deref());
    let cached = match (&agent, ca.is_file()) {
        (Ok(agent), true) => image::cached_image(&cache, &image::image_key(agent, &ca)?).is_file(),
        _ => false,
    };
    let mut missing = image::missing(!cached, &guest_cache);
    let agent = match agent {
        Ok(path) => Some(path),
        Err(why) => {
            missing.insert(0, why);
            None
        }
    };
    image::require(&missing)?;
    Ok(Setup {
        data,
        cache,
        guest_cache,
        ca,
        agent: agent.context("the boot agent")?,
    })
}

/// What [`make`] made or found.
struct Made {
    /// The farm's admin token.
    secrets: crate::quickstart::Secrets,
    /// The binary that runs the install and the server.
    exe: PathBuf,
    /// The image's key and its file in the cache.
    key: String,
    image: PathBuf,
    /// What the build did, when the cache had no image of the key.
    built: Option<image::Built>,
    /// The vDisk in the farm.
    objects: Objects,
}

/// Steps 1 to 3: the farm, the image (cached or built), the vDisk and the device.
fn make(s: &Setup, say: &impl Fn(String), quiet: bool) -> anyhow::Result<Made> {
    say(format!("1. the farm in {}", s.data.display()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start async runtime")?;
    let secrets = runtime.block_on(setup_farm(&s.data, say))?;
    let key = image::image_key(&s.agent, &s.ca)?;
    let file = image::cached_image(&s.cache, &key);
    let exe = running_binary()?;
    let built = if file.is_file() {
        say(format!("2. the image (cached): {}", file.display()));
        None
    } else {
        say("2. the image: Debian 12 with Ferry's boot agent in its initramfs".into());
        let inputs = Inputs {
            exe: &exe,
            agent: &s.agent,
            ca: &s.ca,
            cache: &s.cache,
            key: &key,
            guest_cache: &s.guest_cache,
        };
        Some(image::build(&inputs, say, quiet)?)
    };
    say(format!(
        "3. vDisk {VDISK} and the diskless device {DEVICE} ({MAC}) in the farm"
    ));
    let objects = runtime.block_on(farm_objects(&s.data, &file, say))?;
    Ok(Made {
        secrets,
        exe,
        key,
        image: file,
        built,
        objects,
    })
}

/// What the machine did, for the report.
struct Machine<'a> {
    boot_url: &'a str,
    console_log: &'a Path,
    booted: Duration,
    status: Value,
}

/// The `--json` report: the farm's URLs, token and paths, and what was done.
fn report(a: &Args, s: &Setup, m: &Made, (api, console): (&str, &str), vm: &Machine) -> Value {
    let built = m.built.as_ref();
    json!({
        "console": console,
        "api": format!("{api}/api/v1"),
        "admin_token": m.secrets.admin_token,
        "farm_ca": s.ca,
        "data_dir": s.data,
        "nbd": a.nbd_listen.to_string(),
        "boot_url": vm.boot_url,
        "linux": {
            "guest_root": built.map_or_else(|| guest::root_tar(&s.guest_cache), |b| b.root_tar.clone()),
            "guest_root_built": built.is_some_and(|b| b.root_built),
            "image": m.image,
            "image_key": m.key,
            "image_built": built.is_some(),
            "vdisk": VDISK,
            "vdisk_file": m.objects.file,
            "vdisk_action": m.objects.action,
            "device": { "name": DEVICE, "mac": MAC },
            "console_log": vm.console_log,
            "multi_user": true,
            "boot_secs": vm.booted.as_secs_f64(),
            "farm_status": vm.status,
        },
    })
}

/// The binary of this process, to run the server and the install with: `/proc/self/exe`,
/// which stays this very file when a build or an upgrade replaces the one at its path in
/// the minutes the image takes (a server of another build would find the farm's schema
/// newer than its own).
fn running_binary() -> anyhow::Result<PathBuf> {
    let proc = Path::new("/proc/self/exe");
    if proc.exists() {
        return Ok(proc.to_path_buf());
    }
    std::env::current_exe().context("find the ferry binary")
}

/// `addr` with an unspecified IP (0.0.0.0, ::) replaced by the loopback address, to dial.
fn loopback(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    }
}

/// What [`farm_objects`] found or made.
struct Objects {
    /// The vDisk's base file in the store.
    file: PathBuf,
    /// `created`, `kept`, `replaced` (a new image for a vDisk without versions) or
    /// `outdated` (kept: versions were made above the old image).
    action: &'static str,
}

/// The vDisk (its base the cached `image`), the device and the ticket life, in the farm.
async fn farm_objects(data: &Path, image: &Path, say: &impl Fn(String)) -> anyhow::Result<Objects> {
    let config = farm::FarmConfig {
        data_dir: data.to_path_buf(),
        db_url: None,
        store_root: None,
    };
    let f = farm::Farm::open(&config)
        .await
        .context("open farm database")?;
    let store = f.list_stores(Some(1), Some(0)).await?;
    let store = store
        .items
        .first()
        .context("the quickstart's store is gone")?
        .id;
    let file = f
        .store_dir(store, None)
        .await?
        .join(format!("{VDISK}.vhdx"));
    let (vdisk, action) = match f.vdisk_by_name(VDISK).await {
        Ok(v) => {
            let action = refresh(&f, &v, image, &file).await?;
            (v, action)
        }
        Err(e) if e.kind() == farm::Kind::NotFound => {
            image::place(image, &file)?;
            let n = farm::input::NewVDisk {
                store_id: store,
                name: VDISK.into(),
                size_bytes: None,
                cache_mode: Some(CacheMode::RamOverflow),
                ram_bytes: Some(CACHE_RAM_BYTES),
                description: "Debian 12 with Ferry's boot agent (ferry quickstart --linux)".into(),
            };
            let v = f
                .create_vdisk(&n, ACTOR)
                .await
                .context("add vDisk debian")?;
            // The image's kernel has no console argument of its own: the machine's is
            // its serial port.
            let patch = farm::input::VDiskPatch {
                boot_cmdline: Some("console=ttyS0".into()),
                ..Default::default()
            };
            f.update_vdisk(v.id, &patch, ACTOR).await?;
            (v, "created")
        }
        Err(e) => return Err(e).context("find vDisk debian"),
    };
    say(format!("   vDisk {VDISK} ({action}): {}", file.display()));
    if f.device_by_mac(MAC).await?.is_none() {
        let collections = f.list_collections(Some(1), Some(0)).await?;
        let collection = collections
            .items
            .first()
            .context("the quickstart's collection is gone")?;
        let d = farm::input::NewDevice {
            collection_id: collection.id,
            mac: MAC.into(),
            name: DEVICE.into(),
            device_type: Some(DeviceType::Production),
            vdisk_id: Some(vdisk.id),
            cache_mode: None,
            ram_bytes: None,
            pinned_version: None,
            diskless: true,
        };
        f.create_device(&d, ACTOR).await.context("add the device")?;
    }
    let settings = f.settings().await?;
    if settings.boot_ticket_secs < TICKET_SECS_MIN {
        let patch = farm::input::SettingsPatch {
            boot_ticket_secs: Some(TICKET_SECS_MIN),
            ..Default::default()
        };
        f.update_settings(&patch, ACTOR).await?;
        say(format!(
            "   a boot's login ticket now lives {TICKET_SECS_MIN} s (was {} s): an emulated \
             machine is slow to log in",
            settings.boot_ticket_secs
        ));
    }
    Ok(Objects { file, action })
}

/// Brings the existing vDisk `v` to `image`: kept when its base is that image; replaced when
/// it has no version but its base (the old boot set goes with it); else kept as it is.
async fn refresh(
    f: &farm::Farm,
    v: &farm::model::VDisk,
    image: &Path,
    file: &Path,
) -> anyhow::Result<&'static str> {
    if image::same_image(image, file) {
        return Ok("kept");
    }
    let versions = f.versions(v.id).await?;
    let only_base = matches!(versions.as_slice(), [v0] if v0.number == 0);
    if !only_base {
        return Ok("outdated");
    }
    image::place(image, file)?;
    let mut set = file.as_os_str().to_owned();
    set.push(server::boot_sets::BOOT_SET_SUFFIX);
    let _ = std::fs::remove_file(PathBuf::from(set));
    f.clear_boot_set(v.id, 0, ACTOR).await?;
    Ok("replaced")
}

/// A client of the farm's API that trusts the farm's CA.
fn api_client(ca: &Path) -> anyhow::Result<reqwest::blocking::Client> {
    let pem = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
    let cert = reqwest::Certificate::from_pem(&pem).context("the farm's CA certificate")?;
    reqwest::blocking::Client::builder()
        .add_root_certificate(cert)
        .timeout(Duration::from_secs(5))
        .build()
        .context("an HTTPS client")
}

/// `ferry server --farm` with the boot service, advertised to the machine as 10.0.2.2; once
/// its API and boot port answer.
fn start_server(
    a: &Args,
    data: &Path,
    exe: &Path,
    api: &str,
    client: &reqwest::blocking::Client,
) -> anyhow::Result<Guard> {
    let log = create_log(&data.join("server.log")).context("create server.log")?;
    let mut server = Guard(
        Command::new(exe)
            .arg("server")
            .arg("--farm")
            .arg(data)
            .arg("--api-listen")
            .arg(a.api_listen.to_string())
            .arg("--nbd-listen")
            .arg(a.nbd_listen.to_string())
            .arg("--boot-listen")
            .arg(a.boot_listen.to_string())
            .args(["--advertise", HOST_FROM_GUEST, "--metrics-listen", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("start ferry server")?,
    );
    let openapi = format!("{api}/api/v1/openapi.json");
    let boot = loopback(a.boot_listen);
    wait_for(
        START_TIMEOUT,
        "the farm API and the boot service",
        &mut server.0,
        &data.join("server.log"),
        || {
            TcpStream::connect(boot).is_ok()
                && client
                    .get(&openapi)
                    .send()
                    .is_ok_and(|r| r.status().is_success())
        },
    )?;
    Ok(server)
}

/// The machine, started: a blank overflow disk, network boot from `boot_url`. Its console
/// goes to `DATA/linux/console.log`, returned with it.
fn start_machine(data: &Path, boot_url: &str) -> anyhow::Result<(guest::Running, PathBuf)> {
    let dir = data.join("linux");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    // A new scratch disk each boot: the write cache never reads what it held.
    let overflow = dir.join("overflow.raw");
    let f = std::fs::File::create(&overflow)
        .with_context(|| format!("create {}", overflow.display()))?;
    f.set_len(OVERFLOW_BYTES)
        .with_context(|| format!("size {}", overflow.display()))?;
    let console_log = dir.join("console.log");
    let vm = guest::Qemu::new(&console_log)
        .memory_mib(MACHINE_MIB)
        .mac(MAC)
        .bootfile(boot_url)
        .disk(&overflow)
        .network_boot()
        .spawn()
        .context("start the machine")?;
    Ok((vm, console_log))
}

/// Follows the machine's console: says each of [`MILESTONES`] as it shows, fails on one of
/// [`FAILURES`], on QEMU's exit or after [`BOOT_WAIT`]; the time to multi-user.
fn watch_boot(
    vm: &mut guest::Running,
    console_log: &Path,
    say: &impl Fn(String),
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + BOOT_WAIT;
    let mut next = 0;
    loop {
        let log = vm.log();
        while let Some((needle, what)) = MILESTONES.get(next) {
            let Some(line) = log.lines().find(|l| l.contains(needle)) else {
                break;
            };
            let shown = what.map_or_else(|| line.trim().to_owned(), str::to_owned);
            say(format!("   {:5.1} s  {shown}", vm.elapsed().as_secs_f64()));
            next += 1;
        }
        if next == MILESTONES.len() {
            return Ok(vm.elapsed());
        }
        let failed = FAILURES.iter().find(|f| log.contains(*f));
        let why = if let Some(f) = failed {
            Some(format!("the machine cannot boot ({f:?} on its console)"))
        } else if let Some(status) = vm.try_wait() {
            Some(format!("QEMU exited ({status}) before multi-user"))
        } else if Instant::now() >= deadline {
            Some(format!("no multi-user within {BOOT_WAIT:?}"))
        } else {
            None
        };
        if let Some(why) = why {
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(CONSOLE_TAIL_LINES)..].join("\n");
            bail!(
                "{why}; the last lines of {}:\n{tail}",
                console_log.display()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// Now on the system clock (the farm's), in milliseconds since the Unix epoch.
fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The device's status through the farm's API (client, URL, token) once it shows a session
/// begun since `since_ms` (this boot's, not one an earlier run left) and that session's
/// counters with bytes read (the agent reports every 2 s); fails after [`STATUS_WAIT`].
fn device_status(
    (client, api, token): (&reqwest::blocking::Client, &str, &str),
    since_ms: i64,
    vm: &mut guest::Running,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + STATUS_WAIT;
    loop {
        let status: Value = client
            .get(format!("{api}/api/v1/status"))
            .bearer_auth(token)
            .send()
            .and_then(|r| r.json())
            .unwrap_or(Value::Null);
        let device = status["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["mac"] == MAC)
            .cloned()
            .unwrap_or(Value::Null);
        let (session, counters) = (&device["session"], &device["counters"]);
        let this_boot = session["since_ms"].as_i64().is_some_and(|t| t >= since_ms);
        let reported = counters["session_id"] == session["id"]
            && counters["bytes_read"].as_u64().is_some_and(|n| n > 0);
        if this_boot && reported {
            return Ok(device);
        }
        if vm.try_wait().is_some() || Instant::now() >= deadline {
            bail!("the farm's status does not show {DEVICE} booted: {device}");
        }
        std::thread::sleep(POLL);
    }
}

/// The text the first look ends with, on stdout: the console's URL, the API and token.
fn summary((console, api, token): (&str, &str, &str), ca: &Path, log: &Path, check: bool) {
    outln!();
    outln!(
        "Ferry is running: a farm, its server, and a machine that network-booted Linux from it."
    );
    outln!();
    outln!("  web console   {console}   (log in with the token below)");
    outln!("  admin token   {token}");
    outln!(
        "  farm CA       {}   (it signed the console's certificate)",
        ca.display()
    );
    outln!("  machine       {DEVICE} ({MAC}), diskless, booted vDisk {VDISK} to multi-user");
    outln!("  its console   {}", log.display());
    outln!();
    outln!("Try:");
    outln!("  tail -f {}", log.display());
    outln!(
        "  export FERRY_API={api} FERRY_TOKEN={token} FERRY_FARM_CA={}",
        ca.display()
    );
    outln!("  ferry device list");
    outln!("  ferry version new --vdisk {VDISK}    # a version to change (docs/farm.md)");
    outln!();
    if !check {
        outln!("Ctrl-C stops the machine and the server.");
    }
}

/// Runs until Ctrl-C or SIGTERM; fails when the server exits, says so once when the
/// machine does (the farm keeps running).
fn wait_until_stopped(server: &mut Guard, vm: &mut guest::Running) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut machine_down = false;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tick.tick() => {
                    if let Ok(Some(st)) = server.0.try_wait() {
                        bail!("ferry server exited ({st}); see server.log");
                    }
                    if !machine_down && let Some(st) = vm.try_wait() {
                        eprintln!("the machine stopped ({st}); the farm runs until Ctrl-C");
                        machine_down = true;
                    }
                }
            }
        }
        eprintln!("stopping the machine and the server");
        anyhow::Ok(())
    })
}
