//! Who a certificate names, read back from its DER. The text form, `urn:ferry:KIND:NAME`
//! ([`Identity`], its errors and name rules), lives in `contract::identity`, where it is
//! fuzzed; this module re-exports it and adds only the certificate parsing.

use contract::identity::IDENTITY_URI_PREFIX;
pub use contract::identity::{IDENTITY_NAME_BYTES_MAX, Identity, IdentityError};

/// The identity a certificate (DER) names in its subject alternative names, if it names
/// exactly one and is a client certificate as the farm issues them: the client
/// authentication extended key usage (every device, administrator and server certificate
/// of [`crate::Authority`] has it), and not a CA. The caller has verified the
/// certificate's chain to the farm's CA; a certificate naming none or several identities,
/// or without that usage (a certificate signed by the farm's CA for some other purpose, or
/// with no extended key usage at all, which TLS alone accepts for any purpose), is no
/// identity.
pub fn identity_of(cert_der: &[u8]) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let client_auth = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .is_some_and(|e| e.value.client_auth);
    let ca = cert
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca);
    if !client_auth || ca {
        return None;
    }
    let san = cert.subject_alternative_name().ok()??;
    let mut found = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) if u.starts_with(IDENTITY_URI_PREFIX) => {
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
    fn text_that_is_no_certificate_names_no_identity() {
        assert_eq!(identity_of(b""), None);
        assert_eq!(identity_of(b"urn:ferry:admin:alice"), None);
    }
}
