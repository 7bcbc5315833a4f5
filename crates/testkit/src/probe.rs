//! [`FastProbe`]: a device in memory whose every fast path answers and is counted, so a test
//! can prove that a decorator passes the fast paths of the device below it on
//! ([`check_fast_paths`]), and the [`Fast`] list it counts by, kept equal to the methods of
//! [`FastPath`] by a test.
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
    /// The name of the [`FastPath`] method (exhaustive: a new variant does not compile
    /// until it is named here, and a test checks the names against the trait's methods).
    pub const fn method(self) -> &'static str {
        match self {
            Fast::ReadVectoredAt => "read_vectored_at",
            Fast::TryReadAt => "try_read_at",
            Fast::TryReadShared => "try_read_shared",
            Fast::SharesReads => "shares_reads",
            Fast::ReadShared => "read_shared",
            Fast::TryWriteAt => "try_write_at",
            Fast::SubmitRead => "submit_read",
            Fast::SubmitWrite => "submit_write",
        }
    }

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

/// What a decorator does with one fast path of the device below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Passes the call on: the same fast path of the device below is called, and the
    /// decorator answers.
    Passes,
    /// Answers the call itself (from what it holds): the device below's fast path of that
    /// name is not called.
    Answers,
    /// Declines the call (`None`, or `false` for `shares_reads`), and does not call the
    /// device below's: the caller takes the ordinary path.
    Declines,
}

/// The reads and writes that answered fast-path calls moved, for the tests of counting
/// decorators.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Read calls answered.
    pub reads: u64,
    /// Their bytes.
    pub read_bytes: u64,
    /// Write calls answered.
    pub writes: u64,
    /// Their bytes.
    pub written_bytes: u64,
}

impl Moved {
    fn read(n: usize) -> Moved {
        Moved {
            reads: 1,
            read_bytes: n as u64,
            ..Moved::default()
        }
    }

    fn wrote(n: usize) -> Moved {
        Moved {
            writes: 1,
            written_bytes: n as u64,
            ..Moved::default()
        }
    }
}

/// Offset of the calls that write, [`Fast::TryWriteAt`]'s ([`Fast::SubmitWrite`] writes
/// right after it), apart from the reads at 0 so that a cache that keeps the writes still
/// holds nothing the reads ask for.
pub const WRITE_AT: u64 = 16384;

/// Calls fast path `path` of `dev` once, as a server would: reads at 0 (of 512 + 512 bytes
/// for [`Fast::ReadVectoredAt`], 512 for [`Fast::TryReadAt`], 4,096 for the others), writes
/// at [`WRITE_AT`] (4,096 bytes by [`Fast::TryWriteAt`], then 512 by [`Fast::SubmitWrite`]).
/// Returns what an answered call moved, or `None` when `dev` declined.
///
/// # Panics
/// When an answered call failed.
pub fn call_fast_path(dev: &dyn BlockDevice, path: Fast) -> Option<Moved> {
    let answered = |r: Option<Result<()>>, m: Moved| {
        r.map(|r| {
            r.unwrap_or_else(|e| panic!("{path:?} failed: {e}"));
            m
        })
    };
    let pieces = |r: Option<Result<Vec<Piece>>>, len: usize| {
        answered(r.map(|r| r.map(|_| ())), Moved::read(len))
    };
    match path {
        Fast::ReadVectoredAt => {
            let (mut a, mut b) = ([0u8; 512], [0u8; 512]);
            let r = dev.read_vectored_at(&mut [&mut a[..], &mut b[..]], 0);
            answered(Some(r), Moved::read(1024))
        }
        Fast::TryReadAt => {
            let mut a = [0u8; 512];
            answered(dev.try_read_at(&mut a, 0), Moved::read(512))
        }
        Fast::TryReadShared => pieces(dev.try_read_shared(0, 4096), 4096),
        Fast::SharesReads => dev.shares_reads().then(Moved::default),
        Fast::ReadShared => pieces(dev.read_shared(0, 4096), 4096),
        Fast::TryWriteAt => answered(dev.try_write_at(&[7; 4096], WRITE_AT), Moved::wrote(4096)),
        Fast::SubmitRead => {
            let r = dev.submit_read(0, 4096).map(|call| {
                let read = block_on(call).expect("a submitted read completes");
                read.map(|data| assert_eq!(data.len(), 4096, "submit_read's length"))
            });
            answered(r, Moved::read(4096))
        }
        Fast::SubmitWrite => {
            let r = dev
                .submit_write(&[8; 512], WRITE_AT + 4096)
                .map(|call| block_on(call).expect("a submitted write completes"));
            answered(r, Moved::wrote(512))
        }
    }
}

/// Calls every fast path of `dev`, a decorator over `probe` (at any depth), once with
/// [`call_fast_path`], and checks that each does what `expect` says: a filter passes every
/// one on (`|_| Expect::Passes`); a cache states, by an exhaustive `match`, which it passes
/// on, answers or declines, so a new [`Fast`] does not compile until every cache's test
/// says. Returns what the answered calls moved.
///
/// # Panics
/// When a fast path did not do what `expect` says (all of them are listed).
pub fn check_fast_paths(
    dev: &dyn BlockDevice,
    probe: &FastProbe,
    expect: impl Fn(Fast) -> Expect,
) -> Moved {
    let mut moved = Moved::default();
    let mut wrong = Vec::new();
    for path in Fast::ALL {
        let before = probe.calls(path);
        let answer = call_fast_path(dev, path);
        let reached = probe.calls(path) > before;
        let did = match (answer, reached) {
            (Some(_), true) => Some(Expect::Passes),
            (Some(_), false) => Some(Expect::Answers),
            (None, false) => Some(Expect::Declines),
            // The device below answered and the decorator dropped the answer.
            (None, true) => None,
        };
        if did != Some(expect(path)) {
            wrong.push(format!(
                "{path:?}: expected {:?}, did {did:?}",
                expect(path)
            ));
        }
        if let Some(m) = answer {
            moved.reads += m.reads;
            moved.read_bytes += m.read_bytes;
            moved.writes += m.writes;
            moved.written_bytes += m.written_bytes;
        }
    }
    assert!(wrong.is_empty(), "fast paths not as expected: {wrong:#?}");
    moved
}

/// The devices of the Rust files under `dir` (recursively): the types that implement
/// `disk::BlockDevice`, `disk::Filter` or `disk::FastPath` (`impl [disk::]Filter for NAME`
/// and so on), sorted. A crate's `tests/fast_paths.rs` checks that each is probed, or says
/// why it is not a decorator, so that no decorator is left out.
///
/// # Panics
/// When `dir` cannot be read.
pub fn device_types(dir: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                names.extend(text.lines().filter_map(device_impl));
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// `NAME` of a line `impl [disk::]BlockDevice for NAME {` (or `Filter`, or `FastPath`).
fn device_impl(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("impl ")?;
    let (tr, ty) = rest.split_once(" for ")?;
    let tr = tr.rsplit("::").next()?;
    if !["BlockDevice", "Filter", "FastPath"].contains(&tr) {
        return None;
    }
    let name: String = ty
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The methods of `disk::FastPath`, from its source, in order.
    fn trait_methods() -> Vec<String> {
        let src = include_str!("../../disk/src/device.rs");
        let body = src
            .split_once("pub trait FastPath:")
            .expect("disk::FastPath is in device.rs")
            .1;
        let body = &body[..body.find("\n}\n").expect("the end of the trait")];
        body.lines()
            .filter_map(|l| l.trim_start().strip_prefix("fn "))
            .map(|l| l[..l.find(['(', '<']).expect("a method")].to_string())
            .collect()
    }

    #[test]
    fn fast_names_every_method_of_the_trait_in_order() {
        let names: Vec<String> = Fast::ALL.iter().map(|f| f.method().to_string()).collect();
        assert_eq!(
            names,
            trait_methods(),
            "testkit::Fast and disk::FastPath differ: a fast path added to the trait needs \
             a variant in Fast::ALL, counted by FastProbe and called by call_fast_path"
        );
    }

    #[test]
    fn the_probe_answers_and_counts_every_fast_path() {
        let probe = FastProbe::new(1 << 20);
        let moved = check_fast_paths(&probe, &probe, |_| Expect::Passes);
        assert_eq!(probe.missed(), vec![]);
        let counted: u64 = Fast::ALL.iter().map(|&f| probe.calls(f)).sum();
        assert_eq!(counted, Fast::ALL.len() as u64, "each counted once");
        assert_eq!((moved.reads, moved.writes), (5, 2));
    }

    #[test]
    fn devices_are_found_by_the_trait_they_implement() {
        let found = |l: &str| device_impl(l);
        assert_eq!(
            found("impl disk::Filter for BootWatch {").as_deref(),
            Some("BootWatch")
        );
        assert_eq!(
            found("    impl FastPath for Golden {").as_deref(),
            Some("Golden")
        );
        assert_eq!(
            found("impl disk::BlockDevice for Pattern {").as_deref(),
            Some("Pattern")
        );
        assert_eq!(found("impl ExportSource for Source {"), None);
    }
}
