//! Pure rules over names and text: which file names are kernels and initrds, version-aware
//! ordering, and the kernel command line from `/etc/kernel/cmdline` or `/etc/default/grub`.

use std::cmp::Ordering;

/// File name prefixes of kernels, e.g. `vmlinuz-6.1.0-10-amd64`.
pub const KERNEL_PREFIXES: [&str; 2] = ["vmlinuz-", "vmlinux-"];

/// The kernel version a file name carries (`vmlinuz-6.1.0-10-amd64` → `6.1.0-10-amd64`).
pub fn kernel_version(name: &str) -> Option<&str> {
    KERNEL_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .filter(|v| !v.is_empty() && !v.ends_with(".old") && !v.ends_with(".sig"))
}

/// The directory boot files are served from on a root filesystem.
pub const BOOT_DIR: &str = "/boot";

/// True when `real`, a file's path with every symlink resolved, may be served as a boot
/// file: inside [`BOOT_DIR`] on a root filesystem (`is_root`), anywhere on a separate
/// `/boot` partition (whose root is `/boot`). A link that leads elsewhere (`/vmlinuz` to
/// `/etc/shadow`, `/boot` itself to `/etc`) names nothing a machine boots.
pub fn in_boot_dir(real: &str, is_root: bool) -> bool {
    let clean = real.starts_with('/')
        && real
            .split('/')
            .skip(1)
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !clean {
        return false;
    }
    !is_root
        || real
            .strip_prefix(BOOT_DIR)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The initrd names of a kernel version, in the order to try (Debian, then dracut/Fedora).
pub fn initrd_names(version: &str) -> [String; 3] {
    [
        format!("initrd.img-{version}"),
        format!("initramfs-{version}.img"),
        format!("initrd-{version}"),
    ]
}

/// Compares versions as `sort -V` does in the common cases: runs of digits compare as
/// numbers, other runs byte-wise (`6.1.0-10` > `6.1.0-9`).
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let digits = x.is_ascii_digit();
                if digits != y.is_ascii_digit() {
                    return x.cmp(y);
                }
                let (ra, rest_a) = split_run(a, digits);
                let (rb, rest_b) = split_run(b, digits);
                let ord = if digits {
                    let ra = trim_zeros(ra);
                    let rb = trim_zeros(rb);
                    ra.len().cmp(&rb.len()).then_with(|| ra.cmp(rb))
                } else {
                    ra.cmp(rb)
                };
                if ord != Ordering::Equal {
                    return ord;
                }
                a = rest_a;
                b = rest_b;
            }
        }
    }
}

fn split_run(s: &[u8], digits: bool) -> (&[u8], &[u8]) {
    let n = s
        .iter()
        .position(|c| c.is_ascii_digit() != digits)
        .unwrap_or(s.len());
    s.split_at(n)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let n = s.iter().position(|&c| c != b'0').unwrap_or(s.len());
    &s[n..]
}

/// The command line in `/etc/kernel/cmdline` (systemd's kernel-install): lines joined by
/// spaces, `#` comment lines dropped. `None` when nothing is left.
pub fn cmdline_from_kernel_file(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// `GRUB_CMDLINE_LINUX` then `GRUB_CMDLINE_LINUX_DEFAULT` of an `/etc/default/grub` (a shell
/// fragment; only plain `KEY=value`, `KEY="value"` and `KEY='value'` lines are understood, the
/// last assignment wins). `None` when both are empty or absent.
pub fn cmdline_from_grub_default(text: &str) -> Option<String> {
    let mut linux = String::new();
    let mut default = String::new();
    for line in text.lines() {
        let line = line.trim();
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let slot = match key.trim() {
            "GRUB_CMDLINE_LINUX" => &mut linux,
            "GRUB_CMDLINE_LINUX_DEFAULT" => &mut default,
            _ => continue,
        };
        *slot = unquote(value.trim());
    }
    let words: Vec<&str> = linux
        .split_whitespace()
        .chain(default.split_whitespace())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

fn unquote(v: &str) -> String {
    for q in ['"', '\''] {
        if let Some(rest) = v.strip_prefix(q) {
            return rest.split(q).next().unwrap_or_default().to_string();
        }
    }
    // Unquoted: up to a comment.
    v.split('#').next().unwrap_or_default().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_inside_boot_are_boot_files_on_a_root_filesystem() {
        assert!(in_boot_dir("/boot/vmlinuz-6.1.0-13-amd64", true));
        assert!(in_boot_dir("/boot/efi/x/linux", true));
        for bad in [
            "/etc/shadow",
            "/vmlinuz",
            "/boot",
            "/bootx/v",
            "/boot/../etc/shadow",
            "boot/v",
            "/boot//v",
        ] {
            assert!(!in_boot_dir(bad, true), "{bad}");
        }
        // A /boot partition is /boot: any clean path in it.
        assert!(in_boot_dir("/vmlinuz-6.1.0-13-amd64", false));
        assert!(!in_boot_dir("/a/../b", false));
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            compare_versions("6.1.0-10-amd64", "6.1.0-9-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.1.0-9-amd64", "6.10.0-1-amd64"),
            Ordering::Less
        );
        assert_eq!(compare_versions("5.10.0-007", "5.10.0-7"), Ordering::Equal);
        assert_eq!(compare_versions("6.1", "6.1.0"), Ordering::Less);
        let mut v = vec!["6.1.0-9", "6.1.0-10", "5.19.0-2", "6.1.0-1"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(v, ["5.19.0-2", "6.1.0-1", "6.1.0-9", "6.1.0-10"]);
    }

    #[test]
    fn kernel_names() {
        assert_eq!(
            kernel_version("vmlinuz-6.1.0-10-amd64"),
            Some("6.1.0-10-amd64")
        );
        assert_eq!(kernel_version("vmlinuz"), None);
        assert_eq!(kernel_version("vmlinuz-"), None);
        assert_eq!(kernel_version("vmlinuz-6.1.old"), None);
        assert_eq!(kernel_version("config-6.1.0"), None);
        assert_eq!(initrd_names("6.1")[0], "initrd.img-6.1");
    }

    #[test]
    fn kernel_cmdline_file() {
        assert_eq!(
            cmdline_from_kernel_file("# comment\nroot=/dev/sda1  ro\nquiet\n").as_deref(),
            Some("root=/dev/sda1 ro quiet")
        );
        assert_eq!(cmdline_from_kernel_file("\n# x\n"), None);
    }

    #[test]
    fn grub_default() {
        let text = "GRUB_DEFAULT=0\n# GRUB_CMDLINE_LINUX=\"no\"\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n\
                    GRUB_CMDLINE_LINUX='console=ttyS0 net.ifnames=0'\n";
        assert_eq!(
            cmdline_from_grub_default(text).as_deref(),
            Some("console=ttyS0 net.ifnames=0 quiet")
        );
        assert_eq!(cmdline_from_grub_default("GRUB_CMDLINE_LINUX=\"\"\n"), None);
        assert_eq!(
            cmdline_from_grub_default("GRUB_CMDLINE_LINUX=ro # why\n").as_deref(),
            Some("ro")
        );
    }
}
