//! vDisks: list, get, add (import `NAME.vhdx` from the store, or create it empty), change
//! and remove. Their versions and the lifecycle are in [`crate::lifecycle`].

use std::path::Path;

use serde_json::json;

use crate::confine;
use crate::db::{Farm, audit};
use crate::error::{FarmError, Kind, Result};
use crate::input::{NewVDisk, VDiskPatch};
use crate::lifecycle::{blocking, insert_version};
use crate::model::{AccessMode, CacheMode, Page, VDisk, Version};
use crate::validate;

/// The logical sector size of the vDisks the farm creates; their size is a multiple of it.
pub const SECTOR_BYTES: i64 = 512;
/// The default RAM cache of a new vDisk's devices: 1 GiB.
pub const RAM_BYTES_DEFAULT: i64 = 1 << 30;

pub(crate) const VDISK_COLUMNS: &str = "id, store_id, name, cache_mode, ram_bytes, description, size_bytes, created_at_ms, \
     boot_cmdline, boot_kernel, boot_initrd";

impl Farm {
    /// A page of vDisks.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_vdisks(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<VDisk>> {
        self.page_of("vdisks", VDISK_COLUMNS, "id", None, limit, offset)
            .await
    }

    /// One vDisk.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn vdisk(&self, id: i64) -> Result<VDisk> {
        let db = self.one("vdisks", VDISK_COLUMNS, "vdisk", id);
        self.or_snapshot(db, |s| s.vdisk(id)).await
    }

    /// The vDisk of that name (in any store; the first by id).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn vdisk_by_name(&self, name: &str) -> Result<VDisk> {
        let sql = format!("SELECT {VDISK_COLUMNS} FROM vdisks WHERE name = $1 ORDER BY id");
        sqlx::query_as(&sql)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| FarmError::not_found(format!("no vdisk named {name:?}")))
    }

    /// Adds a vDisk: imports `NAME.vhdx` from the store as version 0 (production), or
    /// creates it empty with `size_bytes`.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`] for an unknown store or a
    /// missing file without `size_bytes`; [`crate::Kind::Conflict`] for a duplicate name;
    /// [`crate::Kind::Image`].
    pub async fn create_vdisk(&self, n: &NewVDisk, actor: &str) -> Result<VDisk> {
        validate::name("name", &n.name)?;
        validate::text("description", &n.description)?;
        let ram = n.ram_bytes.unwrap_or(RAM_BYTES_DEFAULT);
        validate::size("ram_bytes", ram)?;
        if let Some(s) = n.size_bytes {
            validate::size("size_bytes", s)?;
            if s % SECTOR_BYTES != 0 {
                return Err(FarmError::invalid(format!(
                    "size_bytes must be a multiple of {SECTOR_BYTES}"
                )));
            }
        }
        let dir = self.store_dir(n.store_id, None).await?;
        let file_name = format!("{}.vhdx", n.name);
        let path = dir.join(&file_name);
        let created = !path.exists();
        if created {
            let size = n.size_bytes.ok_or_else(|| {
                FarmError::not_found(format!(
                    "no file {file_name} in the store; give size_bytes to create one"
                ))
            })?;
            let size = u64::try_from(size).unwrap_or(0);
            let p = path.clone();
            blocking(format!("create {file_name}"), move || create_vhdx(&p, size)).await?;
        }
        let (p, d) = (path.clone(), dir.clone());
        let opened = blocking(format!("open {file_name}"), move || {
            Ok((confine::chain_outside(&d, &p)?, virtual_size(&p)?))
        })
        .await;
        let result = async {
            let (found, size) = opened?;
            confine::check_chain(found, Kind::InvalidInput, &file_name, &dir)?;
            // Version 0 is production: a bucket store publishes it first.
            let bucket = self.bucket_store(n.store_id).await?;
            self.publish_file(bucket.as_ref(), path.clone(), &file_name)
                .await?;
            self.insert_vdisk(n, ram, size, created, actor).await
        }
        .await;
        if result.is_err() && created {
            let _ = std::fs::remove_file(&path);
        }
        result
    }

    async fn insert_vdisk(
        &self,
        n: &NewVDisk,
        ram: i64,
        size: u64,
        created: bool,
        actor: &str,
    ) -> Result<VDisk> {
        let size = i64::try_from(size).map_err(|_| FarmError::invalid("image too large"))?;
        let now = self.now_ms();
        let mode = n.cache_mode.unwrap_or(CacheMode::RamOverflow);
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO vdisks (store_id, name, cache_mode, ram_bytes, description, size_bytes, \
             created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(n.store_id)
        .bind(&n.name)
        .bind(mode.farm_name())
        .bind(ram)
        .bind(&n.description)
        .bind(size)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let origin = if created { "base" } else { "imported" };
        let v = Version {
            vdisk_id: id,
            number: 0,
            file_name: format!("{}.vhdx", n.name),
            parent_number: None,
            access: AccessMode::Production,
            origin: origin.to_string(),
            created_at_ms: now,
            created_by: actor.to_string(),
            changed_at_ms: now,
            changed_by: actor.to_string(),
        };
        insert_version(&mut tx, &v).await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            now,
            actor,
            "vdisk.create",
            "vdisk",
            &id_s,
            &json!(n),
        )
        .await?;
        tx.commit().await?;
        self.vdisk(id).await
    }

    /// Changes a vDisk's properties.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`].
    pub async fn update_vdisk(&self, id: i64, p: &VDiskPatch, actor: &str) -> Result<VDisk> {
        let mut v = self.vdisk(id).await?;
        if let Some(m) = p.cache_mode {
            v.cache_mode = m;
        }
        if let Some(r) = p.ram_bytes {
            validate::size("ram_bytes", r)?;
            v.ram_bytes = r;
        }
        if let Some(d) = &p.description {
            validate::text("description", d)?;
            v.description.clone_from(d);
        }
        if let Some(c) = &p.boot_cmdline {
            validate::boot_cmdline(c)?;
            v.boot_cmdline.clone_from(c);
        }
        if let Some(k) = &p.boot_kernel {
            if let Some(k) = k {
                validate::boot_path("boot_kernel", k)?;
            }
            v.boot_kernel.clone_from(k);
        }
        if let Some(i) = &p.boot_initrd {
            if let Some(i) = i {
                validate::boot_path("boot_initrd", i)?;
            }
            v.boot_initrd.clone_from(i);
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE vdisks SET cache_mode = $1, ram_bytes = $2, description = $3, \
             boot_cmdline = $4, boot_kernel = $5, boot_initrd = $6 WHERE id = $7",
        )
        .bind(v.cache_mode.farm_name())
        .bind(v.ram_bytes)
        .bind(&v.description)
        .bind(&v.boot_cmdline)
        .bind(v.boot_kernel.as_deref())
        .bind(v.boot_initrd.as_deref())
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "vdisk.update",
            "vdisk",
            &id_s,
            &json!(p),
        )
        .await?;
        tx.commit().await?;
        Ok(v)
    }

    /// Removes a vDisk from the farm (its files stay in the store). Refused while devices,
    /// collections or sessions refer to it.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`].
    pub async fn delete_vdisk(&self, id: i64, actor: &str) -> Result<()> {
        let _held = self.lock_vdisk(id).await?;
        self.vdisk(id).await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM versions WHERE vdisk_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM vdisks WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let id_s = id.to_string();
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "vdisk.delete",
            "vdisk",
            &id_s,
            &json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Creates an empty dynamic VHDX, refusing to overwrite; removes it when creation fails.
fn create_vhdx(path: &Path, size: u64) -> disk::Result<()> {
    let opts = disk::vhdx::CreateOptions {
        size,
        ..disk::vhdx::CreateOptions::default()
    };
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| disk::Error::io(format!("create {}", path.display()), e))?;
    let storage: std::sync::Arc<dyn disk::Storage> = std::sync::Arc::new(disk::FileStorage::new(f));
    let r = disk::vhdx::create(&storage, &opts);
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r
}

/// The virtual size of the image at `path` (its chain opened read-only).
fn virtual_size(path: &Path) -> disk::Result<u64> {
    let chain = disk::open::open(path, disk::open::OpenOptions::default())?;
    Ok(chain.top().geometry().size)
}
