//! Generated test data, all from seeded RNGs: the sparse raw disk, plain random files, random
//! write deltas through the library, and a chain flattened to a sparse raw file.
//!
//! Random bytes come from `SmallRng::fill_bytes` into 32 MiB buffers, so generation runs at
//! several GB/s and the disk, not the generator, sets the pace. Random bytes never compress
//! and are never all-zero, so no tool can skip them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};
use disk::BlockDevice;
use disk::bytes::is_zero;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};

/// The allocation unit of the generated raw disk (VHDX's default block size).
pub const GEN_BLOCK_BYTES: u64 = 32 << 20;
/// The share of generated blocks that hold random bytes; the rest are holes.
pub const DATA_FRACTION: f64 = 0.6;
/// The I/O size of generation and flattening.
const CHUNK_BYTES: usize = 32 << 20;
/// Flattening leaves a hole for every all-zero page of this size, so the flattened file holds
/// exactly the non-zero pages and qemu-img reads no more than the chain holds.
const HOLE_GRAIN_BYTES: usize = 4096;
/// Smallest and largest delta write.
const DELTA_WRITE_BYTES_MIN: u64 = 4096;
const DELTA_WRITE_BYTES_MAX: u64 = 1 << 20;
/// The page size coverage is counted in.
const PAGE_BYTES: u64 = 4096;

/// What [`sparse_raw`] made.
#[derive(Debug, Clone, Copy)]
pub struct RawSummary {
    /// Virtual size in bytes.
    pub size_bytes: u64,
    /// Blocks of [`GEN_BLOCK_BYTES`] in the disk.
    pub blocks: u64,
    /// Of those, blocks holding random bytes.
    pub data_blocks: u64,
    /// Bytes of random data written.
    pub data_bytes: u64,
}

/// Writes a sparse raw file of `size_bytes` in which `DATA_FRACTION` of the 32 MiB blocks
/// (chosen by `seed`) hold random bytes and the others are holes; fsyncs it.
///
/// # Errors
/// I/O failures.
pub fn sparse_raw(path: &Path, size_bytes: u64, seed: u64) -> Result<RawSummary> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = size_bytes.div_ceil(GEN_BLOCK_BYTES);
    let data_blocks = ((blocks as f64) * DATA_FRACTION).round() as u64;
    let mut order: Vec<u64> = (0..blocks).collect();
    order.shuffle(&mut rng);
    let mut chosen = order[..data_blocks as usize].to_vec();
    chosen.sort_unstable();
    let f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    f.set_len(size_bytes)?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut data_bytes = 0;
    for block in chosen {
        let at = block * GEN_BLOCK_BYTES;
        let len = GEN_BLOCK_BYTES.min(size_bytes - at);
        write_random(&f, &mut rng, &mut buf, at, len)?;
        data_bytes += len;
    }
    f.sync_all()?;
    Ok(RawSummary {
        size_bytes,
        blocks,
        data_blocks,
        data_bytes,
    })
}

/// Writes a fully allocated file of `len_bytes` random bytes and fsyncs it.
///
/// # Errors
/// I/O failures.
pub fn random_file(path: &Path, len_bytes: u64, seed: u64) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    write_random(&f, &mut rng, &mut buf, 0, len_bytes)?;
    f.sync_all()?;
    Ok(())
}

fn write_random(f: &File, rng: &mut SmallRng, buf: &mut [u8], at: u64, len: u64) -> Result<()> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        f.write_all_at(&buf[..n], at + done)
            .context("write generated data")?;
        done += n as u64;
    }
    Ok(())
}

/// What [`write_delta`] did.
#[derive(Debug, Clone, Copy)]
pub struct DeltaSummary {
    /// Write calls made.
    pub writes: u64,
    /// Bytes passed to those writes (overlaps counted twice).
    pub bytes_written: u64,
    /// Distinct bytes of the disk the writes covered.
    pub covered_bytes: u64,
}

/// Writes random bytes at random 4 KiB-aligned offsets, in writes of 4 KiB to 1 MiB, through
/// `dev` until `fraction` of its 4 KiB pages have been written at least once.
///
/// # Errors
/// The device's write errors.
pub fn write_delta(dev: &dyn BlockDevice, fraction: f64, seed: u64) -> Result<DeltaSummary> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let pages = dev.size() / PAGE_BYTES;
    let target = ((pages as f64) * fraction) as u64;
    let mut seen = vec![0u64; pages.div_ceil(64) as usize];
    let mut covered = 0u64;
    let mut buf = vec![0u8; DELTA_WRITE_BYTES_MAX as usize];
    let mut s = DeltaSummary {
        writes: 0,
        bytes_written: 0,
        covered_bytes: 0,
    };
    let max_pages = (DELTA_WRITE_BYTES_MAX / PAGE_BYTES).min(pages);
    while covered < target {
        let n = rng.gen_range(DELTA_WRITE_BYTES_MIN / PAGE_BYTES..=max_pages);
        let first = rng.gen_range(0..=pages - n);
        let len = (n * PAGE_BYTES) as usize;
        rng.fill_bytes(&mut buf[..len]);
        dev.write_at(&buf[..len], first * PAGE_BYTES)?;
        for p in first..first + n {
            let (w, bit) = ((p / 64) as usize, 1u64 << (p % 64));
            covered += u64::from(seen[w] & bit == 0);
            seen[w] |= bit;
        }
        s.writes += 1;
        s.bytes_written += len as u64;
    }
    s.covered_bytes = covered * PAGE_BYTES;
    Ok(s)
}

/// Reads all of `dev` and writes it to a new sparse raw file at `path` (all-zero 4 KiB pages
/// stay holes; runs of non-zero pages are written with one call each); fsyncs it. Returns the
/// data bytes written.
///
/// # Errors
/// The device's read errors and I/O failures.
pub fn flatten(dev: &dyn BlockDevice, path: &Path) -> Result<u64> {
    let size = dev.size();
    let f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    f.set_len(size)?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut pos = 0u64;
    let mut written = 0u64;
    while pos < size {
        let n = (size - pos).min(CHUNK_BYTES as u64) as usize;
        dev.read_at(&mut buf[..n], pos)?;
        for (start, end) in non_zero_runs(&buf[..n], HOLE_GRAIN_BYTES) {
            f.write_all_at(&buf[start..end], pos + start as u64)
                .context("write flattened data")?;
            written += (end - start) as u64;
        }
        pos += n as u64;
    }
    f.sync_all()?;
    Ok(written)
}

/// The byte ranges of `buf` made of consecutive pieces of `grain` bytes that are not all zero.
fn non_zero_runs(buf: &[u8], grain: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, piece) in buf.chunks(grain).enumerate() {
        if is_zero(piece) {
            continue;
        }
        let (start, end) = (i * grain, i * grain + piece.len());
        match runs.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// What the merge benchmark's set-up made.
#[derive(Debug, Clone, Copy)]
pub struct MergeSetup {
    /// The delta written into the version.
    pub delta: DeltaSummary,
    /// Data bytes of the flattened raw given to qemu-img.
    pub flat_data_bytes: u64,
    /// Bytes of the file `cp` copies (the size of Ferry's merge output).
    pub cp_source_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_zero_runs_merge_neighbours_and_skip_zero_pages() {
        // Pages 0 and 1 hold data, page 2 is zero, page 3 holds data.
        let mut buf = vec![0u8; 4 * 4096];
        buf[10] = 1;
        buf[4096 + 10] = 1;
        buf[3 * 4096] = 1;
        assert_eq!(
            non_zero_runs(&buf, 4096),
            vec![(0, 8192), (3 * 4096, 4 * 4096)]
        );
    }
}
