//! rustls configurations from PEM text, with the ring provider (no C build, AES-GCM in
//! assembly).
//!
//! A server asks for a client certificate and accepts a connection without one: whether an
//! anonymous client may open an export is the export source's decision, not the TLS
//! layer's. A certificate that is presented must chain to the farm's CA.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// PEM text that holds no certificate or key of the kind wanted.
    #[error("{what}: {why}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("{what}: {source}")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// Why.
        source: rustls::Error,
    },
    /// The client verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

/// The ring provider with AES-128-GCM first. A vDisk's bytes are bulk data: AES-128-GCM
/// costs both ends about a quarter less CPU than AES-256-GCM (ten AES rounds, not fourteen)
/// and is TLS 1.3's mandatory suite. Servers choose in this order, not the client's:
/// GnuTLS (qemu, nbdkit, libnbd, nbd-client) offers AES-256-GCM first.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn certs(what: &'static str, pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let v: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            why: e.to_string(),
        })?;
    if v.is_empty() {
        return Err(TlsError::Pem {
            what,
            why: "no certificate in it".into(),
        });
    }
    Ok(v)
}

fn key(what: &'static str, pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem {
        what,
        why: e.to_string(),
    })
}

fn roots(ca_pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs("CA certificate", ca_pem)? {
        roots.add(c).map_err(|source| TlsError::Rustls {
            what: "CA certificate",
            source,
        })?;
    }
    Ok(roots)
}

/// A server configuration: `cert_pem`/`key_pem` as this server's identity; client
/// certificates requested, optional, and verified against `ca_pem` when presented.
///
/// # Errors
/// [`TlsError`].
pub fn server_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "protocol versions",
            source,
        })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs("server certificate", cert_pem)?,
            key("server key", key_pem)?,
        )
        .map_err(|source| TlsError::Rustls {
            what: "server certificate and key",
            source,
        })?;
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// A client configuration trusting only `ca_pem`, presenting `client` (certificate and key
/// PEM) when given.
///
/// # Errors
/// [`TlsError`].
pub fn client_config(
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "protocol versions",
            source,
        })?
        .with_root_certificates(roots(ca_pem)?);
    let config = match client {
        Some((cert, k)) => builder
            .with_client_auth_cert(certs("client certificate", cert)?, key("client key", k)?)
            .map_err(|source| TlsError::Rustls {
                what: "client certificate and key",
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}
