//! The device decorator: [`CachedDevice`], a read-only, caching [`BlockDevice`] in front
//! of one chain for one connection. It feeds the connection's stream detector, queues the
//! read-ahead it asks for, and reads through the shared cache (`read.rs`); everything but
//! reads (geometry, allocation map, parent, linkage identity) is the inner device's.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TrySendError;
use std::sync::{Arc, Mutex, PoisonError};

use disk::device::{Geometry, LayerRun, ParentRef, Piece, check_bounds};
use disk::{BlockDevice, Error, ErrorKind, Result};
use vhdx::Guid;

use crate::chain::ChainKey;
use crate::config::SCAN_AFTER_BYTES;
use crate::shared::{ChainHandle, Job};
use crate::stream::Streams;

/// A read-only, caching view of a chain for one connection (see
/// [`BlockCache::wrap`](crate::BlockCache::wrap)).
/// Geometry, allocation map, parent and linkage identity are the inner device's, so a
/// differencing child can attach to it and block status walks through it.
pub struct CachedDevice {
    chain: Arc<ChainHandle>,
    /// This connection's sequential streams (read-ahead detection).
    streams: Mutex<Streams>,
    /// False once the connection's reads are known ahead (a boot set is prefetched for
    /// them): its stream detector then queues no read-ahead.
    read_ahead_on: AtomicBool,
    geometry: Geometry,
}

impl fmt::Debug for CachedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedDevice")
            .field("key", &self.chain.key)
            .field("chain_id", &self.chain.id)
            .field("inner", &self.chain.inner)
            .finish_non_exhaustive()
    }
}

impl CachedDevice {
    /// A wrapper of `chain` whose geometry is `geometry` (the inner device's).
    pub(crate) fn new(chain: Arc<ChainHandle>, geometry: Geometry) -> CachedDevice {
        CachedDevice {
            chain,
            streams: Mutex::default(),
            read_ahead_on: AtomicBool::new(true),
            geometry,
        }
    }

    /// The key this wrapper caches under.
    pub fn key(&self) -> &ChainKey {
        &self.chain.key
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.chain.inner
    }

    /// Reads the pages of `[offset, offset + len)` that are not cached into the cache,
    /// without touching this wrapper's stream detector or the chain's read-ahead score
    /// (see `warm.rs`). Returns the bytes read from the store.
    ///
    /// # Errors
    /// Out of bounds; the store's error.
    pub fn warm(&self, offset: u64, len: u64) -> Result<u64> {
        check_bounds(self.geometry.size, offset, len)?;
        if len == 0 {
            return Ok(0);
        }
        self.chain.shared.warm(&self.chain, offset, offset + len)
    }

    /// Turns this wrapper's read-ahead (and scan detection) on or off; off for a
    /// connection whose reads a prefetcher already knows (a version's boot set), so the
    /// store reads nothing the boot will not.
    pub fn set_read_ahead(&self, on: bool) {
        self.read_ahead_on.store(on, Ordering::Relaxed);
    }

    /// Feeds the stream detector and queues read-ahead it asks for. Returns whether the
    /// read is part of a scan.
    fn read_ahead(&self, offset: u64, len: u64) -> bool {
        if !self.read_ahead_on.load(Ordering::Relaxed) {
            return false;
        }
        let shared = &self.chain.shared;
        let window_max = match &shared.read_ahead {
            Some(_) => u64::from(shared.config.read_ahead_blocks_max),
            None => 0,
        };
        let (wanted, span) = {
            let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            let wanted = streams.on_read(
                offset,
                len,
                shared.block_bytes,
                self.chain.blocks,
                window_max,
            );
            (wanted, streams.last_span())
        };
        let scan = self.chain.scanned && span >= SCAN_AFTER_BYTES;
        // A scan's misses read ahead themselves (`SCAN_FILL_BYTES`); a job queued for it
        // could run after the scan passed and its window let the blocks go, and read them
        // again.
        let (Some(tx), Some(blocks), false) = (&shared.read_ahead, wanted, scan) else {
            return scan;
        };
        if !self.chain.score.allows() {
            shared.counters.read_ahead_refused.add(1);
            return scan;
        }
        let job = Job {
            chain: self.chain.clone(),
            blocks,
        };
        match tx.try_send(job) {
            Ok(()) => shared.counters.read_ahead_jobs.add(1),
            Err(TrySendError::Full(_)) => shared.counters.read_ahead_dropped.add(1),
            Err(TrySendError::Disconnected(_)) => {}
        }
        false
    }
}

fn read_only() -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        "cached export is read-only (writes go to a write cache)",
    )
}

impl BlockDevice for CachedDevice {
    fn geometry(&self) -> Geometry {
        self.geometry.clone()
    }

    fn format(&self) -> &'static str {
        self.chain.inner.format()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.geometry.size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let scan = self.read_ahead(offset, buf.len() as u64);
        self.chain.shared.read(&self.chain, buf, offset, scan)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(read_only())
    }

    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn can_write(&self) -> bool {
        false
    }

    fn map_layer(&self, offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        self.chain.inner.map_layer(offset, len)
    }

    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        self.chain.inner.parent()
    }

    fn parent_ref(&self) -> Option<ParentRef> {
        self.chain.inner.parent_ref()
    }

    fn linkage_id(&self) -> Option<Guid> {
        self.chain.inner.linkage_id()
    }

    fn allocated_bytes(&self) -> Result<u64> {
        self.chain.inner.allocated_bytes()
    }

    fn warnings(&self) -> Vec<String> {
        self.chain.inner.warnings()
    }

    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        Some(self)
    }
}

/// Hits are served from the cache's buffers, shared or copied; the cache writes nothing and submits nothing.
impl disk::FastPath for CachedDevice {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return Some(Ok(()));
        }
        // The shared pieces, copied: one lookup path for both.
        let pieces = match self.try_read_shared(offset, buf.len() as u64)? {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let mut at = 0;
        for p in &pieces {
            let dst = &mut buf[at..at + p.len()];
            match p.bytes() {
                Some(b) => dst.copy_from_slice(b),
                None => dst.fill(0),
            }
            at += p.len();
        }
        Some(Ok(()))
    }

    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(Vec::new()));
        }
        let pieces = self
            .chain
            .shared
            .try_read_shared(&self.chain, offset, len)?;
        let _scan = self.read_ahead(offset, len);
        Some(Ok(pieces))
    }

    fn shares_reads(&self) -> bool {
        true
    }

    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        if let Err(e) = check_bounds(self.geometry.size, offset, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(Vec::new()));
        }
        let scan = self.read_ahead(offset, len);
        Some(
            self.chain
                .shared
                .read_shared(&self.chain, offset, offset + len, scan),
        )
    }

    fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn submit_read(&self, _offset: u64, _len: usize) -> Option<disk::device::Submitted<Vec<u8>>> {
        None
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
        None
    }
}
