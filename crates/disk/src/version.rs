//! Creating a new differencing version of an image (`ferry vdisk version new`).

use std::path::{Path, PathBuf};

use crate::open::{self, Format, Image, OpenOptions};
use crate::vhdx::{CreateOptions, ParentSpec, create};
use crate::{Error, ErrorKind, Result};

/// Creates `child` (a new, empty differencing VHDX) whose parent is `parent` (a VHDX).
/// The child gets the parent's geometry and links to its current DataWriteGuid.
///
/// # Errors
/// `InvalidArgument` when the parent is not VHDX or the child exists; open errors of the
/// parent chain; I/O errors.
pub fn new_version(parent: &Path, child: &Path) -> Result<()> {
    let chain = open::open(parent, OpenOptions::default())?;
    let Image::Vhdx(p) = &chain.layers[0].image else {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: a version's parent must be vhdx; convert it first",
                parent.display()
            ),
        ));
    };
    if child.exists() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{} already exists", child.display()),
        ));
    }
    if Format::from_extension(child) != Some(Format::Vhdx) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: a version must be named .avhdx or .vhdx",
                child.display()
            ),
        ));
    }
    let meta = p.metadata();
    let spec = ParentSpec {
        linkage: p.header().data_write_guid,
        relative_path: relative_path(child, parent),
        absolute_path: absolute(parent).display().to_string(),
    };
    let opts = CreateOptions {
        size: meta.virtual_size,
        block_size: meta.block_size,
        logical_sector_size: meta.logical_sector_size,
        physical_sector_size: meta.physical_sector_size,
        parent: Some(spec),
        ..CreateOptions::default()
    };
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(child)
        .map_err(|e| Error::io(format!("create {}", child.display()), e))?;
    let storage: std::sync::Arc<dyn crate::Storage> =
        std::sync::Arc::new(crate::FileStorage::new(f));
    create(&storage, &opts)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The path of `target` relative to the directory of `from` (both made absolute),
/// in the `.\name` / `..\dir\name` style Windows writes.
pub fn relative_path(from: &Path, target: &Path) -> String {
    let from_dir = absolute(
        from.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    );
    let target = absolute(target);
    let a: Vec<_> = from_dir.components().collect();
    let b: Vec<_> = target.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = Vec::new();
    if common == a.len() {
        parts.push(".".into());
    }
    parts.extend(std::iter::repeat_n("..".to_string(), a.len() - common));
    parts.extend(
        b[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("\\")
}
