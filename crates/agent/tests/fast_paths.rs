//! The agent's counting decorator passes the fast paths of the device below it on (a
//! forgotten one would compile and quietly take the blocking path) and counts them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent::stats::{Boot, IoCounted, IoCounters};
use disk::BlockDevice;
use testkit::{FastProbe, block_on};

#[test]
fn io_counted_reaches_every_fast_path_of_its_device_and_counts_them() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let io = Arc::new(IoCounters::default());
    let boot = Arc::new(Boot::new(None, None));
    let dev: Arc<dyn BlockDevice> = Arc::new(IoCounted::new(probe.clone(), io.clone(), boot));

    let mut a = [0u8; 512];
    let mut b = [0u8; 512];
    dev.read_vectored_at(&mut [&mut a[..], &mut b[..]], 0)
        .unwrap();
    assert!(dev.try_read_at(&mut a, 0).unwrap().is_ok());
    assert!(dev.try_read_shared(0, 4096).unwrap().is_ok());
    assert!(dev.shares_reads());
    assert!(dev.read_shared(0, 4096).unwrap().is_ok());
    assert!(dev.try_write_at(&[7; 4096], 0).unwrap().is_ok());
    assert!(block_on(dev.submit_read(0, 4096).unwrap()).unwrap().is_ok());
    assert!(
        block_on(dev.submit_write(&[8; 512], 8192).unwrap())
            .unwrap()
            .is_ok()
    );

    assert_eq!(
        probe.missed(),
        vec![],
        "fast paths that did not reach the device"
    );
    assert_eq!(io.reads.load(Ordering::Relaxed), 5);
    assert_eq!(io.bytes_read.load(Ordering::Relaxed), 1024 + 512 + 4096 * 3);
    assert_eq!(io.writes.load(Ordering::Relaxed), 2);
    assert_eq!(io.bytes_written.load(Ordering::Relaxed), 4096 + 512);
}
