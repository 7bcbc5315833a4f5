//! NBD export names: what a client asks a Ferry server for.
//!
//! ```text
//!   export = vdisk ["@" version]                         read-only, the newest or version N
//!          | vdisk ["@" version] "+" device              server cache (discarded on release)
//!          | vdisk ["@" version] "+" device "+persistent"  server cache, kept
//!          | vdisk "+private"                            the newest file itself, one writer
//!          | "ferry-s-" key                              a device-login session (1 to 56 hex
//!                                                        digits), resolved by the farm
//!   version = decimal u32
//! ```
//!
//! `vdisk` and `device` follow [`crate::name`]. Names that start with
//! [`SESSION_EXPORT_PREFIX`] are always sessions (no vDisk name starts so). The farm makes
//! session keys of 32 lowercase hex digits; any case is accepted and kept.
//!
//! [`Display`](fmt::Display) prints the canonical text and [`FromStr`] parses it back:
//! `parse(display(x)) == x` for every value, and `display(parse(s)) == s` for every
//! canonical `s`. The one non-canonical text accepted is a version with leading zeros
//! (`golden@01` is version 1, printed `golden@1`), which servers have always taken.

use std::fmt;
use std::str::FromStr;

use crate::cache_mode::CacheMode;
pub use crate::name::SESSION_EXPORT_PREFIX;
use crate::name::{DeviceName, NameError, VdiskName};
/// The most hex digits of a session key (a session export name then has 64 bytes).
pub const SESSION_KEY_DIGITS_MAX: usize = 56;
/// The random bytes of the session keys the farm makes (32 hex digits).
pub const SESSION_KEY_BYTES: usize = 16;

/// What is wrong with an export name. The messages are the server's (they reach NBD
/// clients in its refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportNameError {
    /// The device part is not a device name.
    #[error("invalid device name")]
    InvalidDevice(#[source] NameError),
    /// A session export's key is not 1 to [`SESSION_KEY_DIGITS_MAX`] hex digits.
    #[error("{}", self.reason())]
    InvalidSessionKey,
    /// The part after the vDisk is neither `+DEVICE`, `+DEVICE+persistent` nor `+private`.
    #[error("{}", self.reason())]
    InvalidSuffix,
    /// The vDisk part is not a vDisk name.
    #[error(transparent)]
    InvalidVdisk(NameError),
    /// The text after '@' is not a decimal number.
    #[error("{}", self.reason())]
    InvalidVersion,
    /// `NAME@N+private`: private mode writes the newest version.
    #[error("{}", self.reason())]
    PrivateVersion,
    /// The version does not fit a `u32`.
    #[error("{}", self.reason())]
    VersionTooLarge,
}

impl ExportNameError {
    /// The message, as a static string (for error types that keep a `&'static str`).
    pub fn reason(self) -> &'static str {
        match self {
            ExportNameError::InvalidDevice(_) => "invalid device name",
            ExportNameError::InvalidSessionKey => {
                "a session export is 'ferry-s-' and 1 to 56 hex digits"
            }
            ExportNameError::InvalidSuffix => {
                "expected NAME[@N][+DEVICE[+persistent]] or NAME+private"
            }
            ExportNameError::InvalidVdisk(e) => e.reason(),
            ExportNameError::InvalidVersion => "the version after '@' must be a decimal number",
            ExportNameError::PrivateVersion => "private mode writes the newest version; drop '@N'",
            ExportNameError::VersionTooLarge => "version number too large",
        }
    }
}

/// The key of a session export: 1 to [`SESSION_KEY_DIGITS_MAX`] hex digits, as given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(String);

impl SessionKey {
    /// Checks `hex`.
    ///
    /// # Errors
    /// [`ExportNameError::InvalidSessionKey`].
    pub fn new(hex: &str) -> Result<SessionKey, ExportNameError> {
        let digits_ok = hex.bytes().all(|b| b.is_ascii_hexdigit());
        if hex.is_empty() || hex.len() > SESSION_KEY_DIGITS_MAX || !digits_ok {
            return Err(ExportNameError::InvalidSessionKey);
        }
        Ok(SessionKey(hex.to_string()))
    }

    /// The key the farm gives a new session: its random bytes in lowercase hex (32 digits).
    pub fn from_bytes(bytes: [u8; SESSION_KEY_BYTES]) -> SessionKey {
        SessionKey(hex::encode(bytes))
    }

    /// The hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An NBD export name (grammar in the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ExportName {
    /// `NAME[@N]`: read-only, through the server's block cache.
    ReadOnly {
        /// The vDisk.
        vdisk: VdiskName,
        /// The version (`None`: the newest).
        version: Option<u32>,
    },
    /// `NAME[@N]+DEVICE`: writes go to a per-device file on the server, discarded on
    /// release.
    ServerCache {
        /// The vDisk.
        vdisk: VdiskName,
        /// The version (`None`: the newest).
        version: Option<u32>,
        /// The device.
        device: DeviceName,
    },
    /// `NAME[@N]+DEVICE+persistent`: the same, kept.
    Persistent {
        /// The vDisk.
        vdisk: VdiskName,
        /// The version (`None`: the newest).
        version: Option<u32>,
        /// The device.
        device: DeviceName,
    },
    /// `NAME+private`: writes go to the vDisk's newest file itself.
    Private {
        /// The vDisk.
        vdisk: VdiskName,
    },
    /// `ferry-s-KEY`: a device-login session, which the farm maps to one of the others.
    Session(SessionKey),
}

impl ExportName {
    /// The export a target in cache mode `mode` attaches for version `version` of `vdisk`:
    /// the read-only export in the local modes, `+DEVICE`, `+DEVICE+persistent` or
    /// `+private` in the server modes. `device` is checked only in the modes that use it.
    ///
    /// # Errors
    /// [`ExportNameError::InvalidDevice`]; [`ExportNameError::PrivateVersion`] for a
    /// version in private mode (it writes the newest).
    pub fn for_cache_mode(
        mode: CacheMode,
        vdisk: VdiskName,
        version: Option<u32>,
        device: &str,
    ) -> Result<ExportName, ExportNameError> {
        let device = || DeviceName::new(device).map_err(ExportNameError::InvalidDevice);
        Ok(match mode {
            CacheMode::Ram | CacheMode::RamOverflow | CacheMode::Disk => {
                ExportName::ReadOnly { vdisk, version }
            }
            CacheMode::Server => ExportName::ServerCache {
                vdisk,
                version,
                device: device()?,
            },
            CacheMode::ServerPersistent => ExportName::Persistent {
                vdisk,
                version,
                device: device()?,
            },
            CacheMode::Private if version.is_some() => {
                return Err(ExportNameError::PrivateVersion);
            }
            CacheMode::Private => ExportName::Private { vdisk },
        })
    }

    /// The vDisk (`None` for a session).
    pub fn vdisk(&self) -> Option<&VdiskName> {
        match self {
            ExportName::ReadOnly { vdisk, .. }
            | ExportName::ServerCache { vdisk, .. }
            | ExportName::Persistent { vdisk, .. }
            | ExportName::Private { vdisk } => Some(vdisk),
            ExportName::Session(_) => None,
        }
    }

    /// The version asked for (`None`: the newest, private mode, or a session).
    pub fn version(&self) -> Option<u32> {
        match self {
            ExportName::ReadOnly { version, .. }
            | ExportName::ServerCache { version, .. }
            | ExportName::Persistent { version, .. } => *version,
            ExportName::Private { .. } | ExportName::Session(_) => None,
        }
    }

    /// The device of a server-cache export.
    pub fn device(&self) -> Option<&DeviceName> {
        match self {
            ExportName::ServerCache { device, .. } | ExportName::Persistent { device, .. } => {
                Some(device)
            }
            _ => None,
        }
    }
}

impl fmt::Display for ExportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vdisk_at = |f: &mut fmt::Formatter<'_>, vdisk: &VdiskName, version: &Option<u32>| {
            f.write_str(vdisk.as_str())?;
            match version {
                Some(n) => write!(f, "@{n}"),
                None => Ok(()),
            }
        };
        match self {
            ExportName::ReadOnly { vdisk, version } => vdisk_at(f, vdisk, version),
            ExportName::ServerCache {
                vdisk,
                version,
                device,
            } => {
                vdisk_at(f, vdisk, version)?;
                write!(f, "+{device}")
            }
            ExportName::Persistent {
                vdisk,
                version,
                device,
            } => {
                vdisk_at(f, vdisk, version)?;
                write!(f, "+{device}+persistent")
            }
            ExportName::Private { vdisk } => write!(f, "{vdisk}+private"),
            ExportName::Session(key) => write!(f, "{SESSION_EXPORT_PREFIX}{}", key.as_str()),
        }
    }
}

impl FromStr for ExportName {
    type Err = ExportNameError;

    /// Parses an export name; the checks run in the order the server has always made them
    /// (version, vDisk name, suffix, device name), so each bad name gets the same message.
    fn from_str(name: &str) -> Result<ExportName, ExportNameError> {
        if let Some(key) = name.strip_prefix(SESSION_EXPORT_PREFIX) {
            return SessionKey::new(key).map(ExportName::Session);
        }
        let mut parts = name.split('+');
        let head = parts.next().unwrap_or("");
        let (vdisk, version) = match head.split_once('@') {
            None => (head, None),
            Some((vdisk, n)) => (vdisk, Some(parse_version(n)?)),
        };
        let vdisk = VdiskName::new(vdisk).map_err(ExportNameError::InvalidVdisk)?;
        let device = |d: &str| DeviceName::new(d).map_err(ExportNameError::InvalidDevice);
        let (first, second, rest) = (parts.next(), parts.next(), parts.next());
        Ok(match (first, second, rest) {
            (None, _, _) => ExportName::ReadOnly { vdisk, version },
            (Some("private"), None, _) if version.is_some() => {
                return Err(ExportNameError::PrivateVersion);
            }
            (Some("private"), None, _) => ExportName::Private { vdisk },
            (Some(d), None, _) => ExportName::ServerCache {
                vdisk,
                version,
                device: device(d)?,
            },
            (Some(d), Some("persistent"), None) => ExportName::Persistent {
                vdisk,
                version,
                device: device(d)?,
            },
            _ => return Err(ExportNameError::InvalidSuffix),
        })
    }
}

/// A version: decimal digits (leading zeros allowed) that fit a `u32`.
fn parse_version(n: &str) -> Result<u32, ExportNameError> {
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ExportNameError::InvalidVersion);
    }
    n.parse().map_err(|_| ExportNameError::VersionTooLarge)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn vdisk(name: &str) -> VdiskName {
        VdiskName::new(name).unwrap()
    }

    fn device(name: &str) -> DeviceName {
        DeviceName::new(name).unwrap()
    }

    fn parse(s: &str) -> Result<ExportName, ExportNameError> {
        s.parse()
    }

    #[test]
    fn plain_name_is_newest_read_only() {
        let want = ExportName::ReadOnly {
            vdisk: vdisk("golden"),
            version: None,
        };
        assert_eq!(parse("golden"), Ok(want));
    }

    #[test]
    fn versioned_device_name_is_server_cache() {
        let want = ExportName::ServerCache {
            vdisk: vdisk("golden"),
            version: Some(1),
            device: device("pc-01"),
        };
        assert_eq!(parse("golden@1+pc-01"), Ok(want));
    }

    #[test]
    fn persistent_suffix_is_persistent() {
        let want = ExportName::Persistent {
            vdisk: vdisk("golden"),
            version: None,
            device: device("pc-01"),
        };
        assert_eq!(parse("golden+pc-01+persistent"), Ok(want));
    }

    #[test]
    fn private_is_private() {
        let want = ExportName::Private {
            vdisk: vdisk("golden"),
        };
        assert_eq!(parse("golden+private"), Ok(want));
    }

    #[test]
    fn session_prefix_is_a_session() {
        let want = ExportName::Session(SessionKey::new("0123abcdef").unwrap());
        assert_eq!(parse("ferry-s-0123abcdef"), Ok(want));
    }

    #[test]
    fn private_of_a_version_is_invalid() {
        assert_eq!(
            parse("golden@1+private"),
            Err(ExportNameError::PrivateVersion)
        );
    }

    #[test]
    fn unknown_suffix_is_invalid() {
        assert_eq!(
            parse("golden+pc+forever"),
            Err(ExportNameError::InvalidSuffix)
        );
    }

    #[test]
    fn device_with_slash_is_invalid() {
        assert_eq!(
            parse("golden+../x"),
            Err(ExportNameError::InvalidDevice(NameError::LeadingDotDevice))
        );
    }

    #[test]
    fn version_that_is_not_a_number_is_invalid() {
        assert_eq!(parse("golden@x"), Err(ExportNameError::InvalidVersion));
        assert_eq!(parse("golden@"), Err(ExportNameError::InvalidVersion));
    }

    #[test]
    fn version_past_u32_is_too_large() {
        assert_eq!(
            parse("golden@4294967296"),
            Err(ExportNameError::VersionTooLarge)
        );
    }

    #[test]
    fn leading_zeros_are_read_and_dropped_when_printed() {
        assert_eq!(parse("golden@01").unwrap().to_string(), "golden@1");
    }

    #[test]
    fn session_key_that_is_not_hex_is_invalid() {
        assert_eq!(
            parse("ferry-s-xyz"),
            Err(ExportNameError::InvalidSessionKey)
        );
        assert_eq!(parse("ferry-s-"), Err(ExportNameError::InvalidSessionKey));
    }

    #[test]
    fn session_key_of_16_bytes_is_32_lowercase_digits() {
        let key = SessionKey::from_bytes([0xab; SESSION_KEY_BYTES]);
        assert_eq!(key.as_str(), "ab".repeat(16));
    }

    #[test]
    fn cache_modes_map_to_their_exports() {
        let got: Vec<String> = CacheMode::ALL
            .into_iter()
            .filter(|m| *m != CacheMode::Private)
            .map(|m| ExportName::for_cache_mode(m, vdisk("g"), Some(3), "pc1").unwrap())
            .map(|e| e.to_string())
            .collect();
        assert_eq!(got, ["g@3", "g@3", "g@3", "g@3+pc1", "g@3+pc1+persistent"]);
    }

    #[test]
    fn private_mode_maps_to_private_without_a_version() {
        let e = ExportName::for_cache_mode(CacheMode::Private, vdisk("g"), None, "");
        assert_eq!(e.unwrap().to_string(), "g+private");
        let versioned = ExportName::for_cache_mode(CacheMode::Private, vdisk("g"), Some(1), "");
        assert_eq!(versioned, Err(ExportNameError::PrivateVersion));
    }

    #[test]
    fn local_modes_do_not_check_the_device() {
        let e = ExportName::for_cache_mode(CacheMode::Ram, vdisk("g"), None, "not a name");
        assert!(e.is_ok());
    }

    /// The server's hand-written parser before this type (crates/server/src/exports.rs),
    /// as (vdisk, version, suffix words), kept as the reference for which names parse.
    fn reference_accepts(name: &str) -> bool {
        if name.starts_with(SESSION_EXPORT_PREFIX) {
            return true;
        }
        let mut parts = name.split('+');
        let head = parts.next().unwrap_or("");
        let rest: Vec<&str> = parts.collect();
        let (vdisk, version) = match head.split_once('@') {
            None => (head, None),
            Some((v, n)) => match parse_version(n) {
                Ok(n) => (v, Some(n)),
                Err(_) => return false,
            },
        };
        let vdisk_ok = crate::name::check_plain_name(vdisk, 200).is_ok();
        let device_ok = |d: &str| DeviceName::new(d).is_ok();
        vdisk_ok
            && match rest.as_slice() {
                [] => true,
                ["private"] => version.is_none(),
                [d] | [d, "persistent"] => device_ok(d),
                _ => false,
            }
    }

    fn vdisk_names() -> impl Strategy<Value = VdiskName> {
        "[^./\\\\@+\\p{Cc}][^/\\\\@+\\p{Cc}]{0,30}"
            .prop_filter_map("reserved", |s| VdiskName::new(&s).ok())
    }

    fn device_names() -> impl Strategy<Value = DeviceName> {
        "[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}"
            .prop_filter_map("mode word", |s| DeviceName::new(&s).ok())
    }

    fn export_names() -> impl Strategy<Value = ExportName> {
        let version = proptest::option::of(any::<u32>());
        prop_oneof![
            (vdisk_names(), version.clone())
                .prop_map(|(vdisk, version)| ExportName::ReadOnly { vdisk, version }),
            (vdisk_names(), version.clone(), device_names()).prop_map(
                |(vdisk, version, device)| ExportName::ServerCache {
                    vdisk,
                    version,
                    device
                }
            ),
            (vdisk_names(), version, device_names()).prop_map(|(vdisk, version, device)| {
                ExportName::Persistent {
                    vdisk,
                    version,
                    device,
                }
            }),
            vdisk_names().prop_map(|vdisk| ExportName::Private { vdisk }),
            "[0-9a-fA-F]{1,56}".prop_map(|k| ExportName::Session(SessionKey::new(&k).unwrap())),
        ]
    }

    proptest! {
        #[test]
        fn display_parses_back_to_the_same_value(x in export_names()) {
            prop_assert_eq!(parse(&x.to_string()), Ok(x));
        }

        /// Strings built from the grammar's pieces, valid or not: a name that parses
        /// prints back as itself (unless its version has a leading zero), and parsing
        /// accepts exactly what the server's old parser accepted.
        #[test]
        fn valid_strings_print_back_as_themselves(
            s in "(ferry-s-)?[a-z.é/]{0,4}(@0?[0-9]{0,3})?(\\+(private|persistent|[a-z.]{0,3})){0,3}"
        ) {
            let parsed = parse(&s);
            if !s.starts_with(SESSION_EXPORT_PREFIX) {
                prop_assert_eq!(parsed.is_ok(), reference_accepts(&s), "{:?}", s);
            }
            if let Ok(x) = parsed {
                let head = s.split('+').next().unwrap_or("");
                let digits = head.split_once('@').map_or("", |(_, n)| n);
                if !(digits.len() > 1 && digits.starts_with('0')) {
                    prop_assert_eq!(x.to_string(), s);
                }
            }
        }

        #[test]
        fn any_text_parses_or_fails_without_panicking(s in "\\PC{0,80}") {
            let _ = parse(&s);
        }
    }
}
