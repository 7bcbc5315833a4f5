//! The network boot decision: what a machine that asks by its MAC would boot, before it
//! logs in.
//!
//! ```text
//!   GET /boot/ipxe/{mac} ──► Farm::boot_plan(mac)
//!        known device ────────────► its vDisk, the version its type boots (login's rules)
//!        unknown, auto-add ───────► the collection's default vDisk, as a production device
//!        otherwise ───────────────► BootRefusal (a reason a person can act on)
//! ```
//!
//! The plan is read-only: an unauthenticated script request creates no device row (the
//! device login that follows does, as it always did). The rules are login's own: the
//! device's vDisk, [`Farm::boot_version`], [`effective_cache_mode`] and the site's servers.

use std::path::PathBuf;

use contract::Mac;
use contract::login::LoginServer;

use crate::db::Farm;
use crate::error::{Kind, Result};
use crate::login::{auto_device, effective_cache_mode};
use crate::model::{CacheMode, Device, DeviceType, VDisk, Version};
use crate::validate;

/// What a machine boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootTarget {
    /// The device (id 0 when the login would add it: [`BootTarget::auto_add`]).
    pub device: Device,
    /// True when the MAC is unknown and its login will add it to a collection.
    pub auto_add: bool,
    /// The vDisk.
    pub vdisk: VDisk,
    /// The version its type boots.
    pub version: Version,
    /// The version's file on this server (the top of its chain).
    pub path: PathBuf,
    /// The cache mode it will run in.
    pub cache_mode: CacheMode,
    /// The servers of its site, alive ones first.
    pub servers: Vec<LoginServer>,
}

/// Why a machine may not boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The MAC is not a device and no collection adds devices.
    UnknownDevice,
    /// The device (or the auto-add collection) names no vDisk.
    NoVdisk,
    /// Its vDisk has no version its type may boot.
    NoVersion,
    /// The version's file is not in the store.
    FileMissing,
}

/// A refusal, with a reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRefusal {
    /// Which case.
    pub kind: RefusalKind,
    /// The reason, one line.
    pub reason: String,
}

/// The boot decision for one MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootPlan {
    /// It boots this.
    Boot(Box<BootTarget>),
    /// It may not boot.
    Refuse(BootRefusal),
}

fn refuse(kind: RefusalKind, reason: String) -> BootPlan {
    BootPlan::Refuse(BootRefusal { kind, reason })
}

impl Farm {
    /// What the machine with `mac` boots from this server (`server_id`: its store path
    /// overrides apply), or why it may not (see the module documentation). Creates nothing.
    ///
    /// # Errors
    /// [`crate::Kind::InvalidInput`] for a malformed MAC; database errors.
    pub async fn boot_plan(&self, mac: &str, server_id: Option<i64>) -> Result<BootPlan> {
        let mac: Mac = validate::mac(mac)?;
        let (device, auto_add) = match self.device_by_mac(&mac.to_string()).await? {
            Some(d) => (d, false),
            None => match self.auto_add_collection().await? {
                Some((collection_id, vdisk_id)) => (
                    auto_device(mac, collection_id, vdisk_id, true, self.now_ms()),
                    true,
                ),
                None => {
                    return Ok(refuse(
                        RefusalKind::UnknownDevice,
                        format!(
                            "MAC {mac} is not a device of this farm and no collection adds \
                             devices automatically: ferry device add {mac} --name NAME \
                             --collection ID --vdisk VDISK --diskless"
                        ),
                    ));
                }
            },
        };
        let who = if auto_add {
            format!("MAC {mac} (to be added automatically)")
        } else {
            format!("device {} ({mac})", device.name)
        };
        let Some(vdisk_id) = device.vdisk_id else {
            let fix = if auto_add {
                format!(
                    "give collection {} a default vDisk, or add the device: ferry device add \
                     {mac} --name NAME --collection ID --vdisk VDISK --diskless",
                    device.collection_id
                )
            } else {
                format!("ferry device set {} --vdisk VDISK", device.id)
            };
            return Ok(refuse(
                RefusalKind::NoVdisk,
                format!("{who} has no vDisk assigned: {fix}"),
            ));
        };
        let vdisk = self.vdisk(vdisk_id).await?;
        let version = match self
            .boot_version(vdisk_id, device.device_type, device.pinned_version)
            .await
        {
            Ok(v) => v,
            Err(e) if e.kind() == Kind::Conflict => {
                let fix = match device.device_type {
                    DeviceType::Maintenance => "ferry version new --vdisk VDISK",
                    _ => "promote one: ferry version promote N --vdisk VDISK",
                };
                return Ok(refuse(
                    RefusalKind::NoVersion,
                    format!(
                        "vDisk {} has no version a {} device may boot ({who}): {fix}",
                        vdisk.name, device.device_type
                    ),
                ));
            }
            Err(e) => return Err(e),
        };
        let path = self
            .store_dir(vdisk.store_id, server_id)
            .await?
            .join(&version.file_name);
        if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(refuse(
                RefusalKind::FileMissing,
                format!(
                    "version {} of vDisk {} has no file {} in its store on this server",
                    version.number, vdisk.name, version.file_name
                ),
            ));
        }
        let cache_mode =
            effective_cache_mode(device.device_type, device.cache_mode, vdisk.cache_mode);
        let servers = self.site_servers(device.collection_id).await?;
        Ok(BootPlan::Boot(Box::new(BootTarget {
            device,
            auto_add,
            vdisk,
            version,
            path,
            cache_mode,
            servers,
        })))
    }
}
