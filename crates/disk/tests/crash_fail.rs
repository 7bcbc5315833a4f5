//! Fail-stop of `VhdxImage` on `testkit::SimDisk`.
//!
//! **Fail-stop.** The Nth storage op of a flush or close fails with EIO: the call returns the
//! error, every later call on that image returns `Poisoned`, and the flushed data survives.

mod common;

use std::sync::Arc;

use common::*;
use disk::{BlockDevice, ErrorKind};
use testkit::{CrashModel, sim_rng};

/// Writes (new blocks, partial sectors and partial blocks), then `last` (a flush or close),
/// failing the storage op `fail_at` counted from the start of `last`. Returns the number of
/// storage ops `last` takes when nothing fails.
fn fail_during(fx: &Fixture, last: Step, fail_at: Option<u64>) -> u64 {
    let disk = fx.fresh_disk();
    let img = fx.open(&disk, true).expect("open");
    let before = [
        Step::Write {
            off: 0,
            len: 8192,
            seed: 1,
        },
        Step::Flush,
        Step::Write {
            off: BLOCK + 100,
            len: 5000,
            seed: 2,
        },
        Step::Write {
            off: 3 * BLOCK - 512,
            len: BLOCK,
            seed: 3,
        },
        Step::Trim {
            off: 5 * BLOCK,
            len: BLOCK,
        },
        Step::Write {
            off: 0,
            len: 512,
            seed: 4,
        },
    ];
    for s in &before {
        s.exec(&img).expect("workload before the fault");
    }
    let start = disk.op_count();
    let Some(k) = fail_at else {
        last.exec(&img).expect("flush without faults");
        return disk.op_count() - start;
    };
    disk.fail_after(start + k);
    let what = format!("{} with storage op {k} of {last:?} failing", fx.name);
    let e = last.exec(&img).expect_err(&what);
    assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e:?}");
    // The storage works again; the image must not.
    disk.clear_failures();
    let mut buf = [0u8; 512];
    let results = [
        ("write", img.write_at(&[7; 512], 0)),
        ("write to a new block", img.write_at(&[7; 512], 6 * BLOCK)),
        ("read", img.read_at(&mut buf, 0)),
        ("flush", img.flush()),
        ("trim", img.trim(0, BLOCK)),
        ("write_zeroes", img.write_zeroes(0, 4096)),
        ("close", img.close()),
    ];
    for (op, r) in results {
        let kind = r.as_ref().err().map(disk::Error::kind);
        assert_eq!(
            kind,
            Some(ErrorKind::Poisoned),
            "{what}: later {op} returned {r:?}"
        );
    }
    // Dropping a poisoned image must not write.
    let ops = disk.op_count();
    drop(img);
    assert_eq!(
        disk.op_count(),
        ops,
        "{what}: drop of a poisoned image wrote"
    );
    // What was flushed before survives: the first write (flushed) reads back unless the
    // last write covered it.
    let after = Arc::new(disk.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let img = fx
        .open(&after, false)
        .unwrap_or_else(|e| panic!("{what}: reopen: {e:?}"));
    let mut expect = Content::new(fx.initial.clone());
    before[..2].iter().for_each(|s| expect.apply(s));
    let expect = Expect {
        flushed: expect,
        unflushed: before[2..].to_vec(),
    };
    let seen = read_all(&img).expect("read after reopen");
    check_content(&expect, &seen).unwrap_or_else(|e| panic!("{what}: {e}"));
    0
}

#[test]
fn failed_flush_or_close_poisons_the_image() {
    for differencing in [false, true] {
        let fx = Fixture::new("fail-stop", 0, differencing, 512, false);
        for last in [Step::Flush, Step::Close] {
            let n = fail_during(&fx, last, None);
            assert!(
                n >= 4,
                "{last:?} took only {n} storage ops: the test is too weak"
            );
            for k in 0..n {
                fail_during(&fx, last, Some(k));
            }
            eprintln!(
                "differencing {differencing}: failed each of the {n} storage ops of {last:?}"
            );
        }
    }
}
