//! `ferry site|store|collection|device|version ...`: the farm's objects over the REST API
//! (see [`crate::farm_client`] for `--api`, `--token`, `--json`).

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::farm_client::{Client, Conn, Paging, cell, vdisk_id};

/// `ferry site`.
#[derive(Debug, Args)]
pub struct SiteArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: SiteCommand,
}

#[derive(Debug, Subcommand)]
enum SiteCommand {
    /// List sites.
    List(Paging),
    /// Add a site.
    Add {
        /// Its name.
        name: String,
        /// Free text.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Show one site.
    Show {
        /// Its id.
        id: i64,
    },
    /// Remove a site without servers and collections.
    Remove {
        /// Its id.
        id: i64,
    },
}

const SITE_COLUMNS: &[&str] = &["id", "name", "description"];

/// Runs `ferry site`.
///
/// # Errors
/// API errors.
pub fn site(a: SiteArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        SiteCommand::List(p) => c.show(&c.get(&format!("/sites?{}", p.query()))?, SITE_COLUMNS)?,
        SiteCommand::Add { name, description } => {
            let v = c.post(
                "/sites",
                Some(json!({"name": name, "description": description})),
            )?;
            c.done(
                &v,
                &format!("added site {} (id {})", cell(&v["name"]), cell(&v["id"])),
            )?;
        }
        SiteCommand::Show { id } => c.show(&c.get(&format!("/sites/{id}"))?, &[])?,
        SiteCommand::Remove { id } => {
            let v = c.call(Method::DELETE, &format!("/sites/{id}"), None)?;
            c.done(&v, &format!("removed site {id}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry store`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// List stores.
    List(Paging),
    /// Add a store: a directory under the farm's store root (made when missing), and
    /// optionally a bucket its versions are published to.
    #[command(after_help = "Examples:\n  ferry store add main --path main\n  \
                            ferry store add cloud --path cloud --bucket s3://vdisks/site-a")]
    Add {
        /// Its name.
        name: String,
        /// Its directory, relative to the store root (for a bucket store: the lifecycle's
        /// working directory, and on each server the tier of the bucket).
        #[arg(long)]
        path: String,
        /// Make it a bucket store: every version that leaves maintenance is published to
        /// s3://BUCKET[/PREFIX], write-once with its manifest, and servers read it from there.
        #[arg(long, value_name = "S3_URL")]
        bucket: Option<String>,
    },
    /// Show one store and its per-server paths.
    Show {
        /// Its id.
        id: i64,
    },
    /// Remove a store that holds no vDisk (its directory stays).
    Remove {
        /// Its id.
        id: i64,
    },
    /// Set the store's path on one server.
    SetPath {
        /// The store's id.
        id: i64,
        /// The server's id.
        #[arg(long)]
        server: i64,
        /// The path on that server, under the store root.
        #[arg(long)]
        path: String,
    },
}

/// Runs `ferry store`.
///
/// # Errors
/// API errors.
pub fn store(a: StoreArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        StoreCommand::List(p) => {
            let v = c.get(&format!("/stores?{}", p.query()))?;
            c.show(&v, &["id", "name", "path", "bucket"])?;
        }
        StoreCommand::Add { name, path, bucket } => {
            let body = json!({"name": name, "path": path, "bucket": bucket.unwrap_or_default()});
            let v = c.post("/stores", Some(body))?;
            c.done(
                &v,
                &format!(
                    "added store {} at {} (id {})",
                    cell(&v["name"]),
                    cell(&v["path"]),
                    cell(&v["id"])
                ),
            )?;
        }
        StoreCommand::Show { id } => {
            let mut v = c.get(&format!("/stores/{id}"))?;
            v["paths"] = c.get(&format!("/stores/{id}/paths"))?["items"].clone();
            c.show(&v, &[])?;
        }
        StoreCommand::Remove { id } => {
            let v = c.call(Method::DELETE, &format!("/stores/{id}"), None)?;
            c.done(&v, &format!("removed store {id}"))?;
        }
        StoreCommand::SetPath { id, server, path } => {
            let body = Some(json!({ "path": path }));
            let v = c.call(Method::PUT, &format!("/stores/{id}/paths/{server}"), body)?;
            c.done(
                &v,
                &format!("store {id} is at {} on server {server}", cell(&v["path"])),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry collection`.
#[derive(Debug, Args)]
pub struct CollectionArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: CollectionCommand,
}

#[derive(Debug, Subcommand)]
enum CollectionCommand {
    /// List device collections.
    List(Paging),
    /// Add a device collection to a site.
    Add {
        /// Its name.
        name: String,
        /// The site's id.
        #[arg(long)]
        site: i64,
        /// Add unknown devices that boot from the network (diskless, as production devices).
        #[arg(long)]
        auto_add: bool,
        /// The vDisk (name or id) of devices added automatically.
        #[arg(long)]
        vdisk: Option<String>,
        /// The most devices auto-add puts into it, in all (default 500).
        #[arg(long)]
        auto_add_max: Option<i64>,
        /// The most devices auto-add puts into it per minute (default 60).
        #[arg(long)]
        auto_add_per_minute: Option<i64>,
    },
    /// Show one collection.
    Show {
        /// Its id.
        id: i64,
    },
    /// Remove a collection without devices.
    Remove {
        /// Its id.
        id: i64,
    },
}

/// Runs `ferry collection`.
///
/// # Errors
/// API errors.
pub fn collection(a: CollectionArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        CollectionCommand::List(p) => {
            let v = c.get(&format!("/collections?{}", p.query()))?;
            c.show(
                &v,
                &[
                    "id",
                    "site_id",
                    "name",
                    "auto_add",
                    "default_vdisk_id",
                    "auto_add_max",
                    "auto_add_per_minute",
                ],
            )?;
        }
        CollectionCommand::Add {
            name,
            site,
            auto_add,
            vdisk,
            auto_add_max,
            auto_add_per_minute,
        } => {
            let vdisk = vdisk.map(|v| vdisk_id(&c, &v)).transpose()?;
            let body = json!({"name": name, "site_id": site, "auto_add": auto_add,
                              "default_vdisk_id": vdisk, "auto_add_max": auto_add_max,
                              "auto_add_per_minute": auto_add_per_minute});
            let v = c.post("/collections", Some(body))?;
            c.done(
                &v,
                &format!(
                    "added collection {} (id {})",
                    cell(&v["name"]),
                    cell(&v["id"])
                ),
            )?;
        }
        CollectionCommand::Show { id } => c.show(&c.get(&format!("/collections/{id}"))?, &[])?,
        CollectionCommand::Remove { id } => {
            let v = c.call(Method::DELETE, &format!("/collections/{id}"), None)?;
            c.done(&v, &format!("removed collection {id}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry device`.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: DeviceCommand,
}

/// The settable fields of a device.
#[derive(Debug, Args)]
struct DeviceFields {
    /// Its type: production, test or maintenance.
    #[arg(long = "type", value_name = "TYPE")]
    device_type: Option<String>,
    /// The vDisk it boots (name or id).
    #[arg(long)]
    vdisk: Option<String>,
    /// Override of the vDisk's cache mode (private, server, server_persistent, ram,
    /// ram_overflow, disk).
    #[arg(long)]
    cache_mode: Option<String>,
    /// Override of the vDisk's RAM cache size in bytes (at least 1).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    ram_bytes: Option<i64>,
    /// Boot this version instead of the newest production one.
    #[arg(long)]
    pin: Option<i64>,
    /// It boots over the network with no disk: its boot script carries a one-time login
    /// ticket at every boot (docs/netboot.md); `--diskless=false` ends that.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    diskless: Option<bool>,
}

#[derive(Debug, Subcommand)]
enum DeviceCommand {
    /// List devices.
    List {
        /// Only the devices of this collection.
        #[arg(long)]
        collection: Option<i64>,
        #[command(flatten)]
        paging: Paging,
    },
    /// Add a device.
    Add {
        /// Its MAC address.
        mac: String,
        /// Its name.
        #[arg(long)]
        name: String,
        /// Its collection's id.
        #[arg(long)]
        collection: i64,
        #[command(flatten)]
        fields: DeviceFields,
    },
    /// Show one device.
    Show {
        /// Its id.
        id: i64,
    },
    /// Change a device.
    Set {
        /// Its id.
        id: i64,
        /// Rename it.
        #[arg(long)]
        name: Option<String>,
        /// Move it to another collection.
        #[arg(long)]
        collection: Option<i64>,
        /// Clear the pinned version.
        #[arg(long)]
        unpin: bool,
        #[command(flatten)]
        fields: DeviceFields,
    },
    /// Remove a device (and end its session).
    Remove {
        /// Its id.
        id: i64,
    },
    /// Give a device a new credential: a new random device secret, printed once; the old
    /// one stops working. A device with a disk gets its first secret this way: give it to
    /// `ferry target --device-secret FILE` (docs/target.md).
    #[command(after_help = "Example:\n  ferry device credential pc1 --json")]
    Credential {
        /// Its id, name or MAC.
        device: String,
    },
}

/// The id of a device given by id, name or MAC.
fn device_id(c: &Client, device: &str) -> anyhow::Result<i64> {
    if let Ok(id) = device.parse::<i64>() {
        return Ok(id);
    }
    let mac = device.parse::<contract::Mac>().ok().map(|m| m.to_string());
    let mut offset = 0;
    loop {
        let page = c.get(&format!("/devices?limit=1000&offset={offset}"))?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        for d in &items {
            let hit = d["name"].as_str() == Some(device)
                || (mac.is_some() && d["mac"].as_str() == mac.as_deref());
            if hit {
                return d["id"].as_i64().context("device without an id");
            }
        }
        if items.len() < 1000 {
            anyhow::bail!("no device named {device:?}");
        }
        offset += 1000;
    }
}

fn device_body(c: &Client, f: DeviceFields, body: &mut Value) -> anyhow::Result<()> {
    if let Some(t) = f.device_type {
        body["device_type"] = json!(t);
    }
    if let Some(v) = f.vdisk {
        body["vdisk_id"] = json!(vdisk_id(c, &v)?);
    }
    if let Some(m) = f.cache_mode {
        body["cache_mode"] = json!(m);
    }
    if let Some(r) = f.ram_bytes {
        body["ram_bytes"] = json!(r);
    }
    if let Some(p) = f.pin {
        body["pinned_version"] = json!(p);
    }
    if let Some(d) = f.diskless {
        body["diskless"] = json!(d);
    }
    Ok(())
}

const DEVICE_COLUMNS: &[&str] = &[
    "id",
    "mac",
    "name",
    "device_type",
    "collection_id",
    "vdisk_id",
    "pinned_version",
    "diskless",
];

/// Runs `ferry device`.
///
/// # Errors
/// API errors.
pub fn device(a: DeviceArgs) -> anyhow::Result<ExitCode> {
    let c = Client::new(&a.conn)?;
    match a.command {
        DeviceCommand::List { collection, paging } => {
            let filter = collection
                .map(|id| format!("&collection_id={id}"))
                .unwrap_or_default();
            let v = c.get(&format!("/devices?{}{filter}", paging.query()))?;
            c.show(&v, DEVICE_COLUMNS)?;
        }
        DeviceCommand::Add {
            mac,
            name,
            collection,
            fields,
        } => {
            let mut body = json!({"mac": mac, "name": name, "collection_id": collection});
            device_body(&c, fields, &mut body)?;
            let v = c.post("/devices", Some(body))?;
            c.done(
                &v,
                &format!(
                    "added device {} {} (id {})",
                    cell(&v["mac"]),
                    cell(&v["name"]),
                    cell(&v["id"])
                ),
            )?;
        }
        DeviceCommand::Show { id } => c.show(&c.get(&format!("/devices/{id}"))?, &[])?,
        DeviceCommand::Set {
            id,
            name,
            collection,
            unpin,
            fields,
        } => {
            let mut body = json!({});
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            if let Some(col) = collection {
                body["collection_id"] = json!(col);
            }
            if unpin {
                body["pinned_version"] = Value::Null;
            }
            device_body(&c, fields, &mut body)?;
            let v = c.call(Method::PATCH, &format!("/devices/{id}"), Some(body))?;
            c.done(&v, &format!("changed device {id}"))?;
        }
        DeviceCommand::Remove { id } => {
            let v = c.call(Method::DELETE, &format!("/devices/{id}"), None)?;
            c.done(&v, &format!("removed device {id}"))?;
        }
        DeviceCommand::Credential { device } => {
            let id = device_id(&c, &device)?;
            let v = c.post(&format!("/devices/{id}/credential"), None)?;
            c.done(
                &v,
                &format!(
                    "device {device} (mac {}) credential generation {}; device secret, shown \
                     once: {}",
                    cell(&v["mac"]),
                    cell(&v["generation"]),
                    cell(&v["device_secret"])
                ),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    #[command(flatten)]
    conn: Conn,
    /// The vDisk (name or id).
    #[arg(long, global = true)]
    vdisk: Option<String>,
    #[command(subcommand)]
    command: VersionCommand,
}

#[derive(Debug, Subcommand)]
enum VersionCommand {
    /// List the versions of a vDisk, oldest first.
    List,
    /// Make a new version NAME.N.avhdx on the newest, in maintenance.
    New,
    /// Promote a version: maintenance → test → production.
    Promote {
        /// The version number.
        number: i64,
    },
    /// Revert a version one step (production → test → maintenance).
    Revert {
        /// The version number.
        number: i64,
    },
    /// Delete the newest version (when no device boots it or is pinned to it).
    Delete {
        /// The version number.
        number: i64,
    },
    /// Merge the newest chain into a new version.
    Merge {
        /// "updates" (merged updates) or "base" (merged base).
        #[arg(long, default_value = "base")]
        mode: String,
        /// The access mode of the new version.
        #[arg(long, default_value = "test")]
        access: String,
    },
    /// Show or clear a version's boot set (the blocks its first boots read, prefetched
    /// by the servers ahead of the next boots): boots merged, extents, blocks, bytes.
    #[command(after_help = "Examples:\n  ferry version boot-set golden@3\n  \
        ferry version boot-set golden@3 --json\n  ferry version boot-set golden@3 --clear\n  \
        ferry version boot-set golden@3 --store /srv/ferry/store   (a server without a farm)")]
    BootSet(crate::version_boot_set::BootSetArgs),
}

const VERSION_COLUMNS: &[&str] = &[
    "number",
    "access",
    "file_name",
    "parent_number",
    "origin",
    "changed_by",
];

/// Runs `ferry version`.
///
/// # Errors
/// API errors; a missing `--vdisk`.
pub fn version(a: VersionArgs) -> anyhow::Result<ExitCode> {
    if let VersionCommand::BootSet(b) = a.command {
        return crate::version_boot_set::run(&a.conn, b);
    }
    let c = Client::new(&a.conn)?;
    let name = a
        .vdisk
        .ok_or_else(|| anyhow::anyhow!("--vdisk NAME (or id) is required"))?;
    let id = vdisk_id(&c, &name)?;
    let base = format!("/vdisks/{id}/versions");
    let one = |v: &Value, what: &str| {
        c.done(
            v,
            &format!(
                "{name} version {} {what} ({})",
                cell(&v["number"]),
                v["access"].as_str().unwrap_or("-")
            ),
        )
    };
    match a.command {
        VersionCommand::List => c.show(&c.get(&base)?, VERSION_COLUMNS)?,
        VersionCommand::New => one(&c.post(&base, None)?, "created")?,
        VersionCommand::Promote { number } => {
            one(
                &c.post(&format!("{base}/{number}/promote"), None)?,
                "promoted",
            )?;
        }
        VersionCommand::Revert { number } => {
            one(
                &c.post(&format!("{base}/{number}/revert"), None)?,
                "reverted",
            )?;
        }
        VersionCommand::Delete { number } => {
            let v = c.call(Method::DELETE, &format!("{base}/{number}"), None)?;
            c.done(&v, &format!("{name} version {number} deleted"))?;
        }
        VersionCommand::Merge { mode, access } => {
            let body = json!({"mode": mode, "access": access});
            one(
                &c.post(&format!("/vdisks/{id}/merge"), Some(body))?,
                "merged",
            )?;
        }
        VersionCommand::BootSet(_) => unreachable!("boot-set returned above"),
    }
    Ok(ExitCode::SUCCESS)
}
