//! The agent's counting decorator passes the fast paths of the device below it on (a
//! forgotten one would compile and quietly take the blocking path) and counts them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent::stats::{Boot, IoCounted, IoCounters};
use testkit::{FastProbe, call_every_fast_path};

#[test]
fn io_counted_reaches_every_fast_path_of_its_device_and_counts_them() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let io = Arc::new(IoCounters::default());
    let boot = Arc::new(Boot::new(None, None));
    let dev = IoCounted::new(probe.clone(), io.clone(), boot);

    let (read, written) = call_every_fast_path(&dev);

    assert_eq!(
        probe.missed(),
        vec![],
        "fast paths that did not reach the device"
    );
    assert_eq!(io.reads.load(Ordering::Relaxed), 5);
    assert_eq!(io.bytes_read.load(Ordering::Relaxed), read);
    assert_eq!(io.writes.load(Ordering::Relaxed), 2);
    assert_eq!(io.bytes_written.load(Ordering::Relaxed), written);
}
