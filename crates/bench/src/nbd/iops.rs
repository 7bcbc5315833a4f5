//! `nbd-iops`: random 4 KiB reads at queue depth 16 with fio's nbd engine against each
//! server, cold and warm.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};

use super::harness::{
    DataSet, GOAL_VS_PEERS, NbdConfig, PEERS3, Server, fio_iops_args, fio_json, median, verdict,
    warm_up,
};
use crate::{Config, note};

/// Random 4 KiB reads at queue depth 16 with fio's nbd engine, cold (page cache dropped,
/// fresh server) and warm (the export read once first, in random order, same server).
///
/// # Errors
/// A server or fio failing.
pub fn iops_bench(cfg: &Config, n: &NbdConfig, ds: &DataSet) -> Result<String> {
    // [cold, warm] × [ferry, nbdkit, qemu-nbd] → IOPS of each run, server CPU per run.
    let mut iops = vec![vec![Vec::new(); 3]; 2];
    let mut cpu = vec![vec![Vec::new(); 3]; 2];
    let mut disk = vec![vec![Vec::new(); 3]; 2];
    for run in 0..cfg.runs {
        for (w, warm) in [false, true].into_iter().enumerate() {
            for (i, &kind) in PEERS3.iter().enumerate() {
                let srv = Server::start(kind, ds)?;
                cfg.cache.drop_now();
                let uri = srv.uri(ds);
                if warm {
                    warm_up(&uri)?;
                }
                cfg.loads.sample();
                let before = srv.usage();
                let args = fio_iops_args(&uri, n.iops_seconds);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let v = fio_json(&crate::sys::run("fio", &args)?)?;
                let after = srv.usage();
                srv.stop()?;
                let r = v["jobs"][0]["read"]["iops"]
                    .as_f64()
                    .ok_or_else(|| anyhow!("no read.iops in fio's json"))?;
                note(&format!(
                    "nbd-iops run {} {}: {} {r:.0} IOPS",
                    run + 1,
                    if warm { "warm" } else { "cold" },
                    kind.name()
                ));
                iops[w][i].push(r);
                cpu[w][i].push(after.cpu_secs - before.cpu_secs);
                disk[w][i].push((after.disk_read_bytes - before.disk_read_bytes) as f64);
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## NBD random 4 KiB reads (nbd-iops)\n\n\
         The same {} MiB data set as nbd-seq, served by the same three servers. `fio \
         {}` ({} runs per server and cache state, interleaved; median shown). *Cold*: page \
         cache dropped, server started fresh; every read goes to disk (fio's nbd engine \
         cannot pass an fadvise hint to the server, so each server's own read-ahead decides \
         how much a 4 KiB miss fetches: the peers read through the page cache with the \
         kernel's read-ahead, which soon pulls in much of the file; Ferry's block cache \
         fetches the 4 KiB page asked for, and once a tenth of its recent misses are second \
         misses in a 64 KiB block apart from the pages already held, such a miss reads the \
         rest of the block (a boot never gets there: its store-bytes goal stands; the \
         counter is `ferry_cache_block_completions_total`). *Warm*: the export is read once \
         first on the same server process, every 256 KiB of it once in random order (`fio \
         --rw=randread --bs=256k --iodepth=16` over the whole export; a front-to-back copy \
         would be a scan, which Ferry's cache lets go past its last 64 MiB, see nbd-seq), so \
         the run measures the serving path (Ferry from its block cache, the peers from the \
         page cache). Server CPU is per 1,000 reads \
         served; disk read is `/proc/PID/io` `read_bytes` over the run.\n",
        n.seq_bytes >> 20,
        fio_iops_args("nbd://127.0.0.1:PORT/seq", n.iops_seconds)[..8].join(" "),
        cfg.runs,
    );
    out.push_str(
        "| cache | ferry IOPS | nbdkit IOPS | qemu-nbd IOPS | ferry ÷ nbdkit | ferry ÷ qemu-nbd \
         | server CPU ms per 1k reads (ferry / nbdkit / qemu-nbd) \
         | disk read MB (ferry / nbdkit / qemu-nbd) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut goals = String::new();
    for (w, label) in ["cold", "warm"].iter().enumerate() {
        let m: Vec<f64> = (0..3).map(|i| median(&iops[w][i])).collect();
        let per_k: Vec<f64> = (0..3)
            .map(|i| 1e6 * median(&cpu[w][i]) / (m[i] * n.iops_seconds as f64))
            .collect();
        let _ = writeln!(
            out,
            "| {label} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1} \
             | {:.0} / {:.0} / {:.0} |",
            m[0],
            m[1],
            m[2],
            m[0] / m[1],
            m[0] / m[2],
            per_k[0],
            per_k[1],
            per_k[2],
            median(&disk[w][0]) / 1e6,
            median(&disk[w][1]) / 1e6,
            median(&disk[w][2]) / 1e6,
        );
        for (i, peer) in [(1, "nbdkit"), (2, "qemu-nbd")] {
            let q = m[0] / m[i];
            let _ = writeln!(
                goals,
                "- {label}: ferry ÷ {peer} = **{q:.2}** (goal ≥ {GOAL_VS_PEERS:.1}: {})",
                verdict(q >= GOAL_VS_PEERS)
            );
        }
    }
    out.push('\n');
    out.push_str(&goals);
    out.push('\n');
    Ok(out)
}
