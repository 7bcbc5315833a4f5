//! What `ferry target status` shows: I/O counters kept by an [`IoCounted`] decorator at the
//! top of the stack, boot time, and the [`Status`] report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use disk::device::{Piece, Submitted};
use disk::{BlockDevice, Result};
use parking_lot::Mutex;

use crate::boot::{BootClock, BootEnd, Booted};

/// I/O counters of the exported disk.
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Read requests.
    pub reads: AtomicU64,
    /// Bytes read.
    pub bytes_read: AtomicU64,
    /// Write requests (writes, zeroes).
    pub writes: AtomicU64,
    /// Bytes written.
    pub bytes_written: AtomicU64,
    /// Requests that failed.
    pub errors: AtomicU64,
}

/// Boot time: from attach until `mark-booted`, `boot_bytes` read, or the end of the first
/// read burst, whichever comes first ([`BootClock`] decides; this holds it for the threads).
#[derive(Debug)]
pub struct Boot {
    attached: Instant,
    boot_bytes: Option<u64>,
    /// Set once the boot ended, so reads past `boot_bytes` skip the lock.
    ended: AtomicBool,
    clock: Mutex<BootClock>,
}

impl Boot {
    /// Starts the clock now; `boot_bytes` ends it after that many bytes read, and a read
    /// burst followed by `quiet` without reads ends it at the burst's last read.
    pub fn new(boot_bytes: Option<u64>, quiet: Option<Duration>) -> Boot {
        let attached = Instant::now();
        Boot {
            attached,
            boot_bytes,
            ended: AtomicBool::new(false),
            clock: Mutex::new(BootClock::new(attached, quiet)),
        }
    }

    /// Ends the boot now, unless it already ended. Returns the end.
    pub fn mark(&self) -> Booted {
        let b = self.clock.lock().mark(Instant::now());
        self.ended.store(true, Ordering::Relaxed);
        b
    }

    /// The end of the boot, once booted.
    pub fn booted(&self) -> Option<Booted> {
        self.clock.lock().booted()
    }

    /// The boot time, once booted.
    pub fn time(&self) -> Option<Duration> {
        self.booted().map(|b| b.time)
    }

    /// Time since attach.
    pub fn uptime(&self) -> Duration {
        self.attached.elapsed()
    }

    /// The sampler's tick at `now` with `reads` read requests so far: ends the boot when
    /// the first read burst is over.
    pub fn tick(&self, now: Instant, reads: u64) {
        if self.ended.load(Ordering::Relaxed) {
            return;
        }
        let end = self.clock.lock().tick(now, reads);
        if let Some(b) = end {
            self.ended.store(true, Ordering::Relaxed);
            tracing::info!(boot_time = ?b.time, reads, "boot read burst over");
        }
    }

    fn observe_read(&self, total: u64) {
        if self.boot_bytes.is_some_and(|b| total >= b) && !self.ended.load(Ordering::Relaxed) {
            let mut clock = self.clock.lock();
            let first = clock.booted().is_none();
            let b = clock.bytes_reached(Instant::now());
            drop(clock);
            self.ended.store(true, Ordering::Relaxed);
            if first {
                tracing::info!(boot_time = ?b.time, bytes = total, "boot byte count reached");
            }
        }
    }
}

/// Counts the exported disk's reads, writes and failed requests (and their bytes) on the
/// way to `inner`, and ends the boot clock after the boot's bytes were read.
#[derive(Debug)]
pub struct IoCounted {
    inner: Arc<dyn BlockDevice>,
    tally: Tally,
}

impl IoCounted {
    /// Wraps `inner`.
    pub fn new(
        inner: Arc<dyn BlockDevice>,
        counters: Arc<IoCounters>,
        boot: Arc<Boot>,
    ) -> IoCounted {
        IoCounted {
            inner,
            tally: Tally { counters, boot },
        }
    }
}

/// The counters an [`IoCounted`] adds to, also carried by the futures of its submitted calls.
#[derive(Debug, Clone)]
struct Tally {
    counters: Arc<IoCounters>,
    boot: Arc<Boot>,
}

impl Tally {
    fn counted_read<T>(&self, r: Result<T>, len: usize) -> Result<T> {
        if r.is_ok() {
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            let n = len as u64;
            let total = self.counters.bytes_read.fetch_add(n, Ordering::Relaxed) + n;
            self.boot.observe_read(total);
        }
        self.count(r)
    }

    fn counted_write(&self, r: Result<()>, len: usize) -> Result<()> {
        if r.is_ok() {
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_written
                .fetch_add(len as u64, Ordering::Relaxed);
        }
        self.count(r)
    }

    fn count<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

/// What completes, on every path, is counted; the rest is the inner device's.
impl disk::Filter for IoCounted {
    fn next(&self) -> &dyn BlockDevice {
        &*self.inner
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let r = self.inner.read_at(buf, offset);
        self.tally.counted_read(r, buf.len())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let r = self.inner.write_at(buf, offset);
        self.tally.counted_write(r, buf.len())
    }

    fn flush(&self) -> Result<()> {
        let r = self.inner.flush();
        self.tally.count(r)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.trim(offset, len);
        self.tally.count(r)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.write_zeroes(offset, len);
        if r.is_ok() {
            self.tally.counters.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.tally.count(r)
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        let r = self.inner.read_vectored_at(bufs, offset);
        self.tally.counted_read(r, len)
    }

    fn try_read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        let r = self.inner.try_read_shared(offset, len)?;
        Some(self.tally.counted_read(r, len as usize))
    }

    fn read_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<Piece>>> {
        let r = self.inner.read_shared(offset, len)?;
        Some(self.tally.counted_read(r, len as usize))
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        let r = self.inner.try_read_at(buf, offset)?;
        Some(self.tally.counted_read(r, buf.len()))
    }

    fn try_write_at(&self, buf: &[u8], offset: u64) -> Option<Result<()>> {
        let r = self.inner.try_write_at(buf, offset)?;
        Some(self.tally.counted_write(r, buf.len()))
    }

    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        let call = self.inner.submit_read(offset, len)?;
        let tally = self.tally.clone();
        Some(Box::pin(async move {
            let r = call.await?;
            Some(tally.counted_read(r, len))
        }))
    }

    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        let call = self.inner.submit_write(buf, offset)?;
        let (tally, n) = (self.tally.clone(), buf.len());
        Some(Box::pin(async move {
            let r = call.await?;
            Some(tally.counted_write(r, n))
        }))
    }
}

/// Request rates over the last sampling window.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rates {
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// Bytes read per second.
    pub read_bytes_per_s: f64,
    /// Bytes written per second.
    pub write_bytes_per_s: f64,
}

/// Samples the counters every second and keeps the rate over the last window.
#[derive(Debug)]
pub struct Sampler {
    last: Mutex<(Instant, [u64; 4])>,
    rates: Mutex<Rates>,
}

impl Sampler {
    /// A sampler starting now.
    pub fn new(c: &IoCounters) -> Sampler {
        Sampler {
            last: Mutex::new((Instant::now(), snapshot(c))),
            rates: Mutex::new(Rates::default()),
        }
    }

    /// Takes a sample at `now`.
    pub fn sample(&self, c: &IoCounters, now: Instant) {
        let cur = snapshot(c);
        let mut last = self.last.lock();
        let dt = now.duration_since(last.0).as_secs_f64();
        if dt <= 0.0 {
            return;
        }
        let d = |i: usize| cur[i].saturating_sub(last.1[i]) as f64 / dt;
        *self.rates.lock() = Rates {
            read_iops: d(0),
            write_iops: d(1),
            read_bytes_per_s: d(2),
            write_bytes_per_s: d(3),
        };
        *last = (now, cur);
    }

    /// The latest rates.
    pub fn rates(&self) -> Rates {
        *self.rates.lock()
    }
}

fn snapshot(c: &IoCounters) -> [u64; 4] {
    [
        c.reads.load(Ordering::Relaxed),
        c.writes.load(Ordering::Relaxed),
        c.bytes_read.load(Ordering::Relaxed),
        c.bytes_written.load(Ordering::Relaxed),
    ]
}

/// The status report of a running agent (`ferry target status --json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// The server in use.
    pub server: String,
    /// Every configured server, in failover order.
    pub servers: Vec<String>,
    /// The vDisk name.
    pub vdisk: String,
    /// The export attached on the server (after device login: the session's name).
    pub export: String,
    /// The device's MAC, when it logged in to a farm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The server's description of the export (vDisk and version).
    pub version: String,
    /// Size of the disk in bytes.
    pub size_bytes: u64,
    /// Cache mode.
    pub cache_mode: String,
    /// Cache block in bytes (local modes).
    pub cache_block_bytes: u32,
    /// RAM used by the cache.
    pub ram_bytes: u64,
    /// RAM budget.
    pub ram_bytes_max: u64,
    /// Overflow file bytes in use.
    pub overflow_bytes: u64,
    /// Overflow budget.
    pub overflow_bytes_max: u64,
    /// Blocks moved from RAM to the overflow file.
    pub evictions: u64,
    /// Writes refused for lack of cache space (ENOSPC).
    pub enospc: u64,
    /// Bytes read from the exported disk.
    pub bytes_read: u64,
    /// Bytes written to the exported disk.
    pub bytes_written: u64,
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Reads per second, last second.
    pub read_iops: f64,
    /// Writes per second, last second.
    pub write_iops: f64,
    /// Requests that failed.
    pub errors: u64,
    /// Requests retried after a server was lost.
    pub retries: u64,
    /// Moves to another server.
    pub failovers: u64,
    /// Seconds since attach.
    pub uptime_s: f64,
    /// Seconds from attach to boot end, once booted.
    pub boot_time_s: Option<f64>,
    /// What ended the boot, once booted.
    #[serde(default)]
    pub boot_ended_by: Option<BootEnd>,
    /// The host read cache, when the agent reads through one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cache: Option<crate::host_read::HostCacheStatus>,
    /// The boot-set prefetch, when one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::prefetch::PrefetchStatus>,
    /// Status reports to the farm that failed (every API tried), when the agent reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reports_failed: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_mark_is_kept_once() {
        let b = Boot::new(None, None);
        let t = b.mark();
        assert_eq!(b.mark(), t);
        assert_eq!(b.time(), Some(t.time));
    }

    #[test]
    fn boot_bytes_reached_ends_the_boot() {
        let b = Boot::new(Some(100), None);
        b.observe_read(99);
        assert_eq!(b.time(), None);
        b.observe_read(100);
        assert_eq!(b.booted().map(|e| e.by), Some(BootEnd::BootBytes));
    }

    #[test]
    fn boot_tick_after_a_quiet_burst_ends_the_boot() {
        let b = Boot::new(None, Some(crate::boot::BOOT_QUIET));
        let t0 = Instant::now();
        let reads = crate::boot::BOOT_READS_MIN;
        b.tick(t0, reads);
        b.tick(t0 + crate::boot::BOOT_QUIET, reads);
        assert_eq!(b.booted().map(|e| e.by), Some(BootEnd::ReadBurstOver));
    }

    #[test]
    fn sampler_rates_are_per_second() {
        let c = IoCounters::default();
        let s = Sampler::new(&c);
        let t0 = s.last.lock().0;
        c.reads.fetch_add(50, Ordering::Relaxed);
        s.sample(&c, t0 + Duration::from_millis(500));
        assert_eq!(s.rates().read_iops, 100.0);
    }
}
