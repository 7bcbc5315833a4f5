//! [`FastProbe`]: a device in memory whose every fast path answers and is counted, so a test
//! can prove that a decorator passes the fast paths of the device below it on.
//!
//! ```
//! use std::sync::Arc;
//! use disk::BlockDevice;
//! use testkit::{Fast, FastProbe};
//!
//! let probe = Arc::new(FastProbe::new(1 << 20));
//! let dev: Arc<dyn BlockDevice> = probe.clone();
//! let mut buf = [0u8; 512];
//! assert!(dev.try_read_at(&mut buf, 0).is_some());
//! assert_eq!(probe.calls(Fast::TryReadAt), 1);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use disk::device::{Geometry, Piece, SharedBuf, Submitted, check_bounds};
use disk::{BlockDevice, FastPath, Result};

/// One method of [`FastPath`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fast {
    /// [`FastPath::read_vectored_at`].
    ReadVectoredAt,
    /// [`FastPath::try_read_at`].
    TryReadAt,
    /// [`FastPath::try_read_shared`].
    TryReadShared,
    /// [`FastPath::shares_reads`].
    SharesReads,
    /// [`FastPath::read_shared`].
    ReadShared,
    /// [`FastPath::try_write_at`].
    TryWriteAt,
    /// [`FastPath::submit_read`].
    SubmitRead,
    /// [`FastPath::submit_write`].
    SubmitWrite,
}

impl Fast {
    /// Every fast path, in the order of the trait.
    pub const ALL: [Fast; 8] = [
        Fast::ReadVectoredAt,
        Fast::TryReadAt,
        Fast::TryReadShared,
        Fast::SharesReads,
        Fast::ReadShared,
        Fast::TryWriteAt,
        Fast::SubmitRead,
        Fast::SubmitWrite,
    ];
}

/// A writable device in memory that implements every [`FastPath`] method (each one answers,
/// with the device's bytes) and counts how often each was called.
#[derive(Debug)]
pub struct FastProbe {
    bytes: parking_lot::Mutex<Vec<u8>>,
    calls: [AtomicU64; Fast::ALL.len()],
}

impl FastProbe {
    /// A probe of `size` zero bytes.
    pub fn new(size: usize) -> FastProbe {
        FastProbe {
            bytes: parking_lot::Mutex::new(vec![0; size]),
            calls: Default::default(),
        }
    }

    /// How often `path` was called.
    pub fn calls(&self, path: Fast) -> u64 {
        self.calls[path as usize].load(Ordering::Relaxed)
    }

    /// The fast paths never called.
    pub fn missed(&self) -> Vec<Fast> {
        Fast::ALL
            .into_iter()
            .filter(|&p| self.calls(p) == 0)
            .collect()
    }

    fn count(&self, path: Fast) {
        self.calls[path as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn piece(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        let mut buf = vec![0; usize::try_from(len).expect("a probe read fits in memory")];
        self.read_at(&mut buf, offset)?;
        let len = buf.len();
        let buf: SharedBuf = Arc::new(buf);
        Ok(vec![Piece::Shared { buf, start: 0, len }])
    }
}

impl BlockDevice for FastProbe {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.bytes.lock().len() as u64,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }

    fn format(&self) -> &'static str {
        "probe"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let bytes = self.bytes.lock();
        check_bounds(bytes.len() as u64, offset, buf.len() as u64)?;
        let at = offset as usize;
        buf.copy_from_slice(&bytes[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut bytes = self.bytes.lock();
        check_bounds(bytes.len() as u64, offset, buf.len() as u64)?;
        let at = offset as usize;
        bytes[at..at + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn can_write(&self) -> bool {
        true
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for FastProbe {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        self.count(Fast::ReadVectoredAt);
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        self.count(Fast::TryReadAt);
        Some(self.read_at(buf, offset))
    }

    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.count(Fast::TryReadShared);
        Some(self.piece(offset, len))
    }

    fn shares_reads(&self) -> bool {
        self.count(Fast::SharesReads);
        true
    }

    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        self.count(Fast::ReadShared);
        Some(self.piece(offset, len))
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        self.count(Fast::TryWriteAt);
        Some(self.write_at(buf, offset))
    }

    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        self.count(Fast::SubmitRead);
        let mut buf = vec![0; len];
        let r = self.read_at(&mut buf, offset).map(|()| buf);
        Some(Box::pin(async move { Some(r) }))
    }

    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        self.count(Fast::SubmitWrite);
        let r = self.write_at(buf, offset);
        Some(Box::pin(async move { Some(r) }))
    }
}

/// Calls every fast path of `dev` once, as a server would (reads at 0, writes at 0 and
/// 8192), and checks that each one answered: the test of a decorator over a [`FastProbe`]
/// then asks the probe which ones reached it. Returns the bytes read through the calls
/// that read (1,024 + 512 + 3 × 4,096) and written (4,096 + 512), for counting decorators.
///
/// # Panics
/// When a fast path declined or failed.
pub fn call_every_fast_path(dev: &dyn BlockDevice) -> (u64, u64) {
    let mut a = [0u8; 512];
    let mut b = [0u8; 512];
    dev.read_vectored_at(&mut [&mut a[..], &mut b[..]], 0)
        .expect("read_vectored_at");
    assert!(
        dev.try_read_at(&mut a, 0)
            .expect("try_read_at answers")
            .is_ok()
    );
    assert!(
        dev.try_read_shared(0, 4096)
            .expect("try_read_shared answers")
            .is_ok()
    );
    assert!(dev.shares_reads(), "shares_reads");
    assert!(
        dev.read_shared(0, 4096)
            .expect("read_shared answers")
            .is_ok()
    );
    assert!(
        dev.try_write_at(&[7; 4096], 0)
            .expect("try_write_at answers")
            .is_ok()
    );
    let read = block_on(dev.submit_read(0, 4096).expect("submit_read answers"));
    assert!(read.expect("submit_read completes").is_ok());
    let wrote = block_on(
        dev.submit_write(&[8; 512], 8192)
            .expect("submit_write answers"),
    );
    assert!(wrote.expect("submit_write completes").is_ok());
    (1024 + 512 + 3 * 4096, 4096 + 512)
}

/// Runs a submitted call to its end on the calling thread (the probe's futures are ready at
/// once; a pending one is polled again until it resolves).
pub fn block_on<T>(mut call: Submitted<T>) -> Option<Result<T>> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    loop {
        if let std::task::Poll::Ready(r) = call.as_mut().poll(&mut cx) {
            return r;
        }
        std::thread::yield_now();
    }
}
