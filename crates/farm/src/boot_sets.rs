//! Boot sets in the farm (issue 21): a version's encoded boot set, kept by the server that
//! recorded it and read by every server, so it follows the version; dropped with the
//! version (`ON DELETE CASCADE` in migration 0006) or cleared by an administrator.
//!
//! The bytes are opaque here (the `bootset` crate's encoding, checked by whoever decodes
//! them); this module bounds their size and keeps a summary beside them.

use serde_json::json;

use crate::Farm;
use crate::db::audit;
use crate::error::{FarmError, Kind, Result};

/// The largest encoded set the farm keeps (the `bootset` codec's own limit is 16 MiB of
/// extents plus a header).
pub const BOOT_SET_BYTES_MAX: usize = 17 << 20;
/// The most vDisks [`Farm::production_boot_sets`] names at once.
pub const PRODUCTION_SETS_MAX: usize = 10_000;

/// A boot set's summary, as the farm keeps it beside the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct BootSetSummary {
    /// Boots merged into it.
    pub boots: i64,
    /// Its extents.
    pub extents: i64,
    /// The bytes it covers.
    pub bytes: i64,
    /// When it was last saved.
    pub recorded_at_ms: i64,
}

impl Farm {
    /// Keeps `encoded` (summarised by `boots`, `extents` and `bytes`) as the boot set of
    /// vDisk `vdisk` version `number`, replacing any.
    ///
    /// # Errors
    /// [`Kind::NotFound`] for an unknown vDisk or version; [`Kind::InvalidInput`] for a set
    /// over [`BOOT_SET_BYTES_MAX`].
    pub async fn save_boot_set(
        &self,
        vdisk: &str,
        number: i64,
        encoded: &[u8],
        (boots, extents, bytes): (i64, i64, i64),
    ) -> Result<()> {
        if encoded.len() > BOOT_SET_BYTES_MAX {
            return Err(FarmError::new(
                Kind::InvalidInput,
                format!(
                    "boot set of {} bytes (limit {BOOT_SET_BYTES_MAX})",
                    encoded.len()
                ),
            ));
        }
        let v = self.vdisk_by_name(vdisk).await?;
        self.version(v.id, number).await?;
        sqlx::query(
            "INSERT INTO boot_sets (vdisk_id, number, encoded, boots, extents, bytes, recorded_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (vdisk_id, number) DO UPDATE SET encoded = excluded.encoded, \
             boots = excluded.boots, extents = excluded.extents, bytes = excluded.bytes, \
             recorded_at_ms = excluded.recorded_at_ms",
        )
        .bind(v.id)
        .bind(number)
        .bind(encoded.to_vec())
        .bind(boots)
        .bind(extents)
        .bind(bytes)
        .bind(self.now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The encoded boot set of vDisk `vdisk` (by name) version `number`, if it has one.
    ///
    /// # Errors
    /// Database errors.
    pub async fn boot_set_by_name(&self, vdisk: &str, number: i64) -> Result<Option<Vec<u8>>> {
        Ok(sqlx::query_scalar(
            "SELECT b.encoded FROM boot_sets b JOIN vdisks v ON v.id = b.vdisk_id \
             WHERE v.name = $1 AND b.number = $2 ORDER BY v.id LIMIT 1",
        )
        .bind(vdisk)
        .bind(number)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Each vDisk's newest production version (what its production devices boot), by
    /// vDisk name, when that version has a boot set: what a farm server prefetches when a
    /// version is promoted, and when it starts. At most [`PRODUCTION_SETS_MAX`].
    ///
    /// # Errors
    /// Database errors.
    pub async fn production_boot_sets(&self) -> Result<Vec<(String, i64)>> {
        let limit = i64::try_from(PRODUCTION_SETS_MAX).unwrap_or(i64::MAX);
        Ok(sqlx::query_as(
            "SELECT v.name, p.number FROM \
             (SELECT vdisk_id, MAX(number) AS number FROM versions \
              WHERE access = 'production' GROUP BY vdisk_id) p \
             JOIN vdisks v ON v.id = p.vdisk_id \
             JOIN boot_sets b ON b.vdisk_id = p.vdisk_id AND b.number = p.number \
             ORDER BY v.name LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The summary and bytes of the boot set of vDisk `vdisk_id` version `number`, if any.
    ///
    /// # Errors
    /// [`Kind::NotFound`] for an unknown version.
    pub async fn boot_set(
        &self,
        vdisk_id: i64,
        number: i64,
    ) -> Result<Option<(BootSetSummary, Vec<u8>)>> {
        self.version(vdisk_id, number).await?;
        let row: Option<(i64, i64, i64, i64, Vec<u8>)> = sqlx::query_as(
            "SELECT boots, extents, bytes, recorded_at_ms, encoded FROM boot_sets \
             WHERE vdisk_id = $1 AND number = $2",
        )
        .bind(vdisk_id)
        .bind(number)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(boots, extents, bytes, recorded_at_ms, encoded)| {
            (
                BootSetSummary {
                    boots,
                    extents,
                    bytes,
                    recorded_at_ms,
                },
                encoded,
            )
        }))
    }

    /// Clears the boot set of vDisk `vdisk_id` version `number` (the next boots record a
    /// new one); returns whether there was one. Audited.
    ///
    /// # Errors
    /// [`Kind::NotFound`] for an unknown version.
    pub async fn clear_boot_set(&self, vdisk_id: i64, number: i64, actor: &str) -> Result<bool> {
        self.version(vdisk_id, number).await?;
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("DELETE FROM boot_sets WHERE vdisk_id = $1 AND number = $2")
            .bind(vdisk_id)
            .bind(number)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "clear_boot_set",
            "version",
            &format!("{vdisk_id}/{number}"),
            &json!({"cleared": n > 0}),
        )
        .await?;
        tx.commit().await?;
        Ok(n > 0)
    }
}
