//! Credentials an administrator hands out: a device's new secret (a reset credential) and
//! administrator certificates for the NBD tools. Both are audit-logged. A device's secret
//! is 32 random bytes made for it alone, kept by the farm (`devices.device_key`) to check
//! its logins, and derived from nothing; a reset replaces it, so the old one stops working
//! at once. A certificate's key exists only in the directory it is written to.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{Any, Transaction};
use utoipa::ToSchema;

use crate::db::{Farm, audit};
use crate::error::{FarmError, Kind, Result};

/// The longest validity of an administrator certificate.
pub const ADMIN_CERT_DAYS_MAX: u32 = 3650;
/// The validity of an administrator certificate unless told.
pub const ADMIN_CERT_DAYS_DEFAULT: u32 = 30;

/// A device's new credential, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceCredential {
    /// The device's id.
    pub device_id: i64,
    /// Its MAC.
    pub mac: String,
    /// The credential's generation (earlier ones stop working).
    pub generation: i64,
    /// The device's secret (64 hex digits): the device proves its logins with it. Put it in
    /// the target's state file (docs/target.md).
    pub device_secret: String,
}

/// Stores `key_hex` as device `id`'s key, in `tx`, and returns the credential's new
/// generation (earlier keys stop working when `tx` commits).
///
/// # Errors
/// [`Kind::NotFound`] for an unknown device; database errors.
pub(crate) async fn store_device_key(
    tx: &mut Transaction<'_, Any>,
    id: i64,
    key_hex: &str,
) -> Result<i64> {
    sqlx::query_scalar(
        "UPDATE devices SET device_key = $1, \
         credential_generation = COALESCE(credential_generation, 0) + 1 \
         WHERE id = $2 RETURNING credential_generation",
    )
    .bind(key_hex)
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| FarmError::not_found(format!("no device {id}")))
}

impl Farm {
    /// Gives device `id` a new credential: a new random key, returned once (the farm keeps
    /// it to check logins); the old key stops working. This is how a device that keeps a
    /// secret (`ferry target` with a state directory) gets its first key.
    ///
    /// # Errors
    /// [`Kind::NotFound`].
    pub async fn reset_device_credential(&self, id: i64, actor: &str) -> Result<DeviceCredential> {
        let device = self.device(id).await?;
        let now = self.now_ms();
        let key = hex::encode(crate::db::random_bytes::<
            { contract::login::DEVICE_KEY_BYTES },
        >());
        let mut tx = self.pool.begin().await?;
        let generation = store_device_key(&mut tx, id, &key).await?;
        // A device that kept its old key in its TPM boots by ticket again, and seals the
        // key that ticket login gives it.
        sqlx::query("UPDATE devices SET tpm_bound = 0 WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let detail = json!({ "mac": device.mac, "generation": generation });
        audit(
            &mut tx,
            now,
            actor,
            "device.credential_reset",
            "device",
            &id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok(DeviceCredential {
            device_id: id,
            mac: device.mac,
            generation,
            device_secret: key,
        })
    }

    /// Issues an administrator's client certificate (`urn:ferry:admin:NAME`), valid for
    /// `days` (1 to [`ADMIN_CERT_DAYS_MAX`]); the caller writes it out. Returns the CA
    /// certificate (PEM) with it.
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for a bad name or validity; [`Kind::Secrets`] without a CA.
    pub async fn issue_admin_cert(
        &self,
        name: &str,
        days: u32,
        actor: &str,
    ) -> Result<(String, pki::Issued)> {
        let id = pki::Identity::admin(name).map_err(|e| FarmError::invalid(e.to_string()))?;
        if !(1..=ADMIN_CERT_DAYS_MAX).contains(&days) {
            return Err(FarmError::invalid(format!(
                "days must be 1 to {ADMIN_CERT_DAYS_MAX}"
            )));
        }
        let ca = self.authority()?;
        let validity = Duration::from_secs(u64::from(days) * 24 * 3600);
        let issued = ca
            .issue_client(&id, self.system_now(), validity)
            .map_err(|e| FarmError::new(Kind::Secrets, format!("admin certificate: {e}")))?;
        let mut tx = self.pool.begin().await?;
        let detail = json!({ "identity": id.to_string(), "not_after_unix": issued.not_after_unix });
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "cert.admin",
            "admin",
            name,
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok((ca.cert_pem().to_string(), issued))
    }

    /// Issues (or takes from the cache) server `name`'s certificate for `hosts`, as
    /// [`Farm::server_tls`], and audit-logs it.
    ///
    /// # Errors
    /// As [`Farm::server_tls`].
    pub async fn issue_server_cert(
        &self,
        name: &str,
        hosts: &[String],
        actor: &str,
    ) -> Result<(String, pki::Issued)> {
        let (ca, issued) = self.server_tls(name, hosts)?;
        let mut tx = self.pool.begin().await?;
        let detail = json!({ "hosts": hosts, "not_after_unix": issued.not_after_unix });
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "cert.server",
            "server",
            name,
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok((ca, issued))
    }
}
