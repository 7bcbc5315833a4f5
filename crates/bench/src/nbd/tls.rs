//! `nbd-tls`: the nbd-seq and nbd-iops workloads over TLS (`NBD_OPT_STARTTLS`, TLS
//! required), Ferry beside itself without TLS and beside nbdkit with `--tls=require`.
//!
//! ```text
//!   ferry  plain   nbd://127.0.0.1:P/seq
//!   ferry  TLS     nbds://127.0.0.1:P/seq?tls-certificates=DIR   (admin client certificate)
//!   nbdkit plain   nbd://…                                        file plugin, raw twin
//!   nbdkit TLS     nbds://…   nbdkit --tls=require --tls-certificates=DIR
//! ```
//!
//! DIR is a throwaway farm CA, a server certificate for 127.0.0.1 and an administrator's
//! client certificate, made once per run ([`make_cert_dir`]). Each case is measured with
//! `nbdcopy URI null:` (sequential), and fio's nbd engine, random 4 KiB reads at queue depth
//! 16, cold and warm, as in nbd-seq and nbd-iops.
//!
//! fio's nbd engine connects with `nbd_connect_uri` without allowing the URI to name local
//! files, so it cannot take `tls-certificates=DIR`; libnbd then reads its default directory,
//! `$HOME/.pki/libnbd` (for root `/etc/pki/libnbd`, which the harness leaves alone). So every
//! fio of this section (plain and TLS alike) runs as `nobody` through `setpriv`, with `HOME` a
//! temporary directory holding a copy of DIR there ([`FioHome`]).

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};

use super::harness::{
    DataSet, GOAL_VS_PEERS, Kind, NbdConfig, Server, fio_iops_args, fio_json, make_cert_dir,
    median, verdict, waited_children_cpu_secs, warm_up_args,
};
use crate::{Config, note};

/// Goal from the issue: Ferry over TLS keeps at least this share of Ferry without TLS.
pub const GOAL_TLS_VS_PLAIN: f64 = 0.8;

/// One server setup measured.
#[derive(Debug, Clone, Copy)]
struct Case {
    kind: Kind,
    tls: bool,
}

impl Case {
    fn label(self) -> String {
        format!(
            "{} {}",
            self.kind.name(),
            if self.tls { "TLS" } else { "plain" }
        )
    }
}

/// The cases, in the order of the table; the ratios index them.
const CASES: [Case; 4] = [
    Case {
        kind: Kind::Ferry,
        tls: false,
    },
    Case {
        kind: Kind::Ferry,
        tls: true,
    },
    Case {
        kind: Kind::Nbdkit,
        tls: false,
    },
    Case {
        kind: Kind::Nbdkit,
        tls: true,
    },
];
const FERRY_PLAIN: usize = 0;
const FERRY_TLS: usize = 1;
const NBDKIT_PLAIN: usize = 2;
const NBDKIT_TLS: usize = 3;

/// The uid and gid fio runs as when the harness is root (`nobody`).
const FIO_UID: u32 = 65534;

/// A home directory for fio whose `.pki/libnbd` holds the certificate directory, and how
/// to run fio with it (see the module documentation).
struct FioHome {
    dir: tempfile::TempDir,
    /// Run fio as [`FIO_UID`] (the harness is root, for whom libnbd ignores `HOME`).
    drop_root: bool,
}

impl FioHome {
    fn new(certs: &Path) -> Result<FioHome> {
        let dir = tempfile::Builder::new()
            .prefix("ferry-bench-fio-home-")
            .tempdir_in("/var/tmp")?;
        let drop_root = crate::sys::run("id", &["-u"])?.trim() == "0";
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let pki_dir = dir.path().join(".pki");
        let libnbd = pki_dir.join("libnbd");
        std::fs::create_dir_all(&libnbd)?;
        for name in [pki::CA_CERT, pki::CLIENT_CERT, pki::CLIENT_KEY] {
            std::fs::copy(certs.join(name), libnbd.join(name))
                .with_context(|| format!("copy {name} into {}", libnbd.display()))?;
        }
        if drop_root {
            for p in [&pki_dir, &libnbd] {
                std::os::unix::fs::chown(p, Some(FIO_UID), Some(FIO_UID))?;
            }
            for name in [pki::CA_CERT, pki::CLIENT_CERT, pki::CLIENT_KEY] {
                std::os::unix::fs::chown(libnbd.join(name), Some(FIO_UID), Some(FIO_UID))?;
            }
        }
        Ok(FioHome { dir, drop_root })
    }

    /// Runs fio with `args`, returning its stdout.
    fn fio(&self, args: &[String]) -> Result<String> {
        let mut cmd = if self.drop_root {
            let mut c = Command::new("setpriv");
            let id = FIO_UID.to_string();
            c.args(["--reuid", &id, "--regid", &id, "--clear-groups", "fio"]);
            c
        } else {
            Command::new("fio")
        };
        let out = cmd
            .args(args)
            .env("HOME", self.dir.path())
            .output()
            .context("start fio")?;
        if !out.status.success() {
            bail!(
                "fio {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The URI fio gets: the server's, without `?tls-certificates=` (see the module
/// documentation).
fn fio_uri(srv: &Server, ds: &DataSet) -> String {
    let uri = srv.uri(ds);
    match uri.split_once('?') {
        Some((base, _)) => base.to_string(),
        None => uri,
    }
}

/// What one case measured over the runs.
#[derive(Debug, Clone, Default)]
struct Measured {
    seq_secs: Vec<f64>,
    seq_cpu: Vec<f64>,
    /// nbdcopy's CPU seconds (the client decrypts what TLS servers encrypt).
    seq_client_cpu: Vec<f64>,
    /// [cold, warm] IOPS and server CPU seconds over the timed run.
    iops: [Vec<f64>; 2],
    iops_cpu: [Vec<f64>; 2],
}

/// Sequential and random reads with and without TLS, `cfg.runs` times, cases interleaved;
/// every measurement on a fresh server after a drop of the page cache.
///
/// # Errors
/// Certificates, a server, nbdcopy or fio failing.
pub fn tls_bench(cfg: &Config, n: &NbdConfig, ds: &DataSet) -> Result<String> {
    let certs = make_cert_dir(&cfg.dir.join("nbd-tls-certs"))?;
    let r = measure(cfg, n, ds, &certs);
    if !cfg.keep {
        let _ = std::fs::remove_dir_all(&certs);
    }
    Ok(render(cfg, n, ds, &r?))
}

fn measure(cfg: &Config, n: &NbdConfig, ds: &DataSet, certs: &Path) -> Result<Vec<Measured>> {
    let home = FioHome::new(certs)?;
    let mut m = vec![Measured::default(); CASES.len()];
    for run in 0..cfg.runs {
        for (case, got) in CASES.iter().zip(&mut m) {
            let tls = case.tls.then_some(certs);
            let srv = Server::start_with(case.kind, ds, tls)?;
            cfg.cache.drop_now();
            cfg.loads.sample();
            let client_before = waited_children_cpu_secs();
            let start = Instant::now();
            crate::sys::run("nbdcopy", &[&srv.uri(ds), "null:"])?;
            let secs = start.elapsed().as_secs_f64();
            got.seq_client_cpu
                .push(waited_children_cpu_secs() - client_before);
            let u = srv.stop()?;
            note(&format!(
                "nbd-tls run {}: {} sequential {:.0} MB/s, server CPU {:.2} s",
                run + 1,
                case.label(),
                ds.size as f64 / 1e6 / secs,
                u.cpu_secs
            ));
            got.seq_secs.push(secs);
            got.seq_cpu.push(u.cpu_secs);
            for (w, warm) in [false, true].into_iter().enumerate() {
                let srv = Server::start_with(case.kind, ds, tls)?;
                cfg.cache.drop_now();
                let uri = fio_uri(&srv, ds);
                if warm {
                    home.fio(&warm_up_args(&uri))?;
                }
                cfg.loads.sample();
                let before = srv.usage();
                let v = fio_json(&home.fio(&fio_iops_args(&uri, n.iops_seconds))?)?;
                let after = srv.usage();
                srv.stop()?;
                let r = v["jobs"][0]["read"]["iops"]
                    .as_f64()
                    .filter(|r| *r > 0.0)
                    .ok_or_else(|| anyhow!("no read.iops in fio's json"))?;
                note(&format!(
                    "nbd-tls run {} {}: {} {r:.0} IOPS",
                    run + 1,
                    if warm { "warm" } else { "cold" },
                    case.label()
                ));
                got.iops[w].push(r);
                got.iops_cpu[w].push(after.cpu_secs - before.cpu_secs);
            }
        }
    }
    Ok(m)
}

/// A ratio with its goal, as the table shows it.
fn goal_cell(q: f64, goal: f64) -> String {
    format!("**{q:.2}** ({})", verdict(q >= goal))
}

fn render(cfg: &Config, n: &NbdConfig, ds: &DataSet, m: &[Measured]) -> String {
    let mbs = |c: usize| ds.size as f64 / 1e6 / median(&m[c].seq_secs);
    let iops = |c: usize, w: usize| median(&m[c].iops[w]);
    let per_k =
        |c: usize, w: usize| 1e6 * median(&m[c].iops_cpu[w]) / (iops(c, w) * n.iops_seconds as f64);
    let mut out = String::new();
    let fio = fio_iops_args("nbds://127.0.0.1:PORT/seq", n.iops_seconds);
    let _ = writeln!(
        out,
        "## NBD over TLS (nbd-tls)\n\n\
         The nbd-seq and nbd-iops workloads on a {} MiB vDisk of random bytes, with the server \
         requiring TLS (`NBD_OPT_STARTTLS` before anything else), beside the same servers without TLS. Ferry's `serve-internal` gets \
         `--tls-certificates DIR` (its rustls configuration from `pki::server_config`, \
         `TlsMode::Required`) and serves the VHDX through its block cache; nbdkit gets \
         `--tls=require --tls-certificates=DIR` and serves the raw twin with its file plugin. \
         DIR is made once per run: a throwaway farm CA, a server certificate for 127.0.0.1 and \
         an administrator's client certificate, which the clients present \
         (`nbds://127.0.0.1:PORT/seq?tls-certificates=DIR`), so Ferry's access rule lets them \
         read. *Sequential*: `nbdcopy URI null:` over the whole export (as nbd-seq). *Random*: \
         `fio {}` (fio's nbd engine may not name local files in a URI, so libnbd finds DIR as \
         its default, `$HOME/.pki/libnbd`: every fio of this section runs as `nobody` with \
         such a `HOME`), *cold* (page cache dropped, fresh server) and *warm* (the export read once \
         first in random 256 KiB reads on the same server, as nbd-iops). Every measurement \
         starts a fresh server after a drop of the page cache; {} runs per case, cases \
         interleaved; median shown. Server CPU is the server process's utime + stime \
         (`/proc/PID/stat`), per 1,000 reads for the random runs; nbdcopy's CPU is its utime \
         + stime as the harness reaps it (the client decrypts what a TLS server encrypts, on \
         the same CPUs).\n",
        ds.size >> 20,
        fio[..8].join(" "),
        cfg.runs,
    );
    out.push_str(
        "| server | sequential s (median, min–max) | sequential MB/s \
         | sequential CPU s (server / nbdcopy) \
         | random 4 KiB IOPS, cold | random 4 KiB IOPS, warm \
         | server CPU ms per 1k reads (cold / warm) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (c, case) in CASES.iter().enumerate() {
        let s = &m[c].seq_secs;
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "| {} | {:.2} ({lo:.2}–{hi:.2}) | {:.0} | {:.2} / {:.2} | {:.0} | {:.0} | {:.1} / {:.1} |",
            case.label(),
            median(s),
            mbs(c),
            median(&m[c].seq_cpu),
            median(&m[c].seq_client_cpu),
            iops(c, 0),
            iops(c, 1),
            per_k(c, 0),
            per_k(c, 1),
        );
    }
    let _ = writeln!(
        out,
        "\n| workload | ferry TLS ÷ ferry plain (goal ≥ {GOAL_TLS_VS_PLAIN:.1}) \
         | ferry TLS ÷ nbdkit TLS (goal ≥ {GOAL_VS_PEERS:.1}) | nbdkit TLS ÷ nbdkit plain |\n\
         |---|---:|---:|---:|"
    );
    // Each workload's figure (MB/s or IOPS) per case, in the order of CASES.
    let rows: [(&str, [f64; CASES.len()]); 3] = [
        ("sequential read (nbdcopy)", std::array::from_fn(mbs)),
        (
            "random 4 KiB reads, cold",
            std::array::from_fn(|c| iops(c, 0)),
        ),
        (
            "random 4 KiB reads, warm",
            std::array::from_fn(|c| iops(c, 1)),
        ),
    ];
    for (label, v) in &rows {
        let f = |c: usize| v[c];
        let vs_plain = f(FERRY_TLS) / f(FERRY_PLAIN);
        let vs_peer = f(FERRY_TLS) / f(NBDKIT_TLS);
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {:.2} |",
            goal_cell(vs_plain, GOAL_TLS_VS_PLAIN),
            goal_cell(vs_peer, GOAL_VS_PEERS),
            f(NBDKIT_TLS) / f(NBDKIT_PLAIN),
        );
    }
    out.push('\n');
    render_conditions(cfg, n, &mut out);
    out
}

/// This section's own run conditions, so it stands alone when merged into a report whose
/// other sections come from another run.
fn render_conditions(cfg: &Config, n: &NbdConfig, out: &mut String) {
    let date = crate::sys::run("date", &["-u", "+%Y-%m-%d %H:%M:%S"])
        .map(|d| d.trim().to_string())
        .unwrap_or_default();
    let mode = if n.quick {
        "a `--quick` smoke run (numbers are not meaningful)"
    } else {
        "a full run"
    };
    let cache = match cfg.cache {
        crate::sys::CacheDrop::Dropped => "dropped before every timed run",
        crate::sys::CacheDrop::NotPermitted => "**not dropped** (not permitted)",
    };
    let _ = write!(
        out,
        "Machine as in *NBD serving: machine and conditions*, {} CPUs shared by client and \
         server; measured {date} UTC in {mode} with {}, {} and {}; page cache {cache}.",
        crate::sys::cpus(),
        crate::sys::tool_version("nbdkit", &["--version"]),
        crate::sys::tool_version("nbdcopy", &["--version"]),
        crate::sys::tool_version("fio", &["--version"]),
    );
    if let Some((min, mean, max)) = cfg.loads.summary() {
        let _ = write!(
            out,
            " The 1-minute load as the timed runs started was {min:.1} / {mean:.1} / {max:.1} \
             (min / mean / max): compare the ratios of one run, not absolute figures across \
             runs."
        );
    }
    out.push_str("\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goal_cell_marks_a_ratio_below_its_goal() {
        assert_eq!(goal_cell(0.79, GOAL_TLS_VS_PLAIN), "**0.79** (**not met**)");
        assert_eq!(goal_cell(1.0, GOAL_VS_PEERS), "**1.00** (met)");
    }

    #[test]
    fn cases_indices_name_the_cases_the_ratios_compare() {
        assert_eq!(CASES[FERRY_PLAIN].label(), "ferry plain");
        assert_eq!(CASES[FERRY_TLS].label(), "ferry TLS");
        assert_eq!(CASES[NBDKIT_PLAIN].label(), "nbdkit plain");
        assert_eq!(CASES[NBDKIT_TLS].label(), "nbdkit TLS");
    }
}
