//! Checks of untrusted input (API bodies): names, free text, MAC addresses, sizes, store
//! paths and pagination. Each limit is a named constant; each failure is
//! [`crate::Kind::InvalidInput`] with a message naming the field.

use std::path::{Component, Path, PathBuf};

use contract::name::{NameError, check_plain_name};
use contract::{Mac, MacError};

use crate::error::{FarmError, Result};

/// The longest name (site, server, store, collection, device, vDisk, token), in bytes.
pub const NAME_BYTES_MAX: usize = 200;
/// The longest free text (descriptions, addresses, paths), in bytes.
pub const TEXT_BYTES_MAX: usize = 4096;
/// The largest vDisk and RAM cache size accepted: 64 TiB, the VHDX limit.
pub const SIZE_BYTES_MAX: i64 = 64 << 40;
/// The longest per-vDisk boot command line and boot file path, in bytes.
pub const BOOT_TEXT_BYTES_MAX: usize = 1024;
/// The default page size of a list.
pub const PAGE_LIMIT_DEFAULT: i64 = 100;
/// The largest page size of a list.
pub const PAGE_LIMIT_MAX: i64 = 1000;

/// Checks a name: 1 to [`NAME_BYTES_MAX`] bytes, not starting with '.', without '/', '\\',
/// '@', '+' or control characters (the rules of a vDisk name in the store,
/// `contract::name::check_plain_name`, applied to every name so that any can become a file
/// or export name).
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn name(field: &str, value: &str) -> Result<()> {
    check_plain_name(value, NAME_BYTES_MAX).map_err(|e| {
        FarmError::invalid(match e {
            NameError::InvalidVdiskLength => {
                format!("{field} must have 1 to {NAME_BYTES_MAX} bytes")
            }
            NameError::LeadingDotVdisk => format!("{field} must not start with '.'"),
            _ => format!("{field} must not contain '/', '\\', '@', '+' or control characters"),
        })
    })
}

/// Checks free text: at most [`TEXT_BYTES_MAX`] bytes, no NUL.
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn text(field: &str, value: &str) -> Result<()> {
    if value.len() > TEXT_BYTES_MAX {
        return Err(FarmError::invalid(format!(
            "{field} must have at most {TEXT_BYTES_MAX} bytes"
        )));
    }
    if value.contains('\0') {
        return Err(FarmError::invalid(format!("{field} must not contain NUL")));
    }
    Ok(())
}

/// True for a character a kernel argument in a boot script may hold: ASCII letters, digits
/// and `._:=,/+@%-[]` (no space, quote, `$`, `#`, `&`, `|` or control character, which iPXE
/// or the kernel would read as syntax).
pub fn boot_arg_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._:=,/+@%-[]".contains(c)
}

/// The longest API URL a server registers.
pub const API_URL_BYTES_MAX: usize = 200;

/// Checks a server's API URL (`http(s)://HOST:PORT`): boot scripts put it on the kernel
/// command line, so it holds [`boot_arg_char`]s only, no `,` (the list's separator), and
/// at most [`API_URL_BYTES_MAX`] bytes.
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn api_url(value: &str) -> Result<()> {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"));
    let ok = value.len() <= API_URL_BYTES_MAX
        && rest.is_some_and(|r| !r.is_empty() && r.chars().all(|c| c != ',' && boot_arg_char(c)));
    if !ok {
        return Err(FarmError::invalid(format!(
            "api_url must be http(s)://HOST:PORT of at most {API_URL_BYTES_MAX} bytes of \
             letters, digits and ._:/+@%-[]"
        )));
    }
    Ok(())
}

/// Checks a vDisk's boot command line: at most [`BOOT_TEXT_BYTES_MAX`] bytes of kernel
/// arguments separated by spaces, each of [`boot_arg_char`]s.
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn boot_cmdline(value: &str) -> Result<()> {
    if value.len() > BOOT_TEXT_BYTES_MAX {
        return Err(FarmError::invalid(format!(
            "boot_cmdline must have at most {BOOT_TEXT_BYTES_MAX} bytes"
        )));
    }
    if let Some(c) = value.chars().find(|&c| c != ' ' && !boot_arg_char(c)) {
        return Err(FarmError::invalid(format!(
            "boot_cmdline must not contain {c:?}: kernel arguments of letters, digits and \
             ._:=,/+@%-[] separated by spaces"
        )));
    }
    Ok(())
}

/// Checks a boot file's path inside a version's filesystem: a file under `/boot` (as the
/// booted system sees it; on an image with a separate `/boot` partition, that partition),
/// at most [`BOOT_TEXT_BYTES_MAX`] bytes, no empty, `.` or `..` component, no control
/// character. The boot port serves boot files to unauthenticated machines, so a path
/// anywhere else in the image (`/etc/shadow`, a key) is refused here, and again when read
/// (with the image's symlinks resolved, by `bootfiles::read`).
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn boot_path(field: &str, value: &str) -> Result<()> {
    let under_boot = value.strip_prefix("/boot/").is_some_and(|rest| {
        rest.split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
    });
    let bad =
        value.len() > BOOT_TEXT_BYTES_MAX || !under_boot || value.chars().any(char::is_control);
    if bad {
        return Err(FarmError::invalid(format!(
            "{field} must name a file under /boot in the version's filesystem (at most \
             {BOOT_TEXT_BYTES_MAX} bytes, no . or .. component), e.g. \
             /boot/vmlinuz-6.1.0-13-amd64: the boot port serves nothing else"
        )));
    }
    Ok(())
}

/// Checks a size in bytes: 1 to [`SIZE_BYTES_MAX`].
///
/// # Errors
/// [`crate::Kind::InvalidInput`].
pub fn size(field: &str, value: i64) -> Result<()> {
    if !(1..=SIZE_BYTES_MAX).contains(&value) {
        return Err(FarmError::invalid(format!(
            "{field} must be 1 to {SIZE_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

/// Normalizes a MAC address (`AA-BB-CC-DD-EE-FF`, `aa:bb:...`, `aabbccddeeff`; the rules
/// are [`Mac`]'s). Its text is lowercase `aa:bb:cc:dd:ee:ff`.
///
/// # Errors
/// [`crate::Kind::InvalidInput`] for anything that is not six hex bytes.
pub fn mac(value: &str) -> Result<Mac> {
    value
        .parse()
        .map_err(|_: MacError| FarmError::invalid(format!("invalid mac address {value:?}")))
}

/// Checks a store path and returns it normalized: relative to the store root (an absolute
/// path is accepted when it lies under `root`), with no component that leaves the root.
/// Its longest existing ancestor, with symlinks resolved, must lie under the canonical root
/// too, so a symlink in the store root never leads a store out of it (the rest does not
/// exist yet and has no `..`).
///
/// # Errors
/// [`crate::Kind::InvalidInput`] for an empty path or one that escapes the root.
pub fn store_path(root: &Path, value: &str) -> Result<String> {
    text("path", value)?;
    let escape = || FarmError::invalid(format!("store path {value:?} escapes the store root"));
    let given = Path::new(value);
    let relative = if given.is_absolute() {
        given.strip_prefix(root).map_err(|_| escape())?
    } else {
        given
    };
    let mut parts: Vec<String> = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(p) => {
                let p = p
                    .to_str()
                    .ok_or_else(|| FarmError::invalid("store path is not UTF-8"))?;
                parts.push(p.to_string());
            }
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop().ok_or_else(escape)?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(escape()),
        }
    }
    if parts.is_empty() {
        return Err(FarmError::invalid(
            "store path must name a directory under the store root",
        ));
    }
    let normalized = parts.join("/");
    let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let joined: PathBuf = real_root.join(&normalized);
    if !crate::confine::under(&real_root, &joined) {
        return Err(escape());
    }
    Ok(normalized)
}

/// Checks a store's bucket URL (`s3://BUCKET[/PREFIX]`, or empty for a directory store)
/// and returns it in its normal form.
///
/// # Errors
/// [`crate::Kind::InvalidInput`] naming what is wrong.
pub fn bucket_url(field: &str, value: &str) -> Result<String> {
    if value.is_empty() {
        return Ok(String::new());
    }
    contract::BucketUrl::parse(value)
        .map(|u| u.to_string())
        .map_err(|e| FarmError::invalid(format!("{field}: {e}")))
}

/// Checks `limit` and `offset` of a list and returns them with the default applied.
///
/// # Errors
/// [`crate::Kind::InvalidInput`] for a limit outside 1..=[`PAGE_LIMIT_MAX`] or a negative
/// offset.
pub fn page(limit: Option<i64>, offset: Option<i64>) -> Result<(i64, i64)> {
    let limit = limit.unwrap_or(PAGE_LIMIT_DEFAULT);
    if !(1..=PAGE_LIMIT_MAX).contains(&limit) {
        return Err(FarmError::invalid(format!(
            "limit must be 1 to {PAGE_LIMIT_MAX}"
        )));
    }
    let offset = offset.unwrap_or(0);
    if offset < 0 {
        return Err(FarmError::invalid("offset must not be negative"));
    }
    Ok((limit, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_forms_normalize_to_lowercase_colons() {
        assert_eq!(
            mac("AA-BB-CC-00-11-22").unwrap().to_string(),
            "aa:bb:cc:00:11:22"
        );
        assert_eq!(
            mac("aabbcc001122").unwrap().to_string(),
            "aa:bb:cc:00:11:22"
        );
    }

    #[test]
    fn mac_with_wrong_length_is_refused() {
        assert!(mac("aa:bb:cc:dd:ee").is_err());
        assert!(mac("aa:bb:cc:dd:ee:fg").is_err());
        assert!(mac("a:ab:bc:cd:de:ef:f").is_err());
    }

    #[test]
    fn store_path_with_dotdot_out_of_root_is_refused() {
        let root = Path::new("/srv/ferry");
        assert!(store_path(root, "../etc").is_err());
        assert!(store_path(root, "a/../../etc").is_err());
        assert!(store_path(root, "/etc").is_err());
        assert!(store_path(root, "").is_err());
    }

    #[test]
    fn store_path_inside_root_is_normalized() {
        let root = Path::new("/srv/ferry");
        assert_eq!(store_path(root, "a/./b/../c").unwrap(), "a/c");
        assert_eq!(store_path(root, "/srv/ferry/x").unwrap(), "x");
    }

    #[test]
    fn boot_overrides_are_checked() {
        assert!(boot_cmdline("").is_ok());
        assert!(boot_cmdline("console=ttyS0,115200 quiet net.ifnames=0").is_ok());
        for bad in ["a\nkernel x", "${x}", "a || b", "q\"x", "a#b", "a\tb"] {
            assert!(boot_cmdline(bad).is_err(), "{bad:?}");
        }
        assert!(boot_path("k", "/boot/vmlinuz-6.1").is_ok());
        for bad in [
            "boot/vmlinuz",
            "/boot/../etc/shadow",
            "/a/./b",
            "/a\nb",
            "/etc/shadow",
            "/var/lib/ferry/secrets/farm.key",
            "/boot",
            "/boot/",
            "/bootx/vmlinuz",
            "/boot//vmlinuz",
        ] {
            assert!(boot_path("k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn name_with_slash_or_leading_dot_is_refused() {
        assert!(name("name", "a/b").is_err());
        assert!(name("name", ".hidden").is_err());
        assert!(name("name", "").is_err());
        assert!(name("name", "golden-2024").is_ok());
    }
}
