//! Certificates issued by the farm's CA in real TLS handshakes (rustls on both ends, in
//! memory): a device's identity is read back from what it presents; a certificate of
//! another CA, and a server certificate for another host, are refused; a certificate of the
//! farm's CA without the client authentication usage names no identity.

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::time::SystemTime;

use pki::{Authority, DEVICE_CERT_VALIDITY, Identity, identity_of};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection};

/// Runs a handshake between `client` and `server`, returning the server's connection, or
/// the first error either side raised.
fn handshake(
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    host: &str,
) -> Result<ServerConnection, rustls::Error> {
    let name = ServerName::try_from(host.to_string()).unwrap();
    let mut c = ClientConnection::new(client, name)?;
    let mut s = ServerConnection::new(server)?;
    for _ in 0..20 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
        }
        s.process_new_packets()?;
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
        }
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() {
            // One application byte each way proves the keys agree.
            c.writer().write_all(b"x").unwrap();
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets()?;
            let mut got = [0u8; 1];
            s.reader().read_exact(&mut got).unwrap();
            assert_eq!(&got, b"x");
            return Ok(s);
        }
    }
    panic!("handshake did not finish");
}

fn setup() -> (Authority, Arc<rustls::ServerConfig>) {
    let now = SystemTime::now();
    let ca = Authority::create("test", now).unwrap();
    let srv = ca
        .issue_server("s1", &["localhost".into(), "127.0.0.1".into()], now)
        .unwrap();
    let config = pki::server_config(ca.cert_pem(), &srv.cert_pem, &srv.key_pem).unwrap();
    (ca, config)
}

#[test]
fn a_device_certificate_names_its_device_to_the_server() {
    let (ca, server) = setup();
    let mac = "aa:bb:cc:00:00:07".parse().unwrap();
    let dev = ca
        .issue_client(
            &Identity::Device(mac),
            SystemTime::now(),
            DEVICE_CERT_VALIDITY,
        )
        .unwrap();
    let client = pki::client_config(ca.cert_pem(), Some((&dev.cert_pem, &dev.key_pem))).unwrap();
    let s = handshake(client, server, "127.0.0.1").unwrap();
    let peer = s
        .peer_certificates()
        .expect("the client presented its certificate");
    assert_eq!(identity_of(&peer[0]), Some(Identity::Device(mac)));
}

#[test]
fn an_anonymous_client_gets_tls_and_no_identity() {
    let (ca, server) = setup();
    let client = pki::client_config(ca.cert_pem(), None).unwrap();
    let s = handshake(client, server, "localhost").unwrap();
    assert!(s.peer_certificates().is_none());
}

#[test]
fn a_loaded_authority_issues_certificates_the_original_verifies() {
    let (ca, server) = setup();
    let again = Authority::load(ca.cert_pem(), ca.key_pem()).unwrap();
    let admin = Identity::admin("alice").unwrap();
    let cert = again
        .issue_client(&admin, SystemTime::now(), DEVICE_CERT_VALIDITY)
        .unwrap();
    let client = pki::client_config(ca.cert_pem(), Some((&cert.cert_pem, &cert.key_pem))).unwrap();
    let s = handshake(client, server, "127.0.0.1").unwrap();
    assert_eq!(identity_of(&s.peer_certificates().unwrap()[0]), Some(admin));
}

#[test]
fn a_certificate_of_another_ca_is_refused() {
    let (ca, server) = setup();
    let other = Authority::create("other", SystemTime::now()).unwrap();
    let forged = other
        .issue_client(
            &Identity::admin("mallory").unwrap(),
            SystemTime::now(),
            DEVICE_CERT_VALIDITY,
        )
        .unwrap();
    let client =
        pki::client_config(ca.cert_pem(), Some((&forged.cert_pem, &forged.key_pem))).unwrap();
    assert!(handshake(client, server, "127.0.0.1").is_err());
}

/// A certificate the farm's CA signed naming `urn:ferry:admin:mallory` with `eku` (the
/// farm never issues one without client authentication), PEM certificate and key.
fn admin_cert_with(ca: &Authority, eku: Vec<rcgen::ExtendedKeyUsagePurpose>) -> (String, String) {
    let ca_key = rcgen::KeyPair::from_pem(ca.key_pem()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca.cert_pem(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "ferry admin mallory");
    p.subject_alt_names = vec![rcgen::SanType::URI(
        "urn:ferry:admin:mallory".try_into().unwrap(),
    )];
    p.extended_key_usages = eku;
    let cert = p.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Issue 30: a certificate of the farm's CA without the client authentication usage the
/// farm issues to administrators is no identity. TLS accepts one with no extended key usage
/// at all (valid for any purpose), so the identity check must refuse it.
#[test]
fn a_farm_certificate_without_client_auth_names_no_identity() {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let (ca, server) = setup();
    let (cert, key) = admin_cert_with(&ca, Vec::new());
    let client = pki::client_config(ca.cert_pem(), Some((&cert, &key))).unwrap();
    let s = handshake(client, server, "127.0.0.1").unwrap();
    assert_eq!(identity_of(&s.peer_certificates().unwrap()[0]), None);
    let (server_only, _) = admin_cert_with(&ca, vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]);
    let der = CertificateDer::from_pem_slice(server_only.as_bytes()).unwrap();
    assert_eq!(identity_of(&der), None);
    let (issued, _) = admin_cert_with(&ca, vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]);
    let der = CertificateDer::from_pem_slice(issued.as_bytes()).unwrap();
    assert_eq!(identity_of(&der), Some(Identity::admin("mallory").unwrap()));
}

#[test]
fn an_expired_device_certificate_is_refused() {
    let (ca, server) = setup();
    let long_ago = SystemTime::now() - std::time::Duration::from_secs(3 * 24 * 3600);
    let mac = "aa:bb:cc:00:00:08".parse().unwrap();
    let old = ca
        .issue_client(&Identity::Device(mac), long_ago, DEVICE_CERT_VALIDITY)
        .unwrap();
    let client = pki::client_config(ca.cert_pem(), Some((&old.cert_pem, &old.key_pem))).unwrap();
    assert!(handshake(client, server, "127.0.0.1").is_err());
}

#[test]
fn a_client_refuses_a_server_certificate_for_another_host() {
    let (ca, server) = setup();
    let client = pki::client_config(ca.cert_pem(), None).unwrap();
    assert!(handshake(client, server, "evil.example").is_err());
}

#[test]
fn the_cert_dir_keeps_every_file_0600_in_a_0700_directory() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let dir = pki::CertDir::create(&tmp.path().join("tls")).unwrap();
    dir.write(pki::CLIENT_KEY, "secret").unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.path()), 0o700);
    assert_eq!(mode(&dir.file(pki::CLIENT_KEY)), 0o600);
    assert_eq!(dir.read(pki::CLIENT_KEY).unwrap(), "secret");
}

#[test]
fn the_server_chooses_aes_128_gcm_over_a_client_that_prefers_aes_256() {
    use rustls::crypto::ring::cipher_suite as cs;
    let (ca, server) = setup();
    // A client offering what GnuTLS's NORMAL priority offers first: AES-256-GCM.
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS13_AES_128_GCM_SHA256,
    ];
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates({
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject as _;
            let der = rustls::pki_types::CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())
                .unwrap();
            roots.add(der).unwrap();
            roots
        })
        .with_no_client_auth();
    let s = handshake(Arc::new(client), server, "127.0.0.1").unwrap();
    assert_eq!(
        s.negotiated_cipher_suite().map(|c| c.suite()),
        Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
}
