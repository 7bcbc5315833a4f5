//! Device login: the JSON bodies of the farm API's two login routes, and the proof.
//!
//! ```text
//!   target                                        farm API
//!   POST /api/v1/login/challenge ChallengeRequest ──►  Challenge (nonce, one use, 60 s)
//!   hmac = proof(key, nonce, mac)
//!   POST /api/v1/login LoginRequest          ──►  LoginGrant: servers, vDisk, version,
//!                                                 cache mode, sizes, session export, token
//! ```
//!
//! The proof is the lowercase hex HMAC-SHA256, under a key's bytes, of the nonce's text as
//! received followed by the normalized MAC text (`aa:bb:cc:dd:ee:ff`), both as UTF-8. The
//! key never crosses the wire. Which key: an enrolled device proves with its own device
//! secret; the farm key (`DATA/secrets/farm.key`) only *enrols* a device the farm has not
//! enrolled yet, and that first grant carries the device's new secret
//! ([`LoginGrant::device_secret`], shown once). The farm derives a device's key from its
//! master key ([`device_key`]), so it keeps no device key.
//!
//! Every grant from a farm with a CA also carries a short-lived client certificate naming
//! the device ([`DeviceTls`]), which the target presents to the NBD servers.
//!
//! The farm sends its whole device record in the grant; [`LoginGrant`] is generic over it,
//! so the farm serializes `LoginGrant<farm::model::Device>` and a target reads
//! `LoginGrant<DeviceRef>` (the fields it needs; serde skips the others). MACs travel as
//! text: the farm refuses a malformed one with its own message (400), not as bad JSON.

use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::access::AccessMode;
use crate::cache_mode::CacheMode;
use crate::mac::Mac;

/// The path of the challenge route, under the API's base URL.
pub const CHALLENGE_PATH: &str = "api/v1/login/challenge";
/// The path of the login route, under the API's base URL.
pub const LOGIN_PATH: &str = "api/v1/login";

/// A login challenge request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ChallengeRequest {
    /// The device's MAC address.
    pub mac: String,
}

/// A login challenge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Challenge {
    /// The nonce to sign (64 hex digits).
    pub nonce: String,
    /// When it expires.
    pub expires_at_ms: i64,
}

/// A login: the proof of the device's key (its device secret, or the farm key to enrol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The device's MAC address.
    pub mac: String,
    /// The nonce of the challenge.
    pub nonce: String,
    /// HMAC-SHA256(key, nonce ‖ mac), hex, under the device secret (or, to enrol, the farm
    /// key).
    pub hmac: String,
    /// The device boots over the network with no disk to keep a device secret in (the
    /// agent in its initramfs): a device the login adds automatically is made diskless,
    /// which lets the farm key log it in at every boot. It changes nothing for a known
    /// device (an administrator sets that).
    #[serde(default)]
    pub diskless: bool,
}

/// A server of the device's site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct LoginServer {
    /// Name.
    pub name: String,
    /// NBD address (`host:port`).
    pub address: String,
    /// True when it heartbeat within the last minute.
    pub alive: bool,
    /// True when it is draining: it serves, but a device should prefer any live server that
    /// is not (absent in older answers: false).
    #[serde(default)]
    pub draining: bool,
}

/// What a device gets at login. `D` is the device record (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct LoginGrant<D> {
    /// The session's id.
    pub session_id: String,
    /// The session token (bearer), shown once.
    pub session_token: String,
    /// The session-scoped NBD export name.
    pub export_name: String,
    /// When the session ends.
    pub expires_at_ms: i64,
    /// The device (created now when its collection allows auto-add).
    pub device: D,
    /// The servers of its site, alive ones first.
    pub servers: Vec<LoginServer>,
    /// The vDisk's id.
    pub vdisk_id: i64,
    /// The vDisk's name.
    pub vdisk_name: String,
    /// The vDisk's virtual size.
    pub size_bytes: i64,
    /// The version the device boots.
    pub version: i64,
    /// When that version was made (milliseconds since the epoch): a version deleted and
    /// made again under its number has another, so caches keyed by it never mix the two.
    #[serde(default)]
    pub version_created_at_ms: i64,
    /// That version's access mode.
    pub access: AccessMode,
    /// Where the device's writes go.
    pub cache_mode: CacheMode,
    /// The RAM cache size.
    pub ram_bytes: i64,
    /// True in private mode (maintenance): the export writes to the version itself.
    pub writable: bool,
    /// The device's new secret (64 hex digits), only in the grant of the login that enrolled
    /// it (made with the farm key): keep it; later logins prove with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_secret: Option<String>,
    /// The device's client certificate for the NBD servers, when the farm has a CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<DeviceTls>,
}

/// A device's TLS credentials from its login: a client certificate naming the device
/// (`urn:ferry:device:MAC`), its key and the farm's CA certificate, all PEM.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct DeviceTls {
    /// The farm's CA certificate (PEM): the servers' certificates chain to it.
    pub ca_pem: String,
    /// The device's client certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8).
    pub key_pem: String,
    /// When the certificate stops being valid (Unix ms); log in again before.
    pub not_after_ms: i64,
}

impl std::fmt::Debug for DeviceTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTls")
            .field("not_after_ms", &self.not_after_ms)
            .finish_non_exhaustive()
    }
}

/// The fields of the grant's device record that a target reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRef {
    /// The device's id in the farm.
    pub id: i64,
    /// Its MAC address, normalized.
    pub mac: String,
    /// Its name in the farm.
    pub name: String,
}

/// The label that starts the input of [`device_key`].
const DEVICE_KEY_LABEL: &[u8] = b"ferry device key\0";

/// A device's key (its secret's bytes): HMAC-SHA256(master, "ferry device key" NUL ‖ mac ‖
/// NUL ‖ generation as decimal text), `mac` the normalized text. A new generation (a reset
/// credential) makes a new key, and the old one stops proving anything.
pub fn device_key(master: &[u8], mac: Mac, generation: i64) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(master).expect("HMAC takes keys of any length");
    m.update(DEVICE_KEY_LABEL);
    m.update(mac.to_string().as_bytes());
    m.update(b"\0");
    m.update(generation.to_string().as_bytes());
    m.finalize().into_bytes().into()
}

/// The login proof: lowercase hex HMAC-SHA256(key, nonce ‖ mac) (see the module docs).
pub fn proof(key: &[u8], nonce: &str, mac: Mac) -> String {
    hex::encode(keyed(key, nonce, mac).finalize().into_bytes())
}

/// Checks a proof's bytes (hex-decoded) in constant time.
pub fn verify(key: &[u8], nonce: &str, mac: Mac, hmac: &[u8]) -> bool {
    keyed(key, nonce, mac).verify_slice(hmac).is_ok()
}

fn keyed(key: &[u8], nonce: &str, mac: Mac) -> Hmac<Sha256> {
    // HMAC hashes a key longer than a block and pads a shorter one: every length works.
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(nonce.as_bytes());
    m.update(mac.to_string().as_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HMAC-SHA256 of key 00 01 .. 1f over "nonce" ‖ "aa:bb:cc:00:00:01", computed
    /// independently (Python's `hmac` module).
    const VECTOR: &str = "a54a05d133785d3915df18842dea6e3a9927c178b59e4d645516a18eb6425918";

    fn key() -> Vec<u8> {
        (0u8..32).collect()
    }

    #[test]
    fn proof_matches_a_fixed_vector() {
        let mac: Mac = "AA-BB-CC-00-00-01".parse().unwrap();
        assert_eq!(proof(&key(), "nonce", mac), VECTOR);
    }

    #[test]
    fn proof_of_another_nonce_differs() {
        let mac: Mac = "aabbcc000001".parse().unwrap();
        assert_ne!(proof(&key(), "nonce2", mac), VECTOR);
    }

    #[test]
    fn verify_takes_the_proof_and_refuses_a_changed_one() {
        let mac: Mac = "aabbcc000001".parse().unwrap();
        let mut sent = hex::decode(VECTOR).unwrap();
        assert!(verify(&key(), "nonce", mac, &sent));
        sent[0] ^= 1;
        assert!(!verify(&key(), "nonce", mac, &sent));
    }

    #[test]
    fn device_keys_differ_by_mac_generation_and_master() {
        let mac: Mac = "aabbcc000001".parse().unwrap();
        let other: Mac = "aabbcc000002".parse().unwrap();
        let k = device_key(&key(), mac, 1);
        assert_eq!(k, device_key(&key(), mac, 1));
        assert_ne!(k, device_key(&key(), mac, 2));
        assert_ne!(k, device_key(&key(), other, 1));
        assert_ne!(k, device_key(&[9; 32], mac, 1));
        assert_ne!(k.as_slice(), key().as_slice());
    }

    #[test]
    fn request_json_keeps_its_field_names() {
        let r = LoginRequest {
            mac: "aa:bb:cc:00:00:01".into(),
            nonce: "ab".into(),
            hmac: "cd".into(),
            diskless: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"mac":"aa:bb:cc:00:00:01","nonce":"ab","hmac":"cd","diskless":false}"#
        );
        // An older agent's request, without `diskless`, still reads.
        let old: LoginRequest =
            serde_json::from_str(r#"{"mac":"aa:bb:cc:00:00:01","nonce":"ab","hmac":"cd"}"#)
                .unwrap();
        assert_eq!(old, r);
    }

    #[test]
    fn a_target_reads_a_grant_with_the_farm_s_whole_device_record() {
        let text = r#"{"session_id":"s","session_token":"fs_1","export_name":"ferry-s-00",
            "expires_at_ms":5,"device":{"id":1,"collection_id":1,"name":"pc1",
            "mac":"aa:bb:cc:00:00:01","device_type":"production"},
            "servers":[{"name":"a","address":"h:10809","alive":true}],"vdisk_id":1,
            "vdisk_name":"golden","size_bytes":1048576,"version":2,"access":"production",
            "cache_mode":"ram_overflow","ram_bytes":65536,"writable":false}"#;
        let g: LoginGrant<DeviceRef> = serde_json::from_str(text).unwrap();
        assert_eq!(g.device.name, "pc1");
        assert_eq!(g.cache_mode, CacheMode::RamOverflow);
        assert_eq!((g.device_secret, g.tls), (None, None));
    }
}
