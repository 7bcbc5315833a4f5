//! Disk images of the test OS: the cached root tar extracted, changed (files added, commands
//! run in a chroot), packed into an ext4 file system inside a raw disk with a GPT (or MBR, or
//! no) partition table, and its kernel and initramfs copied out beside it.
//!
//! # Design notes
//!
//! The root is extracted per image (a few seconds) rather than shared, so an image's changes
//! never reach another test's. The file system is made by `mkfs.ext4 -d ROOT -E offset=`
//! straight into the partition's place in the disk file: no loop device and no copy. Files
//! are added by resolving their guest path inside the root, following the root's own symlinks
//! as the guest would (an absolute link is taken relative to the root), so no write lands
//! outside it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::cmd::run;
use crate::{GuestError, TEST_SCRIPT, VERSION_FILE, io_err};

/// Size of the disk [`ImageBuilder`] makes unless told otherwise (sparse; the root uses
/// about a third of it).
pub const DEFAULT_DISK_BYTES: u64 = 2 << 30;

/// Where the root partition starts (1 MiB, as partitioning tools align it).
pub const PARTITION_START: u64 = 1 << 20;

/// Room left after the partition for the backup GPT (33 sectors), rounded to 1 MiB.
const GPT_TAIL_BYTES: u64 = 1 << 20;

/// The smallest disk an image may be given.
const DISK_BYTES_MIN: u64 = 64 << 20;

/// Symbolic links followed while resolving one guest path (as the kernel's ELOOP limit).
const SYMLINK_HOPS_MAX: usize = 40;

/// Linux file system data partition type of GPT.
const GPT_LINUX_DATA: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// The partition table of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartitionTable {
    /// GPT with one Linux partition from [`PARTITION_START`] (the guest's `/dev/vda1`).
    #[default]
    Gpt,
    /// MBR with one type-0x83 partition from [`PARTITION_START`].
    Mbr,
    /// No table: the ext4 file system is the whole disk (`/dev/vda`).
    None,
}

/// A built image.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// The raw disk.
    pub disk: PathBuf,
    /// The root's kernel (`/boot/vmlinuz-*`), copied out.
    pub kernel: PathBuf,
    /// The root's initramfs (`/boot/initrd.img-*`), copied out after the image's commands ran.
    pub initrd: PathBuf,
    /// Byte offset of the ext4 file system in [`disk`](Self::disk).
    pub fs_offset: u64,
    /// Byte length of the ext4 file system.
    pub fs_bytes: u64,
}

/// Where an added file's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    Bytes(Vec<u8>),
    Host(PathBuf),
}

/// The argument of [`ImageBuilder::run_on_host`] that stands for the extracted root's path.
pub const ROOT_ARG: &str = "{root}";

/// A file to put into the root.
#[derive(Debug, Clone)]
struct Addition {
    guest: String,
    source: Source,
    mode: u32,
}

/// Builds a [`GuestImage`] from the root tar of [`guest_root`](crate::guest_root).
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    root_tar: PathBuf,
    additions: Vec<Addition>,
    host_commands: Vec<(PathBuf, Vec<OsString>)>,
    commands: Vec<String>,
    disk_bytes: u64,
    table: PartitionTable,
    quiet: bool,
}

impl ImageBuilder {
    /// An image of the root in `root_tar`, unchanged, on a [`DEFAULT_DISK_BYTES`] GPT disk.
    pub fn new(root_tar: impl Into<PathBuf>) -> Self {
        ImageBuilder {
            root_tar: root_tar.into(),
            additions: Vec::new(),
            host_commands: Vec::new(),
            commands: Vec::new(),
            disk_bytes: DEFAULT_DISK_BYTES,
            table: PartitionTable::Gpt,
            quiet: false,
        }
    }

    /// Puts `contents` at the absolute `guest_path` with permission bits `mode`, creating
    /// the directories above it. Added files are written in the order given, before the
    /// commands run.
    pub fn file(mut self, guest_path: &str, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.additions.push(Addition {
            guest: guest_path.to_owned(),
            source: Source::Bytes(contents.into()),
            mode,
        });
        self
    }

    /// Copies the host file `host` to `guest_path` (e.g. the ferry agent and its initramfs
    /// hook), as [`file`](Self::file) does.
    pub fn copy(mut self, host: impl Into<PathBuf>, guest_path: &str, mode: u32) -> Self {
        self.additions.push(Addition {
            guest: guest_path.to_owned(),
            source: Source::Host(host.into()),
            mode,
        });
        self
    }

    /// The version the boot marker names: the contents of `/etc/ferry-version`.
    pub fn version(self, version: &str) -> Self {
        self.file(VERSION_FILE, version, 0o644)
    }

    /// A shell script `ferry-test.service` runs at each boot before the marker, its output
    /// on the console between `FERRY-TEST-BEGIN` and `FERRY-TEST-END rc=N` (see
    /// [`test_output`](crate::test_output)).
    pub fn test_script(self, script: &str) -> Self {
        self.file(TEST_SCRIPT, script, 0o755)
    }

    /// Adds the small init [`QUICK_INIT`](crate::QUICK_INIT) at
    /// [`QUICK_INIT_PATH`](crate::QUICK_INIT_PATH): a boot with `init=` that path on its
    /// kernel command line runs the test script and prints the marker without systemd.
    pub fn quick_init(self) -> Self {
        self.file(crate::QUICK_INIT_PATH, crate::QUICK_INIT, 0o755)
    }

    /// Runs `sh -c command` chrooted into the root after the files are added, with /proc and
    /// /sys mounted (e.g. `update-initramfs -u -k all` after an initramfs hook was added).
    pub fn run_in_root(mut self, command: &str) -> Self {
        self.commands.push(command.to_owned());
        self
    }

    /// Runs `program` on the host with `args` (each [`ROOT_ARG`] replaced by the extracted
    /// root's path) after the files are added and before the [`run_in_root`](Self::run_in_root)
    /// commands, with /proc and /sys mounted in the root and the same clean environment: a
    /// host tool that writes into the root, e.g. `ferry target install-initramfs --root {root}
    /// --update` (whose `update-initramfs` then runs chrooted), so that a binary built for the
    /// host need not run inside the guest's older C library.
    pub fn run_on_host<I, A>(mut self, program: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        let args = args.into_iter().map(Into::into).collect();
        self.host_commands.push((program.into(), args));
        self
    }

    /// No progress lines on stderr (by default each step is named with its time).
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// The disk's size in bytes (rounded down to 1 MiB; at least 64 MiB).
    pub fn disk_bytes(mut self, bytes: u64) -> Self {
        self.disk_bytes = bytes;
        self
    }

    /// The disk's partition table.
    pub fn partition_table(mut self, table: PartitionTable) -> Self {
        self.table = table;
        self
    }

    /// Builds the image in `dir` (created when missing): `disk.raw`, `vmlinuz`, `initrd.img`.
    /// The root is extracted into `dir/root` and removed afterwards.
    pub fn build(self, dir: &Path) -> Result<GuestImage, GuestError> {
        let disk_bytes = self.disk_bytes / (1 << 20) * (1 << 20);
        if disk_bytes < DISK_BYTES_MIN {
            return Err(GuestError::Invalid(format!(
                "a disk of {disk_bytes} bytes is too small"
            )));
        }
        fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        let root = dir.join("root");
        remove_root(&root)?;
        fs::create_dir(&root).map_err(io_err(format!("create {}", root.display())))?;
        let built = self.fill_root(&root, dir, disk_bytes);
        let removed = remove_root(&root);
        let image = built?;
        removed?;
        Ok(image)
    }

    fn fill_root(
        &self,
        root: &Path,
        dir: &Path,
        disk_bytes: u64,
    ) -> Result<GuestImage, GuestError> {
        let started = std::time::Instant::now();
        let step = |what: &str| {
            if self.quiet {
                return;
            }
            let secs = started.elapsed().as_secs_f64();
            eprintln!("guest image {}: {what} after {secs:.1} s", dir.display());
        };
        run(Command::new("tar")
            .args([
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
                "--acls",
                "-xf",
            ])
            .arg(&self.root_tar)
            .arg("-C")
            .arg(root))?;
        step("root extracted");
        for add in &self.additions {
            put_file(root, add)?;
        }
        if !self.commands.is_empty() || !self.host_commands.is_empty() {
            let _mounts = Mounts::for_chroot(root)?;
            for (program, args) in &self.host_commands {
                let mut cmd = Command::new(program);
                for arg in args {
                    if arg == ROOT_ARG {
                        cmd.arg(root);
                    } else {
                        cmd.arg(arg);
                    }
                }
                run(clean_env(&mut cmd))?;
                step(&format!("ran {} on the host", program.display()));
            }
            for command in &self.commands {
                run(&mut chroot_command(root, command))?;
                step(&format!("ran {command:?} in the root"));
            }
        }
        let (kernel, initrd) = boot_files(root, dir)?;
        let disk = dir.join("disk.raw");
        let (fs_offset, fs_bytes) = make_disk(root, &disk, disk_bytes, self.table)?;
        step("disk made");
        Ok(GuestImage {
            disk,
            kernel,
            initrd,
            fs_offset,
            fs_bytes,
        })
    }
}

/// `chroot ROOT /bin/sh -c COMMAND` with a clean environment.
fn chroot_command(root: &Path, command: &str) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.arg(root).args(["/bin/sh", "-c", command]);
    clean_env(&mut cmd);
    cmd
}

/// The environment of the commands run for an image: Debian's PATH, root's HOME, C.UTF-8,
/// no debconf questions; nothing of the caller's.
fn clean_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .env("DEBIAN_FRONTEND", "noninteractive")
}

/// Copies the root's kernel and initramfs to `out/vmlinuz` and `out/initrd.img`. With several
/// kernels installed, the newest by name (as `/vmlinuz`'s link names it, when present).
pub fn boot_files(root: &Path, out: &Path) -> Result<(PathBuf, PathBuf), GuestError> {
    let boot = root.join("boot");
    let mut versions: Vec<String> = fs::read_dir(&boot)
        .map_err(io_err(format!("read {}", boot.display())))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .filter(|v| boot.join(format!("initrd.img-{v}")).is_file())
        .collect();
    versions.sort_by_key(|v| version_key(v));
    let Some(version) = versions.pop() else {
        return Err(GuestError::Invalid(format!(
            "{} holds no vmlinuz-V with an initrd.img-V",
            boot.display()
        )));
    };
    let kernel = out.join("vmlinuz");
    let initrd = out.join("initrd.img");
    for (from, to) in [
        (format!("vmlinuz-{version}"), &kernel),
        (format!("initrd.img-{version}"), &initrd),
    ] {
        let from = boot.join(from);
        fs::copy(&from, to).map_err(io_err(format!(
            "copy {} to {}",
            from.display(),
            to.display()
        )))?;
    }
    Ok((kernel, initrd))
}

/// Orders kernel versions like `6.1.0-9-amd64` < `6.1.0-10-amd64`: numbers as numbers.
fn version_key(v: &str) -> Vec<(u64, String)> {
    v.split(|c: char| !c.is_ascii_alphanumeric())
        .map(|part| (part.parse().unwrap_or(0), part.to_owned()))
        .collect()
}

/// Writes one addition into the root.
fn put_file(root: &Path, add: &Addition) -> Result<(), GuestError> {
    let path = resolve_in_root(root, &add.guest)?;
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("create {}", parent.display())))?;
    }
    match &add.source {
        Source::Bytes(bytes) => {
            fs::write(&path, bytes).map_err(io_err(format!("write {}", path.display())))?
        }
        Source::Host(host) => {
            fs::copy(host, &path).map_err(io_err(format!(
                "copy {} to {}",
                host.display(),
                path.display()
            )))?;
        }
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(add.mode))
        .map_err(io_err(format!("chmod {}", path.display())))
}

/// The host path of the absolute `guest` path inside `root`, following the root's symlinks
/// the way the guest would see them: an absolute target starts again at `root`, and `..`
/// never climbs above it.
pub(crate) fn resolve_in_root(root: &Path, guest: &str) -> Result<PathBuf, GuestError> {
    if !guest.starts_with('/') {
        return Err(GuestError::Invalid(format!(
            "guest path {guest:?} is not absolute"
        )));
    }
    let mut todo: VecDeque<OsString> = components(Path::new(guest));
    let mut done: Vec<OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            done.pop();
            continue;
        }
        let here: PathBuf = std::iter::once(root.as_os_str())
            .chain(done.iter().map(|p| p.as_os_str()))
            .collect::<PathBuf>()
            .join(&part);
        let is_link = fs::symlink_metadata(&here).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            done.push(part);
            continue;
        }
        hops += 1;
        if hops > SYMLINK_HOPS_MAX {
            return Err(GuestError::Invalid(format!(
                "guest path {guest:?}: too many symlinks"
            )));
        }
        let target =
            fs::read_link(&here).map_err(io_err(format!("readlink {}", here.display())))?;
        if target.is_absolute() {
            done.clear();
        }
        for part in components(&target).into_iter().rev() {
            todo.push_front(part);
        }
    }
    Ok(done.iter().fold(root.to_path_buf(), |p, part| p.join(part)))
}

/// The normal and `..` components of `path` (root and `.` dropped).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Makes `disk` (sparse, `disk_bytes`) with `table` and an ext4 file system of `root`; the
/// file system's offset and length.
fn make_disk(
    root: &Path,
    disk: &Path,
    disk_bytes: u64,
    table: PartitionTable,
) -> Result<(u64, u64), GuestError> {
    let file = fs::File::create(disk).map_err(io_err(format!("create {}", disk.display())))?;
    file.set_len(disk_bytes)
        .map_err(io_err(format!("size {}", disk.display())))?;
    drop(file);
    let (offset, bytes) = match table {
        PartitionTable::None => (0, disk_bytes),
        PartitionTable::Gpt | PartitionTable::Mbr => (
            PARTITION_START,
            disk_bytes - PARTITION_START - GPT_TAIL_BYTES,
        ),
    };
    let script = match table {
        PartitionTable::None => None,
        PartitionTable::Gpt => Some(format!(
            "label: gpt\nstart={}, size={}, type={GPT_LINUX_DATA}, name=root\n",
            offset / 512,
            bytes / 512
        )),
        PartitionTable::Mbr => Some(format!(
            "label: dos\nstart={}, size={}, type=83\n",
            offset / 512,
            bytes / 512
        )),
    };
    if let Some(script) = script {
        let script_path = disk.with_extension("sfdisk");
        fs::write(&script_path, script)
            .map_err(io_err(format!("write {}", script_path.display())))?;
        let stdin = fs::File::open(&script_path)
            .map_err(io_err(format!("open {}", script_path.display())))?;
        let mut sfdisk = Command::new("sfdisk");
        sfdisk
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(disk)
            .stdin(stdin);
        run_with_stdin(&mut sfdisk)?;
        let _ = fs::remove_file(&script_path);
    }
    run(Command::new("mkfs.ext4")
        .args(["-F", "-q", "-L", "ferry-root", "-d"])
        .arg(root)
        .arg("-E")
        .arg(format!("offset={offset}"))
        .arg(disk)
        .arg(format!("{}k", bytes / 1024)))?;
    Ok((offset, bytes))
}

/// [`run`] for a command whose stdin was set by the caller.
fn run_with_stdin(cmd: &mut Command) -> Result<(), GuestError> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| GuestError::Spawn {
        cmd: shown.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(GuestError::Tool {
        cmd: shown,
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Removes an extracted root, refusing while anything is mounted under it (a recursive
/// delete through a mount of /proc, /sys or /dev would reach the host's).
fn remove_root(root: &Path) -> Result<(), GuestError> {
    if !root.exists() {
        return Ok(());
    }
    let mounted = mounts_under(root)?;
    if !mounted.is_empty() {
        return Err(GuestError::Invalid(format!(
            "{} still has mounts ({}); not removing it",
            root.display(),
            mounted.join(", ")
        )));
    }
    fs::remove_dir_all(root).map_err(io_err(format!("remove {}", root.display())))
}

/// Mount points at or under `dir`, from /proc/self/mounts.
fn mounts_under(dir: &Path) -> Result<Vec<String>, GuestError> {
    let dir = fs::canonicalize(dir).map_err(io_err(format!("resolve {}", dir.display())))?;
    let table =
        fs::read_to_string("/proc/self/mounts").map_err(io_err("read /proc/self/mounts"))?;
    Ok(table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(&dir))
        .map(str::to_owned)
        .collect())
}

/// /proc and /sys mounted in a root for a chroot, unmounted on drop (lazily if busy).
#[derive(Debug)]
struct Mounts {
    points: Vec<PathBuf>,
}

impl Mounts {
    fn for_chroot(root: &Path) -> Result<Mounts, GuestError> {
        let mut mounts = Mounts { points: Vec::new() };
        for (fstype, dir) in [("proc", "proc"), ("sysfs", "sys")] {
            let point = root.join(dir);
            fs::create_dir_all(&point).map_err(io_err(format!("create {}", point.display())))?;
            run(Command::new("mount")
                .args(["-t", fstype, fstype])
                .arg(&point))?;
            mounts.points.push(point);
        }
        Ok(mounts)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for point in self.points.iter().rev() {
            if run(Command::new("umount").arg(point)).is_err() {
                let _ = run(Command::new("umount").arg("-l").arg(point));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_symlink_resolves_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("/run/x/resolv.conf", root.path().join("etc/resolv.conf"))
            .unwrap();
        let got = resolve_in_root(root.path(), "/etc/resolv.conf").unwrap();
        assert_eq!(got, root.path().join("run/x/resolv.conf"));
    }

    #[test]
    fn dot_dot_stops_at_the_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("usr")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", root.path().join("usr/up")).unwrap();
        let got = resolve_in_root(root.path(), "/usr/up/passwd").unwrap();
        assert_eq!(got, root.path().join("etc/passwd"));
        assert_eq!(
            resolve_in_root(root.path(), "/../../x").unwrap(),
            root.path().join("x")
        );
    }

    #[test]
    fn symlink_loop_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/b", root.path().join("a")).unwrap();
        std::os::unix::fs::symlink("/a", root.path().join("b")).unwrap();
        assert!(resolve_in_root(root.path(), "/a/x").is_err());
    }

    #[test]
    fn relative_guest_path_is_refused() {
        assert!(resolve_in_root(Path::new("/nonexistent"), "etc/x").is_err());
    }

    #[test]
    fn kernel_versions_sort_numerically() {
        let mut v = vec!["6.1.0-10-amd64", "6.1.0-9-amd64"];
        v.sort_by_key(|v| version_key(v));
        assert_eq!(v, ["6.1.0-9-amd64", "6.1.0-10-amd64"]);
    }
}
