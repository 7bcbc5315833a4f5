//! The certificate directory the NBD tools read: qemu's `tls-creds-x509,dir=DIR`, libnbd's
//! `tls-certificates=DIR` and nbdkit's `--tls-certificates=DIR` all take these names.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The CA certificate.
pub const CA_CERT: &str = "ca-cert.pem";
/// A server's certificate.
pub const SERVER_CERT: &str = "server-cert.pem";
/// A server's key (0600).
pub const SERVER_KEY: &str = "server-key.pem";
/// A client's certificate.
pub const CLIENT_CERT: &str = "client-cert.pem";
/// A client's key (0600).
pub const CLIENT_KEY: &str = "client-key.pem";

/// A certificate directory (0700), its keys 0600.
#[derive(Debug, Clone)]
pub struct CertDir {
    dir: PathBuf,
}

impl CertDir {
    /// The directory at `dir`, made 0700 if missing (an existing one is tightened to 0700).
    ///
    /// # Errors
    /// The directory cannot be made or its mode set.
    pub fn create(dir: &Path) -> std::io::Result<CertDir> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        Ok(CertDir {
            dir: dir.to_path_buf(),
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The path of `name` in it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `name` (replacing it atomically) with mode 0600: every file, certificates
    /// included, since nothing else needs to read them.
    ///
    /// # Errors
    /// Writing failed.
    pub fn write(&self, name: &str, contents: &str) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(name))
    }

    /// Reads `name`.
    ///
    /// # Errors
    /// Reading failed (the error names the file).
    pub fn read(&self, name: &str) -> std::io::Result<String> {
        let p = self.dir.join(name);
        fs::read_to_string(&p)
            .map_err(|e| std::io::Error::new(e.kind(), format!("read {}: {e}", p.display())))
    }
}
