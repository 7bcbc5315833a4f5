//! The write cache, a decorator with data of its own, passes reads of blocks it does not
//! hold on to the fast path of the device below it, and answers what it holds itself; and
//! it is the crate's only decorator.

use std::sync::Arc;

use disk::BlockDevice;
use testkit::{Expect, Fast, FastProbe, WRITE_AT, block_on, check_fast_paths, device_types};
use write_cache::{Config, Mode, WriteCache};

/// Every device type in `src/` (an `impl` of `disk::BlockDevice`, `disk::Filter` or
/// `disk::FastPath`) and where its fast paths are probed.
const PROBED: &[(&str, &str)] = &[
    (
        "Golden",
        "not a decorator: the unit tests' device below (src/tests.rs)",
    ),
    (
        "WriteCache",
        "a_fresh_cache_answers_writes_and_passes_reads_it_cannot_answer_on",
    ),
];

#[test]
fn every_decorator_of_the_write_cache_is_probed() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let probed: Vec<&str> = PROBED.iter().map(|p| p.0).collect();
    assert_eq!(device_types(&src), probed);
}

fn ram_cache(below: Arc<FastProbe>) -> Arc<dyn BlockDevice> {
    let config = Config {
        mode: Mode::Ram,
        block_bytes: 4096,
        ram_bytes_max: 1 << 20,
        overflow_bytes_max: 0,
    };
    Arc::new(WriteCache::new(below, config, None).unwrap())
}

/// What a RAM write cache that holds none of the blocks the reads ask for (nor the
/// written ones) decides for each fast path.
fn fresh_write_cache(path: Fast) -> Expect {
    match path {
        // As reads of each buffer: those of blocks not held read the device below.
        Fast::ReadVectoredAt => Expect::Answers,
        // Reads of blocks not held go to the device below, on a blocking thread unless
        // submitted.
        Fast::TryReadAt | Fast::TryReadShared | Fast::ReadShared => Expect::Declines,
        Fast::SubmitRead => Expect::Passes,
        // It keeps no buffers to share.
        Fast::SharesReads => Expect::Declines,
        // A whole new block goes into RAM.
        Fast::TryWriteAt => Expect::Answers,
        // Writes that cannot complete in RAM take the blocking path (eviction, a read of
        // the rest of a block).
        Fast::SubmitWrite => Expect::Declines,
    }
}

/// The same once the cache holds, in RAM, the block the reads ask for.
fn holding_write_cache(path: Fast) -> Expect {
    match path {
        Fast::ReadVectoredAt | Fast::TryReadAt | Fast::TryWriteAt => Expect::Answers,
        // Not below: the device below does not have the block's bytes.
        Fast::SubmitRead => Expect::Declines,
        Fast::TryReadShared | Fast::SharesReads | Fast::ReadShared | Fast::SubmitWrite => {
            Expect::Declines
        }
    }
}

#[test]
fn a_fresh_cache_answers_writes_and_passes_reads_it_cannot_answer_on() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let dev = ram_cache(probe.clone());

    check_fast_paths(dev.as_ref(), &probe, fresh_write_cache);

    // What it answered is its own: the device below was not written.
    let mut below = [1u8; 4096];
    probe.read_at(&mut below, WRITE_AT).unwrap();
    assert_eq!(below, [0; 4096]);
}

#[test]
fn a_cache_that_holds_a_block_answers_its_reads_itself() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let dev = ram_cache(probe.clone());
    dev.write_at(&[1; 4096], 0).unwrap();

    check_fast_paths(dev.as_ref(), &probe, holding_write_cache);
}

#[test]
fn reads_of_blocks_not_held_are_submitted_to_the_device_below() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    probe.write_at(&[9; 4096], 8192).unwrap();
    let dev = ram_cache(probe.clone());
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
