//! Servers' identities (issue 31): a server registers by the random id it keeps in its state
//! directory, its name is a label no other identity may take, and an administrator removes
//! a server that is gone.
//!
//! ```text
//!   register(uid, name) ── row of uid? ── yes ─► update name, address, site (name free?)
//!                          │ no
//!                          └─ row of name? ── no ─► insert
//!                                │ yes, uid NULL (registered before ids) ─► adopt it
//!                                └ yes, another uid ─► Conflict: "already a server NAME"
//!   remove(id) ── heartbeat within SERVER_ALIVE_MS? ── yes ─► Conflict: "still running"
//!                 └ no ─► delete: out of every device's server list; its sessions' server
//!                         unknown (NULL), its store paths gone
//!   site_api_urls ── the API URLs the site's live servers registered (boot scripts)
//! ```

use serde_json::json;

use crate::db::{Farm, audit};
use crate::error::{FarmError, Result};
use crate::input::NewServer;
use crate::model::{SERVER_ALIVE_MS, Server};
use crate::validate;

/// The fewest and most hex digits of a server's uid.
pub const UID_HEX_MIN: usize = 16;
/// See [`UID_HEX_MIN`].
pub const UID_HEX_MAX: usize = 64;

/// A server row as registration sees it.
#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    name: String,
    address: String,
    uid: Option<String>,
}

/// Checks a server uid: [`UID_HEX_MIN`] to [`UID_HEX_MAX`] lowercase hex digits.
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn check_uid(uid: &str) -> Result<()> {
    if !(UID_HEX_MIN..=UID_HEX_MAX).contains(&uid.len())
        || !uid
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(FarmError::invalid(format!(
            "a server uid is {UID_HEX_MIN} to {UID_HEX_MAX} lowercase hex digits"
        )));
    }
    Ok(())
}

impl Farm {
    /// Registers a server (see the module's diagram), audited.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`] for an unknown site;
    /// [`crate::Kind::Conflict`] when the name belongs to another server.
    pub async fn register_server(&self, s: &NewServer, actor: &str) -> Result<Server> {
        validate::name("name", &s.name)?;
        validate::text("address", &s.address)?;
        if s.address.is_empty() {
            return Err(FarmError::invalid("address must not be empty"));
        }
        if let Some(uid) = &s.uid {
            check_uid(uid)?;
        }
        if let Some(url) = &s.api_url {
            validate::api_url(url)?;
        }
        self.site(s.site_id).await?;
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        let by_name: Option<Row> =
            sqlx::query_as("SELECT id, name, address, uid FROM servers WHERE name = $1")
                .bind(&s.name)
                .fetch_optional(&mut *tx)
                .await?;
        let by_uid: Option<Row> = match &s.uid {
            Some(uid) => {
                sqlx::query_as("SELECT id, name, address, uid FROM servers WHERE uid = $1")
                    .bind(uid)
                    .fetch_optional(&mut *tx)
                    .await?
            }
            None => None,
        };
        let taken = |r: &Row| {
            FarmError::conflict(format!(
                "there is already a server named {:?} in the farm (id {}, at {}), another \
                 server than this one: give this one its own --server-name, or remove that \
                 one if it is gone (`ferry farm server remove {}`)",
                r.name, r.id, r.address, r.id
            ))
        };
        let mine = match (by_uid, by_name) {
            (Some(me), Some(other)) if other.id != me.id => return Err(taken(&other)),
            (Some(me), _) => Some(me.id),
            (None, Some(named)) if named.uid.is_none() => Some(named.id),
            (None, Some(named)) => return Err(taken(&named)),
            (None, None) => None,
        };
        let id = if let Some(id) = mine {
            sqlx::query(
                "UPDATE servers SET site_id = $1, name = $2, address = $3, \
                 heartbeat_at_ms = $4, uid = COALESCE($5, uid), api_url = $6 WHERE id = $7",
            )
            .bind(s.site_id)
            .bind(&s.name)
            .bind(&s.address)
            .bind(now)
            .bind(s.uid.as_deref())
            .bind(s.api_url.as_deref())
            .bind(id)
            .execute(&mut *tx)
            .await?;
            id
        } else {
            sqlx::query_scalar(
                "INSERT INTO servers (site_id, name, address, registered_at_ms, \
                 heartbeat_at_ms, uid, api_url) VALUES ($1, $2, $3, $4, $4, $5, $6) RETURNING id",
            )
            .bind(s.site_id)
            .bind(&s.name)
            .bind(&s.address)
            .bind(now)
            .bind(s.uid.as_deref())
            .bind(s.api_url.as_deref())
            .fetch_one(&mut *tx)
            .await?
        };
        audit(
            &mut tx,
            now,
            actor,
            "server.register",
            "server",
            &id.to_string(),
            &json!({ "site_id": s.site_id, "name": s.name, "address": s.address,
                     "api_url": s.api_url }),
        )
        .await?;
        tx.commit().await?;
        self.server(id).await
    }

    /// Removes a server that is gone (no heartbeat for [`SERVER_ALIVE_MS`]), audited: it
    /// leaves every device's server list, its sessions' server becomes unknown (their next
    /// status report names the one they stream from), and its store paths go with it.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] while it still heartbeats.
    pub async fn remove_server(&self, id: i64, actor: &str) -> Result<Server> {
        let s = self.server(id).await?;
        let now = self.now_ms();
        let quiet = now.saturating_sub(s.heartbeat_at_ms);
        if quiet <= SERVER_ALIVE_MS {
            return Err(FarmError::conflict(format!(
                "server {id} ({}) is running: its last heartbeat was {} s ago; stop it \
                 first (drain it to move its devices), then remove it once it has been \
                 quiet for {} s",
                s.name,
                quiet / 1000,
                SERVER_ALIVE_MS / 1000
            )));
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE sessions SET server_id = NULL WHERE server_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM store_paths WHERE server_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM servers WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            now,
            actor,
            "server.remove",
            "server",
            &id.to_string(),
            &json!({ "name": s.name, "address": s.address }),
        )
        .await?;
        tx.commit().await?;
        Ok(s)
    }

    /// The API URLs (`api_url`) the live servers of the site of collection `collection_id`
    /// registered, serving ones first, then by id: what a boot script names beside its
    /// own server's, so that the device logs in and reports through another.
    ///
    /// # Errors
    /// Database errors; [`crate::Kind::NotFound`] for an unknown collection.
    pub async fn site_api_urls(&self, collection_id: i64) -> Result<Vec<String>> {
        let db = self.site_api_urls_db(collection_id);
        self.or_snapshot(db, |s| s.site_api_urls(collection_id))
            .await
    }

    pub(crate) async fn site_api_urls_db(&self, collection_id: i64) -> Result<Vec<String>> {
        let site = self.collection(collection_id).await?.site_id;
        let alive_since = self.now_ms().saturating_sub(SERVER_ALIVE_MS);
        Ok(sqlx::query_scalar(
            "SELECT api_url FROM servers WHERE site_id = $1 AND api_url IS NOT NULL \
             AND heartbeat_at_ms >= $2 ORDER BY draining, id",
        )
        .bind(site)
        .bind(alive_since)
        .fetch_all(&self.pool)
        .await?)
    }
}
