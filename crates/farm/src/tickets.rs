//! Login tickets: the weaker identity of a diskless machine that can keep no key of its own.
//!
//! ```text
//!   GET /boot/ipxe/{mac} (boot port) ──► Farm::issue_boot_ticket(mac) ─► ferry.ticket=ft_…
//!                                        on that MAC's kernel command line
//!   POST /api/v1/login {mac, ticket} ──► Farm::consume_ticket: one use, that MAC, before
//!                                        it expires (FarmSettings::boot_ticket_secs)
//! ```
//!
//! # Design notes
//!
//! A ticket is 32 random bytes (`ft_` and 64 hex digits); the database keeps only its
//! SHA-256, so a copy of the database shows no live ticket. It is bound to the MAC whose
//! boot script carried it and to that boot: single use, and valid for
//! `boot_ticket_secs` (default [`BOOT_TICKET_SECS_DEFAULT`]: the time from the script to the
//! agent's login, the kernel and initramfs loaded and started in between). A MAC has at
//! most [`TICKETS_PER_MAC_MAX`] outstanding (a new script drops the oldest), the farm at
//! most [`TICKETS_MAX`], so fetching scripts cannot fill the table.
//!
//! Only a device the farm may log in by ticket gets one: a device marked diskless, or an
//! unknown MAC when a collection adds devices (the ticket's login adds it, diskless). A
//! device with a disk never gets one and never accepts one ([`crate::login`]). Whoever
//! fetches a MAC's boot script inside the window can log in as that device once: the limit
//! of this mode, stated in docs/threat-model.md.

use contract::Mac;
use contract::login::TICKET_PREFIX;

use crate::db::random_bytes;
use crate::db::{Farm, hash_secret};
use crate::error::{FarmError, Kind, Result};
use crate::validate;

/// The most outstanding tickets of the farm; past it, boot scripts are refused until some
/// expire.
pub const TICKETS_MAX: i64 = 10_000;
/// The most outstanding tickets of one MAC (a new boot script drops its oldest).
pub const TICKETS_PER_MAC_MAX: i64 = 4;
/// A ticket's life unless the farm sets another (`boot_ticket_secs`).
pub const BOOT_TICKET_SECS_DEFAULT: i64 = 120;
/// The shortest and longest `boot_ticket_secs`.
pub const BOOT_TICKET_SECS_MIN: i64 = 5;
/// See [`BOOT_TICKET_SECS_MIN`].
pub const BOOT_TICKET_SECS_MAX: i64 = 3600;

impl Farm {
    /// A login ticket for one boot of `mac`, when the farm logs that MAC in by ticket (a
    /// diskless device, or an unknown MAC a collection would add); `None` for a device that
    /// is not diskless or keeps its key in its TPM, or an unknown MAC that nothing adds.
    ///
    /// # Errors
    /// [`Kind::InvalidInput`] for a malformed MAC; [`Kind::LimitReached`] with
    /// [`TICKETS_MAX`] outstanding.
    pub async fn issue_boot_ticket(&self, mac: &str) -> Result<Option<String>> {
        let mac: Mac = validate::mac(mac)?;
        let takes = match self.device_by_mac(&mac.to_string()).await? {
            Some(d) => d.diskless.0 && !self.tpm_bound(d.id).await?,
            None => self.auto_add_collection().await?.is_some(),
        };
        if !takes {
            return Ok(None);
        }
        let secs = self
            .or_snapshot(self.boot_ticket_secs_db(), |s| Ok(s.boot_ticket_secs()))
            .await?;
        let m = mac.to_string();
        let db = self.issue_boot_ticket_db(mac, secs);
        self.or_snapshot(db, |_| self.offline_ticket(&m, secs).map(Some))
            .await
    }

    /// How long a boot ticket lives (seconds), from the database.
    pub(crate) async fn boot_ticket_secs_db(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT boot_ticket_secs FROM farm WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(BOOT_TICKET_SECS_DEFAULT),
        )
    }

    async fn issue_boot_ticket_db(&self, mac: Mac, secs: i64) -> Result<Option<String>> {
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM login_tickets WHERE expires_at_ms <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "DELETE FROM login_tickets WHERE mac = $1 AND ticket_hash NOT IN (SELECT \
             ticket_hash FROM login_tickets WHERE mac = $1 ORDER BY expires_at_ms DESC \
             LIMIT $2)",
        )
        .bind(mac.to_string())
        .bind(TICKETS_PER_MAC_MAX - 1)
        .execute(&mut *tx)
        .await?;
        let outstanding: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM login_tickets")
            .fetch_one(&mut *tx)
            .await?;
        if outstanding >= TICKETS_MAX {
            return Err(FarmError::new(
                Kind::LimitReached,
                "too many boots under way; try again in a minute",
            ));
        }
        let ticket = format!("{TICKET_PREFIX}{}", hex::encode(random_bytes::<32>()));
        sqlx::query(
            "INSERT INTO login_tickets (ticket_hash, mac, expires_at_ms) VALUES ($1, $2, $3)",
        )
        .bind(hash_secret(&ticket))
        .bind(mac.to_string())
        .bind(now.saturating_add(secs.saturating_mul(1000)))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(ticket))
    }

    /// Uses up `ticket` for `mac`: true when it was outstanding, of that MAC and not
    /// expired (a ticket of another MAC stays outstanding for its own).
    pub(crate) async fn consume_ticket(&self, mac: Mac, ticket: &str) -> Result<bool> {
        validate::text("ticket", ticket)?;
        // One this process issued while the database was away.
        if let Some(live) =
            self.offline
                .take_ticket(&hash_secret(ticket), &mac.to_string(), self.now_ms())
        {
            return Ok(live);
        }
        let used: Option<String> = sqlx::query_scalar(
            "DELETE FROM login_tickets WHERE ticket_hash = $1 AND mac = $2 \
             AND expires_at_ms > $3 RETURNING mac",
        )
        .bind(hash_secret(ticket))
        .bind(mac.to_string())
        .bind(self.now_ms())
        .fetch_optional(&self.pool)
        .await?;
        Ok(used.is_some())
    }
}
