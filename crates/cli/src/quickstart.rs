//! `ferry quickstart`: a demo vDisk with one version, made from embedded defaults.
//!
//! In `--data-dir` (default `./ferry-data`) it creates `demo.vhdx` (1 GiB, dynamic) holding a
//! boot-sector-like first sector and a marked block, then the version `demo.1.avhdx` with a
//! few sectors changed, and prints `info` of the version, which shows the whole chain, then
//! the commands to try next (among them `ferry server --store DIR`; it starts no server).
//!
//! It is idempotent: a file that exists is kept as it is (writing the base again would change
//! its identity and break the version above it), and the info is printed again.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args as ClapArgs;
use disk::open::{self, OpenOptions};
use disk::ops::info::info;
use disk::vhdx::CreateOptions;

use crate::vdisk::create_vhdx;
use crate::{Global, print_json, print_text};

/// The demo vDisk's virtual size: 1 GiB.
const DEMO_SIZE_BYTES: u64 = 1 << 30;
/// The base image's file name.
const BASE_NAME: &str = "demo.vhdx";
/// The version's file name.
const VERSION_NAME: &str = "demo.1.avhdx";
/// Where the base's marked block starts (1 MiB, where a first partition usually starts).
const BASE_BLOCK_OFFSET: u64 = 1 << 20;
/// Where the version writes its marker: the second sector.
const VERSION_MARK_OFFSET: u64 = 512;

/// Arguments of `quickstart`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Directory for the demo files (created if missing).
    #[arg(long, default_value = "ferry-data")]
    pub data_dir: PathBuf,
    /// Print the version's info as JSON on stdout (progress messages go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferry quickstart`.
///
/// # Errors
/// Directory, create, version and write errors.
pub fn run(a: &Args, global: Global) -> anyhow::Result<ExitCode> {
    let say = |msg: String| {
        if a.json {
            if !global.quiet {
                eprintln!("{msg}");
            }
        } else {
            outln!("{msg}");
        }
    };
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("create data directory {}", a.data_dir.display()))?;
    let base = a.data_dir.join(BASE_NAME);
    let version = a.data_dir.join(VERSION_NAME);
    if base.exists() {
        say(format!("{} exists; keeping it", base.display()));
    } else {
        make_base(&base)?;
        say(format!(
            "created {} (1 GiB dynamic vDisk with a demo boot sector)",
            base.display()
        ));
    }
    if version.exists() {
        say(format!("{} exists; keeping it", version.display()));
    } else {
        disk::version::new_version(&base, &version)?;
        write_at(&version, &version_mark(), VERSION_MARK_OFFSET)?;
        say(format!(
            "created version {} on {}",
            version.display(),
            base.display()
        ));
    }
    let report = info(&version)?;
    if a.json {
        print_json(&report)?;
    } else {
        outln!();
        print_text(&report.render());
        outln!();
        outln!(
            "Next: ferry vdisk read {} --offset 0 --length 1K | xxd",
            version.display()
        );
        outln!("      ferry vdisk check {}", version.display());
        outln!();
        outln!("Serve it: ferry server --store {}", a.data_dir.display());
        outln!("then try: nbdinfo nbd://127.0.0.1/demo");
    }
    Ok(ExitCode::SUCCESS)
}

fn make_base(path: &Path) -> anyhow::Result<()> {
    let opts = CreateOptions {
        size: DEMO_SIZE_BYTES,
        ..CreateOptions::default()
    };
    create_vhdx(path, &opts)?;
    write_at(path, &boot_sector(), 0)?;
    write_at(path, &base_block(), BASE_BLOCK_OFFSET)
}

/// Writes `data` at `offset` of the image at `path` and closes it cleanly.
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

/// A recognizable 512-byte boot sector: an x86 short jump, an OEM name, a message where boot
/// code would be, and the 0x55 0xAA signature at its end.
fn boot_sector() -> Vec<u8> {
    let mut s = vec![0u8; 512];
    s[..3].copy_from_slice(&[0xEB, 0x3C, 0x90]); // jmp short +0x3C; nop
    s[3..11].copy_from_slice(b"FERRYDEM");
    let msg = b"Ferry demo vDisk: streamed to diskless machines. Written by `ferry quickstart`.";
    s[0x3E..0x3E + msg.len()].copy_from_slice(msg);
    s[510] = 0x55;
    s[511] = 0xAA;
    s
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

/// The second sector as version 1 writes it.
fn version_mark() -> Vec<u8> {
    let mut s = vec![b' '; 512];
    let msg = b"Ferry demo: this sector belongs to version 1 (demo.1.avhdx).";
    s[..msg.len()].copy_from_slice(msg);
    s[511] = b'\n';
    s
}
