//! A device's boot set: the farm API route a logged-in device (the `ferry target` agent, the
//! boot agent) asks for the boot set of the version it booted, to read its next blocks ahead
//! of the kernel.
//!
//! ```text
//!   device                                          farm API
//!   POST /api/v1/device/boot-set BootSetRequest ──►  200 application/octet-stream: the
//!                                                    encoded set (crates/bootset: versioned,
//!                                                    CRC-32C, carries the version identity)
//!                                                    204: no set yet; 401: no live session
//! ```
//!
//! Like the status report, the request names its session by the session's export name (the
//! unguessable secret login gave the device) and needs no API token. The set returned is the
//! one of the version the session boots, never another's; a device checks its identity
//! (`bootset::BootSet::identity`: vDisk, version, virtual size) against what it attached.

use serde::{Deserialize, Serialize};

/// The path of the route, under the API's base URL.
pub const BOOT_SET_PATH: &str = "api/v1/device/boot-set";
/// The content type of a set in the answer.
pub const BOOT_SET_CONTENT_TYPE: &str = "application/octet-stream";

/// Asks for the boot set of the version a session boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BootSetRequest {
    /// The session's export name, as login gave it (`ferry-s-…`): the credential.
    pub export_name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_its_export_name_in_json() {
        let r = BootSetRequest {
            export_name: "ferry-s-abc".into(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"export_name":"ferry-s-abc"}"#);
        assert!(serde_json::from_str::<BootSetRequest>(r#"{"export_name":"x","y":1}"#).is_err());
    }
}
