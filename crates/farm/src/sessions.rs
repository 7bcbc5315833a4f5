//! The in-process table of device sessions: what the NBD server asks before it opens a
//! session-scoped export.
//!
//! A device that logs in (see [`crate::login`]) gets an export name that is a random,
//! unguessable string (`ferry-s-<32 hex>`). The login records the session in the database
//! (so that the lifecycle sees which versions are booted, and so that another server of the
//! farm can find it with [`crate::Farm::session_by_export`]) and here, so that the server
//! that granted it answers the NBD client's `NBD_OPT_GO` without a database round trip:
//!
//! ```text
//!   POST /api/v1/login ──► Farm::login ──► sessions row (DB) + SessionTable::insert
//!   NBD_OPT_GO "ferry-s-…" ──► SessionLookup::lookup(name, now) ──► Some(grant) → open
//!                                                                  None        → refuse
//! ```
//!
//! The table is bounded ([`SESSIONS_MAX`]); expired grants are dropped on lookup and by
//! [`SessionTable::purge_expired`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::RwLock;

use serde::Serialize;

use crate::error::{FarmError, Kind, Result};
use crate::model::{CacheMode, DeviceType};

/// The most live sessions one process keeps.
pub const SESSIONS_MAX: usize = 100_000;

/// What a session grants: one device reading (or, in private mode, writing) one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionGrant {
    /// The session's id (a UUID), as in the database.
    pub session_id: String,
    /// The session-scoped NBD export name.
    pub export_name: String,
    /// The device.
    pub device_id: i64,
    /// Its MAC address.
    pub mac: String,
    /// Its type at login.
    pub device_type: DeviceType,
    /// The vDisk.
    pub vdisk_id: i64,
    /// Its name.
    pub vdisk_name: String,
    /// The version number the device boots.
    pub version: i64,
    /// The store directory on this host.
    pub store_dir: PathBuf,
    /// The file at the top of the version's chain (open it with `disk::open::open`).
    pub path: PathBuf,
    /// Where the device's writes go.
    pub cache_mode: CacheMode,
    /// The device's RAM cache size.
    pub ram_bytes: i64,
    /// True in private mode: the export writes to `path` itself (one maintenance device).
    pub writable: bool,
    /// When the grant ends (Unix ms).
    pub expires_at_ms: i64,
}

/// The check the NBD server makes before serving a session export.
pub trait SessionLookup: Send + Sync {
    /// The live grant of `export_name` at `now_ms`, if any.
    fn lookup(&self, export_name: &str, now_ms: i64) -> Option<SessionGrant>;
}

/// Called with the export name of each session that ends: removed (`DELETE
/// /sessions/{id}`), replaced by the device's next login, or expired.
type EndListener = Box<dyn Fn(&str) + Send + Sync>;

/// Session grants by export name (see the module documentation).
#[derive(Default)]
pub struct SessionTable {
    grants: RwLock<HashMap<String, SessionGrant>>,
    on_end: RwLock<Vec<EndListener>>,
}

impl std::fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("grants", &self.len())
            .finish_non_exhaustive()
    }
}

impl SessionTable {
    /// An empty table.
    pub fn new() -> SessionTable {
        SessionTable::default()
    }

    /// Adds a grant, replacing any of the same device (one session per device).
    ///
    /// # Errors
    /// [`Kind::LimitReached`] when [`SESSIONS_MAX`] live grants exist.
    pub fn insert(&self, grant: SessionGrant, now_ms: i64) -> Result<()> {
        let mut g = self.write();
        let mut ended = Vec::new();
        g.retain(|name, s| {
            let keep = (s.expires_at_ms > now_ms && s.device_id != grant.device_id)
                || *name == grant.export_name;
            if !keep {
                ended.push(name.clone());
            }
            keep
        });
        if g.len() >= SESSIONS_MAX && !g.contains_key(&grant.export_name) {
            drop(g);
            self.ended(&ended);
            return Err(FarmError::new(
                Kind::LimitReached,
                format!("more than {SESSIONS_MAX} live sessions"),
            ));
        }
        g.insert(grant.export_name.clone(), grant);
        drop(g);
        self.ended(&ended);
        Ok(())
    }

    /// Removes the grant of `export_name` (its session ended).
    pub fn remove(&self, export_name: &str) {
        self.write().remove(export_name);
        // Told even when this table did not hold it: the session may be open here through a
        // grant rebuilt from the database and since forgotten.
        self.ended(&[export_name.to_string()]);
    }

    /// Drops expired grants.
    pub fn purge_expired(&self, now_ms: i64) {
        let mut ended = Vec::new();
        self.write().retain(|name, s| {
            let keep = s.expires_at_ms > now_ms;
            if !keep {
                ended.push(name.clone());
            }
            keep
        });
        self.ended(&ended);
    }

    /// Calls `f` with the export name of every session that ends from now on (removed,
    /// replaced by its device's next login, or expired), after the table forgot it. The
    /// NBD server closes the session's open connections there.
    pub fn on_end(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.on_end
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Box::new(f));
    }

    fn ended(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        let listeners = self
            .on_end
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for name in names {
            for f in listeners.iter() {
                f(name);
            }
        }
    }

    /// Live and expired grants held.
    pub fn len(&self) -> usize {
        self.grants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// True when no grant is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, SessionGrant>> {
        self.grants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SessionLookup for SessionTable {
    fn lookup(&self, export_name: &str, now_ms: i64) -> Option<SessionGrant> {
        let g = self
            .grants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.get(export_name)
            .filter(|s| s.expires_at_ms > now_ms)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(device_id: i64, export: &str, expires_at_ms: i64) -> SessionGrant {
        SessionGrant {
            session_id: "s".into(),
            export_name: export.into(),
            device_id,
            mac: "aa:bb:cc:dd:ee:ff".into(),
            device_type: DeviceType::Production,
            vdisk_id: 1,
            vdisk_name: "golden".into(),
            version: 1,
            store_dir: PathBuf::from("/s"),
            path: PathBuf::from("/s/golden.1.avhdx"),
            cache_mode: CacheMode::Ram,
            ram_bytes: 1,
            writable: false,
            expires_at_ms,
        }
    }

    #[test]
    fn expired_grant_is_not_found() {
        let t = SessionTable::new();
        t.insert(grant(1, "e", 100), 0).unwrap();
        assert!(t.lookup("e", 99).is_some());
        assert!(t.lookup("e", 100).is_none());
    }

    #[test]
    fn ended_sessions_are_told_to_listeners_once_each() {
        use std::sync::{Arc, Mutex};
        let t = SessionTable::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        t.on_end(move |n| s2.lock().unwrap().push(n.to_string()));
        t.insert(grant(1, "a", 100), 0).unwrap();
        t.insert(grant(1, "a", 100), 0).unwrap(); // the same grant again: not an end
        t.insert(grant(1, "b", 100), 0).unwrap(); // a re-login replaces "a"
        t.insert(grant(2, "c", 50), 0).unwrap();
        t.remove("b");
        t.purge_expired(60); // "c" expired
        assert_eq!(*seen.lock().unwrap(), ["a", "b", "c"]);
    }

    #[test]
    fn second_login_of_a_device_replaces_its_grant() {
        let t = SessionTable::new();
        t.insert(grant(1, "a", 100), 0).unwrap();
        t.insert(grant(1, "b", 100), 0).unwrap();
        assert!(t.lookup("a", 1).is_none());
        assert_eq!(t.lookup("b", 1).unwrap().device_id, 1);
        assert_eq!(t.len(), 1);
    }
}
