//! Identities and credentials, on SQLite and PostgreSQL: the farm key and the CA live in
//! `DATA/secrets/`, never in the database (also after moving an old farm's key out of it);
//! the farm key enrols a device once and its device secret proves it from then on; a reset
//! credential invalidates the old secret; every login carries a device certificate that a
//! server of the farm accepts and reads the device from; administrator and server
//! certificates come from the same CA.

use crate::common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use common::{TestFarm, Which};
use farm::input::{NewCollection, NewDevice, NewSite, NewStore, NewVDisk};
use farm::login::{ChallengeRequest, LoginGrant, LoginRequest, proof};
use farm::model::DeviceType;
use farm::{Farm, Kind};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject as _;
use rustls::{ClientConnection, ServerConnection};

const ADMIN: &str = "admin";
const MAC: &str = "aa:bb:cc:00:01:01";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every byte of the farm's SQLite files (the database and any journal beside it).
fn sqlite_bytes(t: &TestFarm) -> Vec<u8> {
    let data = t.dir.path().join("data");
    let mut all = Vec::new();
    for e in std::fs::read_dir(&data).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with(farm::db::SQLITE_FILE_NAME) {
            all.extend(std::fs::read(&p).unwrap());
        }
    }
    assert!(!all.is_empty(), "no SQLite file in {}", data.display());
    all
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Checks that the database holds the farm key in no form: on SQLite no file byte run is
/// the key's hex or its bytes; on PostgreSQL no text column of the farm row holds it.
async fn assert_db_holds_no_key(t: &TestFarm, key_hex: &str) {
    let key = hex::decode(key_hex).unwrap();
    match t.which {
        Which::Sqlite => {
            let bytes = sqlite_bytes(t);
            assert!(
                !contains(&bytes, key_hex.as_bytes()),
                "the key's hex is in farm.db"
            );
            assert!(!contains(&bytes, &key), "the key's bytes are in farm.db");
        }
        Which::Postgres => {
            use sqlx::Connection as _;
            let url = t.db_url.as_deref().unwrap();
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            let row: String = sqlx::query_scalar("SELECT row_to_json(farm)::text FROM farm")
                .fetch_one(&mut c)
                .await
                .unwrap();
            assert!(!row.contains(key_hex), "{row}");
        }
    }
}

/// A vDisk "golden" and a collection that adds unknown devices on it.
async fn fixture(t: &TestFarm) -> i64 {
    let f = &t.farm;
    let site = f
        .create_site(
            &NewSite {
                name: "hq".into(),
                description: String::new(),
            },
            ADMIN,
        )
        .await
        .unwrap()
        .id;
    let store = NewStore {
        name: "main".into(),
        path: "main".into(),
        bucket: String::new(),
    };
    let store = f.create_store(&store, ADMIN).await.unwrap().id;
    let vdisk = NewVDisk {
        store_id: store,
        name: "golden".into(),
        size_bytes: Some(64 << 20),
        cache_mode: None,
        ram_bytes: None,
        description: String::new(),
    };
    let vdisk = f.create_vdisk(&vdisk, ADMIN).await.unwrap().id;
    let c = NewCollection {
        site_id: site,
        name: "lab".into(),
        auto_add: true,
        default_vdisk_id: Some(vdisk),
        auto_add_max: None,
        auto_add_per_minute: None,
    };
    f.create_collection(&c, ADMIN).await.unwrap().id
}

/// A login of `mac` proving with `key_hex`.
async fn login_with(farm: &Farm, mac: &str, key_hex: &str) -> farm::Result<LoginGrant> {
    let c = farm
        .challenge(&ChallengeRequest { mac: mac.into() }, None)
        .await?;
    let hmac = proof(key_hex, &c.nonce, mac)?;
    let r = LoginRequest {
        mac: mac.into(),
        nonce: c.nonce,
        hmac,
        diskless: false,
        ticket: None,
    };
    farm.login(&r, None).await
}

/// A device of `mac` an administrator made (with a disk), and its first key from a reset.
async fn enrolled(t: &TestFarm, mac: &str) -> (i64, String) {
    let coll = t.farm.list_collections(None, None).await.unwrap().items[0].id;
    let vdisk = t.farm.list_vdisks(None, None).await.unwrap().items[0].id;
    let d = NewDevice {
        collection_id: coll,
        mac: mac.into(),
        name: format!("pc-{}", mac.replace(':', "")),
        device_type: Some(DeviceType::Production),
        vdisk_id: Some(vdisk),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless: false,
    };
    let id = t.farm.create_device(&d, ADMIN).await.unwrap().id;
    let c = t.farm.reset_device_credential(id, ADMIN).await.unwrap();
    (id, c.device_secret)
}

/// HMAC-SHA256 (RFC 2104) of a key of at most 64 bytes: how device keys were derived from
/// the farm key before issue 30.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = sha2::Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    sha2::Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The key the farm derived for `mac` at `generation` before issue 30 (hex).
fn derived_key(farm_key_hex: &str, mac: &str, generation: i64) -> String {
    let msg = format!("ferry device key\0{mac}\0{generation}");
    hex::encode(hmac_sha256(
        &hex::decode(farm_key_hex).unwrap(),
        msg.as_bytes(),
    ))
}

async fn actions(t: &TestFarm) -> Vec<String> {
    let page = t.farm.list_audit(Some(1000), None).await.unwrap();
    page.items.into_iter().map(|e| e.action).collect()
}

async fn the_database_holds_no_farm_key_and_the_secrets_dir_does(t: TestFarm) {
    let secrets = t.dir.path().join("data").join(farm::secrets::SECRETS_DIR);
    assert_eq!(mode(&secrets), 0o700);
    for f in [
        farm::secrets::FARM_KEY_FILE,
        farm::secrets::CA_KEY_FILE,
        farm::secrets::CA_CERT_FILE,
    ] {
        assert_eq!(mode(&secrets.join(f)), 0o600, "{f}");
    }
    assert_eq!(
        t.secrets.farm_key_file,
        secrets.join(farm::secrets::FARM_KEY_FILE)
    );
    let on_disk = std::fs::read_to_string(&t.secrets.farm_key_file).unwrap();
    assert_eq!(on_disk.trim(), t.secrets.farm_key_hex);
    assert_db_holds_no_key(&t, &t.secrets.farm_key_hex).await;
    assert!(t.farm.authority().is_ok());
}

async fn an_old_farm_s_key_moves_out_of_the_database_at_open(t: TestFarm) {
    let key_hex = t.secrets.farm_key_hex.clone();
    let config = t.config();
    let secrets = config.data_dir.join(farm::secrets::SECRETS_DIR);
    // Make it a farm of before: the key in the farm row, no secrets directory.
    {
        use sqlx::Connection as _;
        let set = "UPDATE farm SET farm_key = $1, key_fingerprint = ''";
        match t.which {
            Which::Sqlite => {
                let file = config.data_dir.join(farm::db::SQLITE_FILE_NAME);
                let url = format!("sqlite://{}", file.display());
                let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query(set)
                    .bind(&key_hex)
                    .execute(&mut c)
                    .await
                    .unwrap();
                c.close().await.unwrap();
            }
            Which::Postgres => {
                let mut c = sqlx::PgConnection::connect(t.db_url.as_deref().unwrap())
                    .await
                    .unwrap();
                sqlx::query(set)
                    .bind(&key_hex)
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }
    }
    std::fs::remove_dir_all(&secrets).unwrap();
    if t.which == Which::Sqlite {
        // The test means something: the old database does hold the key.
        assert!(contains(&sqlite_bytes(&t), key_hex.as_bytes()));
    }
    let TestFarm {
        farm: old,
        secrets: init,
        dir,
        which,
        db_url,
        device_secrets,
    } = t;
    drop(old);
    let farm = Farm::open(&config).await.unwrap();
    let t = TestFarm {
        farm: Arc::new(farm),
        secrets: init,
        dir,
        which,
        db_url,
        device_secrets,
    };
    let moved = std::fs::read_to_string(secrets.join(farm::secrets::FARM_KEY_FILE)).unwrap();
    assert_eq!(moved.trim(), key_hex);
    assert_eq!(mode(&secrets.join(farm::secrets::FARM_KEY_FILE)), 0o600);
    assert!(
        t.farm.authority().is_ok(),
        "a CA is made for the moved farm"
    );
    assert_db_holds_no_key(&t, &key_hex).await;
    // Logins work (with a device's own key: the moved farm key logs nothing in), and
    // opening again changes nothing.
    fixture(&t).await;
    let (_, key) = enrolled(&t, MAC).await;
    login_with(&t.farm, MAC, &key).await.unwrap();
    let e = login_with(&t.farm, MAC, &key_hex).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    drop(Farm::open(&config).await.unwrap());
}

async fn another_farm_s_secrets_are_refused_at_open(t: TestFarm) {
    let config = t.config();
    let key = config
        .data_dir
        .join(farm::secrets::SECRETS_DIR)
        .join(farm::secrets::FARM_KEY_FILE);
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    let e = Farm::open(&config).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Secrets);
    assert!(e.to_string().contains("another farm's key"), "{e}");
}

async fn neither_the_farm_key_nor_a_key_derived_from_it_logs_anyone_in(t: TestFarm) {
    fixture(&t).await;
    let farm_key = t.secrets.farm_key_hex.clone();
    // An unknown MAC: a proof adds nothing (auto-add is the boot ticket's), whatever key.
    let e = login_with(&t.farm, MAC, &farm_key).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Forbidden);
    assert!(t.farm.device_by_mac(MAC).await.unwrap().is_none());
    let (id, secret) = enrolled(&t, MAC).await;
    assert_eq!(secret.len(), 64);
    for generation in 1..=3 {
        let old = derived_key(&farm_key, MAC, generation);
        assert_ne!(old, secret, "the key is not the farm key's derivation");
        let e = login_with(&t.farm, MAC, &old).await.unwrap_err();
        assert_eq!(
            e.kind(),
            Kind::Unauthenticated,
            "derived, generation {generation}"
        );
    }
    let e = login_with(&t.farm, MAC, &farm_key).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated, "the farm key itself");
    let g = login_with(&t.farm, MAC, &secret).await.unwrap();
    assert_eq!((g.device.id, g.device_secret), (id, None));
    // One device's secret is no other's; two devices' keys differ.
    let other = "aa:bb:cc:00:01:02";
    let (_, other_secret) = enrolled(&t, other).await;
    assert_ne!(other_secret, secret);
    let e = login_with(&t.farm, other, &secret).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    login_with(&t.farm, other, &other_secret).await.unwrap();
    // A device that never had a key is logged in by nothing.
    let d = NewDevice {
        collection_id: g.device.collection_id,
        mac: "aa:bb:cc:00:01:03".into(),
        name: "pc3".into(),
        device_type: Some(DeviceType::Production),
        vdisk_id: Some(g.vdisk_id),
        cache_mode: None,
        ram_bytes: None,
        pinned_version: None,
        diskless: false,
    };
    t.farm.create_device(&d, ADMIN).await.unwrap();
    for key in [&farm_key, &derived_key(&farm_key, "aa:bb:cc:00:01:03", 1)] {
        let e = login_with(&t.farm, "aa:bb:cc:00:01:03", key)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::Unauthenticated);
    }
}

async fn a_reset_credential_invalidates_the_old_secret(t: TestFarm) {
    fixture(&t).await;
    let (id, old) = enrolled(&t, MAC).await;
    let g = login_with(&t.farm, MAC, &old).await.unwrap();
    let c = t
        .farm
        .reset_device_credential(g.device.id, ADMIN)
        .await
        .unwrap();
    assert_eq!((c.device_id, c.generation, c.mac.as_str()), (id, 2, MAC));
    assert_ne!(c.device_secret, old);
    let e = login_with(&t.farm, MAC, &old).await.unwrap_err();
    assert_eq!(e.kind(), Kind::Unauthenticated);
    login_with(&t.farm, MAC, &c.device_secret).await.unwrap();
    assert!(
        actions(&t)
            .await
            .contains(&"device.credential_reset".to_string())
    );
    let e = t
        .farm
        .reset_device_credential(9999, ADMIN)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound);
}

/// Runs an in-memory TLS handshake; returns the server side.
fn handshake(
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    host: &str,
) -> ServerConnection {
    let mut c =
        ClientConnection::new(client, ServerName::try_from(host.to_string()).unwrap()).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    let pump = |from: &mut dyn FnMut(&mut Vec<u8>), to: &mut dyn FnMut(&[u8])| {
        let mut buf = Vec::new();
        from(&mut buf);
        to(&buf);
    };
    for _ in 0..20 {
        pump(
            &mut |b| {
                while c.wants_write() {
                    c.write_tls(b).unwrap();
                }
            },
            &mut |mut b| {
                while !b.is_empty() {
                    s.read_tls(&mut b).unwrap();
                }
                s.process_new_packets().unwrap();
            },
        );
        pump(
            &mut |b| {
                while s.wants_write() {
                    s.write_tls(b).unwrap();
                }
            },
            &mut |mut b| {
                while !b.is_empty() {
                    c.read_tls(&mut b).unwrap();
                }
                c.process_new_packets().unwrap();
            },
        );
        if !c.is_handshaking() && !s.is_handshaking() {
            c.writer().write_all(b"x").unwrap();
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets().unwrap();
            let mut got = [0u8; 1];
            s.reader().read_exact(&mut got).unwrap();
            return s;
        }
    }
    panic!("handshake did not finish");
}

async fn every_login_carries_a_device_certificate_a_farm_server_accepts(t: TestFarm) {
    fixture(&t).await;
    let (_, key) = enrolled(&t, MAC).await;
    let g = login_with(&t.farm, MAC, &key).await.unwrap();
    let tls = g.tls.expect("a farm with a CA issues a device certificate");
    let ttl = tls.not_after_ms - t.farm.now_ms();
    let day = i64::try_from(pki::DEVICE_CERT_VALIDITY.as_millis()).unwrap();
    assert!(ttl > day - 60_000 && ttl <= day, "{ttl}");
    let ca = t.farm.authority().unwrap();
    assert_eq!(tls.ca_pem, ca.cert_pem());
    let hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let (ca_pem, srv) = t.farm.server_tls("s1", &hosts).unwrap();
    let server = pki::server_config(&ca_pem, &srv.cert_pem, &srv.key_pem).unwrap();
    let client = pki::client_config(&tls.ca_pem, Some((&tls.cert_pem, &tls.key_pem))).unwrap();
    let s = handshake(client, server, "127.0.0.1");
    let peer = s
        .peer_certificates()
        .expect("the device presented its certificate");
    let mac = MAC.parse().unwrap();
    assert_eq!(pki::identity_of(&peer[0]), Some(pki::Identity::Device(mac)));
    // The server's certificate is cached, and issued again for other hosts.
    let dir = t
        .dir
        .path()
        .join("data/secrets")
        .join(farm::secrets::SERVERS_DIR)
        .join("s1");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(pki::SERVER_KEY)), 0o600);
    let (_, again) = t.farm.server_tls("s1", &hosts).unwrap();
    assert_eq!(again.cert_pem, srv.cert_pem);
    let (_, moved) = t.farm.server_tls("s1", &["10.0.0.9".to_string()]).unwrap();
    assert_ne!(moved.cert_pem, srv.cert_pem);
}

async fn administrator_certificates_name_the_admin_and_are_audited(t: TestFarm) {
    let (ca_pem, issued) = t.farm.issue_admin_cert("alice", 7, ADMIN).await.unwrap();
    assert_eq!(ca_pem, t.farm.authority().unwrap().cert_pem());
    let der = rustls::pki_types::CertificateDer::from_pem_slice(issued.cert_pem.as_bytes());
    let der = der.unwrap();
    assert_eq!(
        pki::identity_of(&der),
        Some(pki::Identity::admin("alice").unwrap())
    );
    let left = issued.not_after_unix - t.farm.now_ms() / 1000;
    assert!((7 * 86400 - 60..=7 * 86400).contains(&left), "{left}");
    assert!(actions(&t).await.contains(&"cert.admin".to_string()));
    for (name, days) in [("a/b", 7), ("alice", 0), ("alice", 100_000)] {
        let e = t
            .farm
            .issue_admin_cert(name, days, ADMIN)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput, "{name} {days}");
    }
}

dual_tests!(
    the_database_holds_no_farm_key_and_the_secrets_dir_does,
    an_old_farm_s_key_moves_out_of_the_database_at_open,
    another_farm_s_secrets_are_refused_at_open,
    neither_the_farm_key_nor_a_key_derived_from_it_logs_anyone_in,
    a_reset_credential_invalidates_the_old_secret,
    every_login_carries_a_device_certificate_a_farm_server_accepts,
    administrator_certificates_name_the_admin_and_are_audited,
);
