//! The boot section's Markdown: measured rows in, one section out.

use std::fmt::Write as _;

use super::{
    BootConfig, GOAL_COLD_VS_NBDKIT, GOAL_SET_VS_NBDKIT, GOAL_WARM_VS_LOCAL, GUEST_CPUS, GUEST_MIB,
    Results, Row, median,
};
use crate::Config;

const TITLE: &str = "## Boot: Debian 12 in QEMU to multi-user (boot)";

/// The section when it could not run, saying why.
pub fn skipped(why: &str) -> String {
    format!(
        "{TITLE}\n\nNot run on this machine: {why}. It needs root (image build: tar with \
         owners, chroot, mounts), qemu-system-x86_64, debootstrap, e2fsprogs, fdisk, nbdkit, \
         strip, the release `ferry` binary and the static boot agent.\n\n"
    )
}

fn secs(r: &Row) -> String {
    match r.secs.len() {
        0 => "–".into(),
        1 => format!("{:.1}", r.median()),
        _ => {
            let lo = r.secs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.secs.iter().copied().fold(0.0, f64::max);
            format!("{:.1} ({lo:.1}–{hi:.1})", r.median())
        }
    }
}

fn mb_median(v: &[u64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.1}", bytes_median(v) / 1e6)
}

/// The median of byte counts (NaN when empty).
fn bytes_median(v: &[u64]) -> f64 {
    median(&v.iter().map(|&b| b as f64).collect::<Vec<_>>())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

/// The section.
pub fn section(cfg: &Config, b: &BootConfig, r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{TITLE}\n\n\
         One image of the test OS (Debian 12, systemd; `crates/guest`) with the stripped \
         `ferry` binary and the boot agent, `ferry target install-initramfs --agent … \
         --update` run in its root, so its initramfs holds both Ferry's boot script and \
         Debian's nbd-client support (built in {:.0} s, untimed). Every machine is \
         `qemu-system-x86_64 -accel tcg` with {GUEST_CPUS} vCPU and {GUEST_MIB} MiB, the \
         image's own kernel and initramfs booted directly, the console on ttyS0; the time is \
         from QEMU's start to the `FERRY-BOOT-OK` line the guest prints after \
         multi-user.target. Median of {} boot(s) per row (range in brackets; the mean of the middle two of an even count).\n\n\
         - *local disk*: the raw image as a virtio disk (`-snapshot`: writes go to a \
         throw-away overlay), `root=/dev/vda1`: the ceiling; once with the page cache dropped, \
         once right after (the image's blocks in the page cache).\n\
         - *nbdkit*: `nbdkit --filter=cow --filter=stats file disk.raw` (fresh process, page \
         cache dropped), mounted by Debian's nbd-client initramfs support (`nbdroot=10.0.2.2:PORT/root \
         root=/dev/nbd0p1`) over QEMU's user network; the stats \
         filter under the cow filter counts the bytes read from the file.\n\
         - *ferry cold*: `ferry server --store DIR` (standalone, fresh process, page cache \
         dropped) serving the image captured by `ferry vdisk capture` (VHDX), the boot agent \
         in the initramfs (`boot=ferry ferry.server=10.0.2.2:PORT ferry.export=debian \
         ferry.cache=ram root=/dev/nbd0p1`); *ferry warm*: a second boot against the same \
         running server (its block cache warm); *ferry + boot set*: the version's second \
         boot, on a fresh server (page cache dropped) that has the boot set the boots before \
         recorded beside the version (issue 21, docs/boot-sets.md) and prefetches it into its \
         block cache as it starts, as any server does; the machine is started right after \
         (its store bytes include the prefetch). Each run removes the set before its *ferry \
         cold* boot. Store bytes are the server's \
         `ferry_store_read_bytes_total` over the boot, served bytes its \
         `ferry_nbd_bytes_total{{type=\"read\"}}`.\n\
         - Both network rows get the network as Ferry's boot script passes iPXE's lease on \
         (`{}`): the initramfs configures the NIC statically, without a second DHCP.\n",
        r.image_secs,
        b.runs,
        super::NETWORK_APPEND,
    );
    out.push_str(
        "| boot | seconds to the marker | read from the store MB | served to the machine MB |\n\
         |---|---:|---:|---:|\n",
    );
    let rows: [(&str, &Row); 6] = [
        ("local virtio disk, page cache dropped", &r.local),
        (
            "local virtio disk, page cache warm (ceiling)",
            &r.local_warm,
        ),
        ("nbdkit cow + file, nbd-client initramfs", &r.nbdkit),
        (
            "ferry cold (fresh server, page cache dropped)",
            &r.ferry_cold,
        ),
        ("ferry warm (same server, second boot)", &r.ferry_warm),
        (
            "ferry + boot set (fresh server, page cache dropped, second boot)",
            &r.ferry_set,
        ),
    ];
    for (name, row) in rows {
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} |",
            secs(row),
            mb_median(&row.store_read),
            mb_median(&row.served),
        );
    }
    if !r.concurrent.is_empty() {
        let all = r.concurrent.iter().copied().fold(0.0, f64::max);
        let mean = r.concurrent.iter().sum::<f64>() / r.concurrent.len() as f64;
        let _ = writeln!(
            out,
            "| {} machines at once, ferry warm: all up | {all:.1} (each {:.1} on average) | {} | |",
            r.concurrent.len(),
            mean,
            r.concurrent_store_read
                .map_or_else(|| "–".into(), |b| format!("{:.1}", b as f64 / 1e6)),
        );
    }
    render_phases(&mut out, &rows);
    let _ = writeln!(
        out,
        "\nThe vDisk: a {:.0} MiB raw disk of which {:.0} MB are allocated (the root file \
         system as `mkfs.ext4 -d` wrote it); captured in {:.1} s into a {:.0} MB VHDX.\n",
        r.raw_bytes as f64 / (1u64 << 20) as f64,
        r.raw_allocated as f64 / 1e6,
        r.capture_secs,
        r.vhdx_bytes as f64 / 1e6,
    );
    render_goals(&mut out, r);
    render_conditions(&mut out, cfg, b, r);
    out
}

/// Where the time went, by the guest kernel's clock (medians).
fn render_phases(out: &mut String, rows: &[(&str, &Row)]) {
    out.push_str(
        "\nWhere the time went, by the guest kernel's clock (median seconds; the rest of a \
         boot's time is QEMU's start and firmware before the kernel's clock starts):\n\n\
         | boot | kernel start → initramfs `/init` | `/init` → root mounted (network, \
         attach) | root mounted → last kernel message before the marker (systemd) |\n\
         |---|---:|---:|---:|\n",
    );
    for (name, row) in rows {
        if row.phases.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&super::Phases) -> f64| {
            median(&row.phases.iter().map(f).collect::<Vec<_>>())
        };
        let _ = writeln!(
            out,
            "| {name} | {:.1} | {:.1} | {:.1} |",
            m(&|p| p.init),
            m(&|p| p.root - p.init),
            m(&|p| p.last - p.root),
        );
    }
}

fn render_goals(out: &mut String, r: &Results) {
    let cold = r.ferry_cold.median() / r.nbdkit.median();
    let warm = r.ferry_warm.median() / r.local_warm.median();
    let warm_cold_local = r.ferry_warm.median() / r.local.median();
    let set = r.ferry_set.median() / r.nbdkit.median();
    let set_cold = r.ferry_set.median() / r.ferry_cold.median();
    let set_store = bytes_median(&r.ferry_set.store_read) / bytes_median(&r.ferry_cold.store_read);
    let _ = writeln!(
        out,
        "- ferry cold ÷ nbdkit = **{cold:.2}** of the time (goal ≤ {GOAL_COLD_VS_NBDKIT:.2}, \
         no slower: {})\n\
         - ferry warm ÷ local disk (page cache warm) = **{warm:.2}** (goal ≤ \
         {GOAL_WARM_VS_LOCAL:.2}: {}); ÷ local disk with the page cache dropped = \
         {warm_cold_local:.2}\n",
        verdict(cold <= GOAL_COLD_VS_NBDKIT),
        verdict(warm <= GOAL_WARM_VS_LOCAL),
    );
    let _ = writeln!(
        out,
        "- ferry + boot set ÷ nbdkit = **{set:.2}** of the time (issue 21's goal for the \
         second boot, ≤ {GOAL_SET_VS_NBDKIT:.2}: {}); ÷ ferry cold = {set_cold:.2}; its store \
         bytes ÷ ferry cold's (the first boot, which reads only what it asks for) = \
         {set_store:.2}\n",
        verdict(set <= GOAL_SET_VS_NBDKIT),
    );
}

fn render_conditions(out: &mut String, cfg: &Config, b: &BootConfig, r: &Results) {
    let (min, max) = (
        r.loads.iter().copied().fold(f64::INFINITY, f64::min),
        r.loads.iter().copied().fold(0.0, f64::max),
    );
    let mean = r.loads.iter().sum::<f64>() / r.loads.len().max(1) as f64;
    let cache = match cfg.cache {
        crate::sys::CacheDrop::Dropped => "dropped where the rows say",
        crate::sys::CacheDrop::NotPermitted => "**not dropped** (not permitted)",
    };
    let _ = writeln!(
        out,
        "Conditions: {} CPUs shared by the machines, the servers and everything else on the \
         host; TCG emulates the guest CPU, so a boot is CPU-bound and its time follows the \
         host's load. The 1-minute load as each boot started was {min:.1} / {mean:.1} / \
         {max:.1} (min / mean / max); page cache {cache}.{} Compare the ratios of one run, \
         not absolute times across runs.\n",
        crate::sys::cpus(),
        if b.quick {
            " A `--quick` run: one boot per row."
        } else {
            ""
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_section_says_why() {
        let s = skipped("missing nbdkit");
        assert!(s.starts_with("## Boot"));
        assert!(s.contains("missing nbdkit"));
    }

    #[test]
    fn range_is_shown_for_several_boots() {
        let row = Row {
            secs: vec![40.0, 30.0],
            ..Row::default()
        };
        assert_eq!(secs(&row), "35.0 (30.0–40.0)");
    }
}
