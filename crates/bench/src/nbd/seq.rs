//! `nbd-seq`: the whole export read front to back with `nbdcopy URI null:` from each server,
//! beside two reads of the raw twin by fio with no NBD and no server (what the disk itself
//! gives).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Result, anyhow};

use super::harness::{
    DataSet, GOAL_VS_PEERS, Kind, PEERS3, Server, Usage, fio_json, median, verdict,
};
use crate::{Config, note};

const SEQ_NAME: &str = "seq";

fn served_as(kind: Kind) -> &'static str {
    match kind {
        Kind::Ferry => "the VHDX, from the store, through the block cache",
        Kind::Nbdkit => "the raw twin (file plugin)",
        Kind::QemuNbd => "the VHDX (`-f vhdx`)",
    }
}

/// Sequential read results.
#[derive(Debug, Clone)]
pub struct SeqRow {
    pub kind: Kind,
    pub secs: Vec<f64>,
    pub cpu: Vec<f64>,
}

/// The whole export with `nbdcopy URI null:`, each server `runs` times (cold cache, fresh
/// server each run), interleaved.
///
/// # Errors
/// A server or nbdcopy failing.
pub fn seq_bench(cfg: &Config, ds: &DataSet) -> Result<String> {
    let mut rows: Vec<SeqRow> = PEERS3
        .iter()
        .map(|&kind| SeqRow {
            kind,
            secs: vec![],
            cpu: vec![],
        })
        .collect();
    let mut disk = Vec::new();
    let mut disk_buffered = Vec::new();
    // Ferry's last run's cache figures.
    let mut ferry_usage = Usage::default();
    for run in 0..cfg.runs {
        for (secs, how, out) in [
            (
                disk_seq_secs as fn(&DataSet) -> Result<f64>,
                "fio O_DIRECT",
                &mut disk,
            ),
            (
                disk_seq_secs_buffered,
                "fio through the page cache",
                &mut disk_buffered,
            ),
        ] {
            cfg.cache.drop_now();
            let d = secs(ds)?;
            note(&format!(
                "nbd-seq run {}: disk ({how}) {:.0} MB/s",
                run + 1,
                ds.size as f64 / 1e6 / d
            ));
            out.push(d);
        }
        for row in &mut rows {
            let srv = Server::start(row.kind, ds)?;
            cfg.cache.drop_now();
            cfg.loads.sample();
            let uri = srv.uri(ds);
            let start = Instant::now();
            crate::sys::run("nbdcopy", &[&uri, "null:"])?;
            let secs = start.elapsed().as_secs_f64();
            let u = srv.stop()?;
            note(&format!(
                "nbd-seq run {}: {} {:.0} MB/s, server CPU {:.2} s",
                run + 1,
                row.kind.name(),
                ds.size as f64 / 1e6 / secs,
                u.cpu_secs
            ));
            row.secs.push(secs);
            row.cpu.push(u.cpu_secs);
            if row.kind == Kind::Ferry {
                ferry_usage = u;
            }
        }
    }
    let mbs = |r: &SeqRow| ds.size as f64 / 1e6 / median(&r.secs);
    let ferry = mbs(&rows[0]);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## NBD sequential read (nbd-seq)\n\n\
         A {} MiB vDisk of random bytes (every block allocated), captured by the library into \
         a VHDX, and its raw twin. Each server reads from disk: the page cache is dropped and \
         the server started fresh (Ferry's block cache empty) before every run. `nbdcopy \
         nbd://127.0.0.1:PORT/{SEQ_NAME} null:` reads the whole export over loopback \
         (nbdcopy's defaults: multi-conn where offered, 256 KiB requests, 64 in flight per \
         connection). {} runs per server, interleaved; median shown. Server CPU is the \
         server process's utime + stime (`/proc/PID/stat`). Ferry reads its store with \
         `O_DIRECT` into its cache's buffers (the peers through the page cache, with the \
         kernel's read-ahead). The export is larger than a quarter of the cache budget, so \
         each connection's stream becomes a *scan* once it has read 8 MiB: a scan's miss \
         reads 2 MiB at once into one buffer of transparent huge pages (so the device gets \
         one 2 MiB request, where a read into 4 KiB pages is cut into requests of about \
         1 MiB, the most segments a request takes), the cache keeps only the last 64 MiB of \
         what scans filled unless something reads it again, and later fills reuse the \
         buffers so let go instead of faulting in new memory (on this KVM guest, faulting in \
         2 GiB of fresh pages alone cost about 1 CPU-s). The two *disk* rows read the raw \
         twin without NBD: with `O_DIRECT` into fio's 4 KiB-page buffers (requests of at \
         most 1 MiB), and through the page cache (the kernel's read-ahead into large folios, \
         requests of a few MiB, which is what the peers get).\n",
        ds.size >> 20,
        cfg.runs,
    );
    out.push_str(
        "| server | serves | seconds (median, min–max) | MB/s | server CPU s | ferry ÷ server |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let lo = r.secs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.secs.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} ({lo:.2}–{hi:.2}) | {:.0} | {:.2} | {:.2} |",
            r.kind.name(),
            served_as(r.kind),
            median(&r.secs),
            mbs(r),
            median(&r.cpu),
            ferry / mbs(r),
        );
    }
    let disk_mbs = ds.size as f64 / 1e6 / median(&disk);
    let _ = writeln!(
        out,
        "| disk | the raw twin, `fio --rw=read --bs=256k --iodepth=16 --ioengine=io_uring \
         --direct=1` (no NBD, no server) | {:.2} | {disk_mbs:.0} | – | {:.2} |",
        median(&disk),
        ferry / disk_mbs,
    );
    let buffered_mbs = ds.size as f64 / 1e6 / median(&disk_buffered);
    let limit_mbs = disk_mbs.max(buffered_mbs);
    let _ = writeln!(
        out,
        "| disk, page cache | the raw twin, `fio --rw=read --bs=256k --ioengine=psync \
         --direct=0` after a drop of the page cache (the kernel's read-ahead: large folios, \
         requests of a few MiB; what the peers' reads get) | {:.2} | {buffered_mbs:.0} | – | {:.2} |",
        median(&disk_buffered),
        ferry / buffered_mbs,
    );
    out.push('\n');
    for r in &rows[1..] {
        let q = ferry / mbs(r);
        let _ = writeln!(
            out,
            "- ferry ÷ {} = **{q:.2}** (goal ≥ {GOAL_VS_PEERS:.1}: {})",
            r.kind.name(),
            verdict(q >= GOAL_VS_PEERS)
        );
    }
    if let (Some(reads), Some(bytes)) = (ferry_usage.store_reads, ferry_usage.store_read_bytes) {
        let _ = writeln!(
            out,
            "- Ferry's last run: {reads} store reads of {:.0} KiB on average; {} blocks let go \
             by the scan window, {} group fills into reused buffers; {:.0} MiB cached at the end \
             of a {} MiB export",
            bytes as f64 / reads.max(1) as f64 / 1024.0,
            ferry_usage.scan_evictions.unwrap_or(0),
            ferry_usage.buffers_reused.unwrap_or(0),
            ferry_usage.cached_bytes.unwrap_or(0) as f64 / f64::from(1 << 20),
            ds.size >> 20,
        );
    }
    let _ = writeln!(
        out,
        "- of the disk's own sequential read (the faster disk row, {limit_mbs:.0} MB/s): \
         ferry {:.2}, {}",
        ferry / limit_mbs,
        rows[1..]
            .iter()
            .map(|r| format!("{} {:.2}", r.kind.name(), mbs(r) / limit_mbs))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let best = rows.iter().map(mbs).fold(0.0, f64::max);
    if best < 0.8 * limit_mbs {
        let _ = writeln!(
            out,
            "- every server ran below 0.8 of the disk's own speed: here the limit is the CPUs \
             the server shares with nbdcopy (server CPU above), not the disk"
        );
    }
    out.push('\n');
    Ok(out)
}

/// Seconds for fio to read the raw twin front to back through the page cache, one 256 KiB
/// read at a time: the kernel's read-ahead decides the device's requests, as for the peers.
fn disk_seq_secs_buffered(ds: &DataSet) -> Result<f64> {
    fio_read_secs(
        ds,
        &[
            "--name=disk-buffered",
            "--ioengine=psync",
            "--direct=0",
            "--invalidate=1",
        ],
    )
}

/// Seconds for fio to read the raw twin front to back with `O_DIRECT` at queue depth 16:
/// what the disk itself delivers, with no NBD and no server.
fn disk_seq_secs(ds: &DataSet) -> Result<f64> {
    fio_read_secs(
        ds,
        &[
            "--name=disk",
            "--iodepth=16",
            "--ioengine=io_uring",
            "--direct=1",
        ],
    )
}

/// Seconds for one fio job with `how` to read the raw twin front to back in 256 KiB reads.
fn fio_read_secs(ds: &DataSet, how: &[&str]) -> Result<f64> {
    let file = format!("--filename={}", ds.raw.display());
    let size = format!("--size={}", ds.size);
    let mut args = how.to_vec();
    args.extend([file.as_str(), "--readonly", "--rw=read", "--bs=256k"]);
    args.extend([size.as_str(), "--output-format=json"]);
    let out = crate::sys::run("fio", &args)?;
    let v = fio_json(&out)?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .ok_or_else(|| anyhow!("no read.bw_bytes in fio's json"))?;
    Ok(ds.size as f64 / bw)
}
