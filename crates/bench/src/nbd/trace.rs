//! The synthesized boot trace: reads with the published shape of a Windows boot (~600 MB in
//! ~70,000 mostly small reads), its facts, and its fio iolog. Pure but for [`write_iolog`];
//! the boot storm replays it over NBD and `sim-boot` through the block cache.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The published boot shape: ~600 MB in ~70,000 reads.
pub const BOOT_TRACE_BYTES: u64 = 600_000_000;
pub const BOOT_TRACE_READS: u64 = 70_000;

/// One read of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRead {
    pub offset: u64,
    pub len: u64,
}

/// A synthesized boot trace and its facts.
#[derive(Debug, Clone)]
pub struct Trace {
    pub reads: Vec<TraceRead>,
    pub total_bytes: u64,
    pub unique_bytes: u64,
    pub small_reads: u64,
    pub small_bytes: u64,
    pub large_reads: u64,
    pub large_bytes: u64,
    pub reread_runs: u64,
    pub runs: u64,
}

const KIB: u64 = 1024;
/// Small reads: 4–64 KiB, mostly 4 KiB.
fn small_len(rng: &mut SmallRng) -> u64 {
    let p: f64 = rng.r#gen();
    let pages = if p < 0.85 {
        1
    } else if p < 0.93 {
        rng.gen_range(2..=4)
    } else if p < 0.98 {
        rng.gen_range(5..=8)
    } else {
        rng.gen_range(9..=16)
    };
    pages * 4 * KIB
}

/// Large reads: 128 KiB–1 MiB, log-uniform, 4 KiB multiples.
fn large_len(rng: &mut SmallRng) -> u64 {
    let e: f64 = rng.gen_range(17.0..=20.0);
    ((2f64.powf(e) as u64) / (4 * KIB)).max(32) * 4 * KIB
}

/// Synthesizes the trace: `reads` reads totalling about `bytes` over a disk of `disk` bytes.
///
/// Reads come in runs (a file read front to back): small runs of 1–24 contiguous small
/// reads, large runs of 1–8 contiguous large reads (sequential streams). 70% of runs start
/// 0–256 KiB after the previous run's end (files laid out near each other), 30% at a
/// uniformly random 4 KiB-aligned offset; 5% of runs re-read an earlier run. The number of
/// large reads is chosen so the total comes to `bytes`.
pub fn synthesize(disk: u64, reads: u64, bytes: u64, seed: u64) -> Trace {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Sizes first: all small, then swap small reads for large ones until the budget is met.
    let mut small: Vec<u64> = (0..reads).map(|_| small_len(&mut rng)).collect();
    let mut total: u64 = small.iter().sum();
    let mut large: Vec<u64> = Vec::new();
    while total < bytes && !small.is_empty() {
        let l = large_len(&mut rng);
        let s = small.pop().unwrap_or(0);
        total = total - s + l;
        large.push(l);
    }
    // Group into runs.
    let mut runs: Vec<Vec<u64>> = Vec::new();
    let mut si = small.into_iter().peekable();
    let mut li = large.into_iter().peekable();
    let large_share = {
        let (s, l) = (si.len() as f64, li.len() as f64);
        (l / 4.5) / (s / 12.5 + l / 4.5).max(1.0)
    };
    while si.peek().is_some() || li.peek().is_some() {
        let take_large = li.peek().is_some() && (si.peek().is_none() || rng.gen_bool(large_share));
        let run: Vec<u64> = if take_large {
            let n = rng.gen_range(1..=8);
            li.by_ref().take(n).collect()
        } else {
            let n = rng.gen_range(1..=24);
            si.by_ref().take(n).collect()
        };
        runs.push(run);
    }
    runs.shuffle(&mut rng);
    // Lay the runs out.
    let pages = disk / (4 * KIB);
    let mut out: Vec<TraceRead> = Vec::with_capacity(reads as usize);
    let mut placed: Vec<(u64, usize, usize)> = Vec::new(); // (start, first read, count)
    let mut cursor = 0u64;
    let mut reread_runs = 0;
    for run in &runs {
        let len: u64 = run.iter().sum();
        if !placed.is_empty() && rng.gen_bool(0.05) {
            // Re-read an earlier run (same offsets and sizes), in place of this run's sizes.
            let &(_, first, count) = &placed[rng.gen_range(0..placed.len())];
            let again: Vec<TraceRead> = out[first..first + count].to_vec();
            out.extend(again);
            reread_runs += 1;
            continue;
        }
        let start = if rng.gen_bool(0.7) && cursor + len + 256 * KIB < disk {
            cursor + rng.gen_range(0..=64) * 4 * KIB
        } else {
            rng.gen_range(0..pages.saturating_sub(len / (4 * KIB) + 1).max(1)) * 4 * KIB
        };
        let first = out.len();
        let mut at = start;
        for &l in run {
            out.push(TraceRead { offset: at, len: l });
            at += l;
        }
        cursor = at;
        placed.push((start, first, run.len()));
    }
    let mut t = Trace {
        total_bytes: out.iter().map(|r| r.len).sum(),
        unique_bytes: unique_bytes(&out),
        small_reads: out.iter().filter(|r| r.len <= 64 * KIB).count() as u64,
        small_bytes: out
            .iter()
            .filter(|r| r.len <= 64 * KIB)
            .map(|r| r.len)
            .sum(),
        large_reads: 0,
        large_bytes: 0,
        reread_runs,
        runs: runs.len() as u64,
        reads: out,
    };
    t.large_reads = t.reads.len() as u64 - t.small_reads;
    t.large_bytes = t.total_bytes - t.small_bytes;
    t
}

/// Bytes of the union of the reads' ranges.
fn unique_bytes(reads: &[TraceRead]) -> u64 {
    let mut iv: Vec<(u64, u64)> = reads.iter().map(|r| (r.offset, r.offset + r.len)).collect();
    iv.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in iv {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// Writes the trace as a fio version 2 iolog.
pub fn write_iolog(t: &Trace, path: &Path) -> Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "fio version 2 iolog\nboot add\nboot open")?;
    for r in &t.reads {
        writeln!(w, "boot read {} {}", r.offset, r.len)?;
    }
    writeln!(w, "boot close")?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesized_trace_has_the_published_shape() {
        let t = synthesize(4 << 30, BOOT_TRACE_READS, BOOT_TRACE_BYTES, 1);
        let n = t.reads.len() as f64;
        assert!((n - 70_000.0).abs() / 70_000.0 < 0.1, "{n} reads");
        let mb = t.total_bytes as f64 / 1e6;
        assert!((540.0..660.0).contains(&mb), "{mb} MB");
        assert!(t.unique_bytes <= t.total_bytes);
        assert!(t.reads.iter().all(|r| r.offset + r.len <= 4 << 30));
    }

    #[test]
    fn unique_bytes_merges_overlaps() {
        let r = |offset, len| TraceRead { offset, len };
        assert_eq!(unique_bytes(&[r(0, 10), r(5, 10), r(100, 1)]), 16);
    }
}
