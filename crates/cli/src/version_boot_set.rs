//! `ferry version boot-set NAME@V [--json] [--clear] [--store DIR]`: a version's boot set
//! (issue 21): how many boots it came from, its extents, blocks and bytes; `--clear` drops
//! it, and the next boots of the version record a new one.
//!
//! With a farm (the default) it asks the farm API (`GET`/`DELETE
//! /api/v1/vdisks/{id}/versions/{number}/boot-set`, the same roles as the other version
//! routes). With `--store DIR` it reads the file a standalone server keeps beside the
//! version (`NAME.V.avhdx.bootset`); a running server notices a cleared file at the next
//! boot of the version.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use contract::VdiskName;
use reqwest::Method;
use serde_json::{Value, json};

use crate::farm_client::{Client, Conn, vdisk_id};

/// Arguments of `ferry version boot-set`.
#[derive(Debug, Args)]
pub struct BootSetArgs {
    /// The version: NAME@V.
    target: String,
    /// Clear the set: the next boots of the version record a new one.
    #[arg(long)]
    clear: bool,
    /// Read the set beside the version in this store directory (a server without a farm)
    /// instead of asking the farm.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

/// Splits `NAME@V`.
fn parse_target(t: &str) -> anyhow::Result<(String, u32)> {
    let (name, v) = t
        .split_once('@')
        .with_context(|| format!("{t:?}: expected NAME@VERSION, e.g. golden@3"))?;
    let v: u32 = v
        .parse()
        .with_context(|| format!("{t:?}: the version is a number"))?;
    VdiskName::new(name).map_err(|e| anyhow::anyhow!("{name:?}: {e}"))?;
    Ok((name.to_string(), v))
}

/// Runs `ferry version boot-set`.
///
/// # Errors
/// A bad NAME@V, API or file errors, a missing set (exit 1 with a message).
pub fn run(conn: &Conn, a: BootSetArgs) -> anyhow::Result<ExitCode> {
    let (name, version) = parse_target(&a.target)?;
    if let Some(dir) = &a.store {
        return local(conn.json, dir, &name, version, a.clear);
    }
    let c = Client::new(conn)?;
    let id = vdisk_id(&c, &name)?;
    let path = format!("/vdisks/{id}/versions/{version}/boot-set");
    if a.clear {
        let v = c.call(Method::DELETE, &path, None)?;
        c.done(&v, &format!("{name}@{version}: boot set cleared"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let v = c.get(&path)?;
    show(conn.json, &name, version, &v)
}

fn show(json: bool, name: &str, version: u32, v: &Value) -> anyhow::Result<ExitCode> {
    if json {
        crate::print_json(v)?;
        return Ok(ExitCode::SUCCESS);
    }
    let n = |k: &str| v[k].as_i64().unwrap_or(0);
    outln!(
        "{name}@{version}: boot set of {} boot(s): {} bytes ({:.1} MiB) in {} blocks of 4 KiB, {} extents ({} bytes encoded)",
        n("boots"),
        n("bytes"),
        n("bytes") as f64 / 1_048_576.0,
        n("blocks"),
        n("extents"),
        n("encoded_bytes"),
    );
    Ok(ExitCode::SUCCESS)
}

/// The set beside the version in a store directory.
fn local(
    json: bool,
    dir: &std::path::Path,
    name: &str,
    version: u32,
    clear: bool,
) -> anyhow::Result<ExitCode> {
    let store = server::store::Store::open(dir)?;
    let vdisk = VdiskName::new(name).map_err(|e| anyhow::anyhow!("{name:?}: {e}"))?;
    let res = store.resolve_version(&vdisk, Some(version))?;
    let file = server::boot_sets::set_path(&res.path);
    if clear {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("remove {}", file.display())),
        }
        let v = json!({"vdisk": name, "number": version, "cleared": true});
        if json {
            crate::print_json(&v)?;
        } else {
            outln!("{name}@{version}: boot set cleared");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let bytes = match std::fs::metadata(&file) {
        Ok(m) if m.len() > server::boot_sets::BOOT_SET_FILE_BYTES_MAX as u64 => {
            bail!("{}: larger than a boot set may be", file.display())
        }
        Ok(_) => std::fs::read(&file).with_context(|| format!("read {}", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "{name}@{version} has no boot set yet ({} is absent)",
                file.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("read {}", file.display())),
    };
    let set = bootset::BootSet::decode(&bytes)
        .with_context(|| format!("{} is not a valid boot set", file.display()))?;
    if (set.identity.vdisk.as_str(), set.identity.version) != (name, version) {
        bail!(
            "{} was recorded for {}@{}, not {name}@{version}",
            file.display(),
            set.identity.vdisk,
            set.identity.version
        );
    }
    let v = json!({
        "vdisk": name,
        "number": version,
        "boots": set.boots,
        "extents": set.extents.len(),
        "blocks": set.pages(),
        "bytes": set.bytes(),
        "encoded_bytes": bytes.len(),
        "size_bytes": set.identity.size_bytes,
        "file": file,
    });
    show(json, name, version, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_name_at_number() {
        assert_eq!(parse_target("golden@3").unwrap(), ("golden".into(), 3));
        assert!(parse_target("golden").is_err());
        assert!(parse_target("golden@x").is_err());
        assert!(parse_target("../x@1").is_err());
    }
}
