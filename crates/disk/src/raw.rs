//! A raw image: the file's bytes are the disk's bytes.

use std::sync::Arc;

use crate::device::{BlockDevice, Geometry, LayerRun, Source, check_bounds};
use crate::{Result, Storage};

/// A raw disk image over a [`Storage`].
#[derive(Debug)]
pub struct RawDisk {
    storage: Arc<dyn Storage>,
    size: u64,
    writable: bool,
}

impl RawDisk {
    /// Wraps a store; the size is its current length.
    ///
    /// # Errors
    /// When the length cannot be read.
    pub fn open(storage: Arc<dyn Storage>, writable: bool) -> Result<RawDisk> {
        let size = storage.len()?;
        Ok(RawDisk {
            storage,
            size,
            writable,
        })
    }
}

impl BlockDevice for RawDisk {
    fn fast_path(&self) -> Option<&dyn crate::FastPath> {
        None
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.size,
            logical_sector_size: 512,
            physical_sector_size: 512,
            block_size: 1 << 20,
        }
    }

    fn format(&self) -> &'static str {
        "raw"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.size, offset, buf.len() as u64)?;
        self.storage.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        if !self.writable {
            return Err(crate::Error::new(
                crate::ErrorKind::ReadOnly,
                "raw image opened read-only",
            ));
        }
        check_bounds(self.size, offset, buf.len() as u64)?;
        self.storage.write_at(buf, offset)
    }

    fn flush(&self) -> Result<()> {
        self.storage.flush()
    }

    fn can_write(&self) -> bool {
        self.writable
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        // SEEK_DATA/SEEK_HOLE tell holes apart; stores that do not know report all data.
        let mut runs = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let data = self.storage.next_data(pos)?.unwrap_or(end).min(end);
            if data > pos {
                runs.push(LayerRun {
                    len: data - pos,
                    source: Source::Zero,
                });
                pos = data;
                continue;
            }
            let hole = self.storage.next_hole(pos)?.min(end);
            let hole = if hole <= pos { end } else { hole };
            runs.push(LayerRun {
                len: hole - pos,
                source: Source::Data,
            });
            pos = hole;
        }
        Ok(runs)
    }

    fn allocated_bytes(&self) -> Result<u64> {
        Ok(self.size)
    }
}
