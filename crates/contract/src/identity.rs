//! Who a certificate names: a device (by MAC), an administrator or a server, written as a
//! subject alternative name URI.
//!
//! ```text
//!   urn:ferry:device:aa-bb-cc-dd-ee-ff   a device; the MAC in any spelling Mac accepts,
//!                                        printed lowercase with '-' (':' is the URN's
//!                                        own separator)
//!   urn:ferry:admin:NAME                 an administrator
//!   urn:ferry:server:NAME                a server of the farm
//!   NAME                                 1 to IDENTITY_NAME_BYTES_MAX bytes of
//!                                        [A-Za-z0-9._-]
//! ```
//!
//! The text comes from a peer's certificate whose chain the caller has verified (the DER
//! is parsed elsewhere, by `pki`); this module is only the text form, so that it can be
//! fuzzed and shared without a TLS stack.

use std::fmt;
use std::str::FromStr;

use crate::Mac;

/// The URI prefix of every identity.
pub const IDENTITY_URI_PREFIX: &str = "urn:ferry:";
/// The longest administrator or server name.
pub const IDENTITY_NAME_BYTES_MAX: usize = 64;

/// Who a certificate was issued to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A device, by its MAC address (its login's client certificate).
    Device(Mac),
    /// An administrator (may open any export).
    Admin(String),
    /// A server of the farm.
    Server(String),
}

/// Why a text is not an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not `urn:ferry:KIND:NAME` with KIND one of device, admin, server.
    #[error("identity {0:?} is not urn:ferry:device|admin|server:NAME")]
    Shape(String),
    /// A device identity whose MAC does not parse.
    #[error("identity {0:?} names no valid MAC address")]
    Mac(String),
    /// A name that is empty, too long or has characters other than `[A-Za-z0-9._-]`.
    #[error(
        "name {0:?} must be 1 to {IDENTITY_NAME_BYTES_MAX} bytes of letters, digits, '.', '_' or '-'"
    )]
    Name(String),
}

impl Identity {
    /// An administrator identity, checked.
    ///
    /// # Errors
    /// [`IdentityError::Name`].
    pub fn admin(name: &str) -> Result<Identity, IdentityError> {
        check_name(name)?;
        Ok(Identity::Admin(name.to_string()))
    }

    /// A server identity, checked.
    ///
    /// # Errors
    /// [`IdentityError::Name`].
    pub fn server(name: &str) -> Result<Identity, IdentityError> {
        check_name(name)?;
        Ok(Identity::Server(name.to_string()))
    }

    /// The certificate's common name for this identity (for people reading it).
    pub fn common_name(&self) -> String {
        match self {
            Identity::Device(mac) => format!("ferry device {mac}"),
            Identity::Admin(n) => format!("ferry admin {n}"),
            Identity::Server(n) => format!("ferry server {n}"),
        }
    }
}

/// Checks an administrator's or server's name against the rule in the module docs.
fn check_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= IDENTITY_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Name(name.to_string()))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Device(mac) => {
                let dashed = mac.to_string().replace(':', "-");
                write!(f, "{IDENTITY_URI_PREFIX}device:{dashed}")
            }
            Identity::Admin(n) => write!(f, "{IDENTITY_URI_PREFIX}admin:{n}"),
            Identity::Server(n) => write!(f, "{IDENTITY_URI_PREFIX}server:{n}"),
        }
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Identity, IdentityError> {
        let shape = || IdentityError::Shape(s.to_string());
        let rest = s.strip_prefix(IDENTITY_URI_PREFIX).ok_or_else(shape)?;
        let (kind, name) = rest.split_once(':').ok_or_else(shape)?;
        match kind {
            "device" => name
                .parse::<Mac>()
                .map(Identity::Device)
                .map_err(|_| IdentityError::Mac(s.to_string())),
            "admin" => Identity::admin(name),
            "server" => Identity::server(name),
            _ => Err(shape()),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(s: &str) -> Result<Identity, IdentityError> {
        s.parse::<Identity>()
    }

    #[test]
    fn identities_round_trip_through_their_uri() {
        let mac: Mac = "AA:bb:cc:00:00:01".parse().unwrap();
        let longest = "n".repeat(IDENTITY_NAME_BYTES_MAX);
        for id in [
            Identity::Device(mac),
            Identity::admin("alice").unwrap(),
            Identity::admin("A.b_c-9").unwrap(),
            Identity::server("pvs-1.site").unwrap(),
            Identity::server(&longest).unwrap(),
        ] {
            assert_eq!(parse(&id.to_string()), Ok(id.clone()), "{id}");
        }
        assert_eq!(
            Identity::Device(mac).to_string(),
            "urn:ferry:device:aa-bb-cc-00-00-01"
        );
        assert_eq!(
            Identity::admin("alice").unwrap().to_string(),
            "urn:ferry:admin:alice"
        );
        assert_eq!(
            Identity::server("s1").unwrap().to_string(),
            "urn:ferry:server:s1"
        );
    }

    #[test]
    fn a_device_mac_is_read_in_every_spelling_mac_accepts_and_printed_in_one() {
        let want = Identity::Device("aa:bb:cc:dd:ee:ff".parse().unwrap());
        for s in [
            "urn:ferry:device:aa-bb-cc-dd-ee-ff",
            "urn:ferry:device:AA-BB-CC-DD-EE-FF",
            "urn:ferry:device:aa:bb:cc:dd:ee:ff",
            "urn:ferry:device:aabbccddeeff",
        ] {
            assert_eq!(parse(s), Ok(want.clone()), "{s}");
        }
        assert_eq!(want.to_string(), "urn:ferry:device:aa-bb-cc-dd-ee-ff");
    }

    #[test]
    fn common_names_say_the_kind_and_the_name() {
        let mac: Mac = "aa:bb:cc:00:00:01".parse().unwrap();
        assert_eq!(
            Identity::Device(mac).common_name(),
            "ferry device aa:bb:cc:00:00:01"
        );
        assert_eq!(
            Identity::admin("alice").unwrap().common_name(),
            "ferry admin alice"
        );
        assert_eq!(
            Identity::server("s1").unwrap().common_name(),
            "ferry server s1"
        );
    }

    #[test]
    fn a_text_not_shaped_urn_ferry_kind_name_is_a_shape_error() {
        for s in [
            "",
            "urn:ferry:",
            "urn:ferry:admin",
            "urn:ferry:root:x",
            "urn:ferry::x",
            "URN:FERRY:admin:alice",
            "urn:ferry:Admin:alice",
            "urn:other:admin:alice",
            " urn:ferry:admin:alice",
            "admin:alice",
        ] {
            assert_eq!(parse(s), Err(IdentityError::Shape(s.to_string())), "{s:?}");
        }
    }

    #[test]
    fn a_device_identity_without_a_valid_mac_is_a_mac_error() {
        for s in [
            "urn:ferry:device:",
            "urn:ferry:device:zz",
            "urn:ferry:device:aa-bb-cc-dd-ee",
            "urn:ferry:device:aa-bb-cc-dd-ee-ff-00",
            "urn:ferry:device:aa-bb-cc-dd-ee-fg",
            "urn:ferry:device:aa-bb-cc-dd-ee-ff-",
            "urn:ferry:device:aa bb cc dd ee ff",
        ] {
            assert_eq!(parse(s), Err(IdentityError::Mac(s.to_string())), "{s:?}");
        }
    }

    #[test]
    fn an_admin_or_server_name_breaking_the_name_rule_is_a_name_error() {
        let too_long = "n".repeat(IDENTITY_NAME_BYTES_MAX + 1);
        for name in [
            "",
            "a/b",
            "a:b",
            "a b",
            "é",
            "a\0",
            "..\u{202e}",
            too_long.as_str(),
        ] {
            let want = Err(IdentityError::Name(name.to_string()));
            assert_eq!(parse(&format!("urn:ferry:admin:{name}")), want, "{name:?}");
            assert_eq!(parse(&format!("urn:ferry:server:{name}")), want, "{name:?}");
            assert_eq!(Identity::admin(name), want, "{name:?}");
            assert_eq!(Identity::server(name), want, "{name:?}");
        }
    }

    proptest! {
        /// What the fuzz target checks, on texts near the grammar: any text that parses
        /// prints as a URI that parses back to the same identity.
        #[test]
        fn whatever_parses_prints_and_parses_back(
            s in "urn:ferry:(device|admin|server|x)?:?[0-9a-fA-F:._/é -]{0,70}"
        ) {
            if let Ok(id) = s.parse::<Identity>() {
                prop_assert_eq!(id.to_string().parse::<Identity>(), Ok(id));
            }
        }
    }
}
