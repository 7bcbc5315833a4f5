//! Device login: the JSON bodies of the farm API's two login routes, and the proof.
//!
//! ```text
//!   target                                        farm API
//!   POST /api/v1/login/challenge ChallengeRequest ──►  Challenge (nonce, one use, 60 s)
//!   hmac = proof(key, nonce, mac)
//!   POST /api/v1/login LoginRequest          ──►  LoginGrant: servers, vDisk, version,
//!                                                 cache mode, sizes, session export, token
//!   or, a diskless machine's first login of a boot:
//!   POST /api/v1/login {mac, ticket}         ──►  LoginGrant (with the device's new key)
//! ```
//!
//! The proof is the lowercase hex HMAC-SHA256, under a key's bytes, of the nonce's text as
//! received followed by the normalized MAC text (`aa:bb:cc:dd:ee:ff`), both as UTF-8. The
//! key never crosses the wire. The key is the device's own: 32 random bytes the farm made
//! for that device alone and keeps ([`DEVICE_KEY_BYTES`]); nothing farm-wide proves a login
//! and no device key is derived from anything. An administrator's credential reset makes a
//! new random key (the old one stops working); a *ticket* login (below) makes one too and
//! the grant carries it ([`LoginGrant::device_secret`], shown once).
//!
//! A diskless machine that has no key of its own (no disk, no TPM) logs in with a *login
//! ticket* instead of a proof ([`LoginRequest::ticket`]): a random one-time value the farm's
//! boot service put on that MAC's kernel command line (`ferry.ticket=`), valid for seconds
//! and for one login of that MAC, and only for a device the farm marks diskless
//! (docs/threat-model.md says what that mode allows).
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
/// The path of the route where a device says it keeps its key in its TPM (a proof as at
/// login; the farm then takes no login ticket for it).
pub const TPM_BIND_PATH: &str = "api/v1/login/tpm";
/// Bytes of a device key (random, one per device).
pub const DEVICE_KEY_BYTES: usize = 32;
/// The prefix of a login ticket's text (then 64 hex digits), so that one is recognizable.
pub const TICKET_PREFIX: &str = "ft_";
/// The most characters of a login ticket read (a ticket is 67).
pub const TICKET_CHARS_MAX: usize = 128;

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

/// A login: the proof of the device's key (its device secret), or a login ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The device's MAC address.
    pub mac: String,
    /// The nonce of the challenge (empty with a ticket).
    #[serde(default)]
    pub nonce: String,
    /// HMAC-SHA256(key, nonce ‖ mac), hex, under the device secret (empty with a ticket).
    #[serde(default)]
    pub hmac: String,
    /// The device boots over the network with no disk to keep a device secret in (the
    /// agent in its initramfs). It changes nothing for a known device (an administrator
    /// sets that); a device a ticket login adds automatically is always diskless.
    #[serde(default)]
    pub diskless: bool,
    /// A login ticket (`ft_` and 64 hex digits) from the boot script's `ferry.ticket=`,
    /// instead of a nonce and proof: one use, for this MAC, within seconds of the boot
    /// script, for a diskless device only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
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
    /// The device's new secret (64 hex digits), only in the grant of a ticket login (which
    /// makes the device a new random key): keep it (in RAM, or sealed in a TPM); later
    /// logins prove with it, until the next ticket login or an administrator's reset.
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
    fn request_json_keeps_its_field_names() {
        let r = LoginRequest {
            mac: "aa:bb:cc:00:00:01".into(),
            nonce: "ab".into(),
            hmac: "cd".into(),
            diskless: false,
            ticket: None,
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
        // A ticket login carries no nonce or proof.
        let t: LoginRequest =
            serde_json::from_str(r#"{"mac":"aa:bb:cc:00:00:01","ticket":"ft_00"}"#).unwrap();
        assert_eq!((t.nonce.as_str(), t.ticket.as_deref()), ("", Some("ft_00")));
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
