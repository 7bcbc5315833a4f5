//! The iPXE scripts of the boot service, as pure functions of the boot decision: the chain
//! script every machine fetches first, the per-device script that loads a version's kernel
//! and initramfs, and the refusal script that says why a machine may not boot.
//!
//! A diskless device's script carries its boot's one-time login ticket (`ferry.ticket=`,
//! [`DeviceScript::ticket`], made by `farm::tickets`); nothing else in a script is a
//! secret, and no script carries anything farm-wide.
//!
//! Nothing from the database reaches a script unchecked: console text is reduced to
//! [`echo_safe`] characters, kernel arguments are made of [`farm::validate::boot_arg_char`]s
//! (names are percent-encoded, the image's own arguments that are not are dropped), so no
//! newline, `${…}` expansion, `||`/`&&` or comment can be injected.

use std::fmt::Write as _;

use farm::validate::boot_arg_char;

/// How many times a refusal is printed (the console must show it among firmware output).
pub const REFUSAL_REPEAT: usize = 5;
/// What a refused machine prints last, before its script exits to the firmware.
pub const HANDED_BACK: &str = "Ferry: giving this machine back to its firmware";
/// The longest reason printed, in characters.
pub const REASON_CHARS_MAX: usize = 400;
/// The most characters of a MAC as a machine sent it that a refusal (or a log line) shows:
/// a MAC is 17; more is a client's noise, not a reason.
pub const MAC_SHOWN_CHARS_MAX: usize = 24;
/// The longest kernel command line the script passes (Linux x86's `COMMAND_LINE_SIZE`).
pub const CMDLINE_BYTES_MAX: usize = 2048;
/// The network arguments of every boot, expanded by iPXE from the lease it booted with
/// (`netX`: the interface it booted from). The initramfs configures that interface
/// statically (initramfs-tools' `ip=CLIENT::GATEWAY:NETMASK:::off:DNS`, the interface found
/// by `BOOTIF=01-MAC`, as pxelinux passes it) instead of asking DHCP again, which costs a
/// boot seconds (klibc's `ipconfig` gives up on its first DISCOVER after 2 s) and, on a
/// machine with several NICs, may pick another one. A vDisk's `--boot-cmdline` with
/// `ip=dhcp` asks DHCP again (the last `ip=` wins).
pub const NETWORK_ARGS: &str = "ip=${netX/ip}::${netX/gateway}:${netX/netmask}:::off:${netX/dns} \
                                BOOTIF=01-${netX/mac:hexhyp}";
/// The most bytes iPXE's expansion of [`NETWORK_ARGS`] adds (four IPv4 addresses and a MAC
/// in place of their names), counted against [`CMDLINE_BYTES_MAX`].
pub const NETWORK_ARGS_GROWTH_MAX: usize = 4 * 15 + 17;
/// The kernel arguments of the image's own command line that the boot script sets itself
/// (or that would boot the wrong root), dropped from it.
pub const DROPPED_IMAGE_ARGS: [&str; 7] = [
    "root=",
    "BOOT_IMAGE=",
    "initrd=",
    "boot=",
    "ip=",
    "BOOTIF=",
    "ferry.",
];

/// The script every machine fetches first (`GET /boot/ipxe`): it chains the script of its
/// own MAC, relative to where it came from (iPXE expands `${netX/mac:hexhyp}`, the MAC of
/// the interface it booted from, as `aa-bb-cc-dd-ee-ff`). A refusal script exits with 0
/// after its reason, so that this one adds no second reason; only a script that never came
/// (no answer, an HTTP error) takes the `failed` branch. Either way the script ends and
/// iPXE gives the machine back to its firmware, which tries its next boot device.
pub fn chain_script() -> String {
    format!(
        "#!ipxe\n\
         echo Ferry: asking the farm what ${{netX/mac}} boots\n\
         chain --autofree /boot/ipxe/${{netX/mac:hexhyp}} || goto failed\n\
         exit\n\
         :failed\n\
         echo Ferry: this machine cannot boot: no boot script came from the boot server for ${{netX/mac}}\n\
         echo {HANDED_BACK}\n\
         exit 1\n"
    )
}

/// `s` reduced to characters an iPXE `echo` prints as they are: ASCII letters, digits,
/// space and `._:,()/@+=-'`; anything else becomes `_`, and at most
/// [`REASON_CHARS_MAX`] characters stay.
pub fn echo_safe(s: &str) -> String {
    s.chars()
        .take(REASON_CHARS_MAX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || " ._:,()/@+=-'".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The MAC `mac` as the client sent it, to show in a refusal or a log line: at most
/// [`MAC_SHOWN_CHARS_MAX`] [`echo_safe`] characters, then `...` if it was longer.
pub fn mac_shown(mac: &str) -> String {
    let mut shown = echo_safe(&mac.chars().take(MAC_SHOWN_CHARS_MAX).collect::<String>());
    if mac.chars().nth(MAC_SHOWN_CHARS_MAX).is_some() {
        shown.push_str("...");
    }
    shown
}

/// Where the per-device script loads a version's boot files from:
/// `/boot/files/MAC/VDISK-ID/VERSION`, then `/kernel` or `/initrd`. The URL carries the
/// device's MAC (`aa-bb-cc-dd-ee-ff`), so that the boot service serves a file only to the
/// MAC whose boot plan names that version (see `boot.rs`).
pub fn files_url(mac: &str, vdisk_id: i64, version: i64) -> String {
    format!(
        "/boot/files/{}/{vdisk_id}/{version}",
        arg_value(mac).replace(':', "-")
    )
}

/// `s` as a kernel argument value: [`boot_arg_char`]s other than `%` as they are, every
/// other byte as `%XX` (the agent decodes it).
pub fn arg_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let c = char::from(b);
        if b.is_ascii() && c != '%' && boot_arg_char(c) {
            out.push(c);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// True when every character of the argument `arg` is a [`boot_arg_char`].
pub fn arg_ok(arg: &str) -> bool {
    !arg.is_empty() && arg.chars().all(boot_arg_char)
}

/// The arguments of the image's own command line the script keeps: those made of
/// [`boot_arg_char`]s and not in [`DROPPED_IMAGE_ARGS`]. The dropped ones are returned too.
pub fn image_args(cmdline: &str) -> (Vec<String>, Vec<String>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for a in cmdline.split_whitespace() {
        if arg_ok(a) && !DROPPED_IMAGE_ARGS.iter().any(|p| a.starts_with(p)) {
            kept.push(a.to_string());
        } else {
            dropped.push(a.to_string());
        }
    }
    (kept, dropped)
}

/// Where the root filesystem is, for `root=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootDev {
    /// The filesystem is on the whole disk: `/dev/nbd0`.
    WholeDisk,
    /// Partition N: `/dev/nbd0pN`.
    Partition(u32),
    /// Not recognised: no `root=` from the boot service (the image's own stays dropped;
    /// the vDisk's boot command line may name one).
    Unknown,
}

/// What the per-device script says and loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceScript<'a> {
    /// The device's MAC, `aa:bb:cc:dd:ee:ff`.
    pub mac: &'a str,
    /// The device's name (or how it will be added).
    pub device: &'a str,
    /// The vDisk's id (in the file URLs).
    pub vdisk_id: i64,
    /// The vDisk's name.
    pub vdisk: &'a str,
    /// The version.
    pub version: i64,
    /// The farm API URLs the agent logs in at.
    pub api_urls: &'a [String],
    /// The root filesystem.
    pub root: RootDev,
    /// True when the version has an initramfs.
    pub initrd: bool,
    /// The image's own command line.
    pub image_cmdline: Option<&'a str>,
    /// The vDisk's boot command line.
    pub vdisk_cmdline: &'a str,
    /// The login ticket of this boot (`ft_` and hex digits), for a device the farm logs in
    /// by ticket (diskless); `None` for others.
    pub ticket: Option<&'a str>,
}

/// Why a device script cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// An API URL holds a character a kernel argument may not.
    #[error("the farm API URL {0:?} cannot go on a kernel command line")]
    BadApiUrl(String),
    /// The ticket holds a character a kernel argument may not.
    #[error("the login ticket cannot go on a kernel command line")]
    BadTicket,
    /// The command line is longer than the kernel takes.
    #[error("the kernel command line would have {0} bytes, more than {CMDLINE_BYTES_MAX}")]
    TooLong(usize),
}

/// The kernel command line of `s` (see docs/farm.md): the boot service's arguments, then
/// the image's own kept ones ([`image_args`]), then the vDisk's.
///
/// # Errors
/// [`ScriptError`].
pub fn kernel_args(s: &DeviceScript<'_>) -> Result<String, ScriptError> {
    if let Some(bad) = s.api_urls.iter().find(|u| !arg_ok(u)) {
        return Err(ScriptError::BadApiUrl(bad.clone()));
    }
    let mut args = vec![
        "boot=ferry".to_string(),
        NETWORK_ARGS.to_string(),
        format!("ferry.api={}", s.api_urls.join(",")),
        format!("ferry.mac={}", arg_value(s.mac)),
        format!("ferry.vdisk={}", arg_value(s.vdisk)),
        format!("ferry.version={}", s.version),
    ];
    if let Some(t) = s.ticket {
        if !arg_ok(t) || t.contains('%') {
            return Err(ScriptError::BadTicket);
        }
        args.push(format!("ferry.ticket={t}"));
    }
    match s.root {
        RootDev::WholeDisk => args.push("root=/dev/nbd0".into()),
        RootDev::Partition(n) => args.push(format!("root=/dev/nbd0p{n}")),
        RootDev::Unknown => {}
    }
    args.push("panic=30".into());
    if let Some(c) = s.image_cmdline {
        args.extend(image_args(c).0);
    }
    args.extend(
        s.vdisk_cmdline
            .split_whitespace()
            .filter(|a| arg_ok(a))
            .map(str::to_string),
    );
    let line = args.join(" ");
    if line.len() + NETWORK_ARGS_GROWTH_MAX > CMDLINE_BYTES_MAX {
        return Err(ScriptError::TooLong(line.len() + NETWORK_ARGS_GROWTH_MAX));
    }
    Ok(line)
}

/// The per-device script: says what boots, loads the kernel and initramfs of the version
/// from this service (URLs relative to the script's), and boots.
///
/// # Errors
/// As [`kernel_args`].
pub fn device_script(s: &DeviceScript<'_>) -> Result<String, ScriptError> {
    let args = kernel_args(s)?;
    let files = files_url(s.mac, s.vdisk_id, s.version);
    let mut out = String::from("#!ipxe\n");
    let _ = writeln!(
        out,
        "echo Ferry: device {} ({}) boots vDisk {} version {}",
        echo_safe(s.device),
        echo_safe(s.mac),
        echo_safe(s.vdisk),
        s.version
    );
    if s.initrd {
        let _ = writeln!(
            out,
            "kernel {files}/kernel initrd=initrd {args} || goto failed"
        );
        let _ = writeln!(out, "initrd --name initrd {files}/initrd || goto failed");
    } else {
        let _ = writeln!(out, "kernel {files}/kernel {args} || goto failed");
    }
    out.push_str("boot || goto failed\n");
    out.push_str(":failed\n");
    push_refusal_lines(
        &mut out,
        "loading the kernel or initramfs from the boot server failed",
    );
    Ok(out)
}

/// The refusal script: the reason printed [`REFUSAL_REPEAT`] times, then [`HANDED_BACK`]
/// and `exit 0`: the script that chained it ends too, and iPXE gives the machine back to its
/// firmware at once (its next boot device: a local disk, or the firmware's own message).
/// No pause, no loop, no second reason.
pub fn refusal_script(reason: &str) -> String {
    let mut out = String::from("#!ipxe\n");
    push_refusal_lines(&mut out, reason);
    out
}

fn push_refusal_lines(out: &mut String, reason: &str) {
    let line = format!(
        "echo Ferry: this machine cannot boot: {}",
        echo_safe(reason)
    );
    for _ in 0..REFUSAL_REPEAT {
        out.push_str(&line);
        out.push('\n');
    }
    let _ = writeln!(out, "echo {HANDED_BACK}");
    out.push_str("exit 0\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script<'a>(urls: &'a [String]) -> DeviceScript<'a> {
        DeviceScript {
            mac: "52:54:00:12:34:56",
            device: "pc1",
            vdisk_id: 3,
            vdisk: "golden",
            version: 2,
            api_urls: urls,
            root: RootDev::Partition(1),
            initrd: true,
            image_cmdline: Some("BOOT_IMAGE=/vmlinuz root=UUID=abc ro quiet \"x y\""),
            vdisk_cmdline: "console=ttyS0,115200",
            ticket: None,
        }
    }

    #[test]
    fn device_script_loads_kernel_and_initrd_with_the_arguments() {
        let urls = ["https://10.0.2.2:8443".to_string()];
        let s = device_script(&script(&urls)).unwrap();
        let want = "kernel /boot/files/52-54-00-12-34-56/3/2/kernel initrd=initrd boot=ferry \
                    ip=${netX/ip}::${netX/gateway}:${netX/netmask}:::off:${netX/dns} \
                    BOOTIF=01-${netX/mac:hexhyp} ferry.api=https://10.0.2.2:8443 ferry.mac=52:54:00:12:34:56 \
                    ferry.vdisk=golden ferry.version=2 root=/dev/nbd0p1 panic=30 ro quiet \
                    console=ttyS0,115200 || goto failed\n";
        assert!(s.contains(want), "{s}");
        assert!(s.contains(
            "initrd --name initrd /boot/files/52-54-00-12-34-56/3/2/initrd || goto failed\n"
        ));
        assert!(s.starts_with("#!ipxe\necho Ferry: device pc1 (52:54:00:12:34:56)"));
        assert!(!s.contains("UUID=abc") && !s.contains("BOOT_IMAGE"));
    }

    #[test]
    fn hostile_names_cannot_inject_script_lines_or_expansions() {
        let urls = ["https://h:1".to_string()];
        let mut d = script(&urls);
        d.device = "x\nkernel http://evil/ ${net0/ip} || shell";
        d.vdisk = "a b\n#c${x}";
        let s = device_script(&d).unwrap();
        assert_eq!(s.lines().filter(|l| l.starts_with("kernel ")).count(), 1);
        assert!(s.contains(NETWORK_ARGS), "{s}");
        assert!(
            !s.replace(NETWORK_ARGS, "").contains("${"),
            "only the script's own expansions: {s}"
        );
        assert!(s.contains("ferry.vdisk=a%20b%0A%23c%24%7Bx%7D "), "{s}");
        let r = refusal_script("no\nshell ${x} && reboot");
        assert!(!r.contains("${") && !r.contains("&&"));
        assert_eq!(
            r.lines().filter(|l| l.starts_with("echo ")).count(),
            REFUSAL_REPEAT + 1
        );
        assert!(r.ends_with(&format!("echo {HANDED_BACK}\nexit 0\n")), "{r}");
    }

    #[test]
    fn a_long_mac_is_shown_bounded_and_sanitized() {
        let long = format!("{}\n${{x}}", "a".repeat(10_000));
        let shown = mac_shown(&long);
        assert_eq!(shown, format!("{}...", "a".repeat(MAC_SHOWN_CHARS_MAX)));
        assert_eq!(mac_shown("52-54-00-12-34-5$"), "52-54-00-12-34-5_");
    }

    #[test]
    fn bad_api_url_and_overlong_command_line_are_errors() {
        let urls = ["https://h:1 x".to_string()];
        assert!(matches!(
            device_script(&script(&urls)),
            Err(ScriptError::BadApiUrl(_))
        ));
        let urls = ["https://h:1".to_string()];
        let long = "a=1 ".repeat(600);
        let mut d = script(&urls);
        d.vdisk_cmdline = &long;
        assert!(matches!(device_script(&d), Err(ScriptError::TooLong(_))));
    }

    #[test]
    fn a_ticket_goes_on_the_command_line_and_an_image_s_own_is_dropped() {
        let urls = ["https://h:1".to_string()];
        let mut d = script(&urls);
        d.ticket = Some("ft_00ff");
        d.image_cmdline = Some("ro ferry.ticket=ft_11 ferry.key=/etc/ferry/farm.key");
        let s = device_script(&d).unwrap();
        assert!(s.contains(" ferry.version=2 ferry.ticket=ft_00ff "), "{s}");
        assert_eq!(s.matches("ferry.ticket=").count(), 1, "{s}");
        assert!(!s.contains("ferry.key"), "{s}");
        d.ticket = Some("ft_0 x");
        assert_eq!(device_script(&d), Err(ScriptError::BadTicket));
    }

    #[test]
    fn whole_disk_root_and_no_initrd() {
        let urls = ["https://h:1".to_string()];
        let mut d = script(&urls);
        d.root = RootDev::WholeDisk;
        d.initrd = false;
        let s = device_script(&d).unwrap();
        assert!(s.contains(" root=/dev/nbd0 "));
        assert!(!s.contains("initrd"));
    }
}
