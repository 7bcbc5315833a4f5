//! The store-root rule: every store lives under the farm's store root, and every file the
//! farm reads or writes through a store lies inside that store's directory. Symlinks are
//! resolved before a path is trusted, so a link (made before or after the check) never
//! leads the farm out of the root.
//!
//! ```text
//!   new store path ── longest existing ancestor canonical, under the root ── create ──
//!                     canonical again, under the root (else removed and refused)
//!   store dir use  ── canonical, under the root (checked on every resolution)
//!   import, merge, new version ── every layer of the chain canonical, inside the store dir
//! ```

use std::path::{Path, PathBuf};

use crate::error::{FarmError, Kind, Result};

/// True when `path`, with symlinks resolved, lies under `root` (canonical, or missing). A
/// path that does not exist yet is judged by its longest existing ancestor: the missing
/// rest is made only of normal components (the caller normalized it), so it cannot leave
/// that ancestor. A dangling symlink on the way is refused (creating through it would
/// make its target, wherever that is).
pub(crate) fn under(root: &Path, path: &Path) -> bool {
    let mut at = path;
    loop {
        if at == root {
            // The root itself (canonical when it exists; a missing one holds no link).
            return true;
        }
        match at.canonicalize() {
            Ok(real) => return real.starts_with(root),
            Err(_) if at.symlink_metadata().is_ok() => return false,
            Err(_) => match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => at = p,
                _ => return false,
            },
        }
    }
}

/// The canonical form of the existing directory `dir` of store `what`, refused with
/// [`Kind::Conflict`] when it left `root` (a store directory swapped for a symlink). A
/// missing directory is returned as given when its existing ancestors are under `root`.
pub(crate) fn store_dir(root: &Path, dir: &Path, what: &str) -> Result<PathBuf> {
    let left = || {
        FarmError::conflict(format!(
            "{what}: its directory {} leaves the store root {} (a symlink?); refusing to use it",
            dir.display(),
            root.display()
        ))
    };
    match dir.canonicalize() {
        Ok(real) if real.starts_with(root) => Ok(real),
        Ok(_) => Err(left()),
        Err(_) if under(root, dir) => Ok(dir.to_path_buf()),
        Err(_) => Err(left()),
    }
}

/// A layer of a chain that lies outside its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outside {
    /// The layer's path as the chain names it.
    pub path: PathBuf,
    /// Where it really is (symlinks resolved).
    pub real: PathBuf,
}

/// Opens the chain of `top` read-only and checks that every layer's canonical path lies
/// inside `dir` (canonical). Returns the first layer that does not, or `None`.
///
/// # Errors
/// The image library's errors opening the chain (a missing parent, a damaged layer).
pub(crate) fn chain_outside(dir: &Path, top: &Path) -> disk::Result<Option<Outside>> {
    let chain = disk::open::open(top, disk::open::OpenOptions::default())?;
    for layer in &chain.layers {
        let real = layer
            .path
            .canonicalize()
            .map_err(|e| disk::Error::io(format!("resolve {}", layer.path.display()), e))?;
        if !real.starts_with(dir) {
            return Ok(Some(Outside {
                path: layer.path.clone(),
                real,
            }));
        }
    }
    Ok(None)
}

/// Refuses a chain with a layer outside its store: `kind` is the caller's input at an
/// import ([`Kind::InvalidInput`]), the store's state at a merge or a new version
/// ([`Kind::Conflict`]); the message names the layer.
pub(crate) fn check_chain(
    found: Option<Outside>,
    kind: Kind,
    file: &str,
    dir: &Path,
) -> Result<()> {
    match found {
        None => Ok(()),
        Some(o) => Err(FarmError::new(
            kind,
            format!(
                "{file}: layer {} (really {}) of its chain lies outside the store {}; every \
                 layer must be inside the store",
                o.path.display(),
                o.real.display(),
                dir.display()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_path_is_judged_by_its_existing_ancestor() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let out = d.path().join("out");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let root = root.canonicalize().unwrap();
        std::os::unix::fs::symlink(&out, root.join("link")).unwrap();
        assert!(under(&root, &root.join("a/b/c")));
        assert!(!under(&root, &root.join("link/x/y")));
        assert!(!under(&root, &root.join("link")));
        std::os::unix::fs::symlink(d.path().join("nowhere"), root.join("dangling")).unwrap();
        assert!(!under(&root, &root.join("dangling/x")));
        assert!(store_dir(&root, &root.join("link"), "store 1").is_err());
        assert_eq!(
            store_dir(&root, &root.join("new"), "store 1").unwrap(),
            root.join("new")
        );
    }
}
