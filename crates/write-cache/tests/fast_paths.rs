//! The write cache, a decorator, passes reads of blocks it does not hold on to the fast path
//! of the device below it, and answers what it holds itself.

use std::sync::Arc;

use disk::BlockDevice;
use testkit::{Fast, FastProbe, block_on};
use write_cache::{Config, Mode, WriteCache};

#[test]
fn reads_of_blocks_not_held_are_submitted_to_the_device_below() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    probe.write_at(&[9; 4096], 8192).unwrap();
    let config = Config {
        mode: Mode::Ram,
        block_bytes: 4096,
        ram_bytes_max: 1 << 20,
        overflow_bytes_max: 0,
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(WriteCache::new(probe.clone(), config, None).unwrap());
    let got = block_on(
        dev.submit_read(8192, 4096)
            .expect("not held: submitted below"),
    );
    assert_eq!(got.unwrap().unwrap(), vec![9; 4096]);
    assert_eq!(probe.calls(Fast::SubmitRead), 1);

    // A block written into RAM is the cache's own: its fast paths answer without the device.
    dev.write_at(&[1; 4096], 0).unwrap();
    assert!(
        dev.submit_read(0, 4096).is_none(),
        "held: not submitted below"
    );
    let mut buf = [0u8; 4096];
    assert!(dev.try_read_at(&mut buf, 0).unwrap().is_ok());
    assert_eq!(buf, [1; 4096]);
    assert!(dev.try_write_at(&[2; 4096], 0).unwrap().is_ok());
    assert_eq!(probe.calls(Fast::TryReadAt), 0);
    assert_eq!(probe.calls(Fast::TryWriteAt), 0);
}
