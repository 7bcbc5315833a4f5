//! The version lifecycle of vDisks (PVS semantics), over real files in the store: new,
//! promote, revert, delete, merge, and the version a device boots. The vDisks themselves are
//! in [`crate::vdisks`].
//!
//! # Design notes
//!
//! ```text
//!   new      ──► N (maintenance) ──promote──► test ──promote──► production
//!                     ▲                        │                 │
//!                     └──────── revert ────────┘ ◄──── revert ───┘
//! ```
//!
//! Invariants, checked under the vDisk's lock and inside one transaction:
//! * at most one maintenance version, and it is the newest (it is written to, so nothing
//!   may sit on it): `new` and `merge` are refused while one exists, and `revert` to
//!   maintenance only applies to the newest version;
//! * a version is reverted only while no device of the higher type is booted from it
//!   (has a live session on it), and deleted only when it is the newest, not version 0, not
//!   booted and not pinned;
//! * the file is made before its row is committed, and removed again when the row cannot
//!   be; a deleted version's row goes only when its file is gone.
//! * in a bucket store, a version is published before its row says it left maintenance,
//!   and a published version is never rewritten (see [`crate::publish`]).
//!
//! File names are PVS's: `NAME.vhdx` (version 0), `NAME.N.avhdx` (a new version or merged
//! updates), `NAME.N.vhdx` (a merged base, standalone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::confine;
use crate::db::{Farm, audit};
use crate::error::{FarmError, Kind, Result};
use crate::input::MergeRequest;
use crate::model::{AccessMode, DeviceType, MergeMode, VDisk, Version};

/// The most versions a vDisk keeps (rows; numbers keep growing).
pub const VERSIONS_MAX: i64 = 1000;
pub(crate) const VERSION_COLUMNS: &str = "vdisk_id, number, file_name, parent_number, access, origin, \
     created_at_ms, created_by, changed_at_ms, changed_by";

/// Runs blocking image work off the reactor.
pub(crate) async fn blocking<T: Send + 'static>(
    what: String,
    f: impl FnOnce() -> disk::Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        // A refused argument, a damaged image or a broken chain is 4xx, not a failure of
        // the farm (see FarmError::from_image).
        Ok(r) => r.map_err(|e| FarmError::from_image(what, e)),
        Err(e) => Err(FarmError::new(Kind::Image, format!("{what}: {e}"))),
    }
}

impl Farm {
    /// Every version of a vDisk, oldest first.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn versions(&self, vdisk_id: i64) -> Result<Vec<Version>> {
        self.vdisk(vdisk_id).await?;
        let sql =
            format!("SELECT {VERSION_COLUMNS} FROM versions WHERE vdisk_id = $1 ORDER BY number");
        let db = async {
            Ok(sqlx::query_as(&sql)
                .bind(vdisk_id)
                .fetch_all(&self.pool)
                .await?)
        };
        self.or_snapshot(db, |s| s.versions(vdisk_id)).await
    }

    /// One version.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn version(&self, vdisk_id: i64, number: i64) -> Result<Version> {
        let sql =
            format!("SELECT {VERSION_COLUMNS} FROM versions WHERE vdisk_id = $1 AND number = $2");
        let db = async {
            sqlx::query_as(&sql)
                .bind(vdisk_id)
                .bind(number)
                .fetch_optional(&self.pool)
                .await?
                .ok_or_else(|| {
                    FarmError::not_found(format!("vdisk {vdisk_id} has no version {number}"))
                })
        };
        self.or_snapshot(db, |s| s.version(vdisk_id, number)).await
    }

    /// The path of a version's file on this host.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn version_path(&self, vdisk: &VDisk, v: &Version) -> Result<PathBuf> {
        Ok(self
            .store_dir(vdisk.store_id, None)
            .await?
            .join(&v.file_name))
    }

    /// Live sessions of devices of `device_type` on a version.
    async fn booted(&self, vdisk_id: i64, number: i64, device_type: DeviceType) -> Result<i64> {
        let now = self.now_ms();
        Ok(sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM sessions s LEFT JOIN session_counters c ON c.session_id = s.id \
             WHERE s.vdisk_id = $1 AND s.version_number = $2 AND s.device_type = $3 \
             AND s.expires_at_ms > $4 AND {}",
            crate::counters::machine_there(5)
        ))
        .bind(vdisk_id)
        .bind(number)
        .bind(device_type.as_str())
        .bind(now)
        .bind(now.saturating_sub(crate::counters::SESSION_SILENT_MS))
        .fetch_one(&self.pool)
        .await?)
    }

    /// Ends the sessions of `device_type` on version `number` of `vdisk_id` that
    /// [`Farm::booted`] no longer counts (ended by their machines, or silent for
    /// `counters::SESSION_SILENT_MS`): their machines are gone, and a server still holding
    /// one closes it at its next recheck.
    async fn end_silent(&self, vdisk_id: i64, number: i64, device_type: DeviceType) -> Result<()> {
        let ended: Vec<String> = sqlx::query_scalar(
            "DELETE FROM sessions WHERE vdisk_id = $1 AND version_number = $2 \
             AND device_type = $3 RETURNING export_name",
        )
        .bind(vdisk_id)
        .bind(number)
        .bind(device_type.as_str())
        .fetch_all(&self.pool)
        .await?;
        for export in &ended {
            self.sessions.remove(export);
        }
        if !ended.is_empty() {
            tracing::info!(
                vdisk_id,
                version = number,
                sessions = ended.len(),
                "ended sessions whose machines went silent"
            );
        }
        Ok(())
    }

    /// `new`: a new differencing version `NAME.N.avhdx` on the newest version, in
    /// maintenance. When the farm's automatic merge threshold is reached, the chain is first
    /// merged into a new base with the newest version's access mode.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] while a maintenance version
    /// exists or at [`VERSIONS_MAX`]; [`crate::Kind::Image`].
    pub async fn new_version(&self, vdisk_id: i64, actor: &str) -> Result<Version> {
        let _held = self.lock_vdisk(vdisk_id).await?;
        let vdisk = self.vdisk(vdisk_id).await?;
        let mut versions = self.versions(vdisk_id).await?;
        check_no_maintenance(&versions)?;
        let max = self.settings().await?.auto_merge_chain_max;
        let top = newest(&versions)?.clone();
        if max > 0 && chain_len(&versions, top.number) >= max {
            let access = top.access;
            self.merge_locked(&vdisk, &versions, MergeMode::Base, access, "auto")
                .await?;
            versions = self.versions(vdisk_id).await?;
        }
        let parent = newest(&versions)?.clone();
        let bucket = self.bucket_store(vdisk.store_id).await?;
        let name_of = |n: i64| format!("{}.{n}.avhdx", vdisk.name);
        let number = self
            .unused_number(bucket.as_ref(), parent.number + 1, &vdisk.name)
            .await?;
        let file_name = name_of(number);
        let dir = self.store_dir(vdisk.store_id, None).await?;
        let (parent_path, child) = (dir.join(&parent.file_name), dir.join(&file_name));
        let (p, d) = (parent_path.clone(), dir.clone());
        let found = blocking(format!("open {}", parent.file_name), move || {
            confine::chain_outside(&d, &p)
        })
        .await?;
        confine::check_chain(found, Kind::Conflict, &parent.file_name, &dir)?;
        let c = child.clone();
        blocking(format!("create {file_name}"), move || {
            disk::version::new_version(&parent_path, &c)
        })
        .await?;
        let v = self.version_row(vdisk_id, number, file_name, Some(parent.number), actor);
        let v = Version {
            access: AccessMode::Maintenance,
            origin: "new".to_string(),
            ..v
        };
        self.commit_version(&v, &child, "version.new", actor).await
    }

    /// `merge`: merged updates (`NAME.N.avhdx` on the base) or merged base (`NAME.N.vhdx`)
    /// of the newest version's chain, as version N with the access mode asked for.
    ///
    /// # Errors
    /// [`crate::Kind::Conflict`] while a maintenance version exists, or for merged updates
    /// of a chain that is only a base; [`crate::Kind::Image`].
    pub async fn merge(&self, vdisk_id: i64, m: &MergeRequest, actor: &str) -> Result<Version> {
        let _held = self.lock_vdisk(vdisk_id).await?;
        let vdisk = self.vdisk(vdisk_id).await?;
        let versions = self.versions(vdisk_id).await?;
        self.merge_locked(&vdisk, &versions, m.mode, m.access, actor)
            .await
    }

    async fn merge_locked(
        &self,
        vdisk: &VDisk,
        versions: &[Version],
        mode: MergeMode,
        access: AccessMode,
        actor: &str,
    ) -> Result<Version> {
        check_no_maintenance(versions)?;
        let top = newest(versions)?;
        let parent = match mode {
            MergeMode::Base => None,
            MergeMode::Updates => {
                let base = chain_base(versions, top.number);
                if base == top.number {
                    return Err(FarmError::conflict(
                        "the newest version is a base: there are no updates to merge",
                    ));
                }
                Some(base)
            }
        };
        let ext = if parent.is_some() { "avhdx" } else { "vhdx" };
        let name_of = |n: i64| format!("{}.{n}.{ext}", vdisk.name);
        let bucket = self.bucket_store(vdisk.store_id).await?;
        let number = self
            .unused_number(bucket.as_ref(), top.number + 1, &vdisk.name)
            .await?;
        let file_name = name_of(number);
        let dir = self.store_dir(vdisk.store_id, None).await?;
        let (top_path, out) = (dir.join(&top.file_name), dir.join(&file_name));
        let (p, d) = (top_path.clone(), dir.clone());
        let found = blocking(format!("open {}", top.file_name), move || {
            confine::chain_outside(&d, &p)
        })
        .await?;
        confine::check_chain(found, Kind::Conflict, &top.file_name, &dir)?;
        let o = out.clone();
        blocking(format!("merge into {file_name}"), move || {
            let p = disk::ops::NoProgress;
            match mode {
                MergeMode::Base => disk::ops::merge::merge_base(&top_path, &o, &p),
                MergeMode::Updates => disk::ops::merge::merge_updates(&top_path, &o, &p),
            }
        })
        .await?;
        let origin = match mode {
            MergeMode::Base => "merged_base",
            MergeMode::Updates => "merged_updates",
        };
        if access != AccessMode::Maintenance
            && let Err(e) = self
                .publish_file(bucket.as_ref(), out.clone(), &file_name)
                .await
        {
            let _ = std::fs::remove_file(&out);
            return Err(e);
        }
        let v = self.version_row(vdisk.id, number, file_name, parent, actor);
        let v = Version {
            access,
            origin: origin.to_string(),
            ..v
        };
        self.commit_version(&v, &out, "version.merge", actor).await
    }

    fn version_row(
        &self,
        vdisk_id: i64,
        number: i64,
        file_name: String,
        parent_number: Option<i64>,
        actor: &str,
    ) -> Version {
        let now = self.now_ms();
        Version {
            vdisk_id,
            number,
            file_name,
            parent_number,
            access: AccessMode::Maintenance,
            origin: String::new(),
            created_at_ms: now,
            created_by: actor.to_string(),
            changed_at_ms: now,
            changed_by: actor.to_string(),
        }
    }

    /// Inserts a version row whose file `path` exists; removes the file when it cannot.
    async fn commit_version(
        &self,
        v: &Version,
        path: &Path,
        action: &str,
        actor: &str,
    ) -> Result<Version> {
        let result = async {
            if v.number >= VERSIONS_MAX {
                return Err(FarmError::conflict(format!(
                    "a vdisk has at most {VERSIONS_MAX} versions"
                )));
            }
            let mut tx = self.pool.begin().await?;
            insert_version(&mut tx, v).await?;
            let detail = json!({ "number": v.number, "file": v.file_name, "access": v.access });
            let id = v.vdisk_id.to_string();
            audit(
                &mut tx,
                v.created_at_ms,
                actor,
                action,
                "vdisk",
                &id,
                &detail,
            )
            .await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        self.version(v.vdisk_id, v.number).await
    }

    /// `promote`: maintenance → test → production. A maintenance version is promoted only
    /// while no maintenance device is booted from it.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] past production or while booted.
    pub async fn promote(&self, vdisk_id: i64, number: i64, actor: &str) -> Result<Version> {
        let _held = self.lock_vdisk(vdisk_id).await?;
        let v = self.version(vdisk_id, number).await?;
        let to = match v.access {
            AccessMode::Maintenance => {
                if self
                    .booted(vdisk_id, number, DeviceType::Maintenance)
                    .await?
                    > 0
                {
                    return Err(FarmError::conflict(format!(
                        "version {number} is booted by a maintenance device; shut it down first"
                    )));
                }
                self.end_silent(vdisk_id, number, DeviceType::Maintenance)
                    .await?;
                // Leaving maintenance makes it immutable: a bucket store publishes it now.
                let vdisk = self.vdisk(vdisk_id).await?;
                let bucket = self.bucket_store(vdisk.store_id).await?;
                let path = self.version_path(&vdisk, &v).await?;
                self.publish_file(bucket.as_ref(), path, &v.file_name)
                    .await?;
                AccessMode::Test
            }
            AccessMode::Test => AccessMode::Production,
            AccessMode::Production => {
                return Err(FarmError::conflict(format!(
                    "version {number} is already in production"
                )));
            }
        };
        self.set_access(&v, to, "version.promote", actor).await
    }

    /// `revert`: production → test (while no production device is booted from it), test →
    /// maintenance (while no test device is, only for the newest version and when no other
    /// maintenance version exists).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`].
    pub async fn revert(&self, vdisk_id: i64, number: i64, actor: &str) -> Result<Version> {
        let _held = self.lock_vdisk(vdisk_id).await?;
        let versions = self.versions(vdisk_id).await?;
        let v = versions
            .iter()
            .find(|v| v.number == number)
            .ok_or_else(|| {
                FarmError::not_found(format!("vdisk {vdisk_id} has no version {number}"))
            })?;
        let (to, users) = match v.access {
            AccessMode::Production => (AccessMode::Test, DeviceType::Production),
            AccessMode::Test => {
                if newest(&versions)?.number != number {
                    return Err(FarmError::conflict(format!(
                        "only the newest version can go back to maintenance; version {number} \
                         has newer versions"
                    )));
                }
                check_no_maintenance(&versions)?;
                let vdisk = self.vdisk(vdisk_id).await?;
                if let Some(b) = self.bucket_store(vdisk.store_id).await? {
                    return Err(FarmError::conflict(format!(
                        "version {number} is published in {} and a published version is \
                         never rewritten; make a new version instead",
                        b.bucket
                    )));
                }
                (AccessMode::Maintenance, DeviceType::Test)
            }
            AccessMode::Maintenance => {
                return Err(FarmError::conflict(format!(
                    "version {number} is in maintenance: there is no step back"
                )));
            }
        };
        if self.booted(vdisk_id, number, users).await? > 0 {
            return Err(FarmError::conflict(format!(
                "version {number} is booted by a {users} device"
            )));
        }
        self.set_access(v, to, "version.revert", actor).await
    }

    async fn set_access(
        &self,
        v: &Version,
        to: AccessMode,
        action: &str,
        actor: &str,
    ) -> Result<Version> {
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE versions SET access = $1, changed_at_ms = $2, changed_by = $3 \
             WHERE vdisk_id = $4 AND number = $5",
        )
        .bind(to.as_str())
        .bind(now)
        .bind(actor)
        .bind(v.vdisk_id)
        .bind(v.number)
        .execute(&mut *tx)
        .await?;
        let detail = json!({ "number": v.number, "from": v.access, "to": to });
        audit(
            &mut tx,
            now,
            actor,
            action,
            "vdisk",
            &v.vdisk_id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        self.version(v.vdisk_id, v.number).await
    }

    /// `delete`: removes the newest version (not version 0) and its file, when no device
    /// is booted from it and none is pinned to it.
    /// In a bucket store the published objects stay in the bucket (see [`crate::publish`]).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`].
    pub async fn delete_version(&self, vdisk_id: i64, number: i64, actor: &str) -> Result<()> {
        let _held = self.lock_vdisk(vdisk_id).await?;
        let vdisk = self.vdisk(vdisk_id).await?;
        let versions = self.versions(vdisk_id).await?;
        let v = versions
            .iter()
            .find(|v| v.number == number)
            .ok_or_else(|| {
                FarmError::not_found(format!("vdisk {vdisk_id} has no version {number}"))
            })?;
        if newest(&versions)?.number != number {
            return Err(FarmError::conflict(format!(
                "only the newest version can be deleted; version {number} has newer versions"
            )));
        }
        if versions.len() == 1 {
            return Err(FarmError::conflict(
                "the only version of a vdisk cannot be deleted; delete the vdisk",
            ));
        }
        let live: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sessions WHERE vdisk_id = $1 AND version_number = $2 \
             AND expires_at_ms > $3",
        )
        .bind(vdisk_id)
        .bind(number)
        .bind(self.now_ms())
        .fetch_one(&self.pool)
        .await?;
        let pinned: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM devices WHERE vdisk_id = $1 AND pinned_version = $2",
        )
        .bind(vdisk_id)
        .bind(number)
        .fetch_one(&self.pool)
        .await?;
        if live > 0 || pinned > 0 {
            return Err(FarmError::conflict(format!(
                "version {number} is in use ({live} booted devices, {pinned} pinned devices)"
            )));
        }
        let path = self.version_path(&vdisk, v).await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM sessions WHERE vdisk_id = $1 AND version_number = $2")
            .bind(vdisk_id)
            .bind(number)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM versions WHERE vdisk_id = $1 AND number = $2")
            .bind(vdisk_id)
            .bind(number)
            .execute(&mut *tx)
            .await?;
        let detail = json!({ "number": number, "file": v.file_name });
        let id = vdisk_id.to_string();
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "version.delete",
            "vdisk",
            &id,
            &detail,
        )
        .await?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(FarmError::new(
                    Kind::Image,
                    format!("remove {}: {e}", path.display()),
                ));
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// The version a device of `device_type` boots: production → the pinned version or the
    /// newest production one; test → the newest test or production one; maintenance → the
    /// maintenance version.
    ///
    /// # Errors
    /// [`crate::Kind::Conflict`] when there is none.
    pub async fn boot_version(
        &self,
        vdisk_id: i64,
        device_type: DeviceType,
        pinned: Option<i64>,
    ) -> Result<Version> {
        let versions = self.versions(vdisk_id).await?;
        let pick = |modes: &[AccessMode]| {
            versions
                .iter()
                .rev()
                .find(|v| modes.contains(&v.access))
                .cloned()
        };
        let found = match (device_type, pinned) {
            (DeviceType::Production, Some(n)) => versions
                .iter()
                .find(|v| v.number == n && v.access != AccessMode::Maintenance)
                .cloned(),
            (DeviceType::Production, None) => pick(&[AccessMode::Production]),
            (DeviceType::Test, _) => pick(&[AccessMode::Test, AccessMode::Production]),
            (DeviceType::Maintenance, _) => pick(&[AccessMode::Maintenance]),
        };
        found.ok_or_else(|| {
            FarmError::conflict(format!(
                "vdisk {vdisk_id} has no version a {device_type} device may boot"
            ))
        })
    }
}

fn newest(versions: &[Version]) -> Result<&Version> {
    versions
        .last()
        .ok_or_else(|| FarmError::conflict("the vdisk has no version"))
}

fn check_no_maintenance(versions: &[Version]) -> Result<()> {
    match versions
        .iter()
        .find(|v| v.access == AccessMode::Maintenance)
    {
        Some(m) => Err(FarmError::conflict(format!(
            "version {} is in maintenance; promote or delete it first",
            m.number
        ))),
        None => Ok(()),
    }
}

/// The number of files in the chain of version `number`.
fn chain_len(versions: &[Version], number: i64) -> i64 {
    let by_number: BTreeMap<i64, &Version> = versions.iter().map(|v| (v.number, v)).collect();
    let mut n = 0;
    let mut at = Some(number);
    while let Some(k) = at {
        n += 1;
        at = by_number.get(&k).and_then(|v| v.parent_number);
        if n > VERSIONS_MAX {
            break;
        }
    }
    n
}

/// The number of the base of version `number`'s chain.
fn chain_base(versions: &[Version], number: i64) -> i64 {
    let by_number: BTreeMap<i64, &Version> = versions.iter().map(|v| (v.number, v)).collect();
    let mut at = number;
    for _ in 0..VERSIONS_MAX {
        match by_number.get(&at).and_then(|v| v.parent_number) {
            Some(p) => at = p,
            None => break,
        }
    }
    at
}

pub(crate) async fn insert_version(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    v: &Version,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO versions (vdisk_id, number, file_name, parent_number, access, origin, \
         created_at_ms, created_by, changed_at_ms, changed_by) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(v.vdisk_id)
    .bind(v.number)
    .bind(&v.file_name)
    .bind(v.parent_number)
    .bind(v.access.as_str())
    .bind(&v.origin)
    .bind(v.created_at_ms)
    .bind(&v.created_by)
    .bind(v.changed_at_ms)
    .bind(&v.changed_by)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
