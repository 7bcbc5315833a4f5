//! Where a device's writes go, and the two spellings of each mode.
//!
//! ```text
//!   mode               farm_name()          cli_name()           writes go to
//!   Ram                ram                  ram                  target RAM
//!   RamOverflow        ram_overflow         ram-overflow         target RAM, then a local file
//!   Disk               disk                 disk                 a local file
//!   Server             server               server               NAME+DEV on the server
//!   ServerPersistent   server_persistent    server-persistent    NAME+DEV+persistent
//!   Private            private              private              NAME+private (the vDisk)
//! ```
//!
//! The farm spelling is stored in the farm database and used in the API's JSON (serde
//! reads and writes only it, and the OpenAPI document lists it); the CLI spelling is what
//! `ferry target --cache` takes and `ferry target status` shows. [`FromStr`] accepts both,
//! so a name from either side parses. There is no `Display`: say which spelling.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `text` is not a cache mode in either spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cache mode {0:?}")]
pub struct CacheModeError(pub String);

/// Where a device's writes go (DESIGN.md, "Write-cache modes").
// The declaration order is the order of the OpenAPI document's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// The vDisk itself (maintenance, one device).
    Private,
    /// A per-device differencing file on the server, discarded at reboot.
    Server,
    /// The same, kept across reboots.
    ServerPersistent,
    /// Target memory, fixed budget.
    Ram,
    /// Target memory with overflow to a local file.
    RamOverflow,
    /// A local overflow file only.
    Disk,
}

impl CacheMode {
    /// Every mode, in the order of the docs and of the CLI's help (local modes first).
    pub const ALL: [CacheMode; 6] = [
        CacheMode::Ram,
        CacheMode::RamOverflow,
        CacheMode::Disk,
        CacheMode::Server,
        CacheMode::ServerPersistent,
        CacheMode::Private,
    ];

    /// The farm's name: stored in the database and used in the API's JSON
    /// (`ram_overflow`, `server_persistent`).
    pub fn farm_name(self) -> &'static str {
        match self {
            CacheMode::Private => "private",
            CacheMode::Server => "server",
            CacheMode::ServerPersistent => "server_persistent",
            CacheMode::Ram => "ram",
            CacheMode::RamOverflow => "ram_overflow",
            CacheMode::Disk => "disk",
        }
    }

    /// The command line's name, also shown by `ferry target status`
    /// (`ram-overflow`, `server-persistent`).
    pub fn cli_name(self) -> &'static str {
        match self {
            CacheMode::Private => "private",
            CacheMode::Server => "server",
            CacheMode::ServerPersistent => "server-persistent",
            CacheMode::Ram => "ram",
            CacheMode::RamOverflow => "ram-overflow",
            CacheMode::Disk => "disk",
        }
    }

    /// True for the modes whose writes stay on the target (`ram`, `ram-overflow`, `disk`):
    /// the target attaches the read-only export and caches writes itself.
    pub fn is_local(self) -> bool {
        matches!(
            self,
            CacheMode::Ram | CacheMode::RamOverflow | CacheMode::Disk
        )
    }
}

impl FromStr for CacheMode {
    type Err = CacheModeError;

    /// Parses either spelling.
    fn from_str(s: &str) -> Result<CacheMode, CacheModeError> {
        CacheMode::ALL
            .into_iter()
            .find(|m| m.farm_name() == s || m.cli_name() == s)
            .ok_or_else(|| CacheModeError(s.to_string()))
    }
}

/// Parses either spelling (sqlx's `try_from = "String"` reads database text through it).
impl TryFrom<String> for CacheMode {
    type Error = CacheModeError;
    fn try_from(s: String) -> Result<CacheMode, CacheModeError> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_of_every_mode_parse() {
        for m in CacheMode::ALL {
            assert_eq!(m.farm_name().parse(), Ok(m));
            assert_eq!(m.cli_name().parse(), Ok(m));
        }
    }

    #[test]
    fn unknown_name_is_refused() {
        assert_eq!(
            "ram overflow".parse::<CacheMode>(),
            Err(CacheModeError("ram overflow".into()))
        );
    }

    #[test]
    fn json_uses_the_farm_spelling_only() {
        let text = serde_json::to_string(&CacheMode::ServerPersistent).unwrap();
        assert_eq!(text, "\"server_persistent\"");
        assert!(serde_json::from_str::<CacheMode>("\"ram-overflow\"").is_err());
    }
}
