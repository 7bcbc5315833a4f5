//! The server's decorators pass the fast paths of the device below them on (a forgotten
//! one would compile and quietly take the blocking path).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use disk::BlockDevice;
use server::diff_cache::{WriteCounters, WritesCounted};
use testkit::{FastProbe, block_on};

#[test]
fn writes_counted_reaches_every_fast_path_of_its_device_and_counts_its_writes() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let counters = Arc::new(WriteCounters::default());
    let dev: Arc<dyn BlockDevice> = Arc::new(WritesCounted::new(probe.clone(), counters.clone()));

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
    assert_eq!(counters.writes.load(Ordering::Relaxed), 2);
    assert_eq!(counters.bytes.load(Ordering::Relaxed), 4096 + 512);
}
