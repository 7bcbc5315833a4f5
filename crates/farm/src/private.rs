//! Owner-only modes for the farm's data, whatever the umask: the data directory is 0700
//! and the SQLite database files (with their `-wal`, `-shm` and `-journal` companions) are
//! 0600, since they hold the farm's secrets (token hashes, live session export names).
//! Created with those modes, and tightened at open when an older farm left them looser
//! (each change is logged).

use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::error::{FarmError, Result};

/// The mode of the farm's data directory.
pub const DATA_DIR_MODE: u32 = 0o700;
/// The mode of the database files in it.
pub const DB_FILE_MODE: u32 = 0o600;
/// The suffixes of the files SQLite keeps beside its database.
const SQLITE_COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

fn io_error(what: &str, path: &Path, e: &std::io::Error) -> FarmError {
    FarmError::invalid(format!("{what} {}: {e}", path.display()))
}

/// Sets `path` to `mode` when it grants more than `mode` (group or other bits), logging it.
fn tighten(path: &Path, mode: u32) -> Result<()> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("read the mode of", path, &e)),
    };
    let old = meta.permissions().mode() & 0o7777;
    if old & !mode == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("set the mode of", path, &e))?;
    tracing::warn!(
        path = %path.display(),
        old = format!("{old:o}"),
        new = format!("{mode:o}"),
        "tightened the mode of farm data: it held secrets readable by other users"
    );
    Ok(())
}

/// Makes the data directory (and missing parents) with [`DATA_DIR_MODE`], or tightens the
/// existing one.
///
/// # Errors
/// [`crate::Kind::InvalidInput`] naming the directory when it cannot be made or changed.
pub(crate) fn data_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(dir)
        .map_err(|e| io_error("create data directory", dir, &e))?;
    tighten(dir, DATA_DIR_MODE)
}

/// Creates the SQLite file `file` empty with [`DB_FILE_MODE`] when it is missing (SQLite
/// gives its companions the database's mode), and tightens it and its companions.
///
/// # Errors
/// [`crate::Kind::InvalidInput`] naming the file.
pub(crate) fn db_files(file: &Path) -> Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(DB_FILE_MODE)
        .open(file)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error("create database file", file, &e)),
    }
    tighten(file, DB_FILE_MODE)?;
    for suffix in SQLITE_COMPANIONS {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        tighten(&PathBuf::from(name), DB_FILE_MODE)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn loose_modes_are_tightened_and_new_files_are_private() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        data_dir(&data).unwrap();
        assert_eq!(mode(&data), 0o700);
        let db = data.join("farm.db");
        db_files(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        let wal = data.join("farm.db-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o664)).unwrap();
        db_files(&db).unwrap();
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
    }
}
