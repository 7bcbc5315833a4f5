//! The farm model: the rows of the farm database as typed values, and the enums that the
//! database stores as text.
//!
//! ```text
//!   farm ─┬─ sites ─┬─ servers          (register + heartbeat)
//!         │         └─ collections ── devices ──► vdisk (assigned), version (pinned)
//!         ├─ stores ── vdisks ── versions (chain; access mode each)
//!         │     └─ per-server path overrides
//!         ├─ api tokens (role; only a hash is kept)
//!         ├─ sessions (device logins) and login nonces
//!         └─ audit log
//! ```
//!
//! Times are Unix milliseconds (`*_at_ms`); sizes are bytes (`*_bytes`).
//!
//! [`AccessMode`] and [`CacheMode`] are the `contract` crate's (the login grant carries
//! them to targets); they are stored as [`AccessMode::as_str`] and [`CacheMode::farm_name`],
//! and read back through their `TryFrom<String>`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use contract::{AccessMode, CacheMode};

use crate::error::{FarmError, Result};

macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $var),+
        }

        impl $name {
            /// Every value, in order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The name stored in the database and used by the API.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$var => $s),+
                }
            }

            /// Parses the stored name.
            ///
            /// # Errors
            /// [`crate::Kind::InvalidInput`] for an unknown name.
            pub fn parse(s: &str) -> Result<$name> {
                match s {
                    $($s => Ok($name::$var),)+
                    _ => Err(FarmError::invalid(format!(
                        "unknown {} {:?}", stringify!($name), s
                    ))),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl TryFrom<String> for $name {
            type Error = FarmError;
            fn try_from(s: String) -> Result<$name> {
                $name::parse(&s)
            }
        }
    };
}

text_enum!(
    /// The type of a device, which picks the version it boots.
    DeviceType {
        /// Boots the newest production version (or its pinned version).
        Production = "production",
        /// Boots the newest test or production version.
        Test = "test",
        /// Boots the maintenance version, read/write; one at a time.
        Maintenance = "maintenance",
    }
);

text_enum!(
    /// The role of an API token.
    Role {
        /// Everything, including tokens, sites, stores and farm settings.
        Admin = "admin",
        /// Devices, collections, vDisks, versions and sessions; reads everything.
        Operator = "operator",
        /// Reads only.
        ReadOnly = "read_only",
    }
);

text_enum!(
    /// How a merge combines a chain.
    MergeMode {
        /// Every version above the base into one differencing file on the base.
        Updates = "updates",
        /// The whole chain into one new standalone base.
        Base = "base",
    }
);

impl Role {
    /// True when this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        let rank = |r: Role| match r {
            Role::ReadOnly => 0,
            Role::Operator => 1,
            Role::Admin => 2,
        };
        rank(self) >= rank(needed)
    }
}

/// The farm-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct FarmSettings {
    /// The farm's name.
    pub name: String,
    /// When a new version is asked for and the newest version's chain already holds this
    /// many files, the chain is first merged into a new base (0: never).
    pub auto_merge_chain_max: i64,
    /// How long a boot script's login ticket stays valid, in seconds (5 to 3600; a diskless
    /// machine must log in within it: docs/netboot.md).
    pub boot_ticket_secs: i64,
    /// When the farm was created.
    pub created_at_ms: i64,
}

/// A site: a group of servers and device collections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Site {
    /// Id.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// When it was created.
    pub created_at_ms: i64,
}

/// A streaming server of a site, which registers itself and heartbeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Server {
    /// Id.
    pub id: i64,
    /// The site it serves.
    pub site_id: i64,
    /// Unique name (usually the host name).
    pub name: String,
    /// Where devices reach its NBD service (`host:port`).
    pub address: String,
    /// When it first registered.
    pub registered_at_ms: i64,
    /// Its last heartbeat.
    pub heartbeat_at_ms: i64,
    /// Its weight in load balancing (`balance`): devices are spread so that each server's
    /// share is proportional to its rating (1 to [`RATING_MAX`], [`DEFAULT_RATING`] unless
    /// set).
    #[serde(default = "default_rating")]
    pub rating: i64,
    /// Draining: named to devices after every other live server of its site.
    #[sqlx(try_from = "i64")]
    #[serde(default)]
    pub draining: Flag,
    /// Where devices reach its farm API (`https://HOST:PORT`), when it said: boot scripts
    /// name the APIs of a site's live servers, so that a device reports through another
    /// when one goes away.
    #[serde(default)]
    pub api_url: Option<String>,
}

/// A server's rating unless set.
pub const DEFAULT_RATING: i64 = 100;
/// The highest rating (a server rated this carries that many times a server rated 1).
pub const RATING_MAX: i64 = 10_000;
/// A server whose last heartbeat is older is listed as not alive (and ordered last).
pub const SERVER_ALIVE_MS: i64 = 60_000;

fn default_rating() -> i64 {
    DEFAULT_RATING
}

/// A store: a directory of vDisks under the farm's store root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Store {
    /// Id.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// Path relative to the farm's store root: the directory where the lifecycle makes
    /// files (for a bucket store: its working directory, where maintenance versions live).
    pub path: String,
    /// When it was created.
    pub created_at_ms: i64,
    /// `s3://BUCKET/PREFIX` for a bucket store (every version that leaves maintenance is
    /// published there, write-once, with its manifest); empty for a directory store.
    #[serde(default)]
    pub bucket: String,
}

/// A per-server path of a store (the same share mounted elsewhere on that server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct StorePathOverride {
    /// The store.
    pub store_id: i64,
    /// The server.
    pub server_id: i64,
    /// The path on that server, relative to the store root.
    pub path: String,
}

/// A device collection of a site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Collection {
    /// Id.
    pub id: i64,
    /// The site.
    pub site_id: i64,
    /// Name, unique in its site.
    pub name: String,
    /// Unknown devices that log in are added to this collection, or refused.
    #[sqlx(try_from = "i64")]
    pub auto_add: Flag,
    /// The vDisk assigned to devices added automatically.
    pub default_vdisk_id: Option<i64>,
    /// The most devices auto-add puts into this collection, in all.
    pub auto_add_max: i64,
    /// The most devices auto-add puts into it in one minute.
    pub auto_add_per_minute: i64,
    /// When it was created.
    pub created_at_ms: i64,
}

/// A target device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Device {
    /// Id.
    pub id: i64,
    /// Its collection.
    pub collection_id: i64,
    /// MAC address, lowercase `aa:bb:cc:dd:ee:ff`, unique.
    pub mac: String,
    /// Name.
    pub name: String,
    /// Its type, which picks the version it boots.
    #[sqlx(try_from = "String")]
    pub device_type: DeviceType,
    /// The vDisk it boots.
    pub vdisk_id: Option<i64>,
    /// Override of the vDisk's cache mode.
    #[sqlx(try_from = "String")]
    #[serde(default)]
    pub cache_mode: OptCacheMode,
    /// Override of the vDisk's RAM cache size.
    pub ram_bytes: Option<i64>,
    /// A production device boots this version instead of the newest production one.
    pub pinned_version: Option<i64>,
    /// When it was created.
    pub created_at_ms: i64,
    /// When it was last changed.
    pub changed_at_ms: i64,
    /// It boots over the network with no disk to keep its device secret: the farm key's
    /// proof logs it in at every boot (see `login`).
    #[sqlx(try_from = "i64")]
    #[serde(default)]
    pub diskless: Flag,
}

/// A flag as the database stores it (an integer, 0 or 1: both backends map it alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
pub struct Flag(pub bool);

impl TryFrom<i64> for Flag {
    type Error = FarmError;
    fn try_from(v: i64) -> Result<Flag> {
        Ok(Flag(v != 0))
    }
}

/// An optional cache mode as the database stores it (empty text: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
pub struct OptCacheMode(pub Option<CacheMode>);

impl TryFrom<String> for OptCacheMode {
    type Error = FarmError;
    fn try_from(s: String) -> Result<OptCacheMode> {
        if s.is_empty() {
            Ok(OptCacheMode(None))
        } else {
            s.parse()
                .map(|m| OptCacheMode(Some(m)))
                .map_err(|e: contract::CacheModeError| FarmError::invalid(e.to_string()))
        }
    }
}

impl OptCacheMode {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        self.0.map_or("", CacheMode::farm_name)
    }
}

/// A vDisk: a base image and its versions in a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct VDisk {
    /// Id.
    pub id: i64,
    /// The store holding its files.
    pub store_id: i64,
    /// Name, unique in its store; its files are NAME.vhdx, NAME.N.avhdx.
    pub name: String,
    /// Default cache mode of its devices.
    #[sqlx(try_from = "String")]
    pub cache_mode: CacheMode,
    /// Default RAM cache size of its devices.
    pub ram_bytes: i64,
    /// Free text.
    pub description: String,
    /// Virtual size of the disk.
    pub size_bytes: i64,
    /// When it was created.
    pub created_at_ms: i64,
    /// Kernel arguments the network boot appends to its own (empty: none).
    #[serde(default)]
    pub boot_cmdline: String,
    /// The kernel's path inside the version's filesystem (none: found in /boot).
    #[serde(default)]
    pub boot_kernel: Option<String>,
    /// The initramfs's path inside the version's filesystem (none: found in /boot).
    #[serde(default)]
    pub boot_initrd: Option<String>,
}

/// A version of a vDisk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Version {
    /// The vDisk.
    pub vdisk_id: i64,
    /// The version number (0 is the first base).
    pub number: i64,
    /// The file in the store: NAME.vhdx, NAME.N.avhdx, or NAME.N.vhdx for a merged base.
    pub file_name: String,
    /// The version whose file is this one's parent (none for a base).
    pub parent_number: Option<i64>,
    /// Who may boot it.
    #[sqlx(try_from = "String")]
    pub access: AccessMode,
    /// How it was made: "base", "new", "merged_updates", "merged_base" or "imported".
    pub origin: String,
    /// When it was created.
    pub created_at_ms: i64,
    /// Who created it (a token name).
    pub created_by: String,
    /// When its access mode last changed.
    pub changed_at_ms: i64,
    /// Who changed it last.
    pub changed_by: String,
}

/// An API token's public part (the secret is shown once, at creation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Token {
    /// Id.
    pub id: i64,
    /// Name, unique; recorded as the actor of every change made with the token.
    pub name: String,
    /// Its role.
    #[sqlx(try_from = "String")]
    pub role: Role,
    /// When it was created.
    pub created_at_ms: i64,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct AuditEntry {
    /// Id, increasing.
    pub id: i64,
    /// When.
    pub at_ms: i64,
    /// Who (a token name, or `device:MAC`).
    pub actor: String,
    /// What, e.g. `version.promote`.
    pub action: String,
    /// The kind of object.
    pub object_type: String,
    /// The object's id.
    pub object_id: String,
    /// Details as JSON text.
    pub detail: String,
}

/// A device's login session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Session {
    /// Id (a UUID).
    pub id: String,
    /// The device.
    pub device_id: i64,
    /// The vDisk it boots.
    pub vdisk_id: i64,
    /// The version it boots.
    pub version_number: i64,
    /// The device's type at login.
    #[sqlx(try_from = "String")]
    pub device_type: DeviceType,
    /// The session-scoped NBD export name (a credential: the API shows it only to operator
    /// and admin tokens, and an empty string to others).
    pub export_name: String,
    /// When it started.
    pub created_at_ms: i64,
    /// When it ends unless renewed.
    pub expires_at_ms: i64,
}

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// How many items the whole list holds.
    pub total: i64,
    /// The page size asked for.
    pub limit: i64,
    /// How many items were skipped.
    pub offset: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_allows_its_rank_and_below() {
        assert!(Role::Admin.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::ReadOnly));
        assert!(!Role::Operator.allows(Role::Admin));
        assert!(!Role::ReadOnly.allows(Role::Operator));
    }

    #[test]
    fn enum_text_round_trips_and_unknown_is_refused() {
        for t in DeviceType::ALL {
            assert_eq!(DeviceType::parse(t.as_str()).unwrap(), *t);
        }
        assert!(Role::parse("root").is_err());
    }

    #[test]
    fn stored_cache_mode_text_reads_back() {
        for m in CacheMode::ALL {
            let stored = OptCacheMode(Some(m)).as_str().to_string();
            assert_eq!(
                OptCacheMode::try_from(stored).unwrap(),
                OptCacheMode(Some(m))
            );
        }
        assert_eq!(
            OptCacheMode::try_from(String::new()).unwrap(),
            OptCacheMode(None)
        );
    }
}
