//! The farm's secrets, kept in files and never in the database: the farm (master) key and
//! the certificate authority, in `DATA/secrets/` (0700, every file 0600).
//!
//! ```text
//! DATA/secrets/farm.key        the farm key, hex: enrols devices, derives device keys
//! DATA/secrets/ca-key.pem      the CA's private key
//! DATA/secrets/ca-cert.pem     the CA's certificate (every client and server trusts it)
//! DATA/secrets/servers/NAME/   a server's certificate, key and CA (pki::CertDir layout)
//! ```
//!
//! The database keeps only the farm key's fingerprint (SHA-256, hex), so that a farm opened
//! with another farm's secrets directory says so instead of refusing every login. A farm
//! made before the secrets left the database (its key in the `farm` row) is moved here when
//! it is opened (`Farm::open`). With PostgreSQL and several servers, every host needs a
//! copy of the same directory (docs/farm.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pki::{Authority, CertDir, Issued};
use serde::{Deserialize, Serialize};

use crate::error::{FarmError, Kind, Result};

/// The secrets directory under the data directory.
pub const SECRETS_DIR: &str = "secrets";
/// The farm key's file in the secrets directory.
pub const FARM_KEY_FILE: &str = "farm.key";
/// The CA key's file in the secrets directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The CA certificate's file in the secrets directory.
pub const CA_CERT_FILE: &str = pki::CA_CERT;
/// The directory of the servers' certificate directories.
pub const SERVERS_DIR: &str = "servers";
/// The file beside a server's certificate saying what it was issued for.
const SERVER_META_FILE: &str = "issued.json";
/// A cached server certificate is issued again when it has less than this left.
pub const SERVER_CERT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Bytes of the farm key text read (64 hex digits and a newline; more is not a key).
const FARM_KEY_TEXT_BYTES_MAX: u64 = 1024;

/// The secrets directory of a farm.
#[derive(Debug, Clone)]
pub struct Secrets {
    dir: PathBuf,
}

/// What a server certificate in the cache was issued for.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct ServerMeta {
    hosts: Vec<String>,
    not_after_unix: i64,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> FarmError {
    move |e| FarmError::new(Kind::Secrets, format!("{what}: {e}"))
}

fn pki_err(what: &'static str) -> impl FnOnce(pki::PkiError) -> FarmError {
    move |e| FarmError::new(Kind::Secrets, format!("{what}: {e}"))
}

/// The SHA-256 of the farm key's bytes, hex: what the database keeps of it.
pub fn fingerprint(key: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(key))
}

/// `t` as Unix seconds (0 before the epoch).
pub(crate) fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .unwrap_or(0)
}

impl Secrets {
    /// The secrets directory of the data directory `data_dir`.
    pub fn of_data_dir(data_dir: &Path) -> Secrets {
        Secrets {
            dir: data_dir.join(SECRETS_DIR),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The path of the farm key's file.
    pub fn farm_key_path(&self) -> PathBuf {
        self.dir.join(FARM_KEY_FILE)
    }

    /// The directory, made 0700 when missing.
    fn cert_dir(&self) -> Result<CertDir> {
        CertDir::create(&self.dir).map_err(io(format!("create {}", self.dir.display())))
    }

    /// Writes the farm key (hex) and a new CA named after the farm.
    pub(crate) fn create(&self, farm_name: &str, key: &[u8], now: SystemTime) -> Result<()> {
        let d = self.cert_dir()?;
        let ca = Authority::create(farm_name, now).map_err(pki_err("create the farm's CA"))?;
        d.write(FARM_KEY_FILE, &format!("{}\n", hex::encode(key)))
            .map_err(io(format!("write {}", self.farm_key_path().display())))?;
        self.write_ca(&ca)
    }

    fn write_ca(&self, ca: &Authority) -> Result<()> {
        let d = self.cert_dir()?;
        d.write(CA_KEY_FILE, ca.key_pem())
            .map_err(io(format!("write {}", d.file(CA_KEY_FILE).display())))?;
        d.write(CA_CERT_FILE, ca.cert_pem())
            .map_err(io(format!("write {}", d.file(CA_CERT_FILE).display())))
    }

    /// Writes the farm key (hex) moved out of an old database.
    pub(crate) fn write_farm_key(&self, key_hex: &str) -> Result<()> {
        self.cert_dir()?
            .write(FARM_KEY_FILE, &format!("{}\n", key_hex.trim()))
            .map_err(io(format!("write {}", self.farm_key_path().display())))
    }

    /// Makes a CA when the directory has none (a farm moved out of an old database).
    pub(crate) fn ensure_ca(&self, farm_name: &str, now: SystemTime) -> Result<()> {
        if self.dir.join(CA_KEY_FILE).exists() {
            return Ok(());
        }
        let ca = Authority::create(farm_name, now).map_err(pki_err("create the farm's CA"))?;
        self.write_ca(&ca)
    }

    /// The farm key's bytes, or `None` when its file is missing.
    ///
    /// # Errors
    /// The file cannot be read or is not hex.
    pub fn farm_key_if_present(&self) -> Result<Option<Vec<u8>>> {
        use std::io::Read as _;
        let p = self.farm_key_path();
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("read {}", p.display()))(e)),
        };
        let mut text = String::new();
        f.take(FARM_KEY_TEXT_BYTES_MAX)
            .read_to_string(&mut text)
            .map_err(io(format!("read {}", p.display())))?;
        let key = hex::decode(text.trim()).map_err(|_| {
            FarmError::new(
                Kind::Secrets,
                format!("{} does not hold a hex farm key", p.display()),
            )
        })?;
        if key.is_empty() {
            return Err(FarmError::new(
                Kind::Secrets,
                format!("{} is empty", p.display()),
            ));
        }
        Ok(Some(key))
    }

    /// The farm key's bytes.
    ///
    /// # Errors
    /// [`Kind::Secrets`] naming the file when it is missing or unreadable.
    pub fn farm_key(&self) -> Result<Vec<u8>> {
        self.farm_key_if_present()?.ok_or_else(|| {
            FarmError::new(
                Kind::Secrets,
                format!(
                    "the farm key {} is missing: copy the secrets directory from the host \
                     that ran `ferry farm init` (docs/farm.md)",
                    self.farm_key_path().display()
                ),
            )
        })
    }

    /// The CA, or `None` when the directory holds none.
    ///
    /// # Errors
    /// The files cannot be read or do not parse.
    pub fn authority_if_present(&self) -> Result<Option<Authority>> {
        let (cert, key) = (self.dir.join(CA_CERT_FILE), self.dir.join(CA_KEY_FILE));
        if !key.exists() {
            return Ok(None);
        }
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(io(format!("read {}", p.display())));
        let ca =
            Authority::load(&read(&cert)?, &read(&key)?).map_err(pki_err("load the farm's CA"))?;
        Ok(Some(ca))
    }

    /// A server certificate for `name` and `hosts`, from the cache in
    /// `servers/NAME/` when it is there, names the same hosts, chains to the current CA and
    /// has more than [`SERVER_CERT_RENEW_BEFORE`] left; else issued now and cached.
    /// Returns the CA certificate (PEM), the certificate and whether it was issued now.
    pub(crate) fn server_cert(
        &self,
        ca: &Authority,
        name: &str,
        hosts: &[String],
        now: SystemTime,
    ) -> Result<(Issued, bool)> {
        pki::Identity::server(name).map_err(|e| FarmError::invalid(e.to_string()))?;
        self.cert_dir()?;
        let servers = CertDir::create(&self.dir.join(SERVERS_DIR)).map_err(io(format!(
            "create {}",
            self.dir.join(SERVERS_DIR).display()
        )))?;
        let d = CertDir::create(&servers.file(name))
            .map_err(io(format!("create {}", servers.file(name).display())))?;
        let mut sorted = hosts.to_vec();
        sorted.sort();
        sorted.dedup();
        let cached = (|| {
            let meta: ServerMeta = serde_json::from_str(&d.read(SERVER_META_FILE).ok()?).ok()?;
            let cert_pem = d.read(pki::SERVER_CERT).ok()?;
            let key_pem = d.read(pki::SERVER_KEY).ok()?;
            let same_ca = d.read(pki::CA_CERT).ok()? == ca.cert_pem();
            let renew_at = meta.not_after_unix - SERVER_CERT_RENEW_BEFORE.as_secs() as i64;
            (same_ca && meta.hosts == sorted && unix_secs(now) < renew_at).then_some(Issued {
                cert_pem,
                key_pem,
                not_after_unix: meta.not_after_unix,
            })
        })();
        if let Some(issued) = cached {
            return Ok((issued, false));
        }
        let issued = ca
            .issue_server(name, &sorted, now)
            .map_err(|e| FarmError::invalid(format!("server certificate for {name}: {e}")))?;
        let meta = ServerMeta {
            hosts: sorted,
            not_after_unix: issued.not_after_unix,
        };
        let write = |file: &str, text: &str| {
            d.write(file, text)
                .map_err(io(format!("write {}", d.file(file).display())))
        };
        write(pki::SERVER_KEY, &issued.key_pem)?;
        write(pki::SERVER_CERT, &issued.cert_pem)?;
        write(pki::CA_CERT, ca.cert_pem())?;
        let meta = serde_json::to_string(&meta)
            .map_err(|e| FarmError::new(Kind::Secrets, format!("server certificate meta: {e}")))?;
        write(SERVER_META_FILE, &meta)?;
        Ok((issued, true))
    }
}
