//! `ferry`: the one binary of Ferry, which streams VHDX golden images to diskless machines.
//!
//! # Layout
//!
//! ```text
//! main.rs        argument parsing, logging, error printing, exit status
//! vdisk.rs       `ferry vdisk create|info|check|version|read|write` and the dispatcher
//! copy.rs        `ferry vdisk merge|convert|capture|compact` (long work: bars and summaries)
//! quickstart.rs  `ferry quickstart`: a whole farm here (server, console, one target)
//! quickstart_machine.rs its demo machine: the vDisk's boot sector, the QEMU command
//! quickstart_linux.rs `--linux`: a QEMU machine network-boots Debian from the farm
//! quickstart_image.rs its image: prerequisites, the static agent, the cached build
//! server.rs      `ferry server`: NBD + metrics over a store, until SIGINT/SIGTERM
//! server_farm.rs `ferry server --farm`: joins the farm, farm API + console, member flags
//! server_drain.rs `ferry server drain|undrain NAME` (the drain itself: crates/member)
//! target.rs      `ferry target`: the target device agent; `status`, `mark-booted`
//! progress.rs    indicatif bars behind `disk::ops::Progress`
//! size.rs        "10G", "512M", "32MiB" parsing
//! farm.rs        `ferry farm init|serve|vdisk|server|token|session|audit|settings`
//! farm_objects.rs `ferry site|store|collection|device|version` over the farm's REST API
//! farm_servers.rs `ferry farm server list|register|heartbeat|remove|set`
//! farm_client.rs the blocking API client, --api/--token/--json, table rendering
//! ```
//!
//! The commands are thin: they parse, call the `disk` library, and render its reports as text
//! or, with `--json`, as JSON on stdout and nothing else there.
//!
//! # Exit status
//!
//! 0 on success; 1 on any error (usage errors included), printed to stderr as
//! `error: <message>: <cause>: ...`; 2 when `ferry vdisk check` ran but problems remain.

/// `println!` for command output on stdout, through [`write_stdout`]: a reader that goes away
/// (`ferry ... | head`) ends the process quietly instead of panicking.
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod copy;
mod farm;
mod farm_client;
mod farm_objects;
mod farm_servers;
mod progress;
mod quickstart;
mod quickstart_image;
mod quickstart_linux;
mod quickstart_machine;
mod server;
mod server_boot;
mod server_boot_http;
mod server_bucket;
mod server_drain;
mod server_farm;
mod server_listen;
mod server_tls;
mod size;
mod target;
mod target_args;
mod target_farm;
mod target_initramfs;
mod vdisk;
mod vdisk_bucket;
mod version_boot_set;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Exit status of a failed command.
const EXIT_ERROR: u8 = 1;
/// Exit status of `check` when the image still has problems.
const EXIT_PROBLEMS: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "ferry",
    version,
    about = "Ferry: stream VHDX golden images (vDisks) to diskless machines",
    after_help = "Examples:\n  ferry quickstart\n  ferry vdisk create golden.vhdx --size 40G\n  \
                  ferry vdisk info golden.vhdx --json\n  \
                  ferry server --store ferry-data\n\n\
                  Logging: -v (info), -vv (debug), -vvv (trace), or RUST_LOG=disk=debug."
)]
struct Cli {
    /// More log output on stderr (repeat for more); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true, help_heading = "Global options")]
    verbose: u8,

    /// No progress bars and no informational messages on stderr.
    #[arg(short, long, global = true, help_heading = "Global options")]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, inspect, check, version, merge, convert and capture vDisk images.
    #[command(
        after_help = "Examples:\n  ferry vdisk create golden.vhdx --size 40G\n  \
                      ferry vdisk version new golden.vhdx golden.1.avhdx\n  \
                      ferry vdisk info golden.1.avhdx"
    )]
    Vdisk {
        #[command(subcommand)]
        command: vdisk::Command,
    },
    /// Run a whole demo farm on this machine: a server, the web console and one diskless
    /// target.
    ///
    /// In --data-dir (default ferry-data/) it creates a farm (SQLite database farm.db, the
    /// admin token in admin.token, the farm key in farm.key), a store with the demo vDisk
    /// (1 GiB, a demo boot sector) and its version 1 in production, a site, and a collection
    /// with the device 02:00:00:00:00:01. Then it starts `ferry server --farm` (NBD on
    /// --nbd-listen; the REST API and the web console on --api-listen, by default
    /// http://127.0.0.1:8080/) and `ferry target` for that device through device login, whose
    /// disk is exported on the unix socket ferry-data/target.sock. It prints the console's
    /// URL, the admin token to log in with and what to try next, with the QEMU command that
    /// boots a demo machine from the target's disk when qemu-system-x86_64 is installed, and
    /// runs until Ctrl-C (logs in ferry-data/server.log and target.log). Running it again
    /// keeps what exists.
    ///
    /// With --linux, a machine network-boots Linux from the farm instead: where
    /// qemu-system-x86_64 (with its iPXE ROM) and the static boot agent are there, it builds
    /// once (as root, with debootstrap; cached in --cache-dir) a Debian 12 image with the
    /// agent installed by `ferry target install-initramfs`, adds it as vDisk debian with the
    /// diskless device linux-1 (52:54:00:fe:00:01), starts `ferry server --farm` with the
    /// boot service (--boot-listen; the API is then HTTPS), and boots a QEMU machine with no
    /// root disk through iPXE, printing each step of its boot and the console's URL where
    /// the device shows. With --check it runs headless and fails unless the machine reaches
    /// multi-user and the farm shows it booted.
    #[command(after_help = "Examples:\n  \
        ferry quickstart                 # then open http://127.0.0.1:8080/ and paste the token\n  \
        nbdinfo 'nbd+unix:///?socket=ferry-data/target.sock'   # the target's disk\n  \
        qemu-system-x86_64 -nographic -m 64 \\\n      \
        -drive 'file=nbd+unix:///?socket=ferry-data/target.sock,format=raw'   # a demo machine\n  \
        ferry quickstart --data-dir /tmp/ferry-demo --api-listen 127.0.0.1:8081 \\\n      \
        --nbd-listen 127.0.0.1:10810\n  \
        ferry quickstart --check --json  # start, check the console and target, stop\n  \
        sudo ferry quickstart --linux    # a diskless machine boots Debian from the farm\n  \
        sudo ferry quickstart --linux --check \\\n      \
        --agent target/x86_64-unknown-linux-musl/boot-agent/ferry-boot")]
    Quickstart(quickstart::Args),
    /// Serve the vDisks of a store over NBD (with a shared block cache, per-device write
    /// caches and Prometheus metrics) until SIGINT or SIGTERM.
    #[command(after_help = "Exports:\n  \
        NAME                        the newest version, read-only\n  \
        NAME@N                      version N (NAME@0 is the base), read-only\n  \
        NAME[@N]+DEVICE             writable; writes go to a server cache, discarded on \
        disconnect\n  \
        NAME[@N]+DEVICE+persistent  writable; the server cache is kept\n  \
        NAME+private                writes go to the vDisk itself; one writer\n\n\
        Examples:\n  ferry server --store ferry-data\n  \
        nbdinfo nbd://127.0.0.1/demo\n  \
        ferry server --config /etc/ferry/ferry.toml --cache-ram 8G\n  \
        curl http://127.0.0.1:9810/metrics\n  \
        ferry server --farm /srv/ferry --api-listen 0.0.0.0:8080   # farm API, console, device login")]
    Server(server::Args),
    /// Run the target device agent: attach a vDisk from the servers, keep this machine's
    /// writes in a write cache, and export the disk on a unix socket.
    #[command(after_help = "Cache modes:\n  \
        ram                RAM only (--ram); full -> writes fail with ENOSPC\n  \
        ram-overflow       RAM, least recently used blocks moved to a file in --overflow DIR\n  \
        disk               a file in --overflow DIR only\n  \
        server             the server's cache for this --device, discarded on disconnect\n  \
        server-persistent  the server's cache for this --device, kept\n  \
        private            the vDisk itself (maintenance; one device)\n\n\
        Examples:\n  ferry target --server 10.0.0.5,10.0.0.6 --vdisk golden --cache ram-overflow \\\n      \
        --ram 2G --overflow /var/cache/ferry --export unix:/run/ferry/target.sock\n  \
        qemu-system-x86_64 -drive file=nbd+unix:///?socket=/run/ferry/target.sock,format=raw\n  \
        ferry target --server http://10.0.0.5:8080 --device aa:bb:cc:00:00:01 \\\n      \
        --device-secret pc1.secret   # device login: the farm picks vDisk, version, cache\n  \
        ferry target status --json\n  ferry target mark-booted")]
    Target(target::Args),
    /// The farm: `init` and `serve` a farm database and its REST API; farm-wide vDisks,
    /// servers, tokens, sessions, audit log and settings over the API.
    #[command(after_help = "Examples:\n  ferry farm init --data /srv/ferry\n  \
                            ferry farm serve --data /srv/ferry --listen 127.0.0.1:8080\n  \
                            ferry farm vdisk add golden --store 1 --size 40G")]
    Farm(farm::FarmArgs),
    /// Sites of the farm (over the REST API).
    #[command(after_help = "Example:\n  ferry site add hq --token $FERRY_TOKEN")]
    Site(farm_objects::SiteArgs),
    /// Stores of the farm (over the REST API).
    #[command(after_help = "Example:\n  ferry store add main --path main")]
    Store(farm_objects::StoreArgs),
    /// Device collections (over the REST API).
    #[command(
        after_help = "Example:\n  ferry collection add lab --site 1 --auto-add --vdisk golden"
    )]
    Collection(farm_objects::CollectionArgs),
    /// Target devices (over the REST API).
    #[command(
        after_help = "Example:\n  ferry device add aa:bb:cc:00:00:01 --name pc1 --collection 1 \
                            --vdisk golden --type production"
    )]
    Device(farm_objects::DeviceArgs),
    /// The version lifecycle of a farm vDisk: new, promote, revert, delete, merge.
    #[command(after_help = "Examples:\n  ferry version new --vdisk golden\n  \
                            ferry version promote 1 --vdisk golden\n  \
                            ferry version list --vdisk golden --json")]
    Version(farm_objects::VersionArgs),
}

/// Options every command sees.
#[derive(Debug, Clone, Copy)]
pub struct Global {
    /// `--quiet`: no bars, no informational messages.
    pub quiet: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to stderr with 1, so
            // that status 2 always means "check found problems".
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_ERROR)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // A server reports what it serves and when it stops: info unless --quiet.
    let serving = matches!(&cli.command, Command::Server(s) if s.command.is_none())
        || matches!(&cli.command, Command::Target(t) if t.command.is_none());
    let verbose = if serving && !cli.quiet {
        cli.verbose.max(1)
    } else {
        cli.verbose
    };
    init_logging(verbose);
    let global = Global { quiet: cli.quiet };
    let result = match cli.command {
        Command::Vdisk { command } => vdisk::run(command, global),
        Command::Quickstart(args) if args.linux => quickstart_linux::run(&args, global),
        Command::Quickstart(args) => quickstart::run(&args, global),
        Command::Server(args) => server::run(&args, global),
        Command::Target(args) => target::run(&args, global),
        Command::Farm(args) => farm::run(args, global),
        Command::Site(args) => farm_objects::site(args),
        Command::Store(args) => farm_objects::store(args),
        Command::Collection(args) => farm_objects::collection(args),
        Command::Device(args) => farm_objects::device(args),
        Command::Version(args) => farm_objects::version(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            let err: &(dyn std::error::Error + 'static) = err.as_ref();
            let _ = std::io::stdout().flush();
            eprintln!("error: {}", contract::ErrorChain(err));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Logs to stderr. `RUST_LOG` wins; otherwise `-v` raises the level from `warn`.
fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs redirected to a file or journal stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Prints `value` as pretty JSON on stdout (the only thing `--json` puts there).
///
/// # Errors
/// Serialization failures.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    outln!("{text}");
    Ok(())
}

/// Prints text on stdout, adding a final newline if it has none.
pub fn print_text(text: &str) {
    if text.ends_with('\n') {
        write_stdout(format_args!("{text}"));
    } else {
        outln!("{text}");
    }
}

/// Writes command output on stdout. When stdout is a closed pipe the process exits with
/// status 0, as Unix filters do (the work is done; only its report has no reader), and any
/// other stdout failure exits with status 1. Call it only after the command's files are
/// closed, since exiting skips destructors.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        stdout_failed(&e);
    }
}

/// Ends the process after a failed write to stdout (see [`write_stdout`]).
pub fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: write to stdout: {e}");
    std::process::exit(i32::from(EXIT_ERROR));
}

/// The exit status for `check`: 0 when clean, 2 when problems remain.
pub fn check_status(clean: bool) -> ExitCode {
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEMS)
    }
}
