//! `ferry vdisk info`: what an image is, and the whole chain under it.
//!
//! [`info`] opens the image read-only (a dirty log is replayed in memory, never written) and
//! gathers the geometry of the top image, its identity, and one [`LayerInfo`] per layer from
//! the top down to the base. [`Info`] serializes to the JSON that `--json` prints, and
//! [`Info::render`] gives the text a person reads.
//!
//! A broken chain (a parent missing or with the wrong identity) does not make `info` fail: the
//! top image is described alone and the reason is listed under `warnings`, since "which
//! parent does this file want?" is exactly what one asks `info` when a chain is broken.

use std::fmt::Write as _;
use std::io::{Seek, SeekFrom};
use std::path::Path;

use serde::Serialize;

use crate::open::{self, Chain, Format, Image, Layer, OpenOptions};
use crate::{ErrorKind, Result};

/// What `info` reports about an image and its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Info {
    /// The path given.
    pub path: String,
    /// The format of the top image.
    pub format: Format,
    /// Virtual size in bytes.
    pub virtual_size: u64,
    /// Allocation unit in bytes (VHDX BlockSize, VHD block size, 1 MiB for raw).
    pub block_size: u32,
    /// Logical sector size in bytes.
    pub logical_sector_size: u32,
    /// Physical sector size in bytes.
    pub physical_sector_size: u32,
    /// Bytes of the top file that hold data and metadata blocks.
    pub allocated_bytes: u64,
    /// Length of the top file in bytes.
    pub file_size: u64,
    /// True for a fixed (fully allocated) image; `None` for raw.
    pub fixed: Option<bool>,
    /// The creator recorded in the image (VHDX file identifier, VHD creator application).
    pub creator: Option<String>,
    /// The identity children link to (VHDX DataWriteGuid, VHD UniqueId).
    pub linkage_id: Option<String>,
    /// Every layer, from the top (this image) to the base.
    pub chain: Vec<LayerInfo>,
    /// Non-fatal problems of any layer, each prefixed with its path.
    pub warnings: Vec<String>,
}

/// One layer of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerInfo {
    /// Where the layer was opened from.
    pub path: String,
    /// Its format.
    pub format: Format,
    /// Bytes of the file that hold data and metadata blocks.
    pub allocated_bytes: u64,
    /// File length in bytes.
    pub file_size: u64,
    /// The identity children link to.
    pub linkage_id: Option<String>,
    /// The identities this layer accepts for its parent (empty for a base).
    pub parent_linkage: Vec<String>,
}

/// Describes the image at `path` and its whole parent chain.
///
/// # Errors
/// Open errors of the top image (format, I/O); I/O errors while measuring files. A broken
/// parent chain is reported as a warning, not an error.
pub fn info(path: &Path) -> Result<Info> {
    let (chain, broken) = match open::open(path, OpenOptions::default()) {
        Ok(chain) => (chain, None),
        Err(e) if e.kind() == ErrorKind::ChainBroken => {
            let top = open::open_one(path, OpenOptions::default())?;
            (Chain { layers: vec![top] }, Some(e.to_string()))
        }
        Err(e) => return Err(e),
    };
    let top = &chain.layers[0];
    let dev = top.image.device();
    let geometry = dev.geometry();
    let mut layers = Vec::with_capacity(chain.layers.len());
    let mut warnings = Vec::new();
    for layer in &chain.layers {
        layers.push(layer_info(layer)?);
        let name = layer.path.display();
        warnings.extend(
            layer
                .image
                .device()
                .warnings()
                .into_iter()
                .map(|w| format!("{name}: {w}")),
        );
    }
    warnings.extend(broken);
    let (fixed, creator) = identity(top)?;
    Ok(Info {
        path: path.display().to_string(),
        format: top.format,
        virtual_size: geometry.size,
        block_size: geometry.block_size,
        logical_sector_size: geometry.logical_sector_size,
        physical_sector_size: geometry.physical_sector_size,
        allocated_bytes: layers[0].allocated_bytes,
        file_size: layers[0].file_size,
        fixed,
        creator,
        linkage_id: layers[0].linkage_id.clone(),
        chain: layers,
        warnings,
    })
}

fn layer_info(layer: &Layer) -> Result<LayerInfo> {
    let dev = layer.image.device();
    let parent_linkage = dev
        .parent_ref()
        .map(|p| p.linkage.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    Ok(LayerInfo {
        path: layer.path.display().to_string(),
        format: layer.format,
        allocated_bytes: dev.allocated_bytes()?,
        file_size: file_size(&layer.path)?,
        linkage_id: dev.linkage_id().map(|g| g.to_string()),
        parent_linkage,
    })
}

/// The fixed flag and the creator string of one image.
fn identity(layer: &Layer) -> Result<(Option<bool>, Option<String>)> {
    Ok(match &layer.image {
        Image::Vhdx(img) => {
            let d = img.details()?;
            (Some(d.fixed), Some(d.creator).filter(|c| !c.is_empty()))
        }
        Image::Vhd(img) => {
            let f = img.footer();
            let app = String::from_utf8_lossy(&f.creator_app);
            let app = app.trim_end_matches(['\0', ' ']);
            let version = format!("{}.{}", f.creator_version >> 16, f.creator_version & 0xffff);
            let fixed = f.disk_type == vhdx::vhd::footer::DiskType::Fixed;
            (Some(fixed), Some(format!("{app} {version}")))
        }
        Image::Raw(_) => (None, None),
    })
}

/// The length of a file, or of a block device (whose metadata says 0), by seeking to its end.
fn file_size(path: &Path) -> Result<u64> {
    let io = |e| crate::Error::io(format!("measure {}", path.display()), e);
    let mut f = crate::file::open_file(path, false, crate::file::Accept::RegularOrBlock)?;
    f.seek(SeekFrom::End(0)).map_err(io)
}

/// Formats a byte count for people in the largest binary unit it reaches: `1 GiB`,
/// `32 MiB`, `1.5 KiB`, `512 B`, `0 B`. Whole units have no fraction, others one decimal;
/// a value that rounds up to 1024 of a unit is shown as the next one (`1.0 GiB`, not
/// `1024.0 MiB`).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let scale = 1u64 << (10 * unit);
    if bytes.is_multiple_of(scale) {
        return format!("{} {}", bytes / scale, UNITS[unit]);
    }
    let value = format!("{:.1}", bytes as f64 / scale as f64);
    if value == "1024.0" && unit + 1 < UNITS.len() {
        return format!("1.0 {}", UNITS[unit + 1]);
    }
    format!("{value} {}", UNITS[unit])
}

impl Info {
    /// The report as text for a terminal, one `key: value` per line, then the chain.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let differencing = self
            .chain
            .first()
            .is_some_and(|l| !l.parent_linkage.is_empty());
        let kind = match self.fixed {
            _ if differencing => " (differencing)",
            Some(true) => " (fixed)",
            Some(false) => " (dynamic)",
            None => "",
        };
        let format = format_name(self.format);
        let _ = writeln!(s, "path:               {}", self.path);
        let _ = writeln!(s, "format:             {format}{kind}");
        let _ = writeln!(s, "virtual size:       {}", sized(self.virtual_size));
        let _ = writeln!(
            s,
            "block size:         {}",
            human_size(u64::from(self.block_size))
        );
        let _ = writeln!(
            s,
            "sector size:        {} logical, {} physical",
            self.logical_sector_size, self.physical_sector_size
        );
        let _ = writeln!(s, "allocated:          {}", sized(self.allocated_bytes));
        let _ = writeln!(s, "file size:          {}", sized(self.file_size));
        if let Some(creator) = &self.creator {
            let _ = writeln!(s, "creator:            {creator}");
        }
        if let Some(id) = &self.linkage_id {
            let _ = writeln!(s, "linkage id:         {id}");
        }
        let _ = writeln!(
            s,
            "chain:              {} layer(s), top first",
            self.chain.len()
        );
        for (depth, layer) in self.chain.iter().enumerate() {
            let _ = writeln!(
                s,
                "  [{depth}] {} ({})",
                layer.path,
                format_name(layer.format)
            );
            let _ = writeln!(
                s,
                "      allocated {}, file {}",
                human_size(layer.allocated_bytes),
                human_size(layer.file_size)
            );
            if let Some(id) = &layer.linkage_id {
                let _ = writeln!(s, "      id     {id}");
            }
            if !layer.parent_linkage.is_empty() {
                let _ = writeln!(s, "      parent {}", layer.parent_linkage.join(" or "));
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Vhdx => "vhdx",
        Format::Vhd => "vhd",
        Format::Raw => "raw",
    }
}

fn sized(bytes: u64) -> String {
    if bytes < 1024 {
        human_size(bytes)
    } else {
        format!("{} ({bytes} bytes)", human_size(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_size_exact_unit_has_no_fraction() {
        assert_eq!(human_size(32 << 20), "32 MiB");
    }

    #[test]
    fn human_size_partial_unit_has_one_decimal() {
        // 1536 bytes is one and a half KiB.
        assert_eq!(human_size(1536), "1.5 KiB");
    }

    #[test]
    fn human_size_below_one_kib_is_bytes() {
        assert_eq!(human_size(512), "512 B");
    }

    #[test]
    fn human_size_just_below_a_unit_rounds_into_it() {
        // One byte short of 1 GiB is 1023.99999... MiB, which one decimal rounds to 1024.
        assert_eq!(human_size((1 << 30) - 1), "1.0 GiB");
    }

    #[test]
    fn human_size_of_a_tebibyte_is_whole() {
        assert_eq!(human_size(1 << 40), "1 TiB");
    }
}
