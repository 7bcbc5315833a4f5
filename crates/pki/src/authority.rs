//! The farm's certificate authority: made once by `ferry farm init`, loaded by every
//! server, and used to issue server, device and administrator certificates.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

use crate::identity::Identity;

/// How long the farm's CA certificate is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a server certificate is valid.
pub const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(2 * 365 * 24 * 3600);
/// How long a device's login certificate is valid (a device logs in again to renew it).
pub const DEVICE_CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// How far back a new certificate's validity starts, for clocks a little behind.
const CLOCK_SKEW: Duration = Duration::from_secs(300);
/// Bytes of a certificate's random serial number.
const SERIAL_BYTES: usize = 16;

/// Errors of the certificate authority.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to make or sign a certificate or key.
    #[error("{what}: {source}")]
    Rcgen {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: rcgen::Error,
    },
    /// A host name that is neither an IP address nor a DNS name.
    #[error("{0:?} is not a host name or IP address a certificate can name")]
    Host(String),
    /// A time outside what a certificate can hold.
    #[error("certificate validity out of range")]
    Time,
}

fn rc(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Rcgen { what, source }
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8); keep it 0600.
    pub key_pem: String,
    /// When it stops being valid (Unix seconds).
    pub not_after_unix: i64,
}

impl Issued {
    /// The certificate as DER (what a TLS peer presents).
    ///
    /// # Panics
    /// Never for a certificate this crate issued (its PEM always parses).
    pub fn cert_der(&self) -> Vec<u8> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .expect("an issued certificate's PEM parses")
            .to_vec()
    }
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("not_after_unix", &self.not_after_unix)
            .finish_non_exhaustive()
    }
}

/// The farm's certificate authority.
pub struct Authority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// Makes a new CA named after the farm, valid for [`CA_VALIDITY`] from `now`.
    ///
    /// # Errors
    /// [`PkiError`].
    pub fn create(farm_name: &str, now: SystemTime) -> Result<Authority, PkiError> {
        let key = KeyPair::generate().map_err(rc("generate CA key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("ferry farm {farm_name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, now, CA_VALIDITY)?;
        let cert = params.self_signed(&key).map_err(rc("self-sign CA"))?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        Ok(Authority {
            cert_pem,
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its certificate and key (PEM).
    ///
    /// # Errors
    /// [`PkiError::Rcgen`]: either does not parse.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Authority, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(rc("read CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(rc("read CA certificate"))?;
        Ok(Authority {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// The CA certificate (PEM), which every client and server trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PEM); keep it 0600.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A server certificate for `name`, valid for the host names and IP addresses `hosts`
    /// (what clients dial), for [`SERVER_CERT_VALIDITY`].
    ///
    /// # Errors
    /// [`PkiError`].
    pub fn issue_server(
        &self,
        name: &str,
        hosts: &[String],
        now: SystemTime,
    ) -> Result<Issued, PkiError> {
        let id = Identity::server(name).map_err(|_| PkiError::Host(name.to_string()))?;
        let mut sans = Vec::new();
        for h in hosts {
            sans.push(match h.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    h.as_str()
                        .try_into()
                        .map_err(|_| PkiError::Host(h.clone()))?,
                ),
            });
        }
        self.issue(
            &id,
            sans,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            now,
            SERVER_CERT_VALIDITY,
        )
    }

    /// A client certificate naming `id`, valid for `validity` from `now`.
    ///
    /// # Errors
    /// [`PkiError`].
    pub fn issue_client(
        &self,
        id: &Identity,
        now: SystemTime,
        validity: Duration,
    ) -> Result<Issued, PkiError> {
        self.issue(
            id,
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            now,
            validity,
        )
    }

    fn issue(
        &self,
        id: &Identity,
        mut sans: Vec<SanType>,
        eku: Vec<ExtendedKeyUsagePurpose>,
        now: SystemTime,
        validity: Duration,
    ) -> Result<Issued, PkiError> {
        let key = KeyPair::generate().map_err(rc("generate key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, id.common_name());
        let uri = id.to_string();
        sans.push(SanType::URI(
            uri.as_str()
                .try_into()
                .map_err(|_| PkiError::Host(uri.clone()))?,
        ));
        params.subject_alt_names = sans;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = eku;
        params.use_authority_key_identifier_extension = true;
        let not_after = set_validity(&mut params, now, validity)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rc("sign certificate"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after_unix: not_after,
        })
    }
}

/// Sets a random serial and the validity window; returns `not_after` in Unix seconds.
fn set_validity(
    params: &mut CertificateParams,
    now: SystemTime,
    validity: Duration,
) -> Result<i64, PkiError> {
    let mut serial = [0u8; SERIAL_BYTES];
    rand::thread_rng().fill_bytes(&mut serial);
    serial[0] &= 0x7f; // a positive INTEGER
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let secs = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_secs()).ok())
            .ok_or(PkiError::Time)
    };
    let from = secs(now.checked_sub(CLOCK_SKEW).ok_or(PkiError::Time)?)?;
    let until = secs(now.checked_add(validity).ok_or(PkiError::Time)?)?;
    params.not_before =
        time::OffsetDateTime::from_unix_timestamp(from).map_err(|_| PkiError::Time)?;
    params.not_after =
        time::OffsetDateTime::from_unix_timestamp(until).map_err(|_| PkiError::Time)?;
    Ok(until)
}
