//! Device login, server side: a challenge (a one-time nonce) and a proof (an HMAC of the
//! nonce and the MAC under the device's key; no key crosses the wire).
//!
//! ```text
//!   target                                   farm
//!   POST /login/challenge {mac}        ──►   nonce (random, one use, NONCE_TTL_MS)
//!   hmac = HMAC-SHA256(key, nonce ‖ mac)
//!   POST /login {mac, nonce, hmac}     ──►   check nonce + hmac (constant time) under the
//!                                            device's key, or the farm key to enrol it;
//!                                            device by MAC (or auto-add), boot version,
//!                                            one maintenance device at a time
//!                                      ◄──   servers, vdisk, version, cache mode, sizes,
//!                                            export name, session token, device
//!                                            certificate; at enrolment the device secret
//! ```
//!
//! `key` is 32 bytes: an enrolled device's key, or the farm key for a device not enrolled
//! yet (`devices.credential_generation` NULL: a MAC auto-add creates now, or a device an
//! administrator added). The farm key's proof enrols such a device once: its grant carries
//! the device's secret, [`contract::login::device_key`] of the farm key, the MAC and the
//! generation, which the farm derives again at each login and never stores. After that the
//! farm key proves nothing for that MAC, except for a *diskless* device (`devices.diskless`:
//! it boots over the network and has nowhere to keep its secret), which the farm key's proof
//! logs in at every boot, with no new secret after the first; an administrator's reset
//! (`Farm::reset_device_credential`) makes a new generation and secret. `nonce` is the
//! nonce's hex text as sent and `mac` the normalized MAC text (`aa:bb:cc:dd:ee:ff`), both
//! as UTF-8 bytes; `hmac` is sent as lowercase hex. [`proof`] computes it.
//!
//! The request and answer bodies and the proof itself are the `contract` crate's
//! (`contract::login`), which the target's agent uses too.

use contract::{ExportName, Mac, SessionKey};
use rand::RngCore as _;
use serde_json::json;

pub use contract::login::{Challenge, ChallengeRequest, DeviceTls, LoginRequest, LoginServer};

use crate::balance::SessionServer;
use crate::db::{Farm, audit, hash_secret};
use crate::devices::insert_device;
use crate::error::{FarmError, Kind, Result};
use crate::model::{CacheMode, Device, DeviceType, Flag, OptCacheMode};
use crate::sessions::SessionGrant;
use crate::validate;

/// How long a nonce may be answered.
pub const NONCE_TTL_MS: i64 = 60_000;
/// The most outstanding nonces; past it a challenge is refused until some expire.
pub const NONCES_MAX: i64 = 10_000;
/// How long a session lives.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;

/// What a device gets at login: the contract's grant with the farm's whole device record
/// (a target reads it as `LoginGrant<`[`contract::login::DeviceRef`]`>`).
pub type LoginGrant = contract::login::LoginGrant<Device>;

/// The login proof: hex HMAC-SHA256(key, nonce ‖ mac) (see the module documentation), as
/// `contract::login::proof` computes it, from a key's hex text (the farm key's to enrol,
/// else the device secret) and any accepted MAC spelling.
///
/// # Errors
/// [`Kind::InvalidInput`] for a key that is not hex or a malformed MAC.
pub fn proof(key_hex: &str, nonce: &str, mac: &str) -> Result<String> {
    let mac = validate::mac(mac)?;
    let key = hex::decode(key_hex.trim()).map_err(|_| FarmError::invalid("key is not hex"))?;
    Ok(contract::login::proof(&key, nonce, mac))
}

/// The cache mode a device runs in: private for a maintenance device (it writes the
/// version), else its override or its vDisk's mode, where private (one writer) becomes
/// server.
pub fn effective_cache_mode(
    device_type: DeviceType,
    over: OptCacheMode,
    vdisk: CacheMode,
) -> CacheMode {
    match (device_type, over.0.unwrap_or(vdisk)) {
        (DeviceType::Maintenance, _) => CacheMode::Private,
        (_, CacheMode::Private) => CacheMode::Server,
        (_, m) => m,
    }
}

/// The device a MAC auto-add creates (id 0 until inserted).
pub(crate) fn auto_device(
    mac: Mac,
    collection_id: i64,
    vdisk_id: Option<i64>,
    diskless: bool,
    now: i64,
) -> Device {
    Device {
        id: 0,
        collection_id,
        mac: mac.to_string(),
        name: format!("auto-{}", hex::encode(mac.octets())),
        device_type: DeviceType::Production,
        vdisk_id,
        cache_mode: OptCacheMode(None),
        ram_bytes: None,
        pinned_version: None,
        created_at_ms: now,
        changed_at_ms: now,
        diskless: Flag(diskless),
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::thread_rng().fill_bytes(&mut b);
    b
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
        let nonce = hex::encode(random_bytes::<32>());
        let expires_at_ms = self.now_ms() + NONCE_TTL_MS;
        sqlx::query("INSERT INTO login_nonces (nonce, mac, expires_at_ms) VALUES ($1, $2, $3)")
            .bind(&nonce)
            .bind(mac.to_string())
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
        .bind(mac.to_string())
        .bind(self.now_ms())
        .fetch_optional(&self.pool)
        .await?;
        if consumed.is_none() {
            return Err(unauthenticated());
        }
        let master = self.farm_key()?;
        let known = self.device_by_mac(&mac.to_string()).await?;
        let generation = match &known {
            Some(d) => self.credential_generation(d.id).await?,
            None => None,
        };
        let key = match generation {
            Some(g) => contract::login::device_key(&master, mac, g).to_vec(),
            None => master.clone(),
        };
        if !contract::login::verify(&key, &r.nonce, mac, &sent) {
            let by_farm_key =
                generation.is_some() && contract::login::verify(&master, &r.nonce, mac, &sent);
            let diskless = known.as_ref().is_some_and(|d| d.diskless.0);
            if !by_farm_key {
                return Err(unauthenticated());
            }
            if !diskless {
                tracing::warn!(%mac, "refused a farm-key login of an enrolled device");
                return Err(unauthenticated());
            }
            // A diskless device keeps no device secret: the farm key logs it in again,
            // and no new secret is issued (it could not keep that one either).
            tracing::debug!(%mac, "farm-key login of an enrolled diskless device");
        }
        let device = match known {
            Some(d) => d,
            None => self.auto_add(mac, r.diskless).await?,
        };
        let enrol = generation.is_none().then_some(&master[..]);
        self.grant(device, server_id, enrol).await
    }

    /// The generation of a device's credential; `None` when it was never enrolled.
    pub(crate) async fn credential_generation(&self, device_id: i64) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT credential_generation FROM devices WHERE id = $1")
                .bind(device_id)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The device's client certificate for the NBD servers, when the farm has a CA.
    fn device_tls(&self, mac: Mac) -> Result<Option<DeviceTls>> {
        let Some(ca) = self.secrets().authority_if_present()? else {
            return Ok(None);
        };
        let issued = ca
            .issue_client(
                &pki::Identity::Device(mac),
                self.system_now(),
                pki::DEVICE_CERT_VALIDITY,
            )
            .map_err(|e| FarmError::new(Kind::Secrets, format!("device certificate: {e}")))?;
        Ok(Some(DeviceTls {
            ca_pem: ca.cert_pem().to_string(),
            cert_pem: issued.cert_pem,
            key_pem: issued.key_pem,
            not_after_ms: issued.not_after_unix.saturating_mul(1000),
        }))
    }

    /// The first collection that adds unknown devices, and its default vDisk.
    pub(crate) async fn auto_add_collection(&self) -> Result<Option<(i64, Option<i64>)>> {
        Ok(sqlx::query_as(
            "SELECT id, default_vdisk_id FROM collections WHERE auto_add = 1 ORDER BY id",
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Adds an unknown device to the first collection that allows auto-add (diskless when
    /// its login says so).
    async fn auto_add(&self, mac: Mac, diskless: bool) -> Result<Device> {
        let Some((collection_id, vdisk_id)) = self.auto_add_collection().await? else {
            return Err(FarmError::new(
                Kind::Forbidden,
                format!("unknown device {mac}, and no collection adds devices automatically"),
            ));
        };
        let now = self.now_ms();
        let d = auto_device(mac, collection_id, vdisk_id, diskless, now);
        let mut tx = self.pool.begin().await?;
        let id = insert_device(&mut tx, &d).await?;
        let actor = format!("device:{mac}");
        let detail = json!({ "mac": mac.to_string(), "collection_id": collection_id });
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

    /// The grant of a login; `enrol` (the farm key) when the login enrols the device, whose
    /// secret the grant then carries.
    async fn grant(
        &self,
        device: Device,
        server_id: Option<i64>,
        enrol: Option<&[u8]>,
    ) -> Result<LoginGrant> {
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
        let cache_mode =
            effective_cache_mode(device.device_type, device.cache_mode, vdisk.cache_mode);
        let ram_bytes = device.ram_bytes.unwrap_or(vdisk.ram_bytes);
        let session_id = uuid::Uuid::new_v4().to_string();
        let session_token = format!("fs_{}", hex::encode(random_bytes::<32>()));
        let export_name = ExportName::Session(SessionKey::from_bytes(random_bytes())).to_string();
        let expires_at_ms = now + SESSION_TTL_MS;
        // Before the transaction: with SQLite the pool has one connection.
        let store_dir = self.store_dir(vdisk.store_id, server_id).await?;
        let mac: Mac = validate::mac(&device.mac)?;
        let tls = self.device_tls(mac)?;
        let actor = format!("device:{}", device.mac);
        let mut tx = self.pool.begin().await?;
        let device_secret = match enrol {
            Some(master) => {
                // Only if still not enrolled: of two farm-key logins at once, one enrols.
                let done = sqlx::query(
                    "UPDATE devices SET credential_generation = 1 \
                     WHERE id = $1 AND credential_generation IS NULL",
                )
                .bind(device.id)
                .execute(&mut *tx)
                .await?;
                if done.rows_affected() != 1 {
                    return Err(unauthenticated());
                }
                let detail = json!({ "mac": device.mac, "generation": 1 });
                audit(
                    &mut tx,
                    now,
                    &actor,
                    "device.enrol",
                    "device",
                    &device.id.to_string(),
                    &detail,
                )
                .await?;
                Some(hex::encode(contract::login::device_key(master, mac, 1)))
            }
            None => None,
        };
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
        if let Some(first) = servers.first() {
            self.note_session_server(&session_id, SessionServer::Name(&first.name))
                .await?;
        }
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
            version_created_at_ms: version.created_at_ms,
            access: version.access,
            cache_mode,
            ram_bytes,
            writable,
            device_secret,
            tls,
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
}
