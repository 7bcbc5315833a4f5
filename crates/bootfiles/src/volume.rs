//! The I/O side: read a disk's partition table through [`BlockDevice`] (calling the pure
//! [`crate::partition`] codec), and open the ext filesystem of one volume with `ext4-view`
//! through an [`Ext4Read`] adapter that keeps every read inside the volume.

use std::sync::Arc;

use disk::BlockDevice;
use ext4_view::{Ext4, Ext4Read};
use serde::Serialize;

use crate::BootFilesError;
use crate::partition::{self, Partition, Sector0};

/// Most volumes (partitions) of one disk that are looked at.
pub const VOLUMES_MAX: usize = 64;
/// The ext superblock's magic, at byte 56 of the superblock (byte 1080 of the volume).
const EXT_MAGIC: [u8; 2] = [0x53, 0xEF];
/// Where the ext magic lies in a volume.
const EXT_MAGIC_OFFSET: u64 = 1024 + 56;

/// What kind of partition table a disk has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TableKind {
    /// None: a filesystem on the whole disk.
    None,
    /// An MBR (primary partitions).
    Mbr,
    /// A GPT.
    Gpt,
}

/// A range of the disk that may hold a filesystem: the whole disk or one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// The partition, or `None` for the whole disk.
    pub partition: Option<Partition>,
    /// First byte on the disk.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Volume {
    /// The partition number, `None` for the whole disk.
    pub fn number(&self) -> Option<u32> {
        self.partition.as_ref().map(|p| p.number)
    }

    /// "partition N" or "whole disk", for messages.
    pub fn label(&self) -> String {
        match self.number() {
            Some(n) => format!("partition {n}"),
            None => "whole disk".to_string(),
        }
    }
}

/// The volumes of a disk: the whole disk when it holds an ext filesystem itself (or has no
/// table), else the partitions of its MBR or GPT (at most [`VOLUMES_MAX`]).
///
/// # Errors
/// Disk reads; a broken partition table (when the disk is no ext filesystem itself).
pub fn volumes(dev: &dyn BlockDevice) -> Result<(TableKind, Vec<Volume>), BootFilesError> {
    let size = dev.size();
    let whole = || {
        vec![Volume {
            partition: None,
            start: 0,
            len: size,
        }]
    };
    if has_ext_magic(dev, 0, size)? {
        return Ok((TableKind::None, whole()));
    }
    let sector_size = dev.geometry().logical_sector_size;
    let ss = sector_size as usize;
    if size < 2 * ss as u64 {
        return Ok((TableKind::None, whole()));
    }
    let mut head = vec![0u8; 2 * ss];
    dev.read_at(&mut head, 0)?;
    let (kind, parts) = match partition::parse_mbr(&head[..ss], sector_size, size)? {
        Sector0::NoTable => return Ok((TableKind::None, whole())),
        Sector0::Mbr { partitions, .. } => (TableKind::Mbr, partitions),
        Sector0::Protective => {
            let header = partition::parse_gpt_header(&head[ss..2 * ss], sector_size, size)?;
            let (offset, len) = header.entries_span(sector_size);
            let mut array = vec![0u8; len];
            dev.read_at(&mut array, offset)?;
            let parts = partition::parse_gpt_entries(&header, &array, sector_size)?;
            (TableKind::Gpt, parts)
        }
    };
    let vols: Vec<Volume> = parts
        .into_iter()
        .take(VOLUMES_MAX)
        .map(|p| Volume {
            start: p.start,
            len: p.len,
            partition: Some(p),
        })
        .collect();
    // The table parsers refuse partitions past the disk's end and empty ones.
    debug_assert!(
        vols.iter()
            .all(|v| v.len > 0 && v.start.checked_add(v.len).is_some_and(|e| e <= size)),
        "every volume lies inside the {size}-byte disk"
    );
    Ok((kind, vols))
}

/// True when the volume at `start` (of `len` bytes) carries the ext superblock magic.
///
/// # Errors
/// Disk reads.
pub fn has_ext_magic(dev: &dyn BlockDevice, start: u64, len: u64) -> Result<bool, BootFilesError> {
    if len < EXT_MAGIC_OFFSET + 2 {
        return Ok(false);
    }
    let mut m = [0u8; 2];
    dev.read_at(&mut m, start + EXT_MAGIC_OFFSET)?;
    Ok(m == EXT_MAGIC)
}

/// Reads of one volume for `ext4-view`: every read must lie inside the volume.
struct VolumeReader {
    dev: Arc<dyn BlockDevice>,
    start: u64,
    len: u64,
}

/// A read `ext4-view` asked for outside the volume.
#[derive(Debug, thiserror::Error)]
#[error("read of {len} bytes at {offset} is past the end of the {volume_len}-byte volume")]
struct OutsideVolume {
    offset: u64,
    len: usize,
    volume_len: u64,
}

impl Ext4Read for VolumeReader {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let inside = start_byte
            .checked_add(dst.len() as u64)
            .is_some_and(|end| end <= self.len);
        if !inside {
            return Err(Box::new(OutsideVolume {
                offset: start_byte,
                len: dst.len(),
                volume_len: self.len,
            }));
        }
        self.dev
            .read_at(dst, self.start + start_byte)
            .map_err(|e| Box::new(e) as _)
    }
}

/// Opens the ext filesystem of `vol` read-only.
///
/// # Errors
/// [`BootFilesError::Fs`] when `ext4-view` refuses it (corrupt, unsupported features, I/O).
pub fn open_ext(dev: &Arc<dyn BlockDevice>, vol: &Volume) -> Result<Ext4, BootFilesError> {
    let reader = VolumeReader {
        dev: dev.clone(),
        start: vol.start,
        len: vol.len,
    };
    Ext4::load(Box::new(reader)).map_err(|source| BootFilesError::Fs {
        volume: vol.label(),
        source,
    })
}
