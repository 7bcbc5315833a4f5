//! [`BootWatch`]: the device decorator a read-only version is served through while boot
//! sets are on. It tells the version's [`crate::boot_sets`] slot where the boot is (so the
//! prefetch skips what the boot has passed, and reads of prefetched extents are counted),
//! and, for the first boots of a version, records the reads of the connection's boot
//! window into a [`bootset::Recorder`].
//!
//! A [`disk::Filter`]: every call is passed on to the inner device (the connection's
//! cached wrapper), every fast path too; the reads are observed when they complete.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bootset::Recorder;
use disk::BlockDevice;
use disk::device::{Piece, Submitted};

/// What a watched connection reports to: its version's boot-set slot
/// (`crate::boot_sets`), behind a trait so that this file does not depend on that one.
pub(crate) trait BootObserver: Send + Sync + std::fmt::Debug {
    /// A client's read completed.
    fn observe(&self, offset: u64, len: u64);
    /// A connection's recording ended (`None`: it recorded nothing).
    fn recorded(self: Arc<Self>, rec: Option<Recording>);
    /// How long after its first read a connection's reads are its boot's.
    fn window(&self) -> Duration;
    /// The most distinct bytes a recording keeps.
    fn record_bytes_max(&self) -> u64;
    /// The same in pages.
    fn record_pages_max(&self) -> usize;
}

/// Who a connection's reads are recorded for, as the access rule decides it
/// (`crate::access::AccessPolicy::record_as`; see `crate::boot_sets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordAs<'a> {
    /// Nobody: an anonymous reader, never recorded.
    Nobody,
    /// A caller trusted to write (an administrator, a local client of a standalone server).
    Trusted,
    /// The device of the session export named here, opened with its own certificate: at
    /// most one recording per session and version.
    Session(&'a str),
}

/// One connection's recording.
#[derive(Debug)]
pub(crate) struct Recording {
    /// Set at the connection's first read.
    pub(crate) started: Option<Instant>,
    pub(crate) recorder: Recorder,
}

/// A read-only version's device, watched for boot sets (see the module docs).
#[derive(Debug)]
pub struct BootWatch {
    inner: Arc<dyn BlockDevice>,
    slot: Arc<dyn BootObserver>,
    /// True while this connection records.
    recording: AtomicBool,
    rec: Mutex<Option<Recording>>,
}

impl BootWatch {
    /// Watches `inner` for `slot`'s version; records when `record`.
    pub(crate) fn new(
        inner: Arc<dyn BlockDevice>,
        slot: Arc<dyn BootObserver>,
        record: bool,
    ) -> BootWatch {
        let rec = record.then(|| Recording {
            started: None,
            recorder: Recorder::new(inner.size(), slot.record_pages_max()),
        });
        BootWatch {
            inner,
            slot,
            recording: AtomicBool::new(record),
            rec: Mutex::new(rec),
        }
    }

    /// Notes a read the inner device answered.
    fn seen(&self, offset: u64, len: u64) {
        self.slot.observe(offset, len);
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let mut rec = self.rec.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(r) = rec.as_mut() else { return };
        let now = Instant::now();
        let started = *r.started.get_or_insert(now);
        let elapsed = now.duration_since(started);
        let within = elapsed <= self.slot.window()
            && r.recorder.read(
                offset,
                len,
                u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX),
            )
            && r.recorder.bytes() < self.slot.record_bytes_max();
        if !within {
            self.recording.store(false, Ordering::Relaxed);
            let done = rec.take();
            drop(rec);
            Arc::clone(&self.slot).recorded(done);
        }
    }

    fn seen_if<T>(
        &self,
        r: Option<disk::Result<T>>,
        offset: u64,
        len: u64,
    ) -> Option<disk::Result<T>> {
        if matches!(r, Some(Ok(_))) {
            self.seen(offset, len);
        }
        r
    }
}

impl Drop for BootWatch {
    fn drop(&mut self) {
        if self.recording.swap(false, Ordering::Relaxed) {
            let done = self
                .rec
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            Arc::clone(&self.slot).recorded(done);
        }
    }
}

/// Reads, on every path, are observed when they complete; every other call is the inner
/// device's.
impl disk::Filter for BootWatch {
    fn next(&self) -> &dyn BlockDevice {
        &*self.inner
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        self.inner.read_at(buf, offset)?;
        self.seen(offset, buf.len() as u64);
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> disk::Result<()> {
        self.inner.read_vectored_at(bufs, offset)?;
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.seen(offset, len);
        Ok(())
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<disk::Result<()>> {
        let len = buf.len() as u64;
        self.seen_if(self.inner.try_read_at(buf, offset), offset, len)
    }

    fn try_read_shared(&self, offset: u64, len: u64) -> Option<disk::Result<Vec<Piece>>> {
        self.seen_if(self.inner.try_read_shared(offset, len), offset, len)
    }

    fn read_shared(&self, offset: u64, len: u64) -> Option<disk::Result<Vec<Piece>>> {
        self.seen_if(self.inner.read_shared(offset, len), offset, len)
    }

    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        let call = self.inner.submit_read(offset, len)?;
        let slot = Arc::clone(&self.slot);
        Some(Box::pin(async move {
            let r = call.await?;
            if r.is_ok() {
                // Observed for the prefetch only: a submitted read is not recorded (the
                // cached wrapper submits none; a recording misses nothing today).
                slot.observe(offset, len as u64);
            }
            Some(r)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::{Expect, FastProbe, check_fast_paths};

    /// A slot that keeps what it is told.
    #[derive(Debug, Default)]
    struct Told {
        observed: Mutex<Vec<(u64, u64)>>,
        /// Per recording that ended: its distinct bytes (`None`: nothing recorded).
        recorded: Mutex<Vec<Option<u64>>>,
        window: Duration,
    }

    impl BootObserver for Told {
        fn observe(&self, offset: u64, len: u64) {
            self.observed.lock().unwrap().push((offset, len));
        }
        fn recorded(self: Arc<Self>, rec: Option<Recording>) {
            let bytes = rec.map(|r| r.recorder.bytes());
            self.recorded.lock().unwrap().push(bytes);
        }
        fn window(&self) -> Duration {
            self.window
        }
        fn record_bytes_max(&self) -> u64 {
            1 << 30
        }
        fn record_pages_max(&self) -> usize {
            1 << 18
        }
    }

    fn told(window: Duration) -> Arc<Told> {
        Arc::new(Told {
            window,
            ..Told::default()
        })
    }

    #[test]
    fn every_fast_path_reaches_the_device_and_each_read_is_observed() {
        let probe = Arc::new(FastProbe::new(1 << 20));
        let slot = told(Duration::from_secs(3600));
        let dev = BootWatch::new(probe.clone(), slot.clone(), true);
        let moved = check_fast_paths(&dev, &probe, |_| Expect::Passes);
        let observed: u64 = slot.observed.lock().unwrap().iter().map(|r| r.1).sum();
        assert_eq!(
            observed, moved.read_bytes,
            "every completed read is observed"
        );
        drop(dev);
        // Every read was in the first page; the submitted read is observed, not recorded.
        assert_eq!(*slot.recorded.lock().unwrap(), vec![Some(4096)]);
    }

    #[test]
    fn a_recording_ends_once_past_its_window_and_not_again_when_dropped() {
        let probe = Arc::new(FastProbe::new(1 << 20));
        let slot = told(Duration::ZERO);
        let dev = BootWatch::new(probe, slot.clone(), true);
        let mut buf = vec![0u8; 8192];
        dev.read_at(&mut buf, 0).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        dev.read_at(&mut buf, 65536).unwrap();
        dev.read_at(&mut buf, 131072).unwrap();
        assert_eq!(*slot.recorded.lock().unwrap(), vec![Some(8192)]);
        drop(dev);
        assert_eq!(slot.recorded.lock().unwrap().len(), 1);
        assert_eq!(slot.observed.lock().unwrap().len(), 3);
    }

    #[test]
    fn a_failed_read_is_not_observed_and_a_watch_that_does_not_record_reports_nothing() {
        let probe = Arc::new(FastProbe::new(1 << 20));
        let slot = told(Duration::from_secs(3600));
        let dev = BootWatch::new(probe, slot.clone(), false);
        let mut buf = vec![0u8; 4096];
        assert!(dev.read_at(&mut buf, 1 << 20).is_err());
        assert!(slot.observed.lock().unwrap().is_empty());
        dev.read_at(&mut buf, 0).unwrap();
        drop(dev);
        assert_eq!(*slot.observed.lock().unwrap(), vec![(0, 4096)]);
        assert!(slot.recorded.lock().unwrap().is_empty());
    }
}
