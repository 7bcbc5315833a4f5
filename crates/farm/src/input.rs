//! The inputs of the farm's changes: what an API body holds, checked by the farm (not by the
//! caller), so every entry point gets the same rules.

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::model::{AccessMode, CacheMode, DeviceType, MergeMode, Role};

/// Distinguishes an absent field (`None`) from an explicit `null` (`Some(None)`) in a patch.
fn double<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A change of the farm settings; absent fields stay.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    /// The farm's name.
    pub name: Option<String>,
    /// See [`crate::model::FarmSettings::auto_merge_chain_max`] (0 to 64).
    #[schema(minimum = 0, maximum = 64)]
    pub auto_merge_chain_max: Option<i64>,
    /// See [`crate::model::FarmSettings::boot_ticket_secs`] (5 to 3600).
    #[serde(default)]
    #[schema(minimum = 5, maximum = 3600)]
    pub boot_ticket_secs: Option<i64>,
}

/// A new API token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// Unique name.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// A new site.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSite {
    /// Unique name.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Free text.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub description: String,
}

/// A server registering itself. With `uid`, its identity: registering again with that uid
/// updates its row (name, address, site); another uid with a name already taken is refused.
/// Without one (an older server), registering an existing name updates that row unless the
/// row belongs to a server with a uid.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewServer {
    /// The site it serves.
    pub site_id: i64,
    /// Unique name, a label (`--server-name`, by default the host name).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Where devices reach its NBD service (`host:port`).
    pub address: String,
    /// The server's identity: random, made once and kept in its state directory (16 to 64
    /// lowercase hex digits).
    #[serde(default)]
    #[schema(min_length = 16, max_length = 64, pattern = r"^[0-9a-f]+$")]
    pub uid: Option<String>,
    /// Where devices reach its farm API (`http(s)://HOST:PORT`, at most
    /// `validate::API_URL_BYTES_MAX` bytes of kernel-argument characters): boot scripts
    /// name it beside their own server's.
    #[serde(default)]
    #[schema(max_length = 200, pattern = r"^https?://[A-Za-z0-9._:\[\]-]+$")]
    pub api_url: Option<String>,
}

/// What an administrator may change of a server (`PATCH /servers/{id}`): its weight in load
/// balancing and whether it drains (see `balance`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerPatch {
    /// Its rating, 1 to 10000 (`balance::RATING_MAX`): devices are spread so that each
    /// server's share is proportional to it.
    #[schema(minimum = 1, maximum = 10000)]
    pub rating: Option<i64>,
    /// Draining: named to devices after every other live server of its site.
    pub draining: Option<bool>,
}

/// A new store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewStore {
    /// Unique name.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// A directory under the store root (created when missing). For a bucket store, the
    /// working directory of the lifecycle (and where maintenance versions live).
    #[schema(min_length = 1, max_length = 4096)]
    pub path: String,
    /// `s3://BUCKET/PREFIX`: make it a bucket store (absent or empty: a directory store).
    #[serde(default)]
    #[schema(
        max_length = 1024,
        pattern = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?)?$"
    )]
    pub bucket: String,
}

/// A per-server path of a store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StorePath {
    /// The path on that server, under the store root.
    #[schema(min_length = 1, max_length = 4096)]
    pub path: String,
}

/// A new device collection.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCollection {
    /// The site.
    pub site_id: i64,
    /// Name, unique in its site.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Add unknown devices that log in (as production devices).
    #[serde(default)]
    pub auto_add: bool,
    /// The vDisk of devices added automatically.
    #[serde(default)]
    pub default_vdisk_id: Option<i64>,
    /// The most devices auto-add puts into it in all (default 500; 0 to 1,000,000).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000)]
    pub auto_add_max: Option<i64>,
    /// The most devices auto-add puts into it per minute (default 60; 0 to 100,000).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 100_000)]
    pub auto_add_per_minute: Option<i64>,
}

/// A new device.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewDevice {
    /// Its collection.
    pub collection_id: i64,
    /// MAC address (`aa:bb:cc:dd:ee:ff`, `AA-BB-...` or 12 hex digits).
    #[schema(pattern = r"^(([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}|[0-9A-Fa-f]{12})$")]
    pub mac: String,
    /// Name.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Its type (default production).
    #[serde(default)]
    pub device_type: Option<DeviceType>,
    /// The vDisk it boots.
    #[serde(default)]
    pub vdisk_id: Option<i64>,
    /// Override of the vDisk's cache mode.
    #[serde(default)]
    pub cache_mode: Option<CacheMode>,
    /// Override of the vDisk's RAM cache size.
    #[serde(default)]
    pub ram_bytes: Option<i64>,
    /// The version a production device boots instead of the newest production one.
    #[serde(default)]
    pub pinned_version: Option<i64>,
    /// It boots over the network with no disk: the farm key logs it in at every boot.
    #[serde(default)]
    pub diskless: bool,
}

/// A change of a device; absent fields stay, `null` clears an optional one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DevicePatch {
    /// Move to another collection.
    pub collection_id: Option<i64>,
    /// Rename.
    pub name: Option<String>,
    /// Change its type.
    pub device_type: Option<DeviceType>,
    /// Assign a vDisk (`null`: none).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<i64>)]
    pub vdisk_id: Option<Option<i64>>,
    /// Override the cache mode (`null`: the vDisk's).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<CacheMode>)]
    pub cache_mode: Option<Option<CacheMode>>,
    /// Override the RAM size (`null`: the vDisk's).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<i64>)]
    pub ram_bytes: Option<Option<i64>>,
    /// Pin a version (`null`: unpin).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<i64>)]
    pub pinned_version: Option<Option<i64>>,
    /// Diskless or not (see [`NewDevice::diskless`]).
    pub diskless: Option<bool>,
}

/// A new vDisk: an existing `NAME.vhdx` in the store is imported as version 0; otherwise,
/// with `size_bytes`, a new empty dynamic one is created.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewVDisk {
    /// The store.
    pub store_id: i64,
    /// Name (the file is NAME.vhdx).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^./\\@+\x00-\x1f\x7f][^/\\@+\x00-\x1f\x7f]*$"
    )]
    pub name: String,
    /// Size of a new image; ignored when the file exists.
    #[serde(default)]
    #[schema(minimum = 512, maximum = 70368744177664_i64, multiple_of = 512)]
    pub size_bytes: Option<i64>,
    /// Default cache mode of its devices (default `ram_overflow`).
    #[serde(default)]
    pub cache_mode: Option<CacheMode>,
    /// Default RAM cache size (default 1 GiB).
    #[serde(default)]
    pub ram_bytes: Option<i64>,
    /// Free text.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub description: String,
}

/// A change of a vDisk's properties; absent fields stay.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VDiskPatch {
    /// Default cache mode.
    pub cache_mode: Option<CacheMode>,
    /// Default RAM cache size.
    pub ram_bytes: Option<i64>,
    /// Free text.
    pub description: Option<String>,
    /// Kernel arguments the network boot appends (empty: none).
    #[schema(max_length = 4096)]
    pub boot_cmdline: Option<String>,
    /// The kernel's path inside the version's filesystem (`null`: found in /boot).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<String>)]
    pub boot_kernel: Option<Option<String>>,
    /// The initramfs's path inside the version's filesystem (`null`: found in /boot).
    #[serde(default, deserialize_with = "double")]
    #[schema(value_type = Option<String>)]
    pub boot_initrd: Option<Option<String>>,
}

/// A merge of a vDisk's chain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// Merged updates or merged base.
    pub mode: MergeMode,
    /// The access mode of the new version.
    pub access: AccessMode,
}
