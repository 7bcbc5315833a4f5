//! Every decorator of the agent does with each fast path of the device below it what it
//! should: the counting filter passes every one on (a lost one would compile and quietly
//! take the blocking path) and counts it, the host read cache answers hits itself; and none
//! is left unprobed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent::host_read::HostCached;
use agent::stats::{Boot, IoCounted, IoCounters};
use disk::BlockDevice;
use host_cache::{HostCache, VersionIdentity, VersionKey};
use testkit::{Expect, Fast, FastProbe, check_fast_paths, device_types};

/// Every device type in `src/` (an `impl` of `disk::BlockDevice`, `disk::Filter` or
/// `disk::FastPath`) and where its fast paths are probed.
const PROBED: &[(&str, &str)] = &[
    (
        "HostCached",
        "host_cached_answers_hits_and_declines_the_rest",
    ),
    (
        "IoCounted",
        "io_counted_passes_every_fast_path_on_and_counts_them",
    ),
    (
        "Remote",
        "not a decorator: the NBD client at the bottom of the stack (tests/remote.rs)",
    ),
];

#[test]
fn every_decorator_of_the_agent_is_probed() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let probed: Vec<&str> = PROBED.iter().map(|p| p.0).collect();
    assert_eq!(device_types(&src), probed);
}

#[test]
fn io_counted_passes_every_fast_path_on_and_counts_them() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let io = Arc::new(IoCounters::default());
    let boot = Arc::new(Boot::new(None, None));
    let dev = IoCounted::new(probe.clone(), io.clone(), boot);

    let moved = check_fast_paths(&dev, &probe, |_| Expect::Passes);

    assert_eq!(io.reads.load(Ordering::Relaxed), moved.reads);
    assert_eq!(io.bytes_read.load(Ordering::Relaxed), moved.read_bytes);
    assert_eq!(io.writes.load(Ordering::Relaxed), moved.writes);
    assert_eq!(
        io.bytes_written.load(Ordering::Relaxed),
        moved.written_bytes
    );
}

/// The host read cache, a read-only layer with data of its own: what it decides for each
/// fast path, once the block the reads ask for is cached.
fn host_cached(path: Fast) -> Expect {
    match path {
        // Both through its own cache (the vectored read as reads of each buffer).
        Fast::ReadVectoredAt | Fast::TryReadAt => Expect::Answers,
        // It keeps no buffers to share, writes nothing (a read-only version) and submits
        // nothing (its misses fill the host cache on a blocking thread).
        Fast::TryReadShared
        | Fast::SharesReads
        | Fast::ReadShared
        | Fast::TryWriteAt
        | Fast::SubmitRead
        | Fast::SubmitWrite => Expect::Declines,
    }
}

#[test]
fn host_cached_answers_hits_and_declines_the_rest() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let cache = Arc::new(HostCache::private(8 << 20, 64 << 10).unwrap());
    let key = VersionKey::new(&VersionIdentity {
        vdisk: "probe",
        version: 1,
        size_bytes: 1 << 20,
        extra: &[],
    });
    let dev = HostCached::new(probe.clone(), cache, key);
    // The first block, which every read of the check asks for, is cached.
    dev.read_at(&mut vec![0; 64 << 10], 0).unwrap();

    check_fast_paths(&dev, &probe, host_cached);
}
