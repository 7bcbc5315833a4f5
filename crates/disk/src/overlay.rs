//! A read-only [`Storage`] that shows a replayed VHDX log without writing it: used when a
//! dirty image is opened read-only (the golden image on a server must not be modified).

use std::sync::Arc;

use vhdx::log::Write;

use crate::{Error, ErrorKind, Result, Storage};

/// The inner store with the log's writes laid over it, in log order.
#[derive(Debug)]
pub struct OverlayStorage {
    inner: Arc<dyn Storage>,
    writes: Vec<Write>,
    len: u64,
}

impl OverlayStorage {
    /// Lays `writes` (in replay order) over `inner`, whose visible length becomes at least
    /// `min_len`.
    ///
    /// # Errors
    /// When the inner length cannot be read.
    pub fn new(inner: Arc<dyn Storage>, writes: Vec<Write>, min_len: u64) -> Result<Self> {
        let len = inner.len()?.max(min_len);
        Ok(OverlayStorage { inner, writes, len })
    }
}

fn read_only() -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        "image with an unreplayed log is open read-only",
    )
}

impl Storage for OverlayStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        let end = offset.saturating_add(buf.len() as u64);
        for w in &self.writes {
            let (w_off, w_len, data) = match w {
                Write::Data {
                    file_offset,
                    sector,
                } => (*file_offset, sector.len() as u64, Some(sector)),
                Write::Zero { file_offset, len } => (*file_offset, *len, None),
            };
            let (lo, hi) = (w_off.max(offset), w_off.saturating_add(w_len).min(end));
            if lo >= hi {
                continue;
            }
            let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            match data {
                Some(d) => dst.copy_from_slice(&d[(lo - w_off) as usize..(hi - w_off) as usize]),
                None => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(read_only())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.len)
    }

    fn set_len(&self, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn punch_hole(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(read_only())
    }
}
