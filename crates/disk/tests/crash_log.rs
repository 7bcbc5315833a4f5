//! Crash consistency of `VhdxImage` on `testkit::SimDisk` when a commit needs more than one
//! log entry.
//!
//! **A commit bigger than one log entry** (about 600 dirty pages in a sparse 160 GiB child whose
//! chunks start without sector bitmap blocks, as Hyper-V makes them), cut at about sixty points:
//! every entry boundary must leave a valid BAT, and the image must take writes afterwards.
//!
//! **A PARTIALLY_PRESENT block without its sector bitmap block** (what a crash between the
//! entries of such a commit used to leave) must take writes without corrupting the file.
//!
//! `SIM_SEED=n` replays a run (the seed is printed to stderr, which the harness shows on
//! failure); by default every run draws a new seed.

mod common;

use std::sync::Arc;

use common::*;
use disk::vhdx::VhdxImage;
use disk::{BlockDevice, Storage};
use rand::Rng;
use testkit::{CrashModel, SimDisk, seed_from_env, sim_rng};

/// Virtual size of the sparse differencing disk: 160 GiB of 1 MiB blocks (40 chunks).
const BIG: u64 = 160 << 30;
/// Blocks written, 512 blocks apart: each BAT entry sits in its own 4 KiB BAT page and each
/// block's sector bits in their own bitmap page, so the close has about 600 dirty pages,
/// more than one 1 MiB log entry carries (254), and commits them in three entries.
const BIG_WRITES: u64 = 300;

fn big_offsets() -> impl Iterator<Item = u64> {
    (0..BIG_WRITES).map(|i| i * 512 * BLOCK + (i % 7) * 4096)
}

/// A differencing child as Hyper-V creates it: every sector bitmap entry NOT_PRESENT, so the
/// first partial write into a chunk allocates its bitmap block (Ferry's `create` pre-allocates
/// them all).
fn child_without_bitmap_blocks(size: u64, sector: u64, parent: &VhdxImage) -> SimDisk {
    let d = create_on(size, sector, Some(parent));
    let img = open_on(&d, false).expect("open child");
    let (layout, bat_at) = (img.layout(), img.regions().bat.offset);
    for chunk in 0..layout.bitmap_blocks() {
        d.write_at(&[0; 8], bat_at + layout.bitmap_index(chunk) * 8)
            .expect("clear entry");
    }
    d.flush().expect("flush");
    d.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed)
}

/// Writes one sector into each of [`BIG_WRITES`] blocks of a copy of `base`, then closes it
/// with the power cut `cut` storage ops after the close starts. Returns the disk and the
/// number of storage ops the close took.
fn big_run(parent: &Arc<VhdxImage>, base: &SimDisk, cut: Option<u64>) -> (Arc<SimDisk>, u64) {
    let disk = Arc::new(base.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let img = open_on(&disk, true).expect("open");
    img.attach_parent(parent.clone()).expect("attach");
    for off in big_offsets() {
        img.write_at(&pattern(off, 512, 9), off).expect("write");
    }
    let start = disk.op_count();
    if let Some(c) = cut {
        disk.set_crash_at(start + c);
    }
    img.close().expect("close");
    let ops = disk.op_count() - start;
    drop(img);
    (disk, ops)
}

/// Each written sector reads as zeros (the empty parent) or as the write, the same through a
/// read-only and a writable open, and all as the write when `complete`. Then the sector after
/// each is written, the image closed and reopened: both must read back.
fn big_check(parent: &Arc<VhdxImage>, crashed: SimDisk, complete: bool) -> Result<(), String> {
    let crashed = Arc::new(crashed);
    let copy = Arc::new(crashed.crash_with(&mut sim_rng(0), CrashModel::LoseUnflushed));
    let read = |img: &VhdxImage, off: u64| {
        let mut buf = vec![0u8; 512];
        img.read_at(&mut buf, off)
            .map(|()| buf)
            .map_err(|e| format!("read {off:#x}: {e:?}"))
    };
    let mut seen = Vec::new();
    for (d, writable) in [(&copy, false), (&crashed, true)] {
        let img = open_on(d, writable).map_err(|e| format!("open (writable={writable}): {e:?}"))?;
        img.attach_parent(parent.clone())
            .map_err(|e| format!("attach: {e:?}"))?;
        check_bat(&img)?;
        let mut got = Vec::new();
        for off in big_offsets() {
            let buf = read(&img, off)?;
            let new = buf == pattern(off, 512, 9);
            if !new && (complete || buf != [0; 512]) {
                return Err(format!("sector {off:#x} reads {:02x?}", &buf[..16]));
            }
            got.push(buf);
        }
        seen.push(got);
        if writable {
            for off in big_offsets() {
                let next = off + 512;
                img.write_at(&pattern(next, 512, 10), next)
                    .map_err(|e| format!("write after recovery: {e:?}"))?;
            }
            img.close()
                .map_err(|e| format!("close after recovery: {e:?}"))?;
        }
    }
    if seen[0] != seen[1] {
        return Err("read-only and writable opens differ".into());
    }
    let img = open_on(&crashed, false).map_err(|e| format!("reopen after recovery: {e:?}"))?;
    img.attach_parent(parent.clone())
        .map_err(|e| format!("attach: {e:?}"))?;
    check_bat(&img)?;
    for (off, before) in big_offsets().zip(&seen[1]) {
        if read(&img, off)? != *before || read(&img, off + 512)? != pattern(off + 512, 512, 10) {
            return Err(format!(
                "after recovery, writes and close, block of {off:#x} changed"
            ));
        }
    }
    Ok(())
}

#[test]
fn crash_during_a_commit_bigger_than_one_log_entry() {
    let seed = seed_from_env(default_seed());
    let mut rng = variant_rng(seed, 3);
    let parent = {
        let d = create_on(BIG, 512, None);
        Arc::new(open_on(&d, false).expect("open parent"))
    };
    let base = child_without_bitmap_blocks(BIG, 512, &parent);
    let (_, total) = big_run(&parent, &base, None);
    assert!(
        total > 600,
        "the close took {total} storage ops: fewer pages than three log entries"
    );
    // About sixty cuts spread over the whole close, each crashed two ways.
    let step = (total / 60).max(1);
    let mut cut = rng.gen_range(0..step);
    let mut cuts = 0;
    while cut <= total {
        let (disk, _) = big_run(&parent, &base, Some(cut));
        let complete = cut >= total;
        for (how, image) in [
            ("random survivors", disk.crash(&mut rng)),
            (
                "last write torn at a chosen sector",
                disk.crash_torn(rng.gen_range(0..=8)),
            ),
        ] {
            big_check(&parent, image, complete).unwrap_or_else(|e| {
                panic!(
                    "SIM_SEED={seed}: power cut {cut} of {total} ops into the close ({how}): {e}"
                )
            });
        }
        cuts += 1;
        // The last cut is always the one after the whole close.
        cut = if cut < total {
            (cut + step).min(total)
        } else {
            total + 1
        };
    }
    eprintln!("commit bigger than one log entry: {total} storage ops, {cuts} cuts");
}

/// Regression: a PARTIALLY_PRESENT block in a chunk whose sector bitmap entry is NOT_PRESENT
/// (what a crash between the entries of a multi-entry commit used to leave, and what a foreign
/// writer may leave). A write into the block set its bits in a bitmap "at" file offset 0, and
/// the commit wrote that page over the file identifier.
#[test]
fn partial_block_without_bitmap_block_takes_writes() {
    let parent = Arc::new(open_on(&create_on(8 * BLOCK, 512, None), false).expect("parent"));
    let d = Arc::new(child_without_bitmap_blocks(8 * BLOCK, 512, &parent));
    let img = open_on(&d, true).expect("open");
    img.attach_parent(parent.clone()).expect("attach");
    img.write_at(&[1; 512], 0).expect("first write");
    img.close().expect("close");
    let (layout, bat_at) = (img.layout(), img.regions().bat.offset);
    drop(img);
    // Block 0 is PARTIALLY_PRESENT; now take its chunk's bitmap block away.
    d.write_at(&[0; 8], bat_at + layout.bitmap_index(0) * 8)
        .expect("clear entry");
    d.flush().expect("flush");
    let img = open_on(&d, true).expect("reopen");
    img.attach_parent(parent.clone()).expect("attach");
    img.write_at(&[2; 512], 512).expect("second write");
    img.close().expect("close");
    drop(img);
    let img = open_on(&d, false).expect("open after writing the partial block");
    img.attach_parent(parent).expect("attach");
    check_bat(&img).expect("bat invariant");
    let mut buf = vec![0u8; 1024];
    img.read_at(&mut buf, 0).expect("read");
    // The first sector's bit was lost with the bitmap block: it reads from the parent.
    assert_eq!((buf[0], buf[512]), (0, 2));
}
