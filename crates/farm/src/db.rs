//! The farm handle: one connection pool (SQLite or PostgreSQL through sqlx's `Any` driver),
//! the migrations of each backend, the clock, and the farm's initialization.
//!
//! Both backends run the same SQL text: every query uses `$N` placeholders, which SQLite
//! accepts too, and only types both map the same way (BIGINT/INTEGER as `i64`, TEXT,
//! INTEGER as 0 or 1). The schemas differ only in dialect, so each backend has its own migration set
//! (`migrations/sqlite`, `migrations/postgres`) with the same tables and columns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rand::RngCore as _;
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{Any, AnyPool, Transaction};

use crate::error::{FarmError, Kind, Result};
use crate::model::Role;
use crate::secrets::{Secrets, fingerprint};
use crate::sessions::SessionTable;

/// The file name of the embedded SQLite database in the data directory.
pub const SQLITE_FILE_NAME: &str = "farm.db";
/// The directory under the data directory that is the default store root.
pub const STORE_ROOT_DIR: &str = "stores";
/// Connections of a PostgreSQL pool.
pub const PG_CONNECTIONS_MAX: u32 = 8;
/// Bytes of the farm key (it identifies the secrets directory; since issue 30 it proves no
/// device login and no device key is derived from it).
pub const FARM_KEY_BYTES: usize = 32;
/// Bytes of an API token's secret.
pub const TOKEN_BYTES: usize = 32;
/// The prefix of API tokens, so that a leaked one is recognizable.
pub const TOKEN_PREFIX: &str = "fy_";

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static PG_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A source of time, injectable for tests.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told: simulated time for tests and simulations (the farm's
/// expiries and heartbeats, and the farm-member runtime's timers, read it).
///
/// Clones share one time, so a test keeps a clone and advances the clock the farm reads.
#[derive(Debug, Clone, Default)]
pub struct SimClock {
    now_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl SimClock {
    /// A clock at `now_ms` (Unix milliseconds).
    pub fn new(now_ms: i64) -> SimClock {
        SimClock {
            now_ms: Arc::new(std::sync::atomic::AtomicI64::new(now_ms)),
        }
    }

    /// Moves the clock `by` forward; returns the new now.
    pub fn advance(&self, by: std::time::Duration) -> i64 {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms
            .fetch_add(ms, std::sync::atomic::Ordering::SeqCst)
            .saturating_add(ms)
    }

    /// Sets the clock to `now_ms`, which must not be earlier than now (time never goes back).
    ///
    /// # Panics
    /// When `now_ms` is earlier than the clock's now: a bug of the simulation.
    pub fn set(&self, now_ms: i64) {
        let was = self
            .now_ms
            .swap(now_ms, std::sync::atomic::Ordering::SeqCst);
        assert!(
            now_ms >= was,
            "simulated time went back from {was} to {now_ms} ms"
        );
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// How long a call waits for a database connection before it says the database cannot be
/// reached (`Kind::Unavailable`; see `offline`).
pub const DB_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Which database holds the farm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// How to open a farm.
#[derive(Debug, Clone)]
pub struct FarmConfig {
    /// The data directory: the SQLite file and the default store root live here.
    pub data_dir: PathBuf,
    /// `postgres://...` for PostgreSQL; `None` for SQLite in the data directory.
    pub db_url: Option<String>,
    /// The root under which every store path lies (default: `DATA/stores`).
    pub store_root: Option<PathBuf>,
}

/// What [`Farm::init`] made: shown once. The database keeps the token's hash and the key's
/// fingerprint; the key itself is in the secrets directory ([`crate::secrets`]).
#[derive(Debug, Clone)]
pub struct InitSecrets {
    /// The first admin token.
    pub admin_token: String,
    /// The farm key (hex). It logs no device in (devices have keys of their own).
    pub farm_key_hex: String,
    /// The file holding the farm key (`DATA/secrets/farm.key`).
    pub farm_key_file: PathBuf,
}

/// A site's servers with the live sessions each carries (`balance`'s order cache).
pub(crate) type Counted = Vec<(crate::model::Server, i64)>;

/// The farm: the typed data-access API over the database, the lifecycle of versions over
/// the store files, and device login. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Farm {
    pub(crate) pool: AnyPool,
    backend: Backend,
    data_dir: PathBuf,
    store_root: PathBuf,
    secrets: Secrets,
    pub(crate) clock: Arc<dyn Clock>,
    /// One lock per vDisk, held by lifecycle operations for their whole run (file work
    /// included), so two of them never race on one chain within this process.
    pub(crate) vdisk_locks: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
    /// Sessions granted by this process, for the NBD server's export check.
    pub(crate) sessions: Arc<SessionTable>,
    /// Each site's servers with their session counts as status reports are told them, with
    /// when they were counted
    /// (`balance::Farm::device_servers`).
    pub(crate) order_cache: Mutex<HashMap<i64, (i64, Counted)>>,
    /// Uploads versions of bucket stores (`publish`), when this process may.
    pub(crate) publisher: Mutex<Option<Arc<dyn crate::publisher::Publisher>>>,
    /// The login nonce table's bounds (`login::LoginLimits`; settable for tests).
    pub(crate) login_limits: Mutex<LoginLimits>,
    /// The database's state, the snapshot and what waits for the database (`offline`).
    pub(crate) offline: crate::offline_state::Offline,
}

impl Farm {
    /// Opens (creating on first use) the farm database and runs its migrations.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a URL that is neither SQLite nor PostgreSQL;
    /// [`crate::Kind::Database`].
    pub async fn open(config: &FarmConfig) -> Result<Farm> {
        Farm::open_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`Farm::open`] with an injected clock.
    ///
    /// # Errors
    /// As [`Farm::open`].
    pub async fn open_with_clock(config: &FarmConfig, clock: Arc<dyn Clock>) -> Result<Farm> {
        install_default_drivers();
        crate::private::data_dir(&config.data_dir)?;
        let store_root = config
            .store_root
            .clone()
            .unwrap_or_else(|| config.data_dir.join(STORE_ROOT_DIR));
        std::fs::create_dir_all(&store_root).map_err(|e| {
            FarmError::invalid(format!("create store root {}: {e}", store_root.display()))
        })?;
        let store_root = store_root.canonicalize().unwrap_or(store_root);
        let (url, backend) = match &config.db_url {
            None => {
                let file = config.data_dir.join(SQLITE_FILE_NAME);
                crate::private::db_files(&file)?;
                (
                    format!("sqlite://{}?mode=rwc", file.display()),
                    Backend::Sqlite,
                )
            }
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                (u.clone(), Backend::Postgres)
            }
            Some(u) if u.starts_with("sqlite:") => (u.clone(), Backend::Sqlite),
            Some(_) => {
                return Err(FarmError::invalid(
                    "database url must start with postgres:// or sqlite:",
                ));
            }
        };
        // SQLite: one connection, so that transactions never meet a lock upgrade conflict;
        // an embedded farm is small.
        let connections = match backend {
            Backend::Sqlite => 1,
            Backend::Postgres => PG_CONNECTIONS_MAX,
        };
        let pool = AnyPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(DB_WAIT)
            .connect(&url)
            .await?;
        match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&pool).await?,
            Backend::Postgres => PG_MIGRATIONS.run(&pool).await?,
        }
        if config.db_url.is_none() {
            // The companions SQLite made since (its WAL), should a umask have loosened them.
            crate::private::db_files(&config.data_dir.join(SQLITE_FILE_NAME))?;
        }
        let farm = Farm {
            pool,
            backend,
            data_dir: config.data_dir.clone(),
            store_root,
            secrets: Secrets::of_data_dir(&config.data_dir),
            clock,
            vdisk_locks: Mutex::new(HashMap::new()),
            sessions: Arc::new(SessionTable::new()),
            order_cache: Mutex::new(HashMap::new()),
            publisher: Mutex::new(None),
            login_limits: Mutex::new(LoginLimits::default()),
            offline: crate::offline_state::Offline::default(),
        };
        farm.move_key_out_of_the_database().await?;
        Ok(farm)
    }

    /// Moves the farm key of a farm made before the secrets left the database into the
    /// secrets directory (with a new CA), leaving the key's fingerprint in its place; and
    /// checks that the secrets directory, when it holds a key, holds this farm's.
    async fn move_key_out_of_the_database(&self) -> Result<()> {
        let row: Option<(String, String, String)> =
            sqlx::query_as("SELECT name, farm_key, key_fingerprint FROM farm WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?;
        let Some((name, key_hex, mut stored)) = row else {
            return Ok(());
        };
        if !key_hex.is_empty() {
            let key = hex::decode(key_hex.trim())
                .map_err(|_| FarmError::new(Kind::Secrets, "the database's farm key is not hex"))?;
            if let Some(on_disk) = self.secrets.farm_key_if_present()?
                && on_disk != key
            {
                {
                    return Err(FarmError::new(
                        Kind::Secrets,
                        format!(
                            "{} holds another farm's key than this database",
                            self.secrets.farm_key_path().display()
                        ),
                    ));
                }
            }
            self.secrets.write_farm_key(&key_hex)?;
            self.secrets.ensure_ca(&name, self.system_now())?;
            stored = fingerprint(&key);
            if self.backend == Backend::Sqlite {
                // Overwrite the old row's bytes rather than leave them in free space.
                sqlx::query("PRAGMA secure_delete = ON")
                    .execute(&self.pool)
                    .await?;
            }
            sqlx::query("UPDATE farm SET farm_key = '', key_fingerprint = $1 WHERE id = 1")
                .bind(&stored)
                .execute(&self.pool)
                .await?;
            if self.backend == Backend::Sqlite {
                sqlx::query("VACUUM").execute(&self.pool).await?;
            }
            tracing::info!(file = %self.secrets.farm_key_path().display(),
                "moved the farm key out of the database into the secrets directory");
        }
        if let Some(on_disk) = self.secrets.farm_key_if_present()?
            && fingerprint(&on_disk) != stored
        {
            {
                return Err(FarmError::new(
                    Kind::Secrets,
                    format!(
                        "{} holds another farm's key than this database (fingerprints differ)",
                        self.secrets.farm_key_path().display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Now, by the farm's clock, as a [`std::time::SystemTime`] (for certificates).
    pub(crate) fn system_now(&self) -> std::time::SystemTime {
        let ms = u64::try_from(self.now_ms()).unwrap_or(0);
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
    }

    /// The farm's secrets directory.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The farm key's bytes, from the secrets directory.
    ///
    /// # Errors
    /// [`Kind::Secrets`] when its file is missing or unreadable.
    pub fn farm_key(&self) -> Result<Vec<u8>> {
        self.secrets.farm_key()
    }

    /// The farm's certificate authority, from the secrets directory.
    ///
    /// # Errors
    /// [`Kind::Secrets`] when the directory holds no CA or it does not load.
    pub fn authority(&self) -> Result<pki::Authority> {
        self.secrets.authority_if_present()?.ok_or_else(|| {
            FarmError::new(
                Kind::Secrets,
                format!(
                    "no CA in {}: copy the secrets directory from the host that ran                      `ferry farm init` (docs/farm.md)",
                    self.secrets.path().display()
                ),
            )
        })
    }

    /// The TLS identity of the farm's server `server_name`, reachable at `hosts` (host names
    /// or IP addresses): the CA certificate (PEM) and a server certificate, cached in
    /// `DATA/secrets/servers/NAME/` and issued again when missing, near its end
    /// ([`crate::secrets::SERVER_CERT_RENEW_BEFORE`]), for other hosts, or from another CA.
    ///
    /// # Errors
    /// [`Kind::Secrets`] (no CA, files); [`Kind::InvalidInput`] for a bad name or host.
    pub fn server_tls(&self, server_name: &str, hosts: &[String]) -> Result<(String, pki::Issued)> {
        let ca = self.authority()?;
        let (issued, new) = self
            .secrets
            .server_cert(&ca, server_name, hosts, self.system_now())?;
        if new {
            tracing::info!(server = server_name, hosts = %hosts.join(","),
                not_after_unix = issued.not_after_unix, "issued a server certificate");
        }
        Ok((ca.cert_pem().to_string(), issued))
    }

    /// The data directory (the SQLite file, the secrets, lock files).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The store root (absolute).
    pub fn store_root(&self) -> &Path {
        &self.store_root
    }

    /// The sessions granted by this process (see [`SessionTable`]).
    pub fn session_table(&self) -> Arc<SessionTable> {
        Arc::clone(&self.sessions)
    }

    /// Now, by the farm's clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// True when [`Farm::init`] has run.
    ///
    /// # Errors
    /// [`crate::Kind::Database`].
    pub async fn is_initialized(&self) -> Result<bool> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM farm")
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }

    /// Initializes a new farm: its settings, a random farm key and a new CA in the secrets
    /// directory (`DATA/secrets/`, see [`crate::secrets`]; the database keeps the key's
    /// fingerprint), and a first admin token named `admin`.
    ///
    /// # Errors
    /// [`crate::Kind::Conflict`] when the farm is already initialized; [`Kind::Secrets`]
    /// when the secrets cannot be written.
    pub async fn init(&self, name: &str) -> Result<InitSecrets> {
        crate::validate::name("name", name)?;
        let mut key = [0u8; FARM_KEY_BYTES];
        rand::thread_rng().fill_bytes(&mut key);
        let farm_key_hex = hex::encode(key);
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM farm")
            .fetch_one(&mut *tx)
            .await?;
        if exists > 0 {
            return Err(FarmError::conflict("the farm is already initialized"));
        }
        // Only now, with no farm in the database: the files of an earlier one are replaced.
        self.secrets.create(name, &key, self.system_now())?;
        sqlx::query(
            "INSERT INTO farm (id, name, farm_key, key_fingerprint, auto_merge_chain_max, \
             created_at_ms) VALUES (1, $1, '', $2, 0, $3)",
        )
        .bind(name)
        .bind(fingerprint(&key))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let (admin_token, _) = self
            .insert_token(&mut tx, "admin", Role::Admin, "init")
            .await?;
        audit(
            &mut tx,
            now,
            "init",
            "farm.init",
            "farm",
            "1",
            &serde_json::json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(InitSecrets {
            admin_token,
            farm_key_hex,
            farm_key_file: self.secrets.farm_key_path(),
        })
    }

    /// The lock of one vDisk's lifecycle (see the field's comment).
    pub(crate) fn vdisk_lock(&self, vdisk_id: i64) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .vdisk_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(vdisk_id).or_default())
    }

    /// Makes a new token secret and inserts its hash.
    pub(crate) async fn insert_token(
        &self,
        tx: &mut Transaction<'_, Any>,
        name: &str,
        role: Role,
        actor: &str,
    ) -> Result<(String, i64)> {
        crate::validate::name("name", name)?;
        let mut secret = [0u8; TOKEN_BYTES];
        rand::thread_rng().fill_bytes(&mut secret);
        let token = format!("{TOKEN_PREFIX}{}", hex::encode(secret));
        let now = self.now_ms();
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO api_tokens (name, role, token_hash, created_at_ms) \
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(name)
        .bind(role.as_str())
        .bind(hash_secret(&token))
        .bind(now)
        .fetch_one(&mut **tx)
        .await?;
        audit(
            tx,
            now,
            actor,
            "token.create",
            "token",
            &id.to_string(),
            &serde_json::json!({ "name": name, "role": role }),
        )
        .await?;
        Ok((token, id))
    }
}

/// The most outstanding nonces (the default of [`LoginLimits::nonces_max`]).
pub const NONCES_MAX: i64 = 10_000;
/// The most outstanding nonces of one client address (the default of
/// [`LoginLimits::nonces_per_address`]): a device needs one for the moment between its
/// challenge and its login, so this many machines behind one address (a NAT, a hypervisor
/// host) log in at the same instant; a busy one gets 429 and tries again.
pub const NONCES_PER_ADDRESS_MAX: i64 = 64;
/// The bounds of the login nonce table (`crate::login`'s design notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    /// The most outstanding nonces in all.
    pub nonces_max: i64,
    /// The most outstanding nonces of one client address.
    pub nonces_per_address: i64,
}

impl Default for LoginLimits {
    fn default() -> LoginLimits {
        LoginLimits {
            nonces_max: NONCES_MAX,
            nonces_per_address: NONCES_PER_ADDRESS_MAX,
        }
    }
}

/// `N` random bytes (the thread's CSPRNG).
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

/// The SHA-256 of a secret (token), hex: what the database keeps.
pub fn hash_secret(secret: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// Appends one entry to the audit log, inside the change's transaction.
pub(crate) async fn audit(
    tx: &mut Transaction<'_, Any>,
    at_ms: i64,
    actor: &str,
    action: &str,
    object_type: &str,
    object_id: &str,
    detail: &serde_json::Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (at_ms, actor, action, object_type, object_id, detail) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(at_ms)
    .bind(actor)
    .bind(action)
    .bind(object_type)
    .bind(object_id)
    .bind(detail.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
