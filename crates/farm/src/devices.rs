//! Device collections, devices and their sessions: list, get, create, change and delete,
//! each change in one transaction with its audit entry (as in [`crate::repo`]).

use serde_json::json;

use crate::db::{Farm, audit};
use crate::error::{FarmError, Result};
use crate::input::{DevicePatch, NewCollection, NewDevice};

/// The columns of a [`Collection`].
const COLLECTION_COLS: &str = "id, site_id, name, auto_add, default_vdisk_id, auto_add_max, \
                               auto_add_per_minute, created_at_ms";
/// A collection's `auto_add_max` unless told.
pub const AUTO_ADD_MAX_DEFAULT: i64 = 500;
/// A collection's `auto_add_per_minute` unless told.
pub const AUTO_ADD_PER_MINUTE_DEFAULT: i64 = 60;
/// The largest `auto_add_max`.
pub const AUTO_ADD_MAX_LIMIT: i64 = 1_000_000;
/// The largest `auto_add_per_minute`.
pub const AUTO_ADD_PER_MINUTE_LIMIT: i64 = 100_000;
use crate::model::{Collection, Device, DeviceType, Flag, OptCacheMode, Page, Session};
use crate::validate;

/// The columns of a device row, in [`Device`]'s order.
pub(crate) const DEVICE_COLUMNS: &str = "id, collection_id, mac, name, device_type, vdisk_id, \
     cache_mode, ram_bytes, pinned_version, created_at_ms, changed_at_ms, diskless";
pub(crate) const SESSION_COLUMNS: &str = "id, device_id, vdisk_id, version_number, device_type, export_name, created_at_ms, \
     expires_at_ms";

impl Farm {
    // ---- collections and devices --------------------------------------------------------

    /// A page of collections.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_collections(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Collection>> {
        let cols = COLLECTION_COLS;
        self.page_of("collections", cols, "id", None, limit, offset)
            .await
    }

    /// One collection.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn collection(&self, id: i64) -> Result<Collection> {
        let cols = COLLECTION_COLS;
        self.one("collections", cols, "collection", id).await
    }

    /// Creates a collection.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`] for an unknown site or
    /// vDisk; [`crate::Kind::Conflict`] for a duplicate name in the site.
    pub async fn create_collection(&self, c: &NewCollection, actor: &str) -> Result<Collection> {
        validate::name("name", &c.name)?;
        let max = c.auto_add_max.unwrap_or(AUTO_ADD_MAX_DEFAULT);
        let per_minute = c.auto_add_per_minute.unwrap_or(AUTO_ADD_PER_MINUTE_DEFAULT);
        if !(0..=AUTO_ADD_MAX_LIMIT).contains(&max) {
            return Err(crate::FarmError::invalid(format!(
                "auto_add_max must be 0 to {AUTO_ADD_MAX_LIMIT}"
            )));
        }
        if !(0..=AUTO_ADD_PER_MINUTE_LIMIT).contains(&per_minute) {
            return Err(crate::FarmError::invalid(format!(
                "auto_add_per_minute must be 0 to {AUTO_ADD_PER_MINUTE_LIMIT}"
            )));
        }
        self.site(c.site_id).await?;
        if let Some(v) = c.default_vdisk_id {
            self.vdisk(v).await?;
        }
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO collections (site_id, name, auto_add, default_vdisk_id, created_at_ms, \
             auto_add_max, auto_add_per_minute) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(c.site_id)
        .bind(&c.name)
        .bind(i64::from(c.auto_add))
        .bind(c.default_vdisk_id)
        .bind(now)
        .bind(max)
        .bind(per_minute)
        .fetch_one(&mut *tx)
        .await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            now,
            actor,
            "collection.create",
            "collection",
            &id_s,
            &json!(c),
        )
        .await?;
        tx.commit().await?;
        self.collection(id).await
    }

    /// Deletes a collection that holds no device.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] while it holds devices.
    pub async fn delete_collection(&self, id: i64, actor: &str) -> Result<()> {
        self.delete_row("collections", "collection", id, actor)
            .await
    }

    /// A page of devices, optionally of one collection.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_devices(
        &self,
        collection_id: Option<i64>,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Device>> {
        let filter = collection_id.map(|c| ("collection_id", c));
        self.page_of("devices", DEVICE_COLUMNS, "id", filter, limit, offset)
            .await
    }

    /// One device.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn device(&self, id: i64) -> Result<Device> {
        let db = self.one("devices", DEVICE_COLUMNS, "device", id);
        self.or_snapshot(db, |s| s.device(id)).await
    }

    /// The device with that MAC (normalized first), if any.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a malformed MAC.
    pub async fn device_by_mac(&self, mac: &str) -> Result<Option<Device>> {
        let mac = validate::mac(mac)?.to_string();
        let sql = format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE mac = $1");
        let db = async {
            Ok(sqlx::query_as(&sql)
                .bind(&mac)
                .fetch_optional(&self.pool)
                .await?)
        };
        self.or_snapshot(db, |s| Ok(s.device_by_mac(&mac))).await
    }

    /// Checks a device's references and values.
    async fn check_device(&self, d: &Device) -> Result<()> {
        validate::name("name", &d.name)?;
        self.collection(d.collection_id).await?;
        if let Some(r) = d.ram_bytes {
            validate::size("ram_bytes", r)?;
        }
        if let Some(v) = d.vdisk_id {
            self.vdisk(v).await?;
        }
        if let Some(n) = d.pinned_version {
            let v = d
                .vdisk_id
                .ok_or_else(|| FarmError::invalid("pinned_version needs a vdisk_id"))?;
            self.version(v, n).await?;
        }
        Ok(())
    }

    /// Creates a device.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`] for an unknown collection,
    /// vDisk or version; [`crate::Kind::Conflict`] for a MAC already known.
    pub async fn create_device(&self, n: &NewDevice, actor: &str) -> Result<Device> {
        let now = self.now_ms();
        let d = Device {
            id: 0,
            collection_id: n.collection_id,
            mac: validate::mac(&n.mac)?.to_string(),
            name: n.name.clone(),
            device_type: n.device_type.unwrap_or(DeviceType::Production),
            vdisk_id: n.vdisk_id,
            cache_mode: OptCacheMode(n.cache_mode),
            ram_bytes: n.ram_bytes,
            pinned_version: n.pinned_version,
            created_at_ms: now,
            changed_at_ms: now,
            diskless: Flag(n.diskless),
        };
        self.check_device(&d).await?;
        let mut tx = self.pool.begin().await?;
        let id = insert_device(&mut tx, &d).await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            now,
            actor,
            "device.create",
            "device",
            &id_s,
            &json!(n),
        )
        .await?;
        tx.commit().await?;
        self.device(id).await
    }

    /// Changes a device.
    ///
    /// # Errors
    /// As [`Farm::create_device`].
    pub async fn update_device(&self, id: i64, p: &DevicePatch, actor: &str) -> Result<Device> {
        let mut d = self.device(id).await?;
        if let Some(c) = p.collection_id {
            d.collection_id = c;
        }
        if let Some(n) = &p.name {
            d.name.clone_from(n);
        }
        if let Some(t) = p.device_type {
            d.device_type = t;
        }
        if let Some(v) = p.vdisk_id {
            d.vdisk_id = v;
        }
        if let Some(c) = p.cache_mode {
            d.cache_mode = OptCacheMode(c);
        }
        if let Some(r) = p.ram_bytes {
            d.ram_bytes = r;
        }
        if let Some(v) = p.pinned_version {
            d.pinned_version = v;
        }
        if let Some(v) = p.diskless {
            d.diskless = Flag(v);
        }
        d.changed_at_ms = self.now_ms();
        self.check_device(&d).await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE devices SET collection_id = $1, name = $2, device_type = $3, vdisk_id = $4, \
             cache_mode = $5, ram_bytes = $6, pinned_version = $7, changed_at_ms = $8, \
             diskless = $9 WHERE id = $10",
        )
        .bind(d.collection_id)
        .bind(&d.name)
        .bind(d.device_type.as_str())
        .bind(d.vdisk_id)
        .bind(d.cache_mode.as_str())
        .bind(d.ram_bytes)
        .bind(d.pinned_version)
        .bind(d.changed_at_ms)
        .bind(i64::from(d.diskless.0))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            d.changed_at_ms,
            actor,
            "device.update",
            "device",
            &id_s,
            &json!(p),
        )
        .await?;
        tx.commit().await?;
        self.device(id).await
    }

    /// Deletes a device (and its sessions).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn delete_device(&self, id: i64, actor: &str) -> Result<()> {
        let exports: Vec<String> =
            sqlx::query_scalar("SELECT export_name FROM sessions WHERE device_id = $1")
                .bind(id)
                .fetch_all(&self.pool)
                .await?;
        self.delete_row("devices", "device", id, actor).await?;
        for e in exports {
            self.sessions.remove(&e);
        }
        Ok(())
    }

    // ---- sessions -----------------------------------------------------------------------

    /// A page of sessions that have not expired.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_sessions(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Session>> {
        self.purge_expired_sessions().await?;
        self.page_of(
            "sessions",
            SESSION_COLUMNS,
            "created_at_ms",
            None,
            limit,
            offset,
        )
        .await
    }

    /// Ends a session (the device is no longer booted from its version).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn end_session(&self, id: &str, actor: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let export: Option<String> =
            sqlx::query_scalar("DELETE FROM sessions WHERE id = $1 RETURNING export_name")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let export = export.ok_or_else(|| FarmError::not_found(format!("no session {id:?}")))?;
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "session.end",
            "session",
            id,
            &json!({}),
        )
        .await?;
        tx.commit().await?;
        self.sessions.remove(&export);
        Ok(())
    }

    /// Ends the session of `export_name` at its machine's word: the boot agent says so when
    /// the machine shuts down cleanly, after its last write (audited as the device). The
    /// session no longer counts as booted, and stays valid for
    /// [`crate::counters::SESSION_END_GRACE_MS`] (the machine's last reads before the power
    /// goes), then expires.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`] when no live session has that export name.
    pub async fn end_session_by_export(&self, export_name: &str) -> Result<Session> {
        let s = self
            .session_by_export(export_name)
            .await?
            .ok_or_else(|| FarmError::not_found("no live session of that name"))?;
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE sessions SET ended_at_ms = $1, expires_at_ms = $2 \
             WHERE id = $3 AND expires_at_ms > $2",
        )
        .bind(now)
        .bind(now.saturating_add(crate::counters::SESSION_END_GRACE_MS))
        .bind(&s.id)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            now,
            &format!("device:{}", s.device_id),
            "session.end",
            "session",
            &s.id,
            &json!({ "by": "machine", "clean_shutdown": true }),
        )
        .await?;
        tx.commit().await?;
        Ok(s)
    }

    /// The session of an export name, from the database (for a server that did not grant
    /// it itself), if it has not expired.
    ///
    /// # Errors
    /// [`crate::Kind::Database`].
    pub async fn session_by_export(&self, export_name: &str) -> Result<Option<Session>> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE export_name = $1 AND expires_at_ms > $2"
        );
        Ok(sqlx::query_as(&sql)
            .bind(export_name)
            .bind(self.now_ms())
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Deletes expired sessions and login nonces.
    pub(crate) async fn purge_expired_sessions(&self) -> Result<()> {
        let now = self.now_ms();
        sqlx::query("DELETE FROM sessions WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM login_nonces WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        self.sessions.purge_expired(now);
        Ok(())
    }
}

/// Inserts a device row; returns its id.
pub(crate) async fn insert_device(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    d: &Device,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO devices (collection_id, mac, name, device_type, vdisk_id, cache_mode, \
         ram_bytes, pinned_version, created_at_ms, changed_at_ms, diskless) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
    )
    .bind(d.collection_id)
    .bind(&d.mac)
    .bind(&d.name)
    .bind(d.device_type.as_str())
    .bind(d.vdisk_id)
    .bind(d.cache_mode.as_str())
    .bind(d.ram_bytes)
    .bind(d.pinned_version)
    .bind(d.created_at_ms)
    .bind(d.changed_at_ms)
    .bind(i64::from(d.diskless.0))
    .fetch_one(&mut **tx)
    .await?)
}
