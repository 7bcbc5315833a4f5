//! The boot file cache: `DATA/boot-cache/` (0700) holds each version's kernel and
//! initramfs (0600) once read through its chain, named by the vDisk id, the version, the
//! version file's size and modification time and the vDisk's boot file overrides, so a
//! maintenance version that changed, or a changed override, is read again.
//!
//! ```text
//!   boot-cache/v3-n2-s1048576-m1732640000123456789-o0123456789abcdef-kernel
//! ```
//!
//! A file is written under a temporary name of its own fill and renamed, so a reader sees
//! it whole or not at all, also when two fills of one file run at once; the older files of
//! the same version and kind are removed then.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use crate::boot_source::{BootFileKind, BootOverrides};

/// A cache entry's name without its kind: vDisk, version, file state, overrides.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    prefix: String,
    state: String,
}

/// FNV-1a, 64 bits: a stable hash of the overrides for the file name.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The key of version `number` of vDisk `vdisk_id` whose file is `path`.
///
/// # Errors
/// The file's metadata cannot be read (it is missing).
pub async fn key_of(
    path: &Path,
    vdisk_id: i64,
    number: i64,
    overrides: &BootOverrides,
) -> std::io::Result<CacheKey> {
    let m = tokio::fs::metadata(path).await?;
    let mtime = m
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let o = format!(
        "{}\0{}",
        overrides.kernel.as_deref().unwrap_or(""),
        overrides.initrd.as_deref().unwrap_or("")
    );
    Ok(CacheKey {
        prefix: format!("v{vdisk_id}-n{number}-"),
        state: format!("s{}-m{mtime}-o{:016x}", m.len(), fnv(&o)),
    })
}

impl CacheKey {
    /// Whether `other` is a key of the same version of the same vDisk (whatever its file
    /// state and overrides).
    pub fn same_version(&self, other: &CacheKey) -> bool {
        self.prefix == other.prefix
    }
}

/// The cached file of `key` and `kind` in `dir`.
pub fn path_of(dir: &Path, key: &CacheKey, kind: BootFileKind) -> PathBuf {
    dir.join(format!("{}{}-{}", key.prefix, key.state, kind.as_str()))
}

/// Stores `bytes` as the cached file of `key` and `kind` (0600, in `dir`, made 0700), and
/// removes the older files of that version and kind.
///
/// # Errors
/// I/O errors.
pub fn store(dir: &Path, key: &CacheKey, kind: BootFileKind, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let to = path_of(dir, key, kind);
    // A name of this fill alone: two fills of one file at once (a boot storm's first
    // requests) each write their own and rename it whole; the last rename wins with the
    // same bytes. (One name per process let the second truncate the first's file and then
    // find it renamed away: a 404 for a kernel that was there.)
    static FILLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let fill = FILLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".tmp-{}-{fill}-{}",
        std::process::id(),
        to.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let mut f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &to)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let suffix = format!("-{}", kind.as_str());
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = name.starts_with(&key.prefix) && name.ends_with(&suffix) && entry.path() != to;
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[tokio::test]
    async fn a_changed_version_file_gets_a_new_entry_and_the_old_one_goes() {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("g.vhdx");
        std::fs::write(&image, b"one").unwrap();
        let dir = t.path().join("boot-cache");
        let o = BootOverrides::default();
        let k1 = key_of(&image, 1, 2, &o).await.unwrap();
        store(&dir, &k1, BootFileKind::Kernel, b"k1").unwrap();
        std::fs::write(&image, b"longer").unwrap();
        let k2 = key_of(&image, 1, 2, &o).await.unwrap();
        assert_ne!(k1, k2);
        store(&dir, &k2, BootFileKind::Kernel, b"k2").unwrap();
        assert!(!path_of(&dir, &k1, BootFileKind::Kernel).exists());
        let p = path_of(&dir, &k2, BootFileKind::Kernel);
        assert_eq!(std::fs::read(&p).unwrap(), b"k2");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(&dir), 0o700);
        let other = BootOverrides {
            kernel: Some("/boot/vmlinuz-x".into()),
            initrd: None,
        };
        assert_ne!(key_of(&image, 1, 2, &other).await.unwrap(), k2);
    }

    /// A boot storm's first requests fill one file at once: every fill succeeds and the
    /// file is whole (one temporary name per process let one fill truncate the other's
    /// file and then find it renamed away).
    #[tokio::test]
    async fn fills_of_one_file_at_once_all_succeed() {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("g.vhdx");
        std::fs::write(&image, b"one").unwrap();
        let dir = t.path().join("boot-cache");
        let k = key_of(&image, 1, 0, &BootOverrides::default())
            .await
            .unwrap();
        let bytes = vec![7u8; 4 << 20];
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..8 {
                        store(&dir, &k, BootFileKind::Kernel, &bytes).unwrap();
                    }
                });
            }
        });
        let p = path_of(&dir, &k, BootFileKind::Kernel);
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "temporary files left: {left:?}");
    }
}
