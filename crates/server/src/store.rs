//! The store: a directory of vDisks named the PVS way, and the resolution of `NAME` and
//! `NAME@N` to the file at the top of that version's chain.
//!
//! ```text
//!   golden.vhdx          version 0, the base           golden@0
//!   golden.1.avhdx       version 1 (parent: golden.vhdx)   golden@1
//!   golden.2.avhdx       version 2 (parent: 1)         golden@2, and golden (the newest)
//! ```
//!
//! A version's chain is whatever its file's parent locator says (a merged-updates version
//! may sit directly on the base); the number only orders versions. Names are read from the
//! directory on every resolution, so a version made while the server runs is served by the
//! next open. Files that do not follow the pattern (`golden.u3.avhdx`, `notes.txt`) are
//! ignored, and so are entries that are not regular files (FIFOs, devices, sockets,
//! directories) and symlinks that lead out of the store or to anything but a regular file.
//! What this module is not: it opens no image; [`crate::exports`] does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use contract::{ExportName, VdiskName};

/// The most directory entries a scan reads; a bigger store is an error, not a slow scan.
pub const STORE_ENTRIES_MAX: usize = 100_000;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No vDisk of that name.
    #[error("no vdisk named {0:?} in the store")]
    NotFound(String),
    /// The vDisk exists but not that version.
    #[error("vdisk {vdisk:?} has no version {version}")]
    NoVersion {
        /// The vDisk.
        vdisk: String,
        /// The version asked for.
        version: u32,
    },
    /// The name cannot name a vDisk or export.
    #[error("invalid name {name:?}: {why}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The store directory could not be read.
    #[error("read store directory {}", path.display())]
    Scan {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The store holds more entries than a scan reads.
    #[error("store {} holds more than {STORE_ENTRIES_MAX} entries", .0.display())]
    TooManyEntries(PathBuf),
}

/// One vDisk found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VDisk {
    /// Its name (`NAME`).
    pub name: String,
    /// Its files by version number; 0 is the base (`NAME.vhdx`), N is `NAME.N.avhdx`.
    pub versions: BTreeMap<u32, PathBuf>,
}

impl VDisk {
    /// The highest version number present.
    pub fn newest(&self) -> Option<u32> {
        self.versions.keys().next_back().copied()
    }
}

/// A resolved `NAME` or `NAME@N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The vDisk.
    pub vdisk: String,
    /// The version number.
    pub version: u32,
    /// True when it is the newest version.
    pub newest: bool,
    /// The file at the top of the version's chain.
    pub path: PathBuf,
}

/// A store directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    scans: AtomicU64,
    vdisks_seen: AtomicU64,
}

impl Store {
    /// A store at `dir` (made absolute, so chain keys and parent locators are stable).
    ///
    /// # Errors
    /// [`StoreError::Scan`] when `dir` is not a readable directory.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store, StoreError> {
        let dir = dir.as_ref();
        let scan_err = |source| StoreError::Scan {
            path: dir.to_path_buf(),
            source,
        };
        let dir = std::fs::canonicalize(dir).map_err(scan_err)?;
        std::fs::read_dir(&dir).map_err(scan_err)?;
        Ok(Store {
            dir,
            scans: AtomicU64::new(0),
            vdisks_seen: AtomicU64::new(0),
        })
    }

    /// The store directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every vDisk in the store, by name.
    ///
    /// # Errors
    /// [`StoreError::Scan`]; [`StoreError::TooManyEntries`].
    pub fn scan(&self) -> Result<Vec<VDisk>, StoreError> {
        let scan_err = |source| StoreError::Scan {
            path: self.dir.clone(),
            source,
        };
        let mut by_name: BTreeMap<String, VDisk> = BTreeMap::new();
        let mut names = Vec::new();
        for (i, entry) in std::fs::read_dir(&self.dir).map_err(scan_err)?.enumerate() {
            if i >= STORE_ENTRIES_MAX {
                return Err(StoreError::TooManyEntries(self.dir.clone()));
            }
            let entry = entry.map_err(scan_err)?;
            if let Some(file_name) = entry.file_name().to_str()
                && parse_file_name(file_name).is_some()
                && self.is_store_file(&entry)
            {
                names.push(file_name.to_string());
            }
        }
        // Sorted, so that of two spellings of one version (`a.vhdx`, `a.VHDX`) the same one
        // wins on every scan.
        names.sort();
        for file_name in names {
            let Some((name, version)) = parse_file_name(&file_name) else {
                continue;
            };
            let vd = by_name.entry(name.clone()).or_insert_with(|| VDisk {
                name,
                versions: BTreeMap::new(),
            });
            if let Some(kept) = vd.versions.get(&version) {
                tracing::warn!(kept = %kept.display(), ignored = %file_name, "two files for one vdisk version");
                continue;
            }
            vd.versions.insert(version, self.dir.join(&file_name));
        }
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.vdisks_seen
            .store(by_name.len() as u64, Ordering::Relaxed);
        Ok(by_name.into_values().collect())
    }

    /// Whether a directory entry is a vDisk file the store serves: a regular file, or a
    /// symlink to a regular file inside the store. A FIFO, device, socket or directory, or
    /// a symlink out of the store, is skipped (never opened: it could block the opener or
    /// serve a file from elsewhere).
    fn is_store_file(&self, entry: &std::fs::DirEntry) -> bool {
        let Ok(t) = entry.file_type() else {
            return false;
        };
        let keep = if t.is_file() {
            true
        } else if t.is_symlink() {
            std::fs::canonicalize(entry.path()).is_ok_and(|real| {
                real.starts_with(&self.dir) && std::fs::metadata(&real).is_ok_and(|m| m.is_file())
            })
        } else {
            false
        };
        if !keep {
            tracing::debug!(path = %entry.path().display(), "not a regular file in the store; skipped");
        }
        keep
    }

    /// Resolves `NAME` (the newest version) or `NAME@N` (read-only export names, as
    /// `contract::ExportName` parses them).
    ///
    /// # Errors
    /// [`StoreError::InvalidName`], [`StoreError::NotFound`], [`StoreError::NoVersion`],
    /// scan errors.
    pub fn resolve(&self, name: &str) -> Result<Resolved, StoreError> {
        let invalid = |why| StoreError::InvalidName {
            name: name.to_string(),
            why,
        };
        match name.parse::<ExportName>() {
            Ok(ExportName::ReadOnly { vdisk, version }) => self.resolve_version(&vdisk, version),
            Ok(_) => Err(invalid("expected NAME or NAME@N")),
            Err(e) => Err(invalid(e.reason())),
        }
    }

    /// Resolves vDisk `vdisk` at `version` (`None`: the newest), rescanning the directory.
    ///
    /// # Errors
    /// As [`Store::resolve`], but for `InvalidName`.
    pub fn resolve_version(
        &self,
        vdisk: &VdiskName,
        version: Option<u32>,
    ) -> Result<Resolved, StoreError> {
        let vdisk = vdisk.as_str();
        let found = self
            .scan()?
            .into_iter()
            .find(|v| v.name == vdisk)
            .ok_or_else(|| StoreError::NotFound(vdisk.to_string()))?;
        let newest = found
            .newest()
            .ok_or_else(|| StoreError::NotFound(vdisk.to_string()))?;
        let version = version.unwrap_or(newest);
        let path = found
            .versions
            .get(&version)
            .ok_or_else(|| StoreError::NoVersion {
                vdisk: vdisk.to_string(),
                version,
            })?;
        Ok(Resolved {
            vdisk: vdisk.to_string(),
            version,
            newest: version == newest,
            path: path.clone(),
        })
    }

    /// Directory scans done so far.
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }

    /// vDisks found by the last scan.
    pub fn vdisks_seen(&self) -> u64 {
        self.vdisks_seen.load(Ordering::Relaxed)
    }
}

/// The vDisk name and version a store file name encodes: `NAME.vhdx` is version 0,
/// `NAME.N.avhdx` (N ≥ 1, decimal, no leading zero) version N. Extensions match in any case.
pub fn parse_file_name(file_name: &str) -> Option<(String, u32)> {
    let (stem, ext) = file_name.rsplit_once('.')?;
    let (name, version) = if ext.eq_ignore_ascii_case("vhdx") {
        (stem, 0)
    } else if ext.eq_ignore_ascii_case("avhdx") {
        let (name, n) = stem.rsplit_once('.')?;
        let digits_ok = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        if !digits_ok || n.starts_with('0') {
            return None;
        }
        (name, n.parse().ok()?)
    } else {
        return None;
    };
    VdiskName::new(name).ok()?;
    Some((name.to_string(), version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_file_is_version_zero() {
        assert_eq!(parse_file_name("golden.vhdx"), Some(("golden".into(), 0)));
    }

    #[test]
    fn numbered_avhdx_is_that_version() {
        assert_eq!(
            parse_file_name("win10.22h2.12.AVHDX"),
            Some(("win10.22h2".into(), 12))
        );
    }

    #[test]
    fn avhdx_without_number_is_ignored() {
        assert_eq!(parse_file_name("golden.u3.avhdx"), None);
    }

    #[test]
    fn version_with_leading_zero_is_ignored() {
        assert_eq!(parse_file_name("golden.01.avhdx"), None);
    }

    #[test]
    fn version_zero_avhdx_is_ignored() {
        assert_eq!(parse_file_name("golden.0.avhdx"), None);
    }

    #[test]
    fn other_extensions_are_ignored() {
        assert_eq!(parse_file_name("golden.vhd"), None);
    }

    #[test]
    fn hidden_files_are_ignored() {
        assert_eq!(parse_file_name(".golden.vhdx"), None);
    }

    #[test]
    fn scan_skips_fifos_and_symlinks_out_of_the_store() {
        let d = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let dir = d.path();
        std::fs::write(dir.join("a.vhdx"), b"x").unwrap();
        std::fs::write(out.path().join("t.vhdx"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("a.vhdx"), dir.join("in.vhdx")).unwrap();
        std::os::unix::fs::symlink(out.path().join("t.vhdx"), dir.join("out.vhdx")).unwrap();
        std::os::unix::fs::symlink(dir.join("none"), dir.join("dangling.vhdx")).unwrap();
        std::fs::create_dir(dir.join("d.vhdx")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join("p.vhdx"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let names: Vec<String> = Store::open(dir)
            .unwrap()
            .scan()
            .unwrap()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["a", "in"]);
    }

    #[test]
    fn files_named_like_session_exports_are_ignored() {
        assert_eq!(parse_file_name("ferry-s-00.vhdx"), None);
    }
}
