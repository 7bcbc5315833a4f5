//! Device login, server side: a challenge (a one-time nonce) and a proof (an HMAC of the
//! nonce and the MAC under the device's own key; no key crosses the wire), or, for a
//! diskless machine, a one-time login ticket from its boot script.
//!
//! ```text
//!   target                                   farm
//!   POST /login/challenge {mac}        ──►   nonce (random, one use, NONCE_TTL_MS; at most
//!                                            LoginLimits::nonces_per_address outstanding
//!                                            per client address, nonces_max in all)
//!   hmac = HMAC-SHA256(key, nonce ‖ mac)
//!   POST /login {mac, nonce, hmac}     ──►   check nonce + hmac (constant time) under the
//!                                            device's own key (devices.device_key)
//!   POST /login {mac, ticket}          ──►   or: a ticket of this MAC's boot script (one
//!                                            use, seconds), diskless devices only; the
//!                                            device gets a new random key
//!                                            device by MAC (or bounded auto-add), boot
//!                                            version, one maintenance device at a time
//!                                      ◄──   servers, vdisk, version, cache mode, sizes,
//!                                            export name, session token, device
//!                                            certificate; after a ticket the device's key
//! ```
//!
//! # Design notes
//!
//! Every device key is 32 random bytes the farm makes for that device alone and keeps in
//! the database (`devices.device_key`): nothing farm-wide proves a login, and no key is
//! derived from anything, so nothing an image or the boot port holds reveals one. A key is
//! made (and the old one stops working) by an administrator's reset
//! (`Farm::reset_device_credential`), which is how a device with a disk gets its key, and
//! by every ticket login of a diskless device, whose grant carries it for the agent to
//! keep in RAM for that boot's logins again. The farm key proves nothing any more.
//!
//! A ticket ([`crate::tickets`]) is the weaker mode of a diskless machine that can keep no
//! key: the boot script of that MAC carries it, so whoever fetches that script within its
//! life can log in once as that device. The farm only takes a ticket for a device marked
//! diskless (or one the ticket's login adds, always diskless): an enrolled device with a
//! disk never accepts one, nor does a device that keeps its key in its TPM
//! ([`Farm::bind_tpm`], after its first ticket login sealed the key there).
//!
//! Nonces are bounded per client address and overall: an address at its bound is refused
//! (429) while others still get challenges, and when the table is full the address holding
//! the most loses its oldest nonce first, so one flooding address cannot starve the rest.
//! Auto-add is bounded per collection (`auto_add_max` in all, `auto_add_per_minute`).
//! `nonce` is the nonce's hex text as sent and `mac` the normalized MAC text
//! (`aa:bb:cc:dd:ee:ff`), both as UTF-8 bytes; `hmac` is sent as lowercase hex. [`proof`]
//! computes it.
//!
//! The request and answer bodies and the proof itself are the `contract` crate's
//! (`contract::login`), which the target's agent uses too.

use contract::{ExportName, Mac, SessionKey};
use serde_json::json;

pub use contract::login::{Challenge, ChallengeRequest, DeviceTls, LoginRequest, LoginServer};

use crate::balance::SessionServer;
use crate::db::{Farm, audit, hash_secret, random_bytes};
pub use crate::db::{LoginLimits, NONCES_MAX, NONCES_PER_ADDRESS_MAX};
use crate::devices::insert_device;
use crate::error::{FarmError, Kind, Result};
use crate::model::{CacheMode, Device, DeviceType, Flag, OptCacheMode};
use crate::sessions::SessionGrant;
use crate::validate;

/// How long a nonce may be answered.
pub const NONCE_TTL_MS: i64 = 60_000;
/// The window of a collection's `auto_add_per_minute`.
pub const AUTO_ADD_WINDOW_MS: i64 = 60_000;
/// How long a session lives.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;

/// What a device gets at login: the contract's grant with the farm's whole device record
/// (a target reads it as `LoginGrant<`[`contract::login::DeviceRef`]`>`).
pub type LoginGrant = contract::login::LoginGrant<Device>;

/// The login proof: hex HMAC-SHA256(key, nonce ‖ mac) (see the module documentation), as
/// `contract::login::proof` computes it, from a key's hex text (the device secret) and any
/// accepted MAC spelling.
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

pub(crate) fn unauthenticated() -> FarmError {
    FarmError::new(Kind::Unauthenticated, "login refused: bad or expired proof")
}

impl Farm {
    /// The login nonce table's bounds.
    pub fn login_limits(&self) -> LoginLimits {
        *self
            .login_limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the login nonce table's bounds (both at least 1).
    pub fn set_login_limits(&self, limits: LoginLimits) {
        let limits = LoginLimits {
            nonces_max: limits.nonces_max.max(1),
            nonces_per_address: limits.nonces_per_address.max(1),
        };
        *self
            .login_limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = limits;
    }

    /// Issues a one-time nonce for `mac` to the client at `peer` (`None`: unknown, counted
    /// as one address), also for unknown MACs: the answer does not tell whether a device
    /// exists.
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for a malformed MAC; [`Kind::LimitReached`] when `peer` holds
    /// [`LoginLimits::nonces_per_address`] nonces, or the table is full and no address holds
    /// more than `peer`.
    pub async fn challenge(
        &self,
        r: &ChallengeRequest,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Challenge> {
        let mac = validate::mac(&r.mac)?;
        let db = self.challenge_db(mac, peer);
        let m = mac.to_string();
        self.or_snapshot(db, |_| {
            let (nonce, expires_at_ms) = self.offline_challenge(&m)?;
            Ok(Challenge {
                nonce,
                expires_at_ms,
            })
        })
        .await
    }

    async fn challenge_db(&self, mac: Mac, peer: Option<std::net::IpAddr>) -> Result<Challenge> {
        let peer = peer
            .map(|p| p.to_canonical().to_string())
            .unwrap_or_default();
        let limits = self.login_limits();
        self.purge_expired_sessions().await?;
        let mine: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM login_nonces WHERE peer = $1")
            .bind(&peer)
            .fetch_one(&self.pool)
            .await?;
        if mine >= limits.nonces_per_address {
            return Err(FarmError::new(
                Kind::LimitReached,
                "too many logins under way from this address; try again in a minute",
            ));
        }
        let outstanding: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM login_nonces")
            .fetch_one(&self.pool)
            .await?;
        if outstanding >= limits.nonces_max {
            self.evict_nonce_of_the_busiest(&peer, mine).await?;
        }
        let nonce = hex::encode(random_bytes::<32>());
        let expires_at_ms = self.now_ms() + NONCE_TTL_MS;
        sqlx::query(
            "INSERT INTO login_nonces (nonce, mac, expires_at_ms, peer) VALUES ($1, $2, $3, $4)",
        )
        .bind(&nonce)
        .bind(mac.to_string())
        .bind(expires_at_ms)
        .bind(&peer)
        .execute(&self.pool)
        .await?;
        Ok(Challenge {
            nonce,
            expires_at_ms,
        })
    }

    /// With the nonce table full: drops the oldest nonce of the address that holds the most,
    /// when it holds more than `peer` (which holds `mine`); else refuses `peer`.
    async fn evict_nonce_of_the_busiest(&self, peer: &str, mine: i64) -> Result<()> {
        let busiest: Option<(String, i64)> = sqlx::query_as(
            "SELECT peer, COUNT(*) AS n FROM login_nonces GROUP BY peer ORDER BY n DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        match busiest {
            Some((other, n)) if other != peer && n > mine + 1 => {
                sqlx::query(
                    "DELETE FROM login_nonces WHERE nonce = (SELECT nonce FROM login_nonces \
                     WHERE peer = $1 ORDER BY expires_at_ms LIMIT 1)",
                )
                .bind(&other)
                .execute(&self.pool)
                .await?;
                tracing::debug!(peer = %other, held = n, "dropped a nonce of the busiest address");
                Ok(())
            }
            _ => Err(FarmError::new(
                Kind::LimitReached,
                "too many logins under way; try again in a minute",
            )),
        }
    }

    /// Logs a device in (see the module documentation).
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for malformed fields; [`Kind::Unauthenticated`] for a bad,
    /// used or expired nonce or ticket, a wrong HMAC, a device with no key of its own, or a
    /// ticket for a device that is not diskless; [`Kind::Forbidden`] for an unknown device
    /// whose collection does not allow auto-add; [`Kind::LimitReached`] past the auto-add
    /// collection's bounds; [`Kind::Conflict`] when the device has no vDisk, its type has no
    /// version to boot, or another maintenance device is booted.
    pub async fn login(&self, r: &LoginRequest, server_id: Option<i64>) -> Result<LoginGrant> {
        let mac = validate::mac(&r.mac)?;
        if let Some(ticket) = &r.ticket {
            return self.login_with_ticket(mac, ticket, server_id).await;
        }
        let device = self.proven_device(mac, r).await?;
        self.grant(device, server_id, false).await
    }

    /// A ticket login: the ticket consumed, the device (diskless, or added now) given a new
    /// random key, which the grant carries.
    async fn login_with_ticket(
        &self,
        mac: Mac,
        ticket: &str,
        server_id: Option<i64>,
    ) -> Result<LoginGrant> {
        if !self.consume_ticket(mac, ticket).await? {
            return Err(unauthenticated());
        }
        let device = match self.device_by_mac(&mac.to_string()).await? {
            Some(d) if d.diskless.0 && !self.tpm_bound(d.id).await? => d,
            Some(_) => {
                tracing::warn!(%mac,
                    "refused a ticket login of a device that is not diskless or keeps its key in a TPM");
                return Err(unauthenticated());
            }
            None => self.auto_add(mac).await?,
        };
        self.grant(device, server_id, true).await
    }

    /// The device whose own key proves `r` (its nonce used up either way).
    async fn proven_device(&self, mac: Mac, r: &LoginRequest) -> Result<Device> {
        let sent = hex::decode(&r.hmac).map_err(|_| FarmError::invalid("hmac must be hex"))?;
        validate::text("nonce", &r.nonce)?;
        let consumed = match self
            .offline
            .take_nonce(&r.nonce, &mac.to_string(), self.now_ms())
        {
            // One this process issued while the database was away.
            Some(live) => live,
            None => sqlx::query_scalar::<_, String>(
                "DELETE FROM login_nonces WHERE nonce = $1 AND mac = $2 AND expires_at_ms > $3 \
                 RETURNING nonce",
            )
            .bind(&r.nonce)
            .bind(mac.to_string())
            .bind(self.now_ms())
            .fetch_optional(&self.pool)
            .await?
            .is_some(),
        };
        if !consumed {
            return Err(unauthenticated());
        }
        let Some(device) = self.device_by_mac(&mac.to_string()).await? else {
            return Err(FarmError::new(
                Kind::Forbidden,
                format!(
                    "unknown device {mac}: an administrator adds it (ferry device add) and \
                     gives it a key (ferry device credential)"
                ),
            ));
        };
        let Some(key) = self.device_key(device.id).await? else {
            tracing::warn!(%mac, "refused a proof login of a device that has no key");
            return Err(unauthenticated());
        };
        if !contract::login::verify(&key, &r.nonce, mac, &sent) {
            return Err(unauthenticated());
        }
        Ok(device)
    }

    /// Marks device `r.mac` as keeping its key in its TPM, proven with that key (a nonce
    /// and HMAC as at login): from then on the farm issues and accepts no login ticket for
    /// it, until an administrator's credential reset.
    ///
    /// # Errors
    /// As [`Farm::login`]'s proof.
    pub async fn bind_tpm(&self, r: &LoginRequest) -> Result<()> {
        let mac = validate::mac(&r.mac)?;
        let device = self.proven_device(mac, r).await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE devices SET tpm_bound = 1 WHERE id = $1")
            .bind(device.id)
            .execute(&mut *tx)
            .await?;
        let detail = json!({ "mac": device.mac });
        audit(
            &mut tx,
            self.now_ms(),
            &format!("device:{}", device.mac),
            "device.tpm_bind",
            "device",
            &device.id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// True when the device keeps its key in its TPM ([`Farm::bind_tpm`]).
    pub async fn tpm_bound(&self, device_id: i64) -> Result<bool> {
        let db = async {
            let n: Option<i64> = sqlx::query_scalar("SELECT tpm_bound FROM devices WHERE id = $1")
                .bind(device_id)
                .fetch_optional(&self.pool)
                .await?;
            Ok(n == Some(1))
        };
        self.or_snapshot(db, |s| Ok(s.tpm_bound(device_id))).await
    }

    /// The device's own key's bytes; `None` when it has none.
    pub(crate) async fn device_key(&self, device_id: i64) -> Result<Option<Vec<u8>>> {
        let db = async {
            Ok(sqlx::query_scalar::<_, Option<String>>(
                "SELECT device_key FROM devices WHERE id = $1",
            )
            .bind(device_id)
            .fetch_optional(&self.pool)
            .await?
            .flatten())
        };
        let hex_key = self
            .or_snapshot(db, |s| Ok(s.device_key(device_id)))
            .await?;
        hex_key
            .map(|k| {
                hex::decode(k.trim())
                    .map_err(|_| FarmError::new(Kind::Secrets, "a device key is not hex"))
            })
            .transpose()
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
        let db = async {
            Ok(sqlx::query_as(
                "SELECT id, default_vdisk_id FROM collections WHERE auto_add = 1 ORDER BY id",
            )
            .fetch_optional(&self.pool)
            .await?)
        };
        self.or_snapshot(db, |s| Ok(s.auto_add_collection())).await
    }

    /// Adds an unknown device, diskless, to the first collection that allows auto-add,
    /// within that collection's bounds.
    async fn auto_add(&self, mac: Mac) -> Result<Device> {
        let Some((collection_id, vdisk_id)) = self.auto_add_collection().await? else {
            return Err(FarmError::new(
                Kind::Forbidden,
                format!("unknown device {mac}, and no collection adds devices automatically"),
            ));
        };
        let now = self.now_ms();
        let d = auto_device(mac, collection_id, vdisk_id, true, now);
        let mut tx = self.pool.begin().await?;
        let (max, per_minute): (i64, i64) = sqlx::query_as(
            "SELECT auto_add_max, auto_add_per_minute FROM collections WHERE id = $1",
        )
        .bind(collection_id)
        .fetch_one(&mut *tx)
        .await?;
        let (added, recent): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN created_at_ms > $2 THEN 1 ELSE 0 END), 0) \
             FROM devices WHERE collection_id = $1 AND auto_added = 1",
        )
        .bind(collection_id)
        .bind(now - AUTO_ADD_WINDOW_MS)
        .fetch_one(&mut *tx)
        .await?;
        if added >= max || recent >= per_minute {
            tracing::warn!(%mac, collection_id, added, recent, max, per_minute,
                "auto-add refused: the collection's bound is reached");
            return Err(FarmError::new(
                Kind::LimitReached,
                format!(
                    "collection {collection_id} adds no more devices now ({added} of \
                     auto_add_max {max} added, {recent} of auto_add_per_minute {per_minute} \
                     in the last minute)"
                ),
            ));
        }
        let id = insert_device(&mut tx, &d).await?;
        sqlx::query("UPDATE devices SET auto_added = 1 WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
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

    /// The grant of a login; with `new_key` (a ticket login) the device gets a new random
    /// key, which the grant carries.
    async fn grant(
        &self,
        device: Device,
        server_id: Option<i64>,
        new_key: bool,
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
        let device_secret =
            new_key.then(|| hex::encode(random_bytes::<{ contract::login::DEVICE_KEY_BYTES }>()));
        let record = crate::offline_state::LoginRecord {
            session_id: session_id.clone(),
            device_id: device.id,
            mac: device.mac.clone(),
            vdisk_id,
            version: version.number,
            device_type: device.device_type,
            export_name: export_name.clone(),
            token_hash: hash_secret(&session_token),
            created_at_ms: now,
            expires_at_ms,
            new_key: device_secret.clone(),
        };
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
        // Written now, or kept pending while the database is away (crate::offline).
        let old = match self.record_login(record).await {
            Ok(old) => old,
            Err(e) => {
                self.sessions.remove(&export_name);
                return Err(e);
            }
        };
        for e in old {
            self.sessions.remove(&e);
        }
        let servers = self.site_servers(device.collection_id).await?;
        if let Some(first) = servers.first() {
            let noted = self
                .note_session_server(&session_id, SessionServer::Name(&first.name))
                .await;
            match noted {
                Err(e) if e.kind() == Kind::Unavailable => {}
                r => r?,
            }
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
        // A maintenance device silent for SESSION_SILENT_MS is gone: it does not count.
        let others: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM sessions s LEFT JOIN session_counters c ON c.session_id = s.id \
             WHERE s.vdisk_id = $1 AND s.device_type = $2 AND s.device_id <> $3 \
             AND s.expires_at_ms > $4 AND {}",
            crate::counters::machine_there(5)
        ))
        .bind(vdisk_id)
        .bind(DeviceType::Maintenance.as_str())
        .bind(device.id)
        .bind(now)
        .bind(now.saturating_sub(crate::counters::SESSION_SILENT_MS))
        .fetch_one(&self.pool)
        .await?;
        if others > 0 {
            return Err(FarmError::conflict(format!(
                "another maintenance device is booted from vdisk {vdisk_name}"
            )));
        }
        // Those left are silent: ended, so that no second writer is ever let in (a server
        // still holding one closes it at its next recheck).
        let ended: Vec<String> = sqlx::query_scalar(
            "DELETE FROM sessions WHERE vdisk_id = $1 AND device_type = $2 AND device_id <> $3 \
             RETURNING export_name",
        )
        .bind(vdisk_id)
        .bind(DeviceType::Maintenance.as_str())
        .bind(device.id)
        .fetch_all(&self.pool)
        .await?;
        for export in &ended {
            self.sessions.remove(export);
        }
        Ok(())
    }
}
