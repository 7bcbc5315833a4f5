//! The boot set of a logged-in device's version, from its farm: `POST
//! /api/v1/device/boot-set` with the session's export name (the credential a status report
//! uses too; see `contract::boot_set`). It feeds the prefetch ([`crate::prefetch`]).
//!
//! The answer is checked before a byte of it is used: its size is bounded, it must decode
//! (`bootset`: versioned, CRC-32C), and its identity must be the version login gave (vDisk,
//! version, virtual size), so a set of another version never steers what is read ahead.

use std::time::Duration;

use crate::login;
use crate::prefetch::BootSetSource;

/// The largest answer read: a set of [`bootset::EXTENTS_MAX`] extents with the longest name.
pub const BOOT_SET_ANSWER_BYTES_MAX: usize =
    bootset::encoded_len(bootset::NAME_BYTES_MAX, bootset::EXTENTS_MAX);
/// How long the request may take.
pub const BOOT_SET_FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a device's boot set comes from: its farm, asked once when the prefetch starts.
#[derive(Debug, Clone)]
pub struct FarmBootSet {
    /// The farm API's base URL.
    pub api: String,
    /// The farm CA's certificate (PEM), to trust an HTTPS API.
    pub ca_pem: Option<String>,
    /// The session's export name.
    pub export_name: String,
    /// The vDisk login gave.
    pub vdisk: String,
    /// Its version.
    pub version: i64,
    /// Its virtual size.
    pub size_bytes: u64,
}

impl FarmBootSet {
    /// The set of the version `grant` gave, asked of the farm API at `api`.
    pub fn for_grant(api: String, ca_pem: Option<String>, grant: &login::LoginGrant) -> Self {
        FarmBootSet {
            api,
            ca_pem,
            export_name: grant.export_name.to_string(),
            vdisk: grant.vdisk.clone(),
            version: grant.version,
            size_bytes: grant.size_bytes,
        }
    }

    /// The set's extents, checked against the version (see the module's notes).
    ///
    /// # Errors
    /// What failed, as text (the prefetch logs it and reads without a set).
    fn fetch(&self) -> Result<Vec<(u64, u32)>, String> {
        let url = login::parse_api_url(&self.api)
            .map_err(|e| e.to_string())?
            .join(contract::boot_set::BOOT_SET_PATH)
            .map_err(|e| e.to_string())?;
        let client = login::api_client(&url, self.ca_pem.as_deref())
            .map_err(|e| e.to_string())?
            .timeout(BOOT_SET_FETCH_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let body = contract::boot_set::BootSetRequest {
            export_name: self.export_name.clone(),
        };
        let r = client
            .post(url.clone())
            .json(&body)
            .send()
            .map_err(|e| format!("{url}: {e}"))?;
        match r.status().as_u16() {
            204 => return Ok(Vec::new()),
            200 => {}
            s => return Err(format!("{url}: HTTP {s}")),
        }
        if r.content_length()
            .is_some_and(|n| n > BOOT_SET_ANSWER_BYTES_MAX as u64)
        {
            return Err(format!(
                "{url}: answer larger than {BOOT_SET_ANSWER_BYTES_MAX} bytes"
            ));
        }
        let bytes = r.bytes().map_err(|e| format!("{url}: {e}"))?;
        self.extents_of(&bytes)
    }

    /// The extents of an encoded set, when it is this version's.
    fn extents_of(&self, bytes: &[u8]) -> Result<Vec<(u64, u32)>, String> {
        if bytes.len() > BOOT_SET_ANSWER_BYTES_MAX {
            return Err(format!("boot set of {} bytes", bytes.len()));
        }
        let set = bootset::BootSet::decode(bytes).map_err(|e| format!("boot set: {e}"))?;
        let id = &set.identity;
        if id.vdisk != self.vdisk
            || i64::from(id.version) != self.version
            || id.size_bytes != self.size_bytes
        {
            return Err(format!(
                "the farm's boot set is of {}@{} ({} bytes), not of the attached {}@{} ({} \
                 bytes): not used",
                id.vdisk, id.version, id.size_bytes, self.vdisk, self.version, self.size_bytes
            ));
        }
        Ok(set.extents.iter().map(|e| (e.offset, e.len)).collect())
    }
}

impl BootSetSource for FarmBootSet {
    fn boot_set(&self) -> Result<Vec<(u64, u32)>, String> {
        self.fetch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> FarmBootSet {
        FarmBootSet {
            api: "http://127.0.0.1:1".into(),
            ca_pem: None,
            export_name: "ferry-s-x".into(),
            vdisk: "golden".into(),
            version: 2,
            size_bytes: 1 << 30,
        }
    }

    fn set(vdisk: &str, version: u32, size_bytes: u64) -> Vec<u8> {
        let mut r = bootset::Recorder::new(size_bytes, 1024);
        r.read(1 << 20, 65536, 0);
        r.read(0, 4096, 5);
        let id = bootset::Identity {
            vdisk: vdisk.into(),
            version,
            size_bytes,
            stamp: [7; 16],
        };
        r.finish(id).expect("a set").encode()
    }

    #[test]
    fn the_version_s_own_set_gives_its_extents_in_boot_order() {
        let got = source().extents_of(&set("golden", 2, 1 << 30)).unwrap();
        assert_eq!(got.first(), Some(&(1 << 20, 65536)));
        assert!(got.contains(&(0, 4096)));
    }

    #[test]
    fn another_version_s_set_or_damaged_bytes_are_refused() {
        let s = source();
        assert!(s.extents_of(&set("golden", 3, 1 << 30)).is_err());
        assert!(s.extents_of(&set("other", 2, 1 << 30)).is_err());
        assert!(s.extents_of(&set("golden", 2, 1 << 31)).is_err());
        let mut bad = set("golden", 2, 1 << 30);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(s.extents_of(&bad).is_err());
    }

    #[test]
    fn an_unreachable_farm_is_an_error_not_a_hang() {
        assert!(source().boot_set().is_err());
    }
}
