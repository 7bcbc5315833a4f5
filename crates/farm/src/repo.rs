//! The typed repository: list, get, create, change and delete the farm's objects. Every
//! change runs in one transaction with its audit entry, so a failed change leaves nothing.
//!
//! This file holds the shared row helpers and the farm settings, tokens, audit log, sites,
//! servers and stores; [`crate::devices`] holds collections, devices and sessions, and
//! [`crate::vdisks`] and [`crate::lifecycle`] the vDisks and their versions.

use std::path::PathBuf;

use serde_json::json;
use sqlx::any::AnyRow;

use crate::confine;
use crate::db::{Farm, audit, hash_secret};
use crate::error::{FarmError, Result};
use crate::input::{NewSite, NewStore, NewToken, SettingsPatch, StorePath};
use crate::model::{AuditEntry, FarmSettings, Page, Server, Site, Store, StorePathOverride, Token};
use crate::validate;

/// The largest automatic-merge threshold.
pub const AUTO_MERGE_CHAIN_MAX: i64 = 64;

/// One filter of a list: `column = value`.
pub(crate) type Filter<'a> = Option<(&'a str, i64)>;

impl Farm {
    /// A page of `table`'s rows (`columns`), ordered by `order`, optionally filtered.
    pub(crate) async fn page_of<T>(
        &self,
        table: &str,
        columns: &str,
        order: &str,
        filter: Filter<'_>,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<T>>
    where
        T: for<'r> sqlx::FromRow<'r, AnyRow> + Send + Unpin,
    {
        let (limit, offset) = validate::page(limit, offset)?;
        let (where_sql, first) = match filter {
            Some((col, _)) => (format!("WHERE {col} = $1"), 2),
            None => (String::new(), 1),
        };
        let select = format!(
            "SELECT {columns} FROM {table} {where_sql} ORDER BY {order} LIMIT ${first} OFFSET ${}",
            first + 1
        );
        let count = format!("SELECT COUNT(*) FROM {table} {where_sql}");
        let mut q = sqlx::query_as::<_, T>(&select);
        let mut c = sqlx::query_scalar::<_, i64>(&count);
        if let Some((_, v)) = filter {
            q = q.bind(v);
            c = c.bind(v);
        }
        let items = q.bind(limit).bind(offset).fetch_all(&self.pool).await?;
        let total = c.fetch_one(&self.pool).await?;
        Ok(Page {
            items,
            total,
            limit,
            offset,
        })
    }

    /// One row by id, or [`crate::Kind::NotFound`] naming `what`.
    pub(crate) async fn one<T>(&self, table: &str, columns: &str, what: &str, id: i64) -> Result<T>
    where
        T: for<'r> sqlx::FromRow<'r, AnyRow> + Send + Unpin,
    {
        let sql = format!("SELECT {columns} FROM {table} WHERE id = $1");
        sqlx::query_as::<_, T>(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| FarmError::not_found(format!("no {what} with id {id}")))
    }

    /// Deletes one row by id with its audit entry.
    pub(crate) async fn delete_row(
        &self,
        table: &str,
        what: &str,
        id: i64,
        actor: &str,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let sql = format!("DELETE FROM {table} WHERE id = $1");
        let n = sqlx::query(&sql).bind(id).execute(&mut *tx).await?;
        if n.rows_affected() == 0 {
            return Err(FarmError::not_found(format!("no {what} with id {id}")));
        }
        let action = format!("{what}.delete");
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            &action,
            what,
            &id.to_string(),
            &json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    // ---- farm settings, tokens, audit ---------------------------------------------------

    /// The farm settings.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`] when the farm is not initialized.
    pub async fn settings(&self) -> Result<FarmSettings> {
        sqlx::query_as(
            "SELECT name, auto_merge_chain_max, boot_ticket_secs, created_at_ms FROM farm \
             WHERE id = 1",
        )
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| FarmError::not_found("the farm is not initialized"))
    }

    /// Changes the farm settings.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::NotFound`].
    pub async fn update_settings(&self, p: &SettingsPatch, actor: &str) -> Result<FarmSettings> {
        let old = self.settings().await?;
        let name = p.name.clone().unwrap_or(old.name);
        validate::name("name", &name)?;
        let max = p.auto_merge_chain_max.unwrap_or(old.auto_merge_chain_max);
        if !(0..=AUTO_MERGE_CHAIN_MAX).contains(&max) {
            return Err(FarmError::invalid(format!(
                "auto_merge_chain_max must be 0 to {AUTO_MERGE_CHAIN_MAX}"
            )));
        }
        use crate::tickets::{BOOT_TICKET_SECS_MAX, BOOT_TICKET_SECS_MIN};
        let ticket_secs = p.boot_ticket_secs.unwrap_or(old.boot_ticket_secs);
        if !(BOOT_TICKET_SECS_MIN..=BOOT_TICKET_SECS_MAX).contains(&ticket_secs) {
            return Err(FarmError::invalid(format!(
                "boot_ticket_secs must be {BOOT_TICKET_SECS_MIN} to {BOOT_TICKET_SECS_MAX}"
            )));
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE farm SET name = $1, auto_merge_chain_max = $2, boot_ticket_secs = $3 \
             WHERE id = 1",
        )
        .bind(&name)
        .bind(max)
        .bind(ticket_secs)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "farm.update",
            "farm",
            "1",
            &json!(p),
        )
        .await?;
        tx.commit().await?;
        self.settings().await
    }

    /// The token whose secret is `secret`, if any.
    ///
    /// # Errors
    /// [`crate::Kind::Database`].
    pub async fn authenticate(&self, secret: &str) -> Result<Option<Token>> {
        Ok(sqlx::query_as(
            "SELECT id, name, role, created_at_ms FROM api_tokens WHERE token_hash = $1",
        )
        .bind(hash_secret(secret))
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A page of tokens (never their secrets).
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_tokens(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Token>> {
        let cols = "id, name, role, created_at_ms";
        self.page_of("api_tokens", cols, "id", None, limit, offset)
            .await
    }

    /// Creates a token; returns its secret (shown once) and its public part.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::Conflict`] for a duplicate name.
    pub async fn create_token(&self, t: &NewToken, actor: &str) -> Result<(String, Token)> {
        let mut tx = self.pool.begin().await?;
        let (secret, id) = self.insert_token(&mut tx, &t.name, t.role, actor).await?;
        tx.commit().await?;
        let token = self
            .one("api_tokens", "id, name, role, created_at_ms", "token", id)
            .await?;
        Ok((secret, token))
    }

    /// Deletes a token.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn delete_token(&self, id: i64, actor: &str) -> Result<()> {
        self.delete_row("api_tokens", "token", id, actor).await
    }

    /// A page of the audit log, newest first.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_audit(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<AuditEntry>> {
        let cols = "id, at_ms, actor, action, object_type, object_id, detail";
        self.page_of("audit_log", cols, "id DESC", None, limit, offset)
            .await
    }

    // ---- sites and servers --------------------------------------------------------------

    /// A page of sites.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_sites(&self, limit: Option<i64>, offset: Option<i64>) -> Result<Page<Site>> {
        let cols = "id, name, description, created_at_ms";
        self.page_of("sites", cols, "id", None, limit, offset).await
    }

    /// One site.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn site(&self, id: i64) -> Result<Site> {
        self.one("sites", "id, name, description, created_at_ms", "site", id)
            .await
    }

    /// Creates a site.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`]; [`crate::Kind::Conflict`] for a duplicate name.
    pub async fn create_site(&self, s: &NewSite, actor: &str) -> Result<Site> {
        validate::name("name", &s.name)?;
        validate::text("description", &s.description)?;
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO sites (name, description, created_at_ms) VALUES ($1, $2, $3) \
             RETURNING id",
        )
        .bind(&s.name)
        .bind(&s.description)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        audit(
            &mut tx,
            now,
            actor,
            "site.create",
            "site",
            &id.to_string(),
            &json!(s),
        )
        .await?;
        tx.commit().await?;
        self.site(id).await
    }

    /// Deletes a site that has no servers and no collections.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] while it is used.
    pub async fn delete_site(&self, id: i64, actor: &str) -> Result<()> {
        self.delete_row("sites", "site", id, actor).await
    }

    /// A page of servers.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_servers(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Server>> {
        let cols = crate::balance::SERVER_COLUMNS;
        self.page_of("servers", cols, "id", None, limit, offset)
            .await
    }

    /// One server.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn server(&self, id: i64) -> Result<Server> {
        let cols = crate::balance::SERVER_COLUMNS;
        self.one("servers", cols, "server", id).await
    }

    /// Records a heartbeat of a server (not audited: it is not a change of configuration).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn heartbeat(&self, id: i64) -> Result<Server> {
        let beat = sqlx::query("UPDATE servers SET heartbeat_at_ms = $1 WHERE id = $2")
            .bind(self.now_ms())
            .bind(id)
            .execute(&self.pool);
        // The database's state is learnt here first (offline): marked up or down.
        let n = self.watch(async { Ok(beat.await?) }).await?;
        if n.rows_affected() == 0 {
            return Err(FarmError::not_found(format!("no server with id {id}")));
        }
        self.server(id).await
    }

    // ---- stores -------------------------------------------------------------------------

    /// A page of stores.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a bad page.
    pub async fn list_stores(
        &self,
        limit: Option<i64>,
        offset: Option<i64>,
    ) -> Result<Page<Store>> {
        self.page_of(
            "stores",
            "id, name, path, created_at_ms, bucket",
            "id",
            None,
            limit,
            offset,
        )
        .await
    }

    /// One store.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn store(&self, id: i64) -> Result<Store> {
        self.one(
            "stores",
            "id, name, path, created_at_ms, bucket",
            "store",
            id,
        )
        .await
    }

    /// The directory of a store on this host (`server_id`: use that server's override),
    /// canonical when it exists. It is checked on every call: a directory that left the
    /// store root (swapped for a symlink after its creation) is refused.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] for a directory outside the
    /// store root.
    pub async fn store_dir(&self, id: i64, server_id: Option<i64>) -> Result<PathBuf> {
        // The snapshot holds this server's directories (the one server a process is).
        self.or_snapshot(self.store_dir_db(id, server_id), |s| s.store_dir(id))
            .await
    }

    pub(crate) async fn store_dir_db(&self, id: i64, server_id: Option<i64>) -> Result<PathBuf> {
        let store = self.store(id).await?;
        let mut path = store.path;
        if let Some(server_id) = server_id {
            let o: Option<String> = sqlx::query_scalar(
                "SELECT path FROM store_paths WHERE store_id = $1 AND server_id = $2",
            )
            .bind(id)
            .bind(server_id)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(o) = o {
                path = o;
            }
        }
        let what = format!("store {id} ({})", store.name);
        confine::store_dir(self.store_root(), &self.store_root().join(path), &what)
    }

    /// Creates a store (and its directory under the store root).
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] (also for a path that escapes the store root);
    /// [`crate::Kind::Conflict`] for a duplicate name.
    pub async fn create_store(&self, s: &NewStore, actor: &str) -> Result<Store> {
        validate::name("name", &s.name)?;
        let path = validate::store_path(self.store_root(), &s.path)?;
        let bucket = validate::bucket_url("bucket", &s.bucket)?;
        let now = self.now_ms();
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO stores (name, path, created_at_ms, bucket) VALUES ($1, $2, $3, $4) \
             RETURNING id",
        )
        .bind(&s.name)
        .bind(&path)
        .bind(now)
        .bind(&bucket)
        .fetch_one(&mut *tx)
        .await?;
        let dir = self.store_root().join(&path);
        std::fs::create_dir_all(&dir).map_err(|e| {
            FarmError::invalid(format!("create store directory {}: {e}", dir.display()))
        })?;
        // A symlink put in the way between the check and the creation: the directory made
        // is outside; remove it (when empty) and refuse.
        if !confine::under(self.store_root(), &dir) {
            if let Ok(real) = dir.canonicalize() {
                let _ = std::fs::remove_dir(real);
            }
            return Err(FarmError::invalid(format!(
                "store path {:?} escapes the store root",
                s.path
            )));
        }
        let detail = json!({ "name": s.name, "path": path, "bucket": bucket });
        audit(
            &mut tx,
            now,
            actor,
            "store.create",
            "store",
            &id.to_string(),
            &detail,
        )
        .await?;
        tx.commit().await?;
        self.store(id).await
    }

    /// Deletes a store that holds no vDisk (its directory stays).
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`]; [`crate::Kind::Conflict`] while it holds vDisks.
    pub async fn delete_store(&self, id: i64, actor: &str) -> Result<()> {
        self.delete_row("stores", "store", id, actor).await
    }

    /// Sets the path of a store on one server.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`] for an unknown store or server; [`crate::Kind::InvalidInput`]
    /// for a path that escapes the store root.
    pub async fn set_store_path(
        &self,
        store_id: i64,
        server_id: i64,
        p: &StorePath,
        actor: &str,
    ) -> Result<StorePathOverride> {
        self.store(store_id).await?;
        self.server(server_id).await?;
        let path = validate::store_path(self.store_root(), &p.path)?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM store_paths WHERE store_id = $1 AND server_id = $2")
            .bind(store_id)
            .bind(server_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO store_paths (store_id, server_id, path) VALUES ($1, $2, $3)")
            .bind(store_id)
            .bind(server_id)
            .bind(&path)
            .execute(&mut *tx)
            .await?;
        let detail = json!({ "server_id": server_id, "path": path });
        let id = store_id.to_string();
        audit(
            &mut tx,
            self.now_ms(),
            actor,
            "store.set_path",
            "store",
            &id,
            &detail,
        )
        .await?;
        tx.commit().await?;
        Ok(StorePathOverride {
            store_id,
            server_id,
            path,
        })
    }

    /// The per-server paths of a store.
    ///
    /// # Errors
    /// [`crate::Kind::NotFound`].
    pub async fn store_paths(&self, store_id: i64) -> Result<Vec<StorePathOverride>> {
        self.store(store_id).await?;
        Ok(sqlx::query_as(
            "SELECT store_id, server_id, path FROM store_paths WHERE store_id = $1 \
             ORDER BY server_id",
        )
        .bind(store_id)
        .fetch_all(&self.pool)
        .await?)
    }
}
