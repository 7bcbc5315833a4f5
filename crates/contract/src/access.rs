//! Who may boot a version of a vDisk: its access mode, part of the login grant and of the
//! farm's version rows (stored as [`AccessMode::as_str`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `text` is not an access mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown AccessMode {0:?}")]
pub struct AccessModeError(pub String);

/// The access mode of a version: who may boot it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// Being edited: one maintenance device boots it read/write (private mode).
    Maintenance,
    /// Test devices boot it.
    Test,
    /// Production devices boot it.
    Production,
}

impl AccessMode {
    /// Every value, in order.
    pub const ALL: &'static [AccessMode] = &[
        AccessMode::Maintenance,
        AccessMode::Test,
        AccessMode::Production,
    ];

    /// The name stored in the database and used by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::Maintenance => "maintenance",
            AccessMode::Test => "test",
            AccessMode::Production => "production",
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AccessMode {
    type Err = AccessModeError;
    fn from_str(s: &str) -> Result<AccessMode, AccessModeError> {
        AccessMode::ALL
            .iter()
            .copied()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| AccessModeError(s.to_string()))
    }
}

/// Parses the stored name (sqlx's `try_from = "String"` reads database text through it).
impl TryFrom<String> for AccessMode {
    type Error = AccessModeError;
    fn try_from(s: String) -> Result<AccessMode, AccessModeError> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_round_trips_and_unknown_is_refused() {
        for m in AccessMode::ALL {
            assert_eq!(m.as_str().parse(), Ok(*m));
        }
        assert!("staging".parse::<AccessMode>().is_err());
    }
}
