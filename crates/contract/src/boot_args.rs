//! What the boot agent is told: the kernel command line (which the farm's boot script
//! writes: `ferry.api=… ferry.mac=…`) over the initramfs's own `/etc/ferry/boot.conf`
//! (which `ferry target install-initramfs` writes: the farm's CA, defaults; never a
//! secret: the initramfs is served to anyone who asks).
//! Pure: text in, [`BootArgs`] out.
//!
//! | key (`ferry.KEY=` on the command line, `KEY=` in boot.conf) | meaning |
//! |---|---|
//! | `api` | farm API URLs, comma-separated, tried in order |
//! | `mac` | the MAC to log in as (the NIC the firmware booted from) |
//! | `ca` | file of the farm's CA certificate (PEM) |
//! | `ticket` | the one-time login ticket of this boot (`ft_…`; the boot script's only) |
//! | `tpm` | `0`: do not keep the device key in the machine's TPM (default: when it has one) |
//! | `overflow` | the `ram-overflow`/`disk` cache's place: a block device or a directory |
//! | `device` | the kernel NBD device, `/dev/nbd0` by default |
//! | `server`, `export` | without a farm: NBD servers (comma-separated) and the export to attach |
//! | `cache` | without a farm: the cache mode (`ram` by default) |
//! | `vdisk`, `version` | what the boot script chose (checked against the login's grant) |

use std::path::PathBuf;

/// The most bytes of a command line or config file read (the kernel's own limit is 2 KiB
/// on x86; a config file has a few lines).
pub const TEXT_BYTES_MAX: usize = 64 * 1024;
/// The most farm API URLs or servers.
pub const LIST_MAX: usize = 16;

/// The most characters of an unknown key kept (to say which were skipped).
pub const UNKNOWN_KEY_CHARS_MAX: usize = 64;

/// The kernel NBD device when none is named.
pub const DEFAULT_DEVICE: &str = "/dev/nbd0";
/// The longest wait `ferry.login_wait=` and `ferry.attach_wait=` may set, in seconds.
pub const WAIT_SECONDS_MAX: u64 = 3600;

/// Everything the boot agent needs, from the command line and boot.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootArgs {
    /// Farm API URLs.
    pub api: Vec<String>,
    /// The MAC to log in as.
    pub mac: Option<String>,
    /// The farm's CA certificate file.
    pub ca: Option<PathBuf>,
    /// The login ticket of this boot (from the boot script's `ferry.ticket=`).
    pub ticket: Option<String>,
    /// Block device or directory of the overflow.
    pub overflow: Option<PathBuf>,
    /// Kernel NBD device.
    pub device: PathBuf,
    /// NBD servers (no farm).
    pub servers: Vec<String>,
    /// Export name (no farm).
    pub export: Option<String>,
    /// Cache mode (no farm), as written.
    pub cache: Option<String>,
    /// The vDisk the boot script chose.
    pub vdisk: Option<String>,
    /// The version the boot script chose.
    pub version: Option<i64>,
    /// `ferry.prefetch=0` turns the device's boot-set prefetch off (`None`: on).
    pub prefetch: Option<bool>,
    /// `ferry.tpm=0` keeps the device key out of the machine's TPM (`None`: in it, when
    /// there is one).
    pub tpm: Option<bool>,
    /// `ferry.login_wait=SECONDS`: how long the farm's API may stay unreachable at boot
    /// (`None`: the agent's default).
    pub login_wait: Option<std::time::Duration>,
    /// `ferry.attach_wait=SECONDS`: how long attaching the vDisk may take (`None`: the
    /// agent's default).
    pub attach_wait: Option<std::time::Duration>,
    /// Keys skipped as unknown (at most [`LIST_MAX`], each cut to
    /// [`UNKNOWN_KEY_CHARS_MAX`] characters).
    pub unknown: Vec<String>,
}

/// A value the agent cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {key}={value:?}: {reason}")]
pub struct ArgError {
    /// Where it came from (`kernel command line`, `/etc/ferry/boot.conf`).
    pub source_name: String,
    /// The key.
    pub key: String,
    /// The value as given.
    pub value: String,
    /// Why it is refused.
    pub reason: &'static str,
}

impl BootArgs {
    /// The defaults, before any text.
    pub fn new() -> BootArgs {
        BootArgs {
            device: PathBuf::from(DEFAULT_DEVICE),
            ..BootArgs::default()
        }
    }

    /// Applies boot.conf's `KEY=VALUE` lines (`#` comments and blank lines skipped).
    ///
    /// # Errors
    /// [`ArgError`] for a bad value.
    pub fn apply_config(&mut self, text: &str, source_name: &str) -> Result<(), ArgError> {
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                self.set(k.trim(), v.trim().trim_matches('"'), source_name)?;
            }
        }
        Ok(())
    }

    /// Applies the kernel command line's `ferry.KEY=VALUE` words (others are the kernel's
    /// and the init's, and are skipped).
    ///
    /// # Errors
    /// [`ArgError`] for a bad value.
    pub fn apply_cmdline(&mut self, text: &str) -> Result<(), ArgError> {
        for word in text.split_ascii_whitespace() {
            if let Some((k, v)) = word.strip_prefix("ferry.").and_then(|w| w.split_once('=')) {
                self.set(k, v, "kernel command line")?;
            }
        }
        Ok(())
    }

    fn set(&mut self, key: &str, value: &str, source_name: &str) -> Result<(), ArgError> {
        let bad = |reason| ArgError {
            source_name: source_name.to_string(),
            key: key.to_string(),
            value: value.chars().take(256).collect(),
            reason,
        };
        let list = |v: &str| -> Result<Vec<String>, ArgError> {
            let items: Vec<String> = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if items.is_empty() {
                return Err(bad("empty list"));
            }
            if items.len() > LIST_MAX {
                return Err(bad("too many entries"));
            }
            Ok(items)
        };
        let path = |v: &str| -> Result<PathBuf, ArgError> {
            if !v.starts_with('/') {
                return Err(bad("must be an absolute path"));
            }
            Ok(PathBuf::from(v))
        };
        match key {
            "api" => self.api = list(value)?,
            "server" => self.servers = list(value)?,
            "mac" => {
                value
                    .parse::<crate::Mac>()
                    .map_err(|_| bad("not a MAC address"))?;
                self.mac = Some(value.to_string());
            }
            "ca" => self.ca = Some(path(value)?),
            "ticket" => {
                let ok = value.len() <= crate::login::TICKET_CHARS_MAX
                    && value
                        .strip_prefix(crate::login::TICKET_PREFIX)
                        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
                if !ok {
                    return Err(bad("not a login ticket (ft_ and hex digits)"));
                }
                self.ticket = Some(value.to_string());
            }
            "overflow" => self.overflow = Some(path(value)?),
            "device" => {
                if !value.starts_with("/dev/nbd") {
                    return Err(bad("must be a kernel NBD device, /dev/nbdN"));
                }
                self.device = PathBuf::from(value);
            }
            "export" => self.export = Some(value.to_string()),
            "cache" => self.cache = Some(value.to_string()),
            "vdisk" => self.vdisk = Some(value.to_string()),
            "version" => {
                self.version = Some(value.parse().map_err(|_| bad("not a version number"))?);
            }
            "prefetch" | "tpm" => {
                let on = match value {
                    "1" | "on" | "yes" => true,
                    "0" | "off" | "no" => false,
                    _ => return Err(bad("must be 0 or 1")),
                };
                if key == "tpm" {
                    self.tpm = Some(on);
                } else {
                    self.prefetch = Some(on);
                }
            }
            "login_wait" | "attach_wait" => {
                let secs: u64 = value.parse().map_err(|_| bad("not a number of seconds"))?;
                if secs == 0 || secs > WAIT_SECONDS_MAX {
                    return Err(bad("must be 1 to 3600 seconds"));
                }
                let wait = Some(std::time::Duration::from_secs(secs));
                if key == "login_wait" {
                    self.login_wait = wait;
                } else {
                    self.attach_wait = wait;
                }
            }
            // Unknown keys: a newer boot script's; skipped, not fatal, and kept (the first
            // LIST_MAX) so that the agent can say which it skipped.
            _ => {
                let kept: String = key.chars().take(UNKNOWN_KEY_CHARS_MAX).collect();
                if self.unknown.len() < LIST_MAX && !self.unknown.contains(&kept) {
                    self.unknown.push(kept);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_overrides_the_config_and_skips_other_words() {
        let mut a = BootArgs::new();
        a.apply_config(
            "# farm\napi=https://a:1\nca=/etc/ferry/ca.pem\n\noverflow=\"/dev/vda\"\n",
            "boot.conf",
        )
        .unwrap();
        a.apply_cmdline(
            "BOOT_IMAGE=k root=/dev/nbd0p1 boot=ferry ferry.api=https://b:2,https://c:3 \
             ferry.mac=52:54:00:12:34:56 ferry.version=7 ferry.ticket=ft_0a1B ferry.future=x quiet",
        )
        .unwrap();
        assert_eq!(a.api, ["https://b:2", "https://c:3"]);
        assert_eq!(
            a.ca.as_deref(),
            Some(std::path::Path::new("/etc/ferry/ca.pem"))
        );
        assert_eq!(
            a.overflow.as_deref(),
            Some(std::path::Path::new("/dev/vda"))
        );
        assert_eq!(a.ticket.as_deref(), Some("ft_0a1B"));
        assert_eq!(a.mac.as_deref(), Some("52:54:00:12:34:56"));
        assert_eq!(a.version, Some(7));
        assert_eq!(a.device, PathBuf::from(DEFAULT_DEVICE));
        assert_eq!(a.prefetch, None);
        assert_eq!(a.unknown, ["future"]);
        assert_eq!(a.login_wait, None);
        a.apply_cmdline("ferry.login_wait=5 ferry.attach_wait=30")
            .unwrap();
        assert_eq!(a.login_wait, Some(std::time::Duration::from_secs(5)));
        assert_eq!(a.attach_wait, Some(std::time::Duration::from_secs(30)));
        a.apply_cmdline("ferry.prefetch=0 ferry.tpm=0").unwrap();
        assert_eq!((a.prefetch, a.tpm), (Some(false), Some(false)));
        // A long unknown key is kept cut, once, however often it comes (found by fuzzing).
        let long = format!("ferry.{}=1", "k".repeat(100));
        a.apply_cmdline(&format!("{long} {long}")).unwrap();
        a.apply_cmdline(&long).unwrap();
        assert_eq!(a.unknown.len(), 2);
        assert_eq!(a.unknown[1].chars().count(), UNKNOWN_KEY_CHARS_MAX);
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("ferry.mac=zz", "mac", "not a MAC address"),
            ("ferry.version=x", "version", "not a version number"),
            (
                "ferry.device=/dev/sda",
                "device",
                "must be a kernel NBD device, /dev/nbdN",
            ),
            (
                "ferry.overflow=relative",
                "overflow",
                "must be an absolute path",
            ),
            (
                "ferry.ticket=ft_zz",
                "ticket",
                "not a login ticket (ft_ and hex digits)",
            ),
            ("ferry.api=,", "api", "empty list"),
            ("ferry.prefetch=maybe", "prefetch", "must be 0 or 1"),
            (
                "ferry.login_wait=soon",
                "login_wait",
                "not a number of seconds",
            ),
            (
                "ferry.login_wait=0",
                "login_wait",
                "must be 1 to 3600 seconds",
            ),
            (
                "ferry.attach_wait=3601",
                "attach_wait",
                "must be 1 to 3600 seconds",
            ),
        ];
        for (line, key, reason) in cases {
            let e = BootArgs::new().apply_cmdline(line).unwrap_err();
            assert_eq!((e.key.as_str(), e.reason), (key, reason), "{line}");
            assert!(e.to_string().contains("kernel command line"), "{e}");
        }
        let many = format!("ferry.server={}", vec!["h:1"; LIST_MAX + 1].join(","));
        assert_eq!(
            BootArgs::new().apply_cmdline(&many).unwrap_err().reason,
            "too many entries"
        );
    }
}
