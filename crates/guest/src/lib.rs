//! The QEMU boot harness of Ferry's tests and boot benchmark, and the machine of
//! `ferry quickstart --linux`.
//!
//! * [`guest_root`]: the test OS, a Debian 12 root built by `scripts/guest-root.sh` from
//!   Debian's packages and cached as a tar outside the repository (rebuilt when the recipe
//!   changes). It prints `FERRY-BOOT-OK version=<v>` on ttyS0 once multi-user is reached, and
//!   runs `/etc/ferry-test.sh` at boot when present (see [`test_output`]).
//! * [`ImageBuilder`]: a raw GPT disk image with one ext4 root partition made from that root,
//!   with files added and commands run in it (chroot) first; gives the kernel and initramfs
//!   of the built root beside the disk ([`GuestImage`]).
//! * [`Qemu`]: `qemu-system-x86_64` (TCG) with the serial console in a log file, user
//!   networking (bootfile, TFTP, host forwards), virtio disks, direct kernel boot or `-boot n`
//!   through the NIC's iPXE ROM; [`Running::wait_for`] waits for a line on the console.
//! * [`Swtpm`]: a TPM 2.0 for a machine (`swtpm`, QEMU's `tpm-tis` device), its state in a
//!   directory that outlives the boot.
//!
//! ```no_run
//! use std::time::Duration;
//! use guest::{GuestImage, ImageBuilder, Qemu, DIRECT_BOOT_ARGS, guest_root};
//!
//! let dir = std::path::Path::new("/tmp/boot");
//! let image: GuestImage = ImageBuilder::new(guest_root()).version("v1").build(dir).unwrap();
//! let mut vm = Qemu::new(dir.join("serial.log"))
//!     .disk(&image.disk)
//!     .direct_boot(&image.kernel, &image.initrd, &format!("root=/dev/vda1 {DIRECT_BOOT_ARGS}"))
//!     .spawn()
//!     .unwrap();
//! let took = vm.wait_for("FERRY-BOOT-OK version=v1", Duration::from_secs(300)).unwrap();
//! println!("booted in {took:?}");
//! ```
//!
//! Everything here needs root (tar with owners, chroot, mounts) and the Debian packages
//! named by [`TOOLS`]; [`missing_tools`] says what is absent so a test can follow the tool
//! rule of docs/testing.md.

#![warn(missing_docs)]

mod cmd;
mod image;
mod qemu;
mod swtpm;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use cmd::on_path;
pub use image::{
    DEFAULT_DISK_BYTES, GuestImage, ImageBuilder, PARTITION_START, PartitionTable, ROOT_ARG,
    boot_files,
};
pub use qemu::{DEFAULT_MAC, DEFAULT_MEMORY_MIB, OVMF, Qemu, Running, TestOutput, test_output};
pub use swtpm::Swtpm;

/// The marker `ferry-marker.service` writes on ttyS0 after multi-user.target, followed by
/// `version=<contents of /etc/ferry-version>`.
pub const BOOT_MARKER: &str = "FERRY-BOOT-OK";

/// The guest file holding the version the marker names.
pub const VERSION_FILE: &str = "/etc/ferry-version";

/// The guest script `ferry-test.service` runs at boot when present.
pub const TEST_SCRIPT: &str = "/etc/ferry-test.sh";

/// Where [`ImageBuilder::quick_init`] puts [`QUICK_INIT`]; `init=` this path on the kernel
/// command line boots with it.
pub const QUICK_INIT_PATH: &str = "/usr/local/sbin/ferry-quick-init";

/// A small init for boots whose subject is the boot path (firmware, boot script, kernel,
/// initramfs, the root device) rather than systemd: it mounts what the test script needs,
/// makes the root writable, runs [`TEST_SCRIPT`] and prints its output and the
/// [`BOOT_MARKER`] on ttyS0 as the test OS's services do after multi-user.target, then
/// idles (PID 1 must not exit). A TCG boot then skips systemd's tens of seconds.
pub const QUICK_INIT: &str = r#"#!/bin/sh
# ferry-quick-init: the test OS's small init (crates/guest, QUICK_INIT).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -o remount,rw / 2>/dev/null
mount -t tmpfs tmpfs /tmp 2>/dev/null
if [ -f /etc/ferry-test.sh ]; then
    out="$(/bin/sh /etc/ferry-test.sh 2>&1)"
    rc=$?
    printf 'FERRY-TEST-BEGIN
%s
FERRY-TEST-END rc=%d
' "$out" "$rc" >/dev/ttyS0
fi
echo "FERRY-BOOT-OK version=$(cat /etc/ferry-version 2>/dev/null)" >/dev/ttyS0
while :; do sleep 3600; done
"#;

/// Kernel arguments every boot of the test OS wants besides its root: the console on the
/// serial port the harness logs, and the root mounted writable (its fstab names nothing).
pub const DIRECT_BOOT_ARGS: &str = "console=ttyS0 rw";

/// The external tools the harness runs (Debian packages: qemu-system-x86, debootstrap,
/// e2fsprogs, fdisk, tar, util-linux, swtpm).
pub const TOOLS: &[&str] = &[
    "qemu-system-x86_64",
    "swtpm",
    "debootstrap",
    "mkfs.ext4",
    "sfdisk",
    "tar",
    "chroot",
    "mount",
    "umount",
    "flock",
];

/// An error of the harness.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A tool could not be started.
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// A tool ran and failed.
    #[error("{cmd} failed ({status}): {stderr}")]
    Tool {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The input or the root is not as the harness needs it.
    #[error("{0}")]
    Invalid(String),
}

/// `Io` error with context.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> GuestError {
    let what = what.into();
    move |source| GuestError::Io { what, source }
}

/// The recipe of the test OS, `scripts/guest-root.sh` in this repository.
pub fn recipe() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/guest-root.sh")
}

/// The text of [`recipe`], compiled in: a binary (`ferry quickstart --linux`) runs the same
/// recipe as the tests wherever it was installed, and finds the tar they built, since the
/// tar is named by the recipe's hash ([`root_tar`]).
pub const RECIPE: &str = include_str!("../../../scripts/guest-root.sh");

/// The recipe's cache unless told otherwise, as the script chooses it:
/// `$FERRY_GUEST_CACHE`, else `$HOME/.cache/ferry/guest`.
pub fn default_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERRY_GUEST_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/ferry/guest")
}

/// Where the root tar of [`RECIPE`] is in `cache`, built or not:
/// `debian12-<first 12 hex digits of sha256(RECIPE)>.tar`, the script's own name for it.
pub fn root_tar(cache: &Path) -> PathBuf {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(RECIPE.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    cache.join(format!("debian12-{hex}.tar"))
}

/// The tar of the test OS's root, built by [`recipe`] when the cache has none for this
/// recipe (about 3.5 minutes; its progress goes to stderr). The cache is
/// `${FERRY_GUEST_CACHE:-$HOME/.cache/ferry/guest}`; builds are serialized by a lock file.
///
/// # Panics
/// When the recipe fails (it needs root, debootstrap and Debian's mirror): a test cannot go
/// on without its OS, and the message carries the script's error.
pub fn guest_root() -> PathBuf {
    try_guest_root().unwrap_or_else(|e| panic!("the guest root could not be built: {e}"))
}

/// [`guest_root`] returning the error instead of panicking.
pub fn try_guest_root() -> Result<PathBuf, GuestError> {
    build_root(&default_cache(), true)
}

/// The tar of the root [`RECIPE`] builds, in `cache`: found at once when there, else built
/// (root, debootstrap and Debian's mirror; about 3.5 minutes), other builds waiting on its
/// lock file. The recipe runs from a copy in the temporary directory (its hash, and so the
/// tar's name, is of its text). With `progress` its progress goes to this process's stderr;
/// without, its stderr is kept and its end goes into the error.
///
/// # Errors
/// The copy cannot be written, or the recipe fails or names no file.
pub fn build_root(cache: &Path, progress: bool) -> Result<PathBuf, GuestError> {
    let script = std::env::temp_dir().join(format!(
        "ferry-guest-root-{}-{}.sh",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::write(&script, RECIPE).map_err(io_err(format!("write {}", script.display())))?;
    let mut bash = Command::new("bash");
    bash.arg(&script).env("FERRY_GUEST_CACHE", cache);
    let out = if progress {
        run_showing_stderr(&mut bash)
    } else {
        cmd::run(&mut bash)
    };
    let _ = std::fs::remove_file(&script);
    let shown = "scripts/guest-root.sh";
    let out = out.map_err(|e| match e {
        GuestError::Tool { status, stderr, .. } => GuestError::Tool {
            cmd: shown.into(),
            status,
            stderr,
        },
        other => other,
    })?;
    let path = PathBuf::from(out.lines().last().unwrap_or(""));
    if !path.is_file() {
        return Err(GuestError::Invalid(format!(
            "{shown} printed {}, which is no file",
            path.display()
        )));
    }
    Ok(path)
}

/// Runs `cmd` with its stderr on this process's; its stdout on success.
fn run_showing_stderr(cmd: &mut Command) -> Result<String, GuestError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|child| child.wait_with_output())
        .map_err(|source| GuestError::Spawn {
            cmd: shown.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(GuestError::Tool {
            cmd: shown,
            status: out.status.to_string(),
            stderr: "see its output above".into(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the harness lacks on this machine: tools from [`TOOLS`] not on PATH, and root.
/// Empty when everything is there.
pub fn missing_tools() -> Vec<String> {
    let mut missing: Vec<String> = TOOLS
        .iter()
        .filter(|t| !cmd::on_path(t))
        .map(|t| (*t).to_owned())
        .collect();
    if !is_root() {
        missing.push("root (tar with owners, chroot, mounts)".into());
    }
    missing
}

/// Whether the process runs as root (from /proc/self/status, without unsafe code).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .is_some_and(|euid| euid == "0")
    })
}

/// The tool rule of docs/testing.md for boot tests: `true` when the harness can run. When it
/// cannot, prints why and returns `false` outside CI; under `CI=true` it panics.
pub fn can_run_or_skip(test: &str) -> bool {
    let missing = missing_tools();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: missing under CI: {}", missing.join(", "));
    }
    eprintln!("{test}: skipped, missing: {}", missing.join(", "));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_is_in_the_repository() {
        assert!(recipe().is_file(), "{}", recipe().display());
    }
}
