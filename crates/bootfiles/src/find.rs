//! [`find`] the kernel, initramfs, command line and root filesystem of a disk, and [`read`]
//! a found file's bytes.
//!
//! Each volume ([`crate::volume::volumes`]) with an ext filesystem is opened. A root
//! filesystem (`/etc` plus `/sbin` or `/usr`) offers Debian's `/vmlinuz` and `/initrd.img`
//! symlinks (at `/` or in `/boot`) first, then the highest `vmlinuz-VERSION` in `/boot`; any
//! other ext volume is taken for a separate `/boot` partition with the kernels at its root.
//! A kernel on the root filesystem wins; else a `/boot` partition's, preferring the version
//! the root's dangling `/vmlinuz` link names (Debian keeps the links on the root when /boot
//! is separate).

use std::sync::Arc;

use disk::BlockDevice;
use ext4_view::{Ext4, Ext4Error};
use serde::Serialize;
use tracing::debug;

use crate::names::{
    cmdline_from_grub_default, cmdline_from_kernel_file, compare_versions, in_boot_dir,
    initrd_names, kernel_version,
};
use crate::volume::{TableKind, Volume, has_ext_magic, open_ext, volumes};
use crate::{BOOT_FILE_BYTES_MAX, BootFilesError};

/// Most directory entries looked at in one boot directory.
pub const DIR_ENTRIES_MAX: usize = 4096;
/// Largest `/etc/kernel/cmdline` or `/etc/default/grub` read.
pub const CONFIG_BYTES_MAX: u64 = 64 << 10;

/// A kernel or initramfs in one volume's filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootFile {
    /// Its partition number (`None`: the filesystem is on the whole disk).
    pub partition: Option<u32>,
    /// Its path in that filesystem, symlinks resolved.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The kernel version its name carries (`vmlinuz-VERSION`, `initrd.img-VERSION`).
    pub version: Option<String>,
}

/// The root filesystem, for `root=` on the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootFs {
    /// Its partition number (`/dev/nbd0pN`); `None` when it is the whole disk.
    pub partition: Option<u32>,
    /// The partition's PARTUUID (GPT unique GUID, or `SSSSSSSS-NN` on an MBR disk).
    pub partuuid: Option<String>,
    /// The filesystem UUID (`root=UUID=...`).
    pub fs_uuid: String,
    /// The filesystem label, if it has one.
    pub label: Option<String>,
}

/// What [`find`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootFiles {
    /// The disk's partition table.
    pub table: TableKind,
    /// The kernel.
    pub kernel: BootFile,
    /// Its initramfs, when one with the kernel's version (or Debian's link) exists.
    pub initrd: Option<BootFile>,
    /// The command line from `/etc/kernel/cmdline`, else GRUB's defaults, else `None`.
    pub cmdline: Option<String>,
    /// The root filesystem, when one was recognised.
    pub root: Option<RootFs>,
}

/// A kernel and its initrd found in one filesystem.
#[derive(Debug, Clone)]
struct Pair {
    kernel: BootFile,
    initrd: Option<BootFile>,
}

/// What one ext volume offers.
#[derive(Debug, Default)]
struct Offer {
    /// The kernel named by the `vmlinuz` link.
    linked: Option<Pair>,
    /// Kernels by name in the boot directory, highest version first.
    scanned: Vec<Pair>,
    /// The version a dangling root `/vmlinuz` link names.
    hint: Option<String>,
}

/// Finds the boot files of the disk `dev` (the top of an opened chain: reads resolve through
/// every layer).
///
/// # Errors
/// [`BootFilesError::NoKernel`] listing every volume tried and why; a broken partition
/// table; disk reads.
pub fn find(dev: &Arc<dyn BlockDevice>) -> Result<BootFiles, BootFilesError> {
    let (table, vols) = volumes(dev.as_ref())?;
    let mut tried = Vec::new();
    let mut root: Option<(RootFs, Offer, Option<String>)> = None;
    let mut boots: Vec<Offer> = Vec::new();
    for vol in &vols {
        let label = vol.label();
        if !has_ext_magic(dev.as_ref(), vol.start, vol.len)? {
            tried.push(format!("{label}: no ext filesystem"));
            continue;
        }
        let fs = match open_ext(dev, vol) {
            Ok(fs) => fs,
            Err(e) => {
                tried.push(format!("{label}: {}", chain_text(&e)));
                continue;
            }
        };
        let is_root = looks_like_root(&fs);
        let offer = match offer(&fs, vol, is_root) {
            Ok(o) => o,
            Err(e) => {
                tried.push(format!("{label}: {}", chain_text(&e)));
                continue;
            }
        };
        let dir = if is_root { "/boot" } else { "/" };
        if offer.linked.is_none() && offer.scanned.is_empty() {
            tried.push(format!("{label}: ext, no vmlinuz-VERSION in {dir}"));
        }
        debug!(volume = %label, is_root, kernels = offer.scanned.len(), "looked for kernels");
        if is_root && root.is_none() {
            let cmdline = read_cmdline(&fs);
            root = Some((root_fs(&fs, vol), offer, cmdline));
        } else {
            boots.push(offer);
        }
    }
    let hint = root.as_ref().and_then(|(_, o, _)| o.hint.clone());
    let from_root = root
        .as_ref()
        .and_then(|(_, o, _)| o.linked.clone().or_else(|| o.scanned.first().cloned()));
    let chosen = from_root.or_else(|| pick_boot_partition(&boots, hint.as_deref()));
    let Some(pair) = chosen else {
        return Err(BootFilesError::NoKernel { tried });
    };
    let (root, cmdline) = match root {
        Some((r, _, c)) => (Some(r), c),
        None => (None, None),
    };
    Ok(BootFiles {
        table,
        kernel: pair.kernel,
        initrd: pair.initrd,
        cmdline,
        root,
    })
}

/// A `/boot` partition's kernel: the hinted version in any of them, else the first one's
/// highest.
fn pick_boot_partition(boots: &[Offer], hint: Option<&str>) -> Option<Pair> {
    let all = || boots.iter().flat_map(|o| o.linked.iter().chain(&o.scanned));
    if let Some(h) = hint
        && let Some(p) = all().find(|p| p.kernel.version.as_deref() == Some(h))
    {
        return Some(p.clone());
    }
    boots
        .iter()
        .find_map(|o| o.linked.clone().or_else(|| o.scanned.first().cloned()))
}

/// The text of an error and its sources, for the list of volumes tried.
fn chain_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn is_dir(fs: &Ext4, path: &str) -> bool {
    fs.metadata(path).is_ok_and(|m| m.is_dir())
}

fn looks_like_root(fs: &Ext4) -> bool {
    is_dir(fs, "/etc") && (is_dir(fs, "/sbin") || is_dir(fs, "/usr"))
}

fn root_fs(fs: &Ext4, vol: &Volume) -> RootFs {
    let label = fs.label().to_str().ok().filter(|l| !l.is_empty());
    RootFs {
        partition: vol.number(),
        partuuid: vol.partition.as_ref().map(|p| p.partuuid.clone()),
        fs_uuid: fs.uuid().to_string(),
        label: label.map(str::to_string),
    }
}

/// A regular file at `path` (symlinks followed, inside the filesystem), or `None` if there
/// is none, or if the links lead out of `/boot` ([`in_boot_dir`]: `is_root` says whether
/// `fs` is a root filesystem).
fn file_at(
    fs: &Ext4,
    vol: &Volume,
    path: &str,
    is_root: bool,
) -> Result<Option<BootFile>, BootFilesError> {
    let real = match fs.canonicalize(path) {
        Ok(p) => p,
        Err(Ext4Error::NotFound | Ext4Error::NotADirectory) => return Ok(None),
        Err(source) => return Err(fs_err(vol, source)),
    };
    let Ok(real) = real.to_str().map(str::to_string) else {
        return Ok(None);
    };
    if !in_boot_dir(&real, is_root) {
        debug!(volume = %vol.label(), path, real, "a boot file link leads out of /boot: skipped");
        return Ok(None);
    }
    let meta = match fs.metadata(real.as_str()) {
        Ok(m) => m,
        Err(Ext4Error::NotFound) => return Ok(None),
        Err(source) => return Err(fs_err(vol, source)),
    };
    if !meta.file_type().is_regular_file() {
        return Ok(None);
    }
    let name = real.rsplit('/').next().unwrap_or_default();
    let version = kernel_version(name)
        .or_else(|| name.strip_prefix("initrd.img-"))
        .map(str::to_string);
    Ok(Some(BootFile {
        partition: vol.number(),
        path: real,
        size: meta.len(),
        version,
    }))
}

fn fs_err(vol: &Volume, source: Ext4Error) -> BootFilesError {
    BootFilesError::Fs {
        volume: vol.label(),
        source,
    }
}

/// The kernels `fs` offers: links first, then by name in its boot directory.
fn offer(fs: &Ext4, vol: &Volume, is_root: bool) -> Result<Offer, BootFilesError> {
    let mut out = Offer::default();
    let (dir, links): (&str, &[&str]) = if is_root {
        ("/boot", &["/vmlinuz", "/boot/vmlinuz"])
    } else {
        ("/", &["/vmlinuz"])
    };
    for link in links {
        if let Some(kernel) = file_at(fs, vol, link, is_root)? {
            let initrd_link = link.replace("vmlinuz", "initrd.img");
            let initrd = match file_at(fs, vol, &initrd_link, is_root)? {
                Some(i) => Some(i),
                None => initrd_for(fs, vol, &kernel, is_root)?,
            };
            out.linked = Some(Pair { kernel, initrd });
            break;
        }
        if out.hint.is_none()
            && let Ok(target) = fs.read_link(*link)
            && let Ok(t) = target.to_str()
        {
            out.hint = kernel_version(t.rsplit('/').next().unwrap_or_default()).map(str::to_string);
        }
    }
    if !is_dir(fs, dir) {
        return Ok(out);
    }
    let mut versions: Vec<String> = Vec::new();
    let entries = fs.read_dir(dir).map_err(|e| fs_err(vol, e))?;
    for entry in entries.take(DIR_ENTRIES_MAX) {
        let entry = entry.map_err(|e| fs_err(vol, e))?;
        let name = entry.file_name();
        if let Ok(name) = name.as_str()
            && let Some(v) = kernel_version(name)
        {
            versions.push(v.to_string());
        }
    }
    versions.sort_by(|a, b| compare_versions(b, a));
    for v in versions {
        let path = format!("{}/vmlinuz-{v}", dir.trim_end_matches('/'));
        // Only regular files count by name (a link named vmlinuz-X is followed to its file).
        if let Some(kernel) = file_at(fs, vol, &path, is_root)? {
            let initrd = initrd_for(fs, vol, &kernel, is_root)?;
            out.scanned.push(Pair { kernel, initrd });
        }
    }
    Ok(out)
}

/// The initrd beside `kernel` with its version.
fn initrd_for(
    fs: &Ext4,
    vol: &Volume,
    kernel: &BootFile,
    is_root: bool,
) -> Result<Option<BootFile>, BootFilesError> {
    let Some(version) = kernel.version.as_deref() else {
        return Ok(None);
    };
    let dir = kernel.path.rsplit_once('/').map_or("", |(d, _)| d);
    for name in initrd_names(version) {
        if let Some(mut f) = file_at(fs, vol, &format!("{dir}/{name}"), is_root)? {
            f.version = Some(version.to_string());
            return Ok(Some(f));
        }
    }
    Ok(None)
}

/// The command line from `/etc/kernel/cmdline`, else `/etc/default/grub`.
fn read_cmdline(fs: &Ext4) -> Option<String> {
    let text = |path: &str| -> Option<String> {
        let meta = fs.metadata(path).ok()?;
        if !meta.file_type().is_regular_file() || meta.len() > CONFIG_BYTES_MAX {
            return None;
        }
        let bytes = fs.read(path).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    if let Some(t) = text("/etc/kernel/cmdline") {
        return cmdline_from_kernel_file(&t);
    }
    text("/etc/default/grub").and_then(|t| cmdline_from_grub_default(&t))
}

/// Reads the bytes of `file` (as [`find`] returned it, or a path a vDisk's boot
/// configuration names) from the disk `dev`, refusing a file larger than `max_bytes` (at
/// most [`BOOT_FILE_BYTES_MAX`]) before reading it, and a path whose symlinks, resolved
/// inside the volume's filesystem, lead out of `/boot` ([`in_boot_dir`]: on a root
/// filesystem only `/boot` is served; a separate `/boot` partition is `/boot` whole).
///
/// # Errors
/// [`BootFilesError::FileTooLarge`], [`BootFilesError::NoVolume`],
/// [`BootFilesError::NotAFile`], [`BootFilesError::OutsideBoot`], filesystem and disk
/// errors.
pub fn read(
    dev: &Arc<dyn BlockDevice>,
    file: &BootFile,
    max_bytes: u64,
) -> Result<Vec<u8>, BootFilesError> {
    let max = max_bytes.min(BOOT_FILE_BYTES_MAX);
    let (_, vols) = volumes(dev.as_ref())?;
    let label = || match file.partition {
        Some(n) => format!("partition {n}"),
        None => "whole disk".to_string(),
    };
    let vol = vols
        .iter()
        .find(|v| v.number() == file.partition)
        .ok_or_else(|| BootFilesError::NoVolume { volume: label() })?;
    if !has_ext_magic(dev.as_ref(), vol.start, vol.len)? {
        return Err(BootFilesError::NoVolume { volume: label() });
    }
    let fs = open_ext(dev, vol)?;
    let outside = || BootFilesError::OutsideBoot {
        volume: label(),
        path: file.path.clone(),
    };
    let real = fs
        .canonicalize(file.path.as_str())
        .map_err(|e| fs_err(vol, e))?;
    let real = real.to_str().map_err(|_| outside())?.to_string();
    if !in_boot_dir(&real, looks_like_root(&fs)) {
        return Err(outside());
    }
    let meta = fs.metadata(real.as_str()).map_err(|e| fs_err(vol, e))?;
    if !meta.file_type().is_regular_file() {
        return Err(BootFilesError::NotAFile {
            volume: label(),
            path: file.path.clone(),
        });
    }
    let size = meta.len();
    if size > max {
        return Err(BootFilesError::FileTooLarge {
            volume: label(),
            path: file.path.clone(),
            size,
            max,
        });
    }
    let mut f = fs.open(real.as_str()).map_err(|e| fs_err(vol, e))?;
    // size <= BOOT_FILE_BYTES_MAX, which fits in usize on the 64-bit hosts Ferry runs on.
    debug_assert!(size <= BOOT_FILE_BYTES_MAX, "refused above when larger");
    let mut out = vec![0u8; usize::try_from(size).unwrap_or(0)];
    let mut got = 0usize;
    while got < out.len() {
        let n = f.read_bytes(&mut out[got..]).map_err(|e| fs_err(vol, e))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    debug_assert!(got <= out.len(), "reads fill at most the buffer");
    if got as u64 != size {
        return Err(BootFilesError::ShortRead {
            volume: label(),
            path: file.path.clone(),
            size,
            got: got as u64,
        });
    }
    Ok(out)
}
