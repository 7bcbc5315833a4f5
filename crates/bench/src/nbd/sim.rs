//! `ferry-bench sim-boot`: the boot trace replayed offline through the block cache over an
//! in-memory device (diagnostics; no network, no server).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::harness::BOOT_DISK_BYTES_DEFAULT;
use super::trace::{BOOT_TRACE_BYTES, BOOT_TRACE_READS, TraceRead, synthesize};

/// A read-only device whose bytes are a function of their offset (never zero), counting
/// nothing itself: the cache's counters say what it read.
#[derive(Debug)]
struct PatternDevice {
    size: u64,
}

impl disk::BlockDevice for PatternDevice {
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }

    fn geometry(&self) -> disk::device::Geometry {
        disk::device::Geometry {
            size: self.size,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }

    fn format(&self) -> &'static str {
        "pattern"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        disk::device::check_bounds(self.size, offset, buf.len() as u64)?;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = ((offset + i as u64) % 251) as u8 | 1;
        }
        Ok(())
    }
}

/// `ferry-bench sim-boot [--clients N] [--read-ahead BLOCKS] [--seed S]`: replays the
/// synthesized boot trace through a [`block_cache::BlockCache`] over an in-memory device,
/// with no network, and prints the cache's store bytes ÷ the trace's unique bytes. A quick
/// check of cache policy; the report's figures come from `bootstorm`.
///
/// # Errors
/// Bad arguments or a failed read.
pub fn sim_boot(args: &[String]) -> Result<()> {
    let (mut clients, mut ra, mut seed) = (1usize, None::<u32>, 1u64);
    let (mut complete, mut random) = (true, 0usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing value");
        match a.as_str() {
            "--clients" => clients = val()?.parse()?,
            "--read-ahead" => ra = Some(val()?.parse()?),
            "--seed" => seed = val()?.parse()?,
            "--no-complete" => complete = false,
            "--random" => random = val()?.parse()?,
            other => bail!("sim-boot: unknown argument {other:?}"),
        }
    }
    let mut t = synthesize(
        BOOT_DISK_BYTES_DEFAULT,
        BOOT_TRACE_READS,
        BOOT_TRACE_BYTES,
        seed ^ 0xb007,
    );
    if random > 0 {
        // `--random N`: N uniformly random 4 KiB reads of the first 2 GiB (fio's randread
        // of nbd-iops, without its random map) instead of the boot trace.
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut seen = std::collections::HashSet::new();
        t.reads = (0..random)
            .map(|_| {
                let offset = rng.gen_range(0..(2u64 << 30) / 4096) * 4096;
                seen.insert(offset);
                TraceRead { offset, len: 4096 }
            })
            .collect();
        t.unique_bytes = seen.len() as u64 * 4096;
    }
    let mut cfg = block_cache::CacheConfig {
        budget_bytes: 8 << 30,
        complete_blocks: complete,
        ..block_cache::CacheConfig::default()
    };
    if let Some(n) = ra {
        cfg.read_ahead_blocks_max = n;
    }
    let cache = block_cache::BlockCache::with_config(cfg)?;
    let dev: Arc<dyn disk::BlockDevice> = Arc::new(PatternDevice {
        size: BOOT_DISK_BYTES_DEFAULT,
    });
    let key = block_cache::ChainKey::new("sim", None);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for _ in 0..clients {
            let w = cache.wrap(key.clone(), dev.clone());
            let t = &t;
            hs.push(s.spawn(move || -> Result<()> {
                let mut buf = vec![0u8; 1 << 20];
                for r in &t.reads {
                    let b = &mut buf[..r.len as usize];
                    w.read_at(b, r.offset)?;
                    for i in (0..b.len()).step_by(509) {
                        let at = r.offset + i as u64;
                        if b[i] != ((at % 251) as u8 | 1) {
                            bail!("wrong byte at {at}");
                        }
                    }
                }
                Ok(())
            }));
        }
        for h in hs {
            h.join().map_err(|_| anyhow!("replay panicked"))??;
        }
        anyhow::Ok(())
    })?;
    let st = cache.stats();
    println!(
        "clients {clients}: {:.2} s; unique {:.1} MB; store {:.1} MB in {} reads \
         (read-ahead {} blocks, {} completions); store/unique {:.3}; hits {} misses {} \
         waits {} cached {:.1} MB",
        t0.elapsed().as_secs_f64(),
        t.unique_bytes as f64 / 1e6,
        st.store_read_bytes as f64 / 1e6,
        st.store_reads,
        st.read_ahead_blocks,
        st.completions,
        st.store_read_bytes as f64 / t.unique_bytes as f64,
        st.hits,
        st.misses,
        st.inflight_waits,
        st.cached_bytes as f64 / 1e6,
    );
    Ok(())
}
