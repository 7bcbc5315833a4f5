//! `ferry server`'s TLS: the NBD listener's rustls configuration, from `[tls] dir` (or
//! `--tls-dir`) or, for a farm server, from the farm's own certificate authority.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use server::config::Resolved;

/// A server certificate, its key and the CA whose clients are accepted (PEM).
#[derive(Clone)]
pub struct TlsMaterial {
    /// The CA certificate.
    pub ca_pem: String,
    /// This server's certificate.
    pub cert_pem: String,
    /// Its key.
    pub key_pem: String,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Reads a certificate directory (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`).
    ///
    /// # Errors
    /// A file is missing or unreadable (the error names it).
    pub fn from_dir(dir: &Path) -> anyhow::Result<TlsMaterial> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))
        };
        Ok(TlsMaterial {
            ca_pem: read(pki::CA_CERT)?,
            cert_pem: read(pki::SERVER_CERT)?,
            key_pem: read(pki::SERVER_KEY)?,
        })
    }

    /// The rustls server configuration.
    ///
    /// # Errors
    /// The PEM texts do not make a configuration.
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        pki::server_config(&self.ca_pem, &self.cert_pem, &self.key_pem)
            .context("build the TLS configuration")
    }
}

/// Sets the NBD listener's TLS from `material` (the farm's, or `[tls] dir`'s when
/// `material` is `None`); `[tls] required` without any material is an error.
///
/// # Errors
/// Unreadable or invalid certificates; `required` without TLS.
pub fn apply(
    r: &mut Resolved,
    material: Option<TlsMaterial>,
) -> anyhow::Result<Option<TlsMaterial>> {
    let material = match (material, &r.tls_dir) {
        (Some(m), _) => Some(m),
        (None, Some(dir)) => Some(TlsMaterial::from_dir(dir)?),
        (None, None) => None,
    };
    match &material {
        Some(m) => {
            r.nbd.tls = Some(m.server_config()?);
            if r.tls_required {
                r.nbd.tls_mode = nbd_server::TlsMode::Required;
            }
        }
        None if r.tls_required => {
            anyhow::bail!(
                "[tls] required is set but no certificate is configured ([tls] dir or --tls-dir)"
            )
        }
        None => {}
    }
    Ok(material)
}
