//! The lock a change of a vDisk's chain holds for its whole run, file work included (issue
//! 20): this process's mutex, then the farm's own lock, so that two API processes of one
//! farm never race on a chain.
//!
//! * PostgreSQL: `pg_advisory_xact_lock` in a transaction on a connection of its own, held
//!   until the guard drops (the transaction then rolls back and the lock goes with it).
//!   The process's mutex is taken first, so a process waits on the database with at most
//!   one connection per vDisk.
//! * SQLite (a farm on one host): an exclusive `flock` on `DATA/locks/vdisk-ID.lock`
//!   (0700 directory, 0600 file), taken off the reactor. The farm's one connection is not
//!   held meanwhile, so the API and heartbeats go on.
//!
//! Logins take only the process's mutex: a storm of logins must not queue on the
//! database.

use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use sqlx::{Any, Transaction};

use crate::db::{Backend, Farm};
use crate::error::{FarmError, Result};

/// The namespace of Ferry's advisory lock keys ("FERR" in the high half), so that other
/// users of the same PostgreSQL database do not collide with a vDisk's lock.
pub const ADVISORY_KEY_BASE: i64 = 0x4645_5252_0000_0000;
/// The directory of the SQLite farm's lock files, in its data directory.
pub const LOCK_DIR: &str = "locks";

/// Held while a vDisk's chain changes.
#[derive(Debug)]
pub(crate) struct VdiskGuard {
    _local: tokio::sync::OwnedMutexGuard<()>,
    _farm: FarmLock,
}

/// What holds the farm's lock; it is released by being dropped, never read.
#[derive(Debug)]
enum FarmLock {
    /// The transaction of the advisory lock (rolled back when dropped).
    Postgres { _tx: Transaction<'static, Any> },
    /// The locked file (the lock goes when it closes).
    File { _file: std::fs::File },
}

/// Opens (creating) and locks the lock file of `vdisk_id` under `dir`, waiting for it.
fn lock_file(dir: &Path, vdisk_id: i64) -> std::io::Result<std::fs::File> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(format!("vdisk-{vdisk_id}.lock")))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
    Ok(f)
}

impl Farm {
    /// Takes the lock of a change of `vdisk_id`'s chain (see the module docs).
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::InvalidInput`] when the lock file cannot be made.
    pub(crate) async fn lock_vdisk(&self, vdisk_id: i64) -> Result<VdiskGuard> {
        let local = self.vdisk_lock(vdisk_id).lock_owned().await;
        let farm = match self.backend() {
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(ADVISORY_KEY_BASE.wrapping_add(vdisk_id))
                    .execute(&mut *tx)
                    .await?;
                FarmLock::Postgres { _tx: tx }
            }
            Backend::Sqlite => {
                let dir: PathBuf = self.data_dir().join(LOCK_DIR);
                let f = tokio::task::spawn_blocking(move || {
                    lock_file(&dir, vdisk_id).map_err(|e| {
                        FarmError::invalid(format!(
                            "lock vdisk {vdisk_id} in {}: {e}",
                            dir.display()
                        ))
                    })
                })
                .await
                .map_err(|e| FarmError::invalid(format!("lock vdisk {vdisk_id}: {e}")))??;
                FarmLock::File { _file: f }
            }
        };
        Ok(VdiskGuard {
            _local: local,
            _farm: farm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_the_same_vdisk_waits_for_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(LOCK_DIR);
        let first = lock_file(&dir, 7).unwrap();
        let other = lock_file(&dir, 8).unwrap();
        let again = std::fs::File::open(dir.join("vdisk-7.lock")).unwrap();
        let busy = rustix::fs::flock(&again, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        assert!(busy.is_err(), "a second lock of vdisk 7 must wait");
        drop(first);
        rustix::fs::flock(&again, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .expect("free once the first is dropped");
        drop(other);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("vdisk-7.lock")), 0o600);
    }
}
