//! The host read cache as a layer of the agent's stack: [`HostCached`] sits between the
//! write cache and the remote vDisk in the local cache modes, where the export is the
//! version itself, read-only. A read takes what the host cache holds, waits for a block
//! another agent is fetching, and fetches the rest from the server in runs of whole
//! blocks (one request each), which it stores for every agent on the host.
//!
//! ```text
//!   write cache (this device's writes)
//!        ▼ reads of blocks it does not hold
//!   HostCached ──hit──► host_cache::HostCache  (/dev/shm/ferry-host-cache-UID, or private)
//!        ▼ miss: one request per run of missing blocks, then fill
//!   remote::Remote ──► server (NAME@V, read-only)
//! ```
//!
//! Never in the server modes: their export carries the device's own writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use disk::device::{Geometry, check_bounds};
use disk::{BlockDevice, Error, ErrorKind, Result};
use host_cache::{Claim, HostCache, Lookup, VersionKey};

/// Told the block of every read that reaches the layer (the prefetch's cursor).
pub trait ReadObserver: Send + Sync + std::fmt::Debug {
    /// A read of cache block `block`.
    fn observe(&self, block: u64);
}

/// Most blocks fetched by one server request (1 MiB of 64 KiB blocks).
pub const RUN_BYTES_MAX: u64 = 1 << 20;

/// The remote vDisk read through the host cache (see the module docs).
#[derive(Debug)]
pub struct HostCached {
    next: Arc<dyn BlockDevice>,
    cache: Arc<HostCache>,
    key: VersionKey,
    size: u64,
    shift: u32,
    /// The prefetch's view of where the boot is (set once a boot set is known).
    cursor: parking_lot::RwLock<Option<Arc<dyn ReadObserver>>>,
    /// Bytes this layer fetched from the server (fills and reads past the cache).
    pub(crate) server_bytes: AtomicU64,
}

/// What `ferry target status` shows of the host cache.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostCacheStatus {
    /// The cache file, or `private` (this agent's memory, for the prefetch).
    pub path: String,
    /// The version key (hex).
    pub key: String,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// Bytes of the whole cache.
    pub bytes_max: u64,
    /// Block reads answered from the cache by this agent.
    pub hits: u64,
    /// Bytes of those.
    pub hit_bytes: u64,
    /// Block reads the cache did not hold.
    pub misses: u64,
    /// Reads that waited for another agent's fetch of the same block.
    pub waits: u64,
    /// Bytes this agent read from the server below the cache.
    pub server_bytes: u64,
    /// Hits of every agent on the host.
    pub host_hits: u64,
    /// Bytes every agent on the host fetched into the cache.
    pub host_fill_bytes: u64,
    /// Slots found torn and refetched (this agent).
    pub torn: u64,
    /// Fills taken over from agents that died mid-fill (this agent).
    pub stolen: u64,
}

impl HostCached {
    /// `next` (the remote read-only version) read through `cache` under `key`.
    pub fn new(next: Arc<dyn BlockDevice>, cache: Arc<HostCache>, key: VersionKey) -> HostCached {
        let size = next.size();
        let shift = cache.block_bytes().trailing_zeros();
        HostCached {
            next,
            cache,
            key,
            size,
            shift,
            cursor: parking_lot::RwLock::new(None),
            server_bytes: AtomicU64::new(0),
        }
    }

    /// The cache block in bytes.
    pub fn block_bytes(&self) -> u64 {
        1 << self.shift
    }

    /// Tells reads to report their blocks to the prefetch's `cursor`.
    pub(crate) fn watch(&self, cursor: Arc<dyn ReadObserver>) {
        *self.cursor.write() = Some(cursor);
    }

    /// The status report's part.
    pub fn status(&self) -> HostCacheStatus {
        let c = self.cache.counters();
        let g = self.cache.geometry();
        HostCacheStatus {
            path: self
                .cache
                .path()
                .map_or_else(|| "private".to_string(), |p| p.display().to_string()),
            key: self.key.hex(),
            block_bytes: g.block_bytes,
            bytes_max: g.file_bytes().unwrap_or(0),
            hits: c.hits,
            hit_bytes: c.hit_bytes,
            misses: c.misses,
            waits: c.waits,
            server_bytes: self.server_bytes.load(Ordering::Relaxed),
            host_hits: c.host_hits,
            host_fill_bytes: c.host_fill_bytes,
            torn: c.torn,
            stolen: c.stolen,
        }
    }

    /// Ensures blocks `[first, first + n)` are cached or being fetched by someone:
    /// claims the missing ones and fetches each run of claimed blocks with one request.
    /// Returns the bytes fetched. (The prefetch's fetch; reads use it for their misses.)
    ///
    /// # Errors
    /// The server read failed (nothing was stored).
    pub fn fill_run(&self, first: u64, n: u64) -> Result<u64> {
        let mut fetched = 0;
        let mut b = first;
        let end = first + n;
        while b < end {
            let mut fills = Vec::new();
            while b + (fills.len() as u64) < end {
                match self.cache.claim(self.key, b + fills.len() as u64) {
                    Claim::Mine(f) => fills.push(f),
                    _ => break,
                }
            }
            if fills.is_empty() {
                b += 1;
                continue;
            }
            let start = b << self.shift;
            let stop = ((b + fills.len() as u64) << self.shift).min(self.size);
            let len = usize::try_from(stop - start)
                .map_err(|_| Error::new(ErrorKind::Io, "run too long"))?;
            let mut data = vec![0u8; len];
            self.next.read_at(&mut data, start)?;
            self.server_bytes.fetch_add(len as u64, Ordering::Relaxed);
            fetched += len as u64;
            let bb = self.block_bytes() as usize;
            for (f, chunk) in fills.into_iter().zip(data.chunks(bb)) {
                f.commit(chunk);
            }
            b = stop.div_ceil(self.block_bytes());
        }
        Ok(fetched)
    }

    /// The block of `at` and the offset in it.
    fn split(&self, at: u64) -> (u64, usize) {
        (at >> self.shift, (at & (self.block_bytes() - 1)) as usize)
    }

    /// Reads `dst` at `at` (inside one block) past the cache.
    fn read_past(&self, dst: &mut [u8], at: u64) -> Result<()> {
        self.next.read_at(dst, at)?;
        self.server_bytes
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl BlockDevice for HostCached {
    fn geometry(&self) -> Geometry {
        self.next.geometry()
    }

    fn format(&self) -> &'static str {
        "host-cache"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.size, offset, buf.len() as u64)?;
        let cursor = self.cursor.read().clone();
        let len = buf.len();
        let mut pos = 0usize;
        let last = if len == 0 {
            0
        } else {
            (offset + len as u64 - 1) >> self.shift
        };
        let mut tries = 0u32;
        while pos < len {
            let at = offset + pos as u64;
            let (b, o) = self.split(at);
            let n = (self.block_bytes() as usize - o).min(len - pos);
            if let Some(c) = &cursor {
                c.observe(b);
            }
            let dst = &mut buf[pos..pos + n];
            match self.cache.read(self.key, b, o, dst) {
                Lookup::Hit => {}
                Lookup::Filling if tries < 2 && self.cache.wait_fill(self.key, b) => {
                    tries += 1;
                    continue;
                }
                Lookup::Filling => self.read_past(dst, at)?,
                Lookup::Miss if tries < 2 => {
                    // The missing run up to this request's last block, at most RUN_BYTES_MAX.
                    let n_blocks = (last - b + 1).min(RUN_BYTES_MAX >> self.shift);
                    self.fill_run(b, n_blocks)?;
                    tries += 1;
                    continue;
                }
                // Filled and evicted at once (a cache far too small), or a torn slot.
                Lookup::Miss => self.read_past(dst, at)?,
            }
            tries = 0;
            pos += n;
        }
        Ok(())
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            "the host read cache holds read-only versions",
        ))
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            "the host read cache holds read-only versions",
        ))
    }

    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            "the host read cache holds read-only versions",
        ))
    }

    fn can_write(&self) -> bool {
        false
    }

    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        Some(self)
    }
}

/// Hits complete in place; everything else takes the blocking path (fills, waits).
impl disk::FastPath for HostCached {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    /// Only when every block is cached (the copy waits on nothing).
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = check_bounds(self.size, offset, buf.len() as u64) {
            return Some(Err(e));
        }
        let mut pos = 0;
        while pos < buf.len() {
            let (b, o) = self.split(offset + pos as u64);
            let n = (self.block_bytes() as usize - o).min(buf.len() - pos);
            if self.cache.read(self.key, b, o, &mut buf[pos..pos + n]) != Lookup::Hit {
                return None;
            }
            pos += n;
        }
        Some(Ok(()))
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
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
