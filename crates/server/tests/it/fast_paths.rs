//! Every decorator of the server passes each fast path of the device below it on (a lost
//! one would compile and quietly take the blocking path), and none is left unprobed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use server::diff_cache::{WriteCounters, WritesCounted};
use testkit::{Expect, FastProbe, check_fast_paths, device_types};

/// Every device type in `src/` (an `impl` of `disk::BlockDevice`, `disk::Filter` or
/// `disk::FastPath`) and where its fast paths are probed.
const PROBED: &[(&str, &str)] = &[
    (
        "BootWatch",
        "src/boot_watch.rs, unit test (its constructor is crate-private)",
    ),
    (
        "WritesCounted",
        "writes_counted_passes_every_fast_path_on_and_counts_its_writes",
    ),
];

#[test]
fn every_decorator_of_the_server_is_probed() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let probed: Vec<&str> = PROBED.iter().map(|p| p.0).collect();
    assert_eq!(device_types(&src), probed);
}

#[test]
fn writes_counted_passes_every_fast_path_on_and_counts_its_writes() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let counters = Arc::new(WriteCounters::default());
    let dev = WritesCounted::new(probe.clone(), counters.clone());

    let moved = check_fast_paths(&dev, &probe, |_| Expect::Passes);

    assert_eq!(counters.writes.load(Ordering::Relaxed), moved.writes);
    assert_eq!(counters.bytes.load(Ordering::Relaxed), moved.written_bytes);
}
