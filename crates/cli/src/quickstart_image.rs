//! The image of `ferry quickstart --linux`: what this machine lacks to boot one, the static
//! boot agent, and the Debian 12 image with that agent installed as docs/netboot.md says,
//! built once and kept in a cache.
//!
//! # Design notes
//!
//! The root is the boot tests' (`guest::RECIPE`, compiled in, run with debootstrap): a
//! machine where the suite ran finds its tar at once, and a fresh one builds the same root.
//! The image is that root with `ferry target install-initramfs --root ROOT --agent …
//! --farm-ca … --overflow /dev/vda --update` run by this binary on the host (`--root`, so the
//! host's `ferry` never runs under the guest's older C library; its `update-initramfs` runs
//! chrooted), captured into `CACHE/debian12-<key>.vhdx`. The key is a hash of all that can
//! change in it: the recipe, the agent, the farm's CA (it is in the initramfs, so an image
//! belongs to one farm), the hook and scripts the install writes, the install's arguments
//! and ferry's version. An image of the key in the cache is used as it is; a build removes
//! the images of other keys. The farm's vDisk is a hard link to the cached file (a copy when
//! the cache is on another file system), so the image takes its room once.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use sha2::Digest as _;

/// What `/etc/ferry-version` holds in the image: the machine's marker names it once
/// multi-user is reached (`FERRY-BOOT-OK version=quickstart-linux`).
pub(crate) const VERSION: &str = "quickstart-linux";

/// The arguments of `ferry target install-initramfs` after `--root ROOT --agent FILE
/// --farm-ca FILE`, as docs/netboot.md's image block gives them.
const INSTALL_ARGS: [&str; 3] = ["--overflow", "/dev/vda", "--update"];

/// The QEMU NIC's option ROM (iPXE) that `-boot n` runs: Debian's `ipxe-qemu`.
const IPXE_ROM: &str = "efi-virtio.rom";

/// Where the boot-agent profile puts the static agent, from a cargo target directory.
const AGENT_IN_TARGET: &str = "x86_64-unknown-linux-musl/boot-agent/ferry-boot";

/// How to build the static agent, for the error that names it missing.
const AGENT_BUILD: &str = "rustup target add x86_64-unknown-linux-musl; apt-get install \
                           musl-tools; cargo build --profile boot-agent --target \
                           x86_64-unknown-linux-musl -p boot-agent";

/// The bytes compared to tell two VHDX files apart: the file identifier, both headers (their
/// write GUIDs are new in every capture) and the region table.
const IDENTITY_BYTES: usize = 1 << 20;

/// The ELF program header type of an interpreter (a dynamically linked executable).
const PT_INTERP: u32 = 3;

/// The tools an image build runs on the host, with the Debian package of each.
const BUILD_TOOLS: [(&str, &str); 6] = [
    ("tar", "tar"),
    ("mkfs.ext4", "e2fsprogs"),
    ("sfdisk", "fdisk"),
    ("chroot", "coreutils"),
    ("mount", "mount"),
    ("umount", "mount"),
];

/// The tools the root's recipe runs besides those, with the Debian package of each.
const ROOT_TOOLS: [(&str, &str); 3] = [
    ("debootstrap", "debootstrap"),
    ("flock", "util-linux"),
    ("sha256sum", "coreutils"),
];

/// What this machine lacks to boot the machine (QEMU and its iPXE ROM) and, with `build`,
/// to build the image (root and the build's tools; debootstrap's when the root's tar is not
/// in `guest_cache`). Each entry names the Debian package.
pub(crate) fn missing(build: bool, guest_cache: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    let qemu = crate::quickstart_machine::QEMU;
    if !guest::on_path(qemu) {
        missing.push(format!("{qemu} (Debian: qemu-system-x86)"));
    } else if !ipxe_rom_present() {
        missing.push(format!(
            "QEMU's iPXE ROM {IPXE_ROM} in the directories `{qemu} -L help` names \
             (Debian: ipxe-qemu)"
        ));
    }
    if !build {
        return missing;
    }
    if !guest::is_root() {
        missing.push("root (the image is built with debootstrap, chroot and mount)".into());
    }
    let root_built = guest::root_tar(guest_cache).is_file();
    let tools = BUILD_TOOLS
        .iter()
        .chain(ROOT_TOOLS.iter().filter(|_| !root_built));
    for (tool, package) in tools {
        if !guest::on_path(tool) {
            missing.push(format!("{tool} (Debian: {package})"));
        }
    }
    missing
}

/// Whether a directory of QEMU's firmware search path holds the virtio NIC's iPXE ROM.
fn ipxe_rom_present() -> bool {
    let out = std::process::Command::new(crate::quickstart_machine::QEMU)
        .args(["-L", "help"])
        .output();
    out.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|dir| Path::new(dir.trim()).join(IPXE_ROM).is_file())
    })
}

/// The static boot agent: `given`, which must be a static executable; else the first static
/// one of the boot-agent profile's output in this ferry's target directory and `ferry-boot`
/// beside ferry. The error says what is missing and how to build it.
pub(crate) fn find_agent(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return match static_executable(path) {
            Ok(true) => Ok(path.to_path_buf()),
            Ok(false) => Err(format!(
                "a static boot agent: --agent {} is dynamically linked, and a machine's \
                 initramfs has no C library for it ({AGENT_BUILD})",
                path.display()
            )),
            Err(why) => Err(format!(
                "a static boot agent: --agent {}: {why}",
                path.display()
            )),
        };
    }
    let exe = std::env::current_exe().ok();
    let dir = exe.as_deref().and_then(Path::parent);
    let candidates: Vec<PathBuf> = [
        dir.and_then(Path::parent).map(|t| t.join(AGENT_IN_TARGET)),
        dir.map(|d| d.join("ferry-boot")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(found) = candidates
        .iter()
        .find(|p| static_executable(p).unwrap_or(false))
    {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "the static boot agent ferry-boot (not at {}; build it: {AGENT_BUILD}; or give \
         --agent FILE)",
        tried.join(" nor ")
    ))
}

/// Whether the file at `path` is an ELF executable without an interpreter (statically
/// linked); the error says why it is no executable at all.
fn static_executable(path: &Path) -> Result<bool, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    elf_is_static(&bytes).ok_or_else(|| "not a 64-bit little-endian ELF file".to_owned())
}

/// Whether the 64-bit little-endian ELF file `elf` has no `PT_INTERP` program header;
/// `None` when it is no such file or its program headers lie outside it.
fn elf_is_static(elf: &[u8]) -> Option<bool> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?));
    // e_ident: magic, ELFCLASS64 (2), ELFDATA2LSB (1).
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(at)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The key of the image this binary builds with `agent` for the farm whose CA is `ca`.
///
/// # Errors
/// The agent or the CA cannot be read.
pub(crate) fn image_key(agent: &Path, ca: &Path) -> anyhow::Result<String> {
    let agent = std::fs::read(agent).with_context(|| format!("read {}", agent.display()))?;
    let ca = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
    let mut h = sha2::Sha256::new();
    let parts: [&[u8]; 5] = [
        b"ferry quickstart --linux image 1",
        env!("CARGO_PKG_VERSION").as_bytes(),
        guest::RECIPE.as_bytes(),
        &agent,
        &ca,
    ];
    let text = crate::target_initramfs::INSTALLED_FILES
        .iter()
        .chain(INSTALL_ARGS.iter())
        .chain([VERSION].iter());
    for part in parts.into_iter().chain(text.map(|t| t.as_bytes())) {
        // Each part's length first, so that no two lists of parts hash alike.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    Ok(hex::encode(&h.finalize()[..8]))
}

/// The cached image of `key` in `cache`.
pub(crate) fn cached_image(cache: &Path, key: &str) -> PathBuf {
    cache.join(format!("debian12-{key}.vhdx"))
}

/// What [`build`] did.
#[derive(Debug)]
pub(crate) struct Built {
    /// The root's tar.
    pub(crate) root_tar: PathBuf,
    /// Whether the recipe had to build it (debootstrap) rather than find it.
    pub(crate) root_built: bool,
}

/// What an image is built from and where it goes.
#[derive(Debug)]
pub(crate) struct Inputs<'a> {
    /// The `ferry` binary that runs the install (this one).
    pub(crate) exe: &'a Path,
    /// The static boot agent.
    pub(crate) agent: &'a Path,
    /// The farm's CA certificate.
    pub(crate) ca: &'a Path,
    /// The image cache.
    pub(crate) cache: &'a Path,
    /// The image's key ([`image_key`] of the agent and the CA).
    pub(crate) key: &'a str,
    /// The guest root's cache (`guest::default_cache`).
    pub(crate) guest_cache: &'a Path,
}

/// Builds the image of `i.key` into `i.cache` (see the module's notes): the guest root
/// (built when its cache has none), the install run by `i.exe`, the capture.
///
/// # Errors
/// The recipe, the image build, the install or the capture failed.
pub(crate) fn build(i: &Inputs, say: &dyn Fn(String), quiet: bool) -> anyhow::Result<Built> {
    let Inputs {
        exe,
        agent,
        ca,
        cache,
        key,
        guest_cache,
    } = *i;
    let tar = guest::root_tar(guest_cache);
    let root_built = !tar.is_file();
    if root_built {
        say(format!(
            "building the Debian 12 root with debootstrap (about 3.5 minutes, once): {}",
            tar.display()
        ));
    }
    let root_tar = guest::build_root(guest_cache, !quiet).context("build the Debian 12 root")?;
    say(format!("the Debian 12 root: {}", root_tar.display()));
    std::fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
    let work = cache.join("build");
    let mut install: Vec<std::ffi::OsString> = ["target", "install-initramfs", "--root"]
        .map(Into::into)
        .to_vec();
    install.push(guest::ROOT_ARG.into());
    install.extend([
        "--agent".into(),
        agent.into(),
        "--farm-ca".into(),
        ca.into(),
    ]);
    install.extend(INSTALL_ARGS.map(Into::into));
    say(format!(
        "building the image: the root, then `ferry target install-initramfs --root ROOT \
         --agent {} --farm-ca {} {}` (about a minute)",
        agent.display(),
        ca.display(),
        INSTALL_ARGS.join(" ")
    ));
    let image = guest::ImageBuilder::new(&root_tar)
        .version(VERSION)
        .run_on_host(exe, install)
        .quiet(quiet)
        .build(&work)
        .context("build the image")?;
    let target = cached_image(cache, key);
    let partial = cache.join(format!("debian12-{key}.partial.vhdx"));
    let _ = std::fs::remove_file(&partial);
    let bar = crate::progress::Bar::new(quiet, "capturing");
    let captured = disk::ops::capture::capture(
        &image.disk,
        &partial,
        &disk::ops::capture::CaptureOptions::default(),
        &bar,
    );
    bar.finish();
    for file in [&image.disk, &image.kernel, &image.initrd] {
        let _ = std::fs::remove_file(file);
    }
    let _ = std::fs::remove_dir(&work);
    captured.with_context(|| format!("capture {}", image.disk.display()))?;
    std::fs::rename(&partial, &target)
        .with_context(|| format!("rename {} to {}", partial.display(), target.display()))?;
    remove_other_images(cache, &target);
    say(format!("captured the image: {}", target.display()));
    Ok(Built {
        root_tar,
        root_built,
    })
}

/// Removes the cache's images other than `keep` (older keys).
fn remove_other_images(cache: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path != keep && name.starts_with("debian12-") && name.ends_with(".vhdx") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Puts the cached image `cached` at `file` (a vDisk's base in a store): a hard link, or a
/// copy when the two are on different file systems, renamed into place.
///
/// # Errors
/// Neither a link nor a copy could be made, or the rename failed.
pub(crate) fn place(cached: &Path, file: &Path) -> anyhow::Result<()> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .context("a vDisk file name")?;
    let tmp = file.with_file_name(format!(".{name}.quickstart"));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(cached, &tmp).is_err() {
        std::fs::copy(cached, &tmp)
            .with_context(|| format!("copy {} to {}", cached.display(), tmp.display()))?;
    }
    std::fs::rename(&tmp, file).with_context(|| format!("rename to {}", file.display()))
}

/// Whether `a` and `b` are the same image: one file, or the same length and headers (a
/// capture writes new GUIDs into them).
pub(crate) fn same_image(a: &Path, b: &Path) -> bool {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
        return true;
    }
    if ma.len() != mb.len() {
        return false;
    }
    let head = |p: &Path| -> Option<Vec<u8>> {
        let mut buf = Vec::with_capacity(IDENTITY_BYTES);
        std::fs::File::open(p)
            .ok()?
            .take(IDENTITY_BYTES as u64)
            .read_to_end(&mut buf)
            .ok()?;
        Some(buf)
    };
    matches!((head(a), head(b)), (Some(x), Some(y)) if x == y)
}

/// Fails with one message naming everything in `missing`.
///
/// # Errors
/// When `missing` is not empty.
pub(crate) fn require(missing: &[String]) -> anyhow::Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    bail!(
        "ferry quickstart --linux cannot boot a machine here; missing: {} (docs/netboot.md, \
         \"A first machine\")",
        missing.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit little-endian ELF header with `types` as its program headers' types.
    fn elf(types: &[u32]) -> Vec<u8> {
        const PHOFF: usize = 64; // program headers right after the 64-byte ELF header
        const PHENTSIZE: usize = 56; // Elf64_Phdr
        let mut f = vec![0u8; PHOFF + PHENTSIZE * types.len()];
        f[..6].copy_from_slice(b"\x7fELF\x02\x01");
        f[0x20..0x28].copy_from_slice(&(PHOFF as u64).to_le_bytes());
        f[0x36..0x38].copy_from_slice(&(PHENTSIZE as u16).to_le_bytes());
        f[0x38..0x3A].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            let at = PHOFF + i * PHENTSIZE;
            f[at..at + 4].copy_from_slice(&t.to_le_bytes());
        }
        f
    }

    #[test]
    fn an_elf_without_an_interpreter_is_static() {
        const PT_LOAD: u32 = 1;
        assert_eq!(elf_is_static(&elf(&[PT_LOAD, PT_LOAD])), Some(true));
    }

    #[test]
    fn an_elf_with_an_interpreter_is_dynamic() {
        const PT_PHDR: u32 = 6;
        assert_eq!(elf_is_static(&elf(&[PT_PHDR, PT_INTERP])), Some(false));
    }

    #[test]
    fn a_script_or_a_cut_elf_is_no_executable() {
        assert_eq!(elf_is_static(b"#!/bin/sh\n"), None);
        let cut = elf(&[1, 1]);
        assert_eq!(elf_is_static(&cut[..80]), None);
    }

    #[test]
    fn the_key_changes_with_the_agent_and_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (agent, other_agent) = (file("a", "agent 1"), file("b", "agent 2"));
        let (ca, other_ca) = (file("c", "ca 1"), file("d", "ca 2"));
        let key = image_key(&agent, &ca).unwrap();
        assert_eq!(key, image_key(&agent, &ca).unwrap());
        assert_ne!(key, image_key(&other_agent, &ca).unwrap());
        assert_ne!(key, image_key(&agent, &other_ca).unwrap());
    }
}
