//! The server's decorators pass the fast paths of the device below them on (a forgotten
//! one would compile and quietly take the blocking path).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use server::diff_cache::{WriteCounters, WritesCounted};
use testkit::{FastProbe, call_every_fast_path};

#[test]
fn writes_counted_reaches_every_fast_path_of_its_device_and_counts_its_writes() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let counters = Arc::new(WriteCounters::default());
    let dev = WritesCounted::new(probe.clone(), counters.clone());

    let (_, written) = call_every_fast_path(&dev);

    assert_eq!(
        probe.missed(),
        vec![],
        "fast paths that did not reach the device"
    );
    assert_eq!(counters.writes.load(Ordering::Relaxed), 2);
    assert_eq!(counters.bytes.load(Ordering::Relaxed), written);
}
