//! Device login, server side: a challenge (a one-time nonce) and a proof (an HMAC of the
//! nonce and the MAC under the farm key; the key never crosses the wire).
//!
//! ```text
//!   target                                   farm
//!   POST /login/challenge {mac}        ──►   nonce (random, one use, NONCE_TTL_MS)
//!   hmac = HMAC-SHA256(key, nonce ‖ mac)
//!   POST /login {mac, nonce, hmac}     ──►   check nonce + hmac (constant time)
//!                                            device by MAC (or auto-add), boot version,
//!                                            one maintenance device at a time
//!                                      ◄──   servers, vdisk, version, cache mode, sizes,
//!                                            export name, session token
//! ```
//!
//! `key` is the farm key's 32 bytes (hex-decoded); `nonce` is the nonce's hex text as sent
//! and `mac` the normalized MAC text (`aa:bb:cc:dd:ee:ff`), both as UTF-8 bytes; `hmac` is
//! sent as lowercase hex. [`proof`] computes it.

use hmac::{Hmac, Mac as _};
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Sha256;
use utoipa::ToSchema;

use crate::db::{Farm, audit, hash_secret};
use crate::error::{FarmError, Kind, Result};
use crate::model::{AccessMode, CacheMode, Device, DeviceType, OptCacheMode, Server};
use crate::repo::insert_device;
use crate::sessions::SessionGrant;
use crate::validate;

/// How long a nonce may be answered.
pub const NONCE_TTL_MS: i64 = 60_000;
/// The most outstanding nonces; past it a challenge is refused until some expire.
pub const NONCES_MAX: i64 = 10_000;
/// How long a session lives.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;
/// A server whose last heartbeat is older is listed as not alive.
pub const SERVER_ALIVE_MS: i64 = 60_000;
/// The prefix of a session's export name.
pub const EXPORT_PREFIX: &str = "ferry-s-";

/// A login challenge request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChallengeRequest {
    /// The device's MAC address.
    pub mac: String,
}

/// A login challenge.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Challenge {
    /// The nonce to sign (64 hex digits).
    pub nonce: String,
    /// When it expires.
    pub expires_at_ms: i64,
}

/// A login: the proof of the farm key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The device's MAC address.
    pub mac: String,
    /// The nonce of the challenge.
    pub nonce: String,
    /// HMAC-SHA256(farm key, nonce ‖ mac), hex.
    pub hmac: String,
}

/// A server of the device's site.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoginServer {
    /// Name.
    pub name: String,
    /// NBD address (`host:port`).
    pub address: String,
    /// True when it heartbeat within the last minute.
    pub alive: bool,
}

/// What a device gets at login.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoginGrant {
    /// The session's id.
    pub session_id: String,
    /// The session token (bearer), shown once.
    pub session_token: String,
    /// The session-scoped NBD export name.
    pub export_name: String,
    /// When the session ends.
    pub expires_at_ms: i64,
    /// The device (created now when its collection allows auto-add).
    pub device: Device,
    /// The servers of its site, alive ones first.
    pub servers: Vec<LoginServer>,
    /// The vDisk's id.
    pub vdisk_id: i64,
    /// The vDisk's name.
    pub vdisk_name: String,
    /// The vDisk's virtual size.
    pub size_bytes: i64,
    /// The version the device boots.
    pub version: i64,
    /// That version's access mode.
    pub access: AccessMode,
    /// Where the device's writes go.
    pub cache_mode: CacheMode,
    /// The RAM cache size.
    pub ram_bytes: i64,
    /// True in private mode (maintenance): the export writes to the version itself.
    pub writable: bool,
}

type HmacSha256 = Hmac<Sha256>;

/// The login proof: hex HMAC-SHA256(key, nonce ‖ mac) (see the module documentation).
///
/// # Errors
/// [`Kind::InvalidInput`] for a key that is not hex or a malformed MAC.
pub fn proof(farm_key_hex: &str, nonce: &str, mac: &str) -> Result<String> {
    let mac = validate::mac(mac)?;
    let mut m = keyed(farm_key_hex)?;
    m.update(nonce.as_bytes());
    m.update(mac.as_bytes());
    Ok(hex::encode(m.finalize().into_bytes()))
}

fn keyed(farm_key_hex: &str) -> Result<HmacSha256> {
    let key = hex::decode(farm_key_hex).map_err(|_| FarmError::invalid("farm key is not hex"))?;
    HmacSha256::new_from_slice(&key).map_err(|_| FarmError::invalid("bad farm key"))
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

fn unauthenticated() -> FarmError {
    FarmError::new(Kind::Unauthenticated, "login refused: bad or expired proof")
}

impl Farm {
    /// Issues a one-time nonce for `mac` (also for unknown MACs: the answer does not tell
    /// whether a device exists).
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for a malformed MAC; [`Kind::LimitReached`] past
    /// [`NONCES_MAX`].
    pub async fn challenge(&self, r: &ChallengeRequest) -> Result<Challenge> {
        let mac = validate::mac(&r.mac)?;
        self.purge_expired_sessions().await?;
        let outstanding: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM login_nonces")
            .fetch_one(&self.pool)
            .await?;
        if outstanding >= NONCES_MAX {
            return Err(FarmError::new(
                Kind::LimitReached,
                "too many logins under way; try again in a minute",
            ));
        }
        let nonce = random_hex(32);
        let expires_at_ms = self.now_ms() + NONCE_TTL_MS;
        sqlx::query("INSERT INTO login_nonces (nonce, mac, expires_at_ms) VALUES ($1, $2, $3)")
            .bind(&nonce)
            .bind(&mac)
            .bind(expires_at_ms)
            .execute(&self.pool)
            .await?;
        Ok(Challenge {
            nonce,
            expires_at_ms,
        })
    }

    /// Logs a device in (see the module documentation).
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for malformed fields; [`Kind::Unauthenticated`] for a bad,
    /// used or expired nonce or a wrong HMAC; [`Kind::Forbidden`] for an unknown device
    /// whose collection does not allow auto-add; [`Kind::Conflict`] when the device has no
    /// vDisk, its type has no version to boot, or another maintenance device is booted.
    pub async fn login(&self, r: &LoginRequest, server_id: Option<i64>) -> Result<LoginGrant> {
        let mac = validate::mac(&r.mac)?;
        let sent = hex::decode(&r.hmac).map_err(|_| FarmError::invalid("hmac must be hex"))?;
        validate::text("nonce", &r.nonce)?;
        let consumed: Option<String> = sqlx::query_scalar(
            "DELETE FROM login_nonces WHERE nonce = $1 AND mac = $2 AND expires_at_ms > $3 \
             RETURNING nonce",
        )
        .bind(&r.nonce)
        .bind(&mac)
        .bind(self.now_ms())
        .fetch_optional(&self.pool)
        .await?;
        if consumed.is_none() {
            return Err(unauthenticated());
        }
        let mut m = keyed(&self.farm_key_hex().await?)?;
        m.update(r.nonce.as_bytes());
        m.update(mac.as_bytes());
        m.verify_slice(&sent).map_err(|_| unauthenticated())?;
        let device = match self.device_by_mac(&mac).await? {
            Some(d) => d,
            None => self.auto_add(&mac).await?,
        };
        self.grant(device, server_id).await
    }

    /// Adds an unknown device to the first collection that allows auto-add.
    async fn auto_add(&self, mac: &str) -> Result<Device> {
        let found: Option<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT id, default_vdisk_id FROM collections WHERE auto_add = 1 ORDER BY id",
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some((collection_id, vdisk_id)) = found else {
            return Err(FarmError::new(
                Kind::Forbidden,
                format!("unknown device {mac}, and no collection adds devices automatically"),
            ));
        };
        let now = self.now_ms();
        let d = Device {
            id: 0,
            collection_id,
            mac: mac.to_string(),
            name: format!("auto-{}", mac.replace(':', "")),
            device_type: DeviceType::Production,
            vdisk_id,
            cache_mode: OptCacheMode(None),
            ram_bytes: None,
            pinned_version: None,
            created_at_ms: now,
            changed_at_ms: now,
        };
        let mut tx = self.pool.begin().await?;
        let id = insert_device(&mut tx, &d).await?;
        let actor = format!("device:{mac}");
        let detail = json!({ "mac": mac, "collection_id": collection_id });
        audit(
            &mut tx,
            now,
            &actor,
            "device.auto_add",
            "device",
            &id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        self.device(id).await
    }

    async fn grant(&self, device: Device, server_id: Option<i64>) -> Result<LoginGrant> {
        let vdisk_id = device.vdisk_id.ok_or_else(|| {
            FarmError::conflict(format!("device {} has no vdisk assigned", device.mac))
        })?;
        let lock = self.vdisk_lock(vdisk_id);
        let _held = lock.lock().await;
        let vdisk = self.vdisk(vdisk_id).await?;
        let version = self
            .boot_version(vdisk_id, device.device_type, device.pinned_version)
            .await?;
        let now = self.now_ms();
        if device.device_type == DeviceType::Maintenance {
            self.check_no_other_maintenance(&device, &vdisk.name, vdisk_id, now)
                .await?;
        }
        let writable = device.device_type == DeviceType::Maintenance;
        let cache_mode = match (writable, device.cache_mode.0.unwrap_or(vdisk.cache_mode)) {
            (true, _) => CacheMode::Private,
            (false, CacheMode::Private) => CacheMode::Server,
            (false, m) => m,
        };
        let ram_bytes = device.ram_bytes.unwrap_or(vdisk.ram_bytes);
        let session_id = uuid::Uuid::new_v4().to_string();
        let session_token = format!("fs_{}", random_hex(32));
        let export_name = format!("{EXPORT_PREFIX}{}", random_hex(16));
        let expires_at_ms = now + SESSION_TTL_MS;
        // Before the transaction: with SQLite the pool has one connection.
        let store_dir = self.store_dir(vdisk.store_id, server_id).await?;
        let mut tx = self.pool.begin().await?;
        let old: Vec<String> =
            sqlx::query_scalar("DELETE FROM sessions WHERE device_id = $1 RETURNING export_name")
                .bind(device.id)
                .fetch_all(&mut *tx)
                .await?;
        sqlx::query(
            "INSERT INTO sessions (id, device_id, vdisk_id, version_number, device_type, \
             export_name, token_hash, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&session_id)
        .bind(device.id)
        .bind(vdisk_id)
        .bind(version.number)
        .bind(device.device_type.as_str())
        .bind(&export_name)
        .bind(hash_secret(&session_token))
        .bind(now)
        .bind(expires_at_ms)
        .execute(&mut *tx)
        .await?;
        let actor = format!("device:{}", device.mac);
        let detail =
            json!({ "vdisk_id": vdisk_id, "version": version.number, "session": session_id });
        audit(
            &mut tx,
            now,
            &actor,
            "device.login",
            "device",
            &device.id.to_string(),
            &detail,
        )
        .await?;
        let g = SessionGrant {
            session_id: session_id.clone(),
            export_name: export_name.clone(),
            device_id: device.id,
            mac: device.mac.clone(),
            device_type: device.device_type,
            vdisk_id,
            vdisk_name: vdisk.name.clone(),
            version: version.number,
            path: store_dir.join(&version.file_name),
            store_dir,
            cache_mode,
            ram_bytes,
            writable,
            expires_at_ms,
        };
        self.sessions.insert(g, now)?;
        if let Err(e) = tx.commit().await {
            self.sessions.remove(&export_name);
            return Err(e.into());
        }
        for e in old {
            self.sessions.remove(&e);
        }
        let servers = self.site_servers(device.collection_id).await?;
        Ok(LoginGrant {
            session_id,
            session_token,
            export_name,
            expires_at_ms,
            device,
            servers,
            vdisk_id,
            vdisk_name: vdisk.name,
            size_bytes: vdisk.size_bytes,
            version: version.number,
            access: version.access,
            cache_mode,
            ram_bytes,
            writable,
        })
    }

    /// Refuses a maintenance login while another maintenance device is booted from the
    /// vDisk (one writer in private mode).
    async fn check_no_other_maintenance(
        &self,
        device: &Device,
        vdisk_name: &str,
        vdisk_id: i64,
        now: i64,
    ) -> Result<()> {
        let others: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sessions WHERE vdisk_id = $1 AND device_type = $2 \
             AND device_id <> $3 AND expires_at_ms > $4",
        )
        .bind(vdisk_id)
        .bind(DeviceType::Maintenance.as_str())
        .bind(device.id)
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        if others > 0 {
            return Err(FarmError::conflict(format!(
                "another maintenance device is booted from vdisk {vdisk_name}"
            )));
        }
        Ok(())
    }

    /// The servers of a collection's site, alive ones first.
    async fn site_servers(&self, collection_id: i64) -> Result<Vec<LoginServer>> {
        let site = self.collection(collection_id).await?.site_id;
        let rows: Vec<Server> = sqlx::query_as(
            "SELECT id, site_id, name, address, registered_at_ms, heartbeat_at_ms FROM servers \
             WHERE site_id = $1 ORDER BY heartbeat_at_ms DESC, id",
        )
        .bind(site)
        .fetch_all(&self.pool)
        .await?;
        let now = self.now_ms();
        Ok(rows
            .into_iter()
            .map(|s| LoginServer {
                alive: now - s.heartbeat_at_ms <= SERVER_ALIVE_MS,
                name: s.name,
                address: s.address,
            })
            .collect())
    }
}
