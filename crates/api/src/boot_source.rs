//! Where the boot service gets a version's boot files: the [`BootSource`] trait and its
//! implementation over the `bootfiles` crate, [`BootfilesSource`]: a version's chain opened
//! read-only, its kernel, initramfs, command line and root found in its own filesystem. An
//! override path (the vDisk's `boot_kernel`/`boot_initrd`) names a file under `/boot` as
//! the booted system sees it: on the root filesystem when the kernel was found there, else
//! at the root of the `/boot` partition the kernel was found on. Nothing outside `/boot` is
//! read, whatever the override or the image's symlinks say (`bootfiles::read`).
//!
//! The search is split from the reads: [`BootSource::locate`] opens the chain and searches
//! once, and the [`Located`] it returns answers what the version offers and reads its files
//! through the chain it holds. The boot service keeps a version's `Located` (see
//! `boot_versions.rs`), so a boot (script, kernel, initramfs) searches once per version.

use std::path::Path;
use std::sync::Arc;

use disk::BlockDevice;

use crate::boot_script::RootDev;

/// Which boot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootFileKind {
    /// The kernel.
    Kernel,
    /// The initramfs.
    Initrd,
}

impl BootFileKind {
    /// Its name in the URL and the cache.
    pub fn as_str(self) -> &'static str {
        match self {
            BootFileKind::Kernel => "kernel",
            BootFileKind::Initrd => "initrd",
        }
    }
}

/// A vDisk's boot file paths, when the administrator set them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BootOverrides {
    /// The kernel's path in the version's filesystem.
    pub kernel: Option<String>,
    /// The initramfs's path in the version's filesystem.
    pub initrd: Option<String>,
}

/// What a version's filesystem offers for booting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    /// True when it has an initramfs.
    pub initrd: bool,
    /// Its own kernel command line, if it has one.
    pub cmdline: Option<String>,
    /// Its root filesystem.
    pub root: RootDev,
}

/// Where the boot service finds a version's boot files: `image` is the version's file, the
/// top of its chain. The call blocks (it reads the chain); the service makes it on the
/// blocking pool. Errors are one line for a person.
pub trait BootSource: Send + Sync + std::fmt::Debug + 'static {
    /// Opens the version's chain and searches it for boot files: the one search a version's
    /// boot needs.
    ///
    /// # Errors
    /// No kernel found, an image or filesystem error.
    fn locate(&self, image: &Path) -> Result<Arc<dyn Located>, String>;
}

/// A version's boot files, found: what the version offers and reads of its files, through
/// the chain the search opened (held until this is dropped).
pub trait Located: Send + Sync + std::fmt::Debug {
    /// What the version offers, with the vDisk's overrides applied.
    fn info(&self, overrides: &BootOverrides) -> BootInfo;
    /// The bytes of one boot file, at most `max_bytes`. Blocks (it reads the chain).
    ///
    /// # Errors
    /// The file is missing or larger than `max_bytes`; an image or filesystem error.
    fn read(
        &self,
        kind: BootFileKind,
        overrides: &BootOverrides,
        max_bytes: u64,
    ) -> Result<Vec<u8>, String>;
}

/// Boot files through the `bootfiles` crate: the version's chain opened read-only.
#[derive(Debug, Default)]
pub struct BootfilesSource;

/// What [`BootfilesSource`] found: the chain's top and the files in its filesystems.
#[derive(Debug)]
struct Found {
    dev: Arc<dyn BlockDevice>,
    files: bootfiles::BootFiles,
}

/// Opens the chain of `image`. The error names the file, not its directory: it is shown to
/// the machine that asked (the server's paths are its own), and logged by the caller.
fn open_chain(image: &Path) -> Result<Arc<dyn BlockDevice>, String> {
    let name = image.file_name().unwrap_or_default().to_string_lossy();
    disk::open::open(image, disk::open::OpenOptions::default())
        .map(|c| c.top())
        .map_err(|e| format!("open {name}: {}", contract::ErrorChain(&e)))
}

/// The file the override `path` names (see the module docs), or why it names none.
fn at_path(files: &bootfiles::BootFiles, path: &str) -> Result<bootfiles::BootFile, String> {
    let Some(rest) = path.strip_prefix("/boot/") else {
        return Err(format!("{path} is not under /boot: not served"));
    };
    let kernel = &files.kernel;
    let on_root = files
        .root
        .as_ref()
        .is_some_and(|r| r.partition == kernel.partition);
    Ok(bootfiles::BootFile {
        partition: kernel.partition,
        path: if on_root {
            path.to_string()
        } else {
            format!("/{rest}")
        },
        size: 0,
        version: None,
    })
}

impl BootSource for BootfilesSource {
    fn locate(&self, image: &Path) -> Result<Arc<dyn Located>, String> {
        let dev = open_chain(image)?;
        let files = bootfiles::find(&dev).map_err(|e| contract::ErrorChain(&e).to_string())?;
        Ok(Arc::new(Found { dev, files }))
    }
}

impl Located for Found {
    fn info(&self, overrides: &BootOverrides) -> BootInfo {
        let f = &self.files;
        let root = match &f.root {
            Some(r) => r.partition.map_or(RootDev::WholeDisk, RootDev::Partition),
            None => RootDev::Unknown,
        };
        BootInfo {
            initrd: f.initrd.is_some() || overrides.initrd.is_some(),
            cmdline: f.cmdline.clone(),
            root,
        }
    }

    fn read(
        &self,
        kind: BootFileKind,
        overrides: &BootOverrides,
        max_bytes: u64,
    ) -> Result<Vec<u8>, String> {
        let f = &self.files;
        let file = match kind {
            BootFileKind::Kernel => match &overrides.kernel {
                Some(p) => at_path(f, p)?,
                None => f.kernel.clone(),
            },
            BootFileKind::Initrd => match (&overrides.initrd, &f.initrd) {
                (Some(p), _) => at_path(f, p)?,
                (None, Some(i)) => i.clone(),
                (None, None) => return Err("the version has no initramfs".into()),
            },
        };
        bootfiles::read(&self.dev, &file, max_bytes)
            .map_err(|e| format!("{}: {}", file.path, contract::ErrorChain(&e)))
    }
}
