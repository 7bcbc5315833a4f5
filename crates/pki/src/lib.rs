//! The farm's certificate authority and the TLS configurations built on it.
//!
//! Ferry's data path and API are TLS with X.509 certificates, as the NBD ecosystem does it
//! (qemu's `tls-creds-x509`, libnbd's `tls-certificates=DIR`, nbdkit's `--tls-certificates`):
//! the farm is its own certificate authority; each server has a server certificate; each
//! device gets a short-lived client certificate at login; an administrator gets one by
//! command. A peer's identity is read back from its verified certificate
//! ([`identity_of`]), so any server of the farm can tell who is connected without asking
//! anyone.
//!
//! ```text
//! identity.rs   identity_of: a certificate's SAN URI urn:ferry:KIND:NAME ─► Identity (contract)
//! authority.rs  Authority: make or load the CA, issue server and client certificates
//! tls.rs        rustls ServerConfig / ClientConfig from PEM text (ring provider)
//! files.rs      CertDir: the on-disk layout the NBD tools read (keys 0600, dir 0700)
//! ```
//!
//! A file uses only files listed above it.
#![warn(missing_docs)]

mod authority;
mod files;
mod identity;
mod tls;

pub use authority::{
    Authority, CA_VALIDITY, DEVICE_CERT_VALIDITY, Issued, PkiError, SERVER_CERT_VALIDITY,
};
pub use files::{CA_CERT, CLIENT_CERT, CLIENT_KEY, CertDir, SERVER_CERT, SERVER_KEY};
pub use identity::{IDENTITY_NAME_BYTES_MAX, Identity, IdentityError, identity_of};
pub use tls::{TlsError, client_config, server_config};
