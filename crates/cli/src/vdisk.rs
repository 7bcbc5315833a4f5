//! `ferry vdisk ...`: the image subcommands and their dispatcher.
//!
//! The short commands (create, info, check, version new, read, write) live here; the long
//! copy-like ones (merge, convert, capture, compact) are in [`crate::copy`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use disk::open::{self, Format, OpenOptions};
use disk::ops::check::{CheckOptions, check};
use disk::ops::info::{human_size, info};
use disk::vhdx::{CreateOptions, create};
use disk::{FileStorage, Storage};

use crate::copy;
use crate::progress::Bar;
use crate::size::{parse_block_size, parse_nonzero_size, parse_sector_size, parse_size};
use crate::{Global, check_status, print_json, print_text};

/// Bytes moved per read or write call of `read` and `write`.
const IO_CHUNK_BYTES: usize = 1 << 20;

/// The `ferry vdisk` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new, empty VHDX vDisk (dynamic unless --fixed).
    #[command(
        after_help = "Examples:\n  ferry vdisk create golden.vhdx --size 40G\n  \
                            ferry vdisk create small.vhdx --size 512M --block-size 1M --sector-size 4096"
    )]
    Create(CreateArgs),
    /// Show format, sizes, allocation and the whole parent chain of an image.
    #[command(after_help = "Examples:\n  ferry vdisk info golden.1.avhdx\n  \
                            ferry vdisk info golden.vhdx --json | jq .virtual_size")]
    Info(InfoArgs),
    /// Check an image's structures; exit 0 when consistent, 2 when problems remain.
    #[command(after_help = "Examples:\n  ferry vdisk check golden.vhdx\n  \
                            ferry vdisk check golden.vhdx --repair --json")]
    Check(CheckArgs),
    /// Manage versions (differencing images) of a vDisk.
    #[command(after_help = "Example:\n  ferry vdisk version new golden.vhdx golden.1.avhdx")]
    Version {
        #[command(subcommand)]
        command: VersionCommand,
    },
    /// Merge a chain: into one standalone base, or (--updates) into one version on the base.
    #[command(
        after_help = "Examples:\n  ferry vdisk merge golden.3.avhdx --output golden-v3.vhdx\n  \
                            ferry vdisk merge golden.3.avhdx --updates --output golden.u3.avhdx"
    )]
    Merge(copy::MergeArgs),
    /// Convert an image or a whole chain (VHDX, VHD, raw) to VHDX or raw.
    #[command(
        after_help = "Examples:\n  ferry vdisk convert old.vhd golden.vhdx\n  \
                            ferry vdisk convert golden.1.avhdx flat.img --flatten"
    )]
    Convert(copy::ConvertArgs),
    /// Capture a block device or raw file into a new VHDX, skipping unused space.
    #[command(
        after_help = "Examples:\n  ferry vdisk capture /dev/sda golden.vhdx --verify\n  \
                            ferry vdisk capture disk.img golden.vhdx --block-size 2M"
    )]
    Capture(copy::CaptureArgs),
    /// Print a range of the virtual disk on stdout, read through the whole chain.
    #[command(
        after_help = "Example:\n  ferry vdisk read golden.1.avhdx --offset 0 --length 512 | xxd"
    )]
    Read(ReadArgs),
    /// Write stdin into the image at an offset (the top image of a chain).
    #[command(
        after_help = "Example:\n  printf 'hello' | ferry vdisk write golden.1.avhdx --offset 1M"
    )]
    Write(WriteArgs),
    /// Give back the space of unused and trimmed blocks.
    #[command(after_help = "Example:\n  ferry vdisk compact golden.vhdx")]
    Compact(copy::CompactArgs),
    /// List the kernel, initramfs, command line and root partition found in the image's own
    /// filesystem (whole-disk ext2/3/4, or an MBR or GPT partition of it).
    #[command(after_help = "Examples:\n  ferry vdisk boot-files golden.2.avhdx\n  \
                            ferry vdisk boot-files golden.vhdx --json | jq -r .kernel.path")]
    BootFiles(BootFilesArgs),
    /// Upload a vDisk file to an S3-compatible bucket as a new, write-once object with its
    /// manifest of BLAKE3 chunk hashes (see docs/s3.md).
    #[command(
        after_help = "Examples:\n  ferry vdisk push golden.2.avhdx s3://vdisks/farm --s3-endpoint http://127.0.0.1:9000\n  \
                            ferry vdisk push golden.vhdx s3://vdisks/farm --json"
    )]
    Push(crate::vdisk_bucket::PushArgs),
    /// Copy every vDisk of a bucket into a local store directory, checking each chunk.
    #[command(
        after_help = "Example:\n  ferry vdisk fill s3://vdisks/farm /srv/ferry/store --s3-endpoint http://127.0.0.1:9000"
    )]
    Fill(crate::vdisk_bucket::FillArgs),
    /// Compare a local store directory with a bucket's manifests, chunk by chunk (exit
    /// status 2 when anything differs or is missing).
    #[command(
        after_help = "Examples:\n  ferry vdisk verify s3://vdisks/farm /srv/ferry/store --json\n  ferry vdisk verify s3://vdisks/farm /srv/ferry/store --bytes   # the bucket's bytes too"
    )]
    Verify(crate::vdisk_bucket::VerifyArgs),
}

/// `ferry vdisk version ...`.
#[derive(Debug, Subcommand)]
pub enum VersionCommand {
    /// Create a new, empty differencing version of PARENT.
    #[command(after_help = "Example:\n  ferry vdisk version new golden.vhdx golden.1.avhdx")]
    New(VersionNewArgs),
}

/// Arguments of `create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The new image (.vhdx); it must not exist.
    pub path: PathBuf,
    /// Virtual size, e.g. 40G, 512M, 1T, 32MiB (K/M/G/T are powers of 1024).
    #[arg(long, value_parser = parse_nonzero_size)]
    pub size: u64,
    /// Payload block size, a power of two from 1M to 256M.
    #[arg(long, value_parser = parse_block_size, default_value = "32M")]
    pub block_size: u32,
    /// Logical sector size: 512 or 4096.
    #[arg(long, value_parser = parse_sector_size, default_value = "512")]
    pub sector_size: u32,
    /// Physical sector size: 512 or 4096.
    #[arg(long, value_parser = parse_sector_size, default_value = "4096")]
    pub physical_sector_size: u32,
    /// Allocate every block now (a fixed disk).
    #[arg(long)]
    pub fixed: bool,
}

/// Arguments of `info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The image (any layer of a chain; the chain below it is shown).
    pub path: PathBuf,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The image to check.
    pub path: PathBuf,
    /// Replay logs and fix what can be fixed without losing data.
    #[arg(long)]
    pub repair: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `version new`.
#[derive(Debug, Args)]
pub struct VersionNewArgs {
    /// The image the version is based on (a .vhdx or .avhdx).
    pub parent: PathBuf,
    /// The new differencing image (.avhdx); it must not exist.
    pub child: PathBuf,
}

/// Arguments of `read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The image; reads resolve through its whole chain.
    pub path: PathBuf,
    /// Virtual offset in bytes (size suffixes allowed: 1M).
    #[arg(long, value_parser = parse_size)]
    pub offset: u64,
    /// Number of bytes (size suffixes allowed: 4K).
    #[arg(long, value_parser = parse_size)]
    pub length: u64,
}

/// Arguments of `boot-files`.
#[derive(Debug, Args)]
pub struct BootFilesArgs {
    /// The image (any version of a chain; reads resolve through the chain below it).
    pub path: PathBuf,
    /// Print JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `write`.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// The image; its top layer is opened for writing.
    pub path: PathBuf,
    /// Virtual offset in bytes (size suffixes allowed: 1M).
    #[arg(long, value_parser = parse_size)]
    pub offset: u64,
}

/// Runs one `ferry vdisk` subcommand.
///
/// # Errors
/// Whatever the command fails with; the caller prints it.
pub fn run(command: Command, global: Global) -> anyhow::Result<ExitCode> {
    match command {
        Command::Create(a) => create_cmd(&a).map(|()| ExitCode::SUCCESS),
        Command::Info(a) => info_cmd(&a).map(|()| ExitCode::SUCCESS),
        Command::Check(a) => check_cmd(&a, global),
        Command::Version {
            command: VersionCommand::New(a),
        } => version_new(&a).map(|()| ExitCode::SUCCESS),
        Command::Merge(a) => copy::merge(&a, global).map(|()| ExitCode::SUCCESS),
        Command::Convert(a) => copy::convert(&a, global).map(|()| ExitCode::SUCCESS),
        Command::Capture(a) => copy::capture(&a, global).map(|()| ExitCode::SUCCESS),
        Command::Read(a) => read_cmd(&a).map(|()| ExitCode::SUCCESS),
        Command::Write(a) => write_cmd(&a, global).map(|()| ExitCode::SUCCESS),
        Command::Compact(a) => copy::compact(&a, global).map(|()| ExitCode::SUCCESS),
        Command::BootFiles(a) => boot_files_cmd(&a).map(|()| ExitCode::SUCCESS),
        Command::Push(a) => crate::vdisk_bucket::push(&a, global),
        Command::Fill(a) => crate::vdisk_bucket::fill(&a, global),
        Command::Verify(a) => crate::vdisk_bucket::verify(&a, global),
    }
}

fn create_cmd(a: &CreateArgs) -> anyhow::Result<()> {
    let opts = CreateOptions {
        size: a.size,
        block_size: a.block_size,
        logical_sector_size: a.sector_size,
        physical_sector_size: a.physical_sector_size,
        fixed: a.fixed,
        ..CreateOptions::default()
    };
    create_vhdx(&a.path, &opts)?;
    let kind = if a.fixed { "fixed" } else { "dynamic" };
    outln!(
        "created {} ({kind} vhdx, {}, block size {}, sectors {}/{})",
        a.path.display(),
        human_size(a.size),
        human_size(u64::from(a.block_size)),
        a.sector_size,
        a.physical_sector_size
    );
    Ok(())
}

/// Creates a new VHDX file at `path`, refusing to overwrite, and removes it again when the
/// creation fails half-way.
///
/// # Errors
/// An existing path, a name that says another format, geometry and I/O errors.
pub fn create_vhdx(path: &Path, opts: &CreateOptions) -> anyhow::Result<()> {
    match Format::from_extension(path) {
        None | Some(Format::Vhdx) => {}
        Some(other) => bail!(
            "{}: create writes VHDX, but the name says {}; name it .vhdx \
             (or create a .vhdx and `ferry vdisk convert` it)",
            path.display(),
            format!("{other:?}").to_lowercase()
        ),
    }
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(file));
    if let Err(e) = create(&storage, opts) {
        drop(storage);
        let _ = std::fs::remove_file(path);
        return Err(anyhow::Error::new(e).context(format!("create {}", path.display())));
    }
    Ok(())
}

fn info_cmd(a: &InfoArgs) -> anyhow::Result<()> {
    let report = info(&a.path)?;
    if a.json {
        print_json(&report)
    } else {
        print_text(&report.render());
        Ok(())
    }
}

fn check_cmd(a: &CheckArgs, global: Global) -> anyhow::Result<ExitCode> {
    let label = if a.repair {
        "checking and repairing"
    } else {
        "checking"
    };
    let bar = Bar::spinner(global.quiet, label);
    let report = check(&a.path, &CheckOptions { repair: a.repair })?;
    bar.finish();
    if a.json {
        print_json(&report)?;
    } else {
        print_text(&report.render());
    }
    Ok(check_status(report.clean))
}

fn boot_files_cmd(a: &BootFilesArgs) -> anyhow::Result<()> {
    let chain = open::open(&a.path, OpenOptions::default())?;
    let found = bootfiles::find(&chain.top())
        .with_context(|| format!("{}: boot files", a.path.display()))?;
    if a.json {
        return print_json(&found);
    }
    print_text(&render_boot_files(&found));
    Ok(())
}

fn render_boot_file(f: &bootfiles::BootFile) -> String {
    let on = match f.partition {
        Some(n) => format!("partition {n}"),
        None => "the whole disk".to_string(),
    };
    let version = f
        .version
        .as_deref()
        .map(|v| format!(", version {v}"))
        .unwrap_or_default();
    format!("{} on {on} ({}{version})", f.path, human_size(f.size))
}

fn render_boot_files(b: &bootfiles::BootFiles) -> String {
    let table = format!("{:?}", b.table).to_lowercase();
    let initrd = b
        .initrd
        .as_ref()
        .map_or_else(|| "(none)".to_string(), render_boot_file);
    let cmdline = b.cmdline.as_deref().unwrap_or("(none)");
    let root = match &b.root {
        None => "(not found)".to_string(),
        Some(r) => {
            let part = r
                .partition
                .map_or_else(|| "whole disk".to_string(), |n| format!("partition {n}"));
            let partuuid = r
                .partuuid
                .as_deref()
                .map(|p| format!(", PARTUUID={p}"))
                .unwrap_or_default();
            let dev = r
                .partition
                .map_or_else(|| "/dev/nbd0".to_string(), |n| format!("/dev/nbd0p{n}"));
            format!("{part} (UUID={}{partuuid}; on NBD: root={dev})", r.fs_uuid)
        }
    };
    format!(
        "table:   {table}\nkernel:  {}\ninitrd:  {initrd}\ncmdline: {cmdline}\nroot:    {root}",
        render_boot_file(&b.kernel)
    )
}

fn version_new(a: &VersionNewArgs) -> anyhow::Result<()> {
    disk::version::new_version(&a.parent, &a.child)?;
    outln!(
        "created version {} on {}",
        a.child.display(),
        a.parent.display()
    );
    Ok(())
}

fn read_cmd(a: &ReadArgs) -> anyhow::Result<()> {
    let chain = open::open(&a.path, OpenOptions::default())?;
    let dev = chain.top();
    let size = dev.size();
    if a.offset.checked_add(a.length).is_none_or(|end| end > size) {
        bail!(
            "{}: cannot read {} bytes at offset {}: the range ends past the end of the \
             {size}-byte disk",
            a.path.display(),
            a.length,
            a.offset
        );
    }
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; IO_CHUNK_BYTES];
    let mut done = 0u64;
    while done < a.length {
        let n = (a.length - done).min(IO_CHUNK_BYTES as u64) as usize;
        dev.read_at(&mut buf[..n], a.offset + done)?;
        if let Err(e) = out.write_all(&buf[..n]) {
            // The image is read-only, so ending here (a closed pipe ends quietly) is safe.
            crate::stdout_failed(&e);
        }
        done += n as u64;
    }
    if let Err(e) = out.flush() {
        crate::stdout_failed(&e);
    }
    Ok(())
}

fn write_cmd(a: &WriteArgs, global: Global) -> anyhow::Result<()> {
    let chain = open::open(
        &a.path,
        OpenOptions {
            writable: true,
            format: None,
        },
    )?;
    let dev = chain.top();
    let result = copy_stdin(dev.as_ref(), a.offset, &a.path);
    // Close even after a failed write: what was written so far is committed cleanly.
    let closed = chain.close();
    let written = result?;
    closed?;
    if !global.quiet {
        eprintln!(
            "wrote {written} bytes at offset {} of {}",
            a.offset,
            a.path.display()
        );
    }
    Ok(())
}

/// Copies stdin to `dev` at `offset`; refuses (before writing it) a chunk that would end past
/// the end of the disk. Returns the number of bytes written.
fn copy_stdin(dev: &dyn disk::BlockDevice, offset: u64, path: &Path) -> anyhow::Result<u64> {
    let size = dev.size();
    let mut input = std::io::stdin().lock();
    let mut buf = vec![0u8; IO_CHUNK_BYTES];
    let mut done = 0u64;
    loop {
        let n = fill(&mut input, &mut buf).context("read stdin")?;
        if n == 0 {
            return Ok(done);
        }
        let at = offset + done;
        if at.checked_add(n as u64).is_none_or(|end| end > size) {
            bail!(
                "{}: input is longer than the disk: writing at offset {offset} would go past the \
                 end of the {size}-byte disk (wrote {done} bytes before stopping)",
                path.display()
            );
        }
        dev.write_at(&buf[..n], at)?;
        done += n as u64;
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn fill(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
