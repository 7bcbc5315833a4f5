//! Who a certificate names: a device (by MAC), an administrator or a server, written as a
//! subject alternative name URI `urn:ferry:device:aa-bb-cc-dd-ee-ff`,
//! `urn:ferry:admin:NAME` or `urn:ferry:server:NAME`.

use std::fmt;
use std::str::FromStr;

use contract::Mac;

/// The URI prefix of every identity.
const URI_PREFIX: &str = "urn:ferry:";
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
    /// Not `urn:ferry:KIND:NAME`.
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
                write!(f, "{URI_PREFIX}device:{dashed}")
            }
            Identity::Admin(n) => write!(f, "{URI_PREFIX}admin:{n}"),
            Identity::Server(n) => write!(f, "{URI_PREFIX}server:{n}"),
        }
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Identity, IdentityError> {
        let shape = || IdentityError::Shape(s.to_string());
        let rest = s.strip_prefix(URI_PREFIX).ok_or_else(shape)?;
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

/// The identity a certificate (DER) names in its subject alternative names, if it names
/// exactly one. The caller has verified the certificate's chain to the farm's CA; a
/// certificate naming none or several is no identity.
pub fn identity_of(cert_der: &[u8]) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let mut found = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) if u.starts_with(URI_PREFIX) => {
            u.parse::<Identity>().ok()
        }
        _ => None,
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_through_their_uri() {
        let mac: Mac = "AA:bb:cc:00:00:01".parse().unwrap();
        for id in [
            Identity::Device(mac),
            Identity::admin("alice").unwrap(),
            Identity::server("pvs-1.site").unwrap(),
        ] {
            assert_eq!(id.to_string().parse::<Identity>(), Ok(id.clone()));
        }
        assert_eq!(
            Identity::Device(mac).to_string(),
            "urn:ferry:device:aa-bb-cc-00-00-01"
        );
    }

    #[test]
    fn malformed_identities_are_refused_with_the_rule_they_break() {
        assert!(matches!(
            "urn:ferry:root:x".parse::<Identity>(),
            Err(IdentityError::Shape(_))
        ));
        assert!(matches!(
            "urn:ferry:device:zz".parse::<Identity>(),
            Err(IdentityError::Mac(_))
        ));
        assert!(matches!(
            "urn:ferry:admin:a/b".parse::<Identity>(),
            Err(IdentityError::Name(_))
        ));
        assert!(matches!(
            "urn:ferry:admin:".parse::<Identity>(),
            Err(IdentityError::Name(_))
        ));
    }
}
