//! The names an export name is made of: a vDisk's name and a device's name.
//!
//! ```text
//!   vdisk name   1 to 200 bytes, not starting with '.', no '/' '\' '@' '+' or control
//!                characters ('@' and '+' separate the parts of an export name), and not
//!                starting with "ferry-s-" (the prefix of session exports)
//!   device name  1 to 64 bytes of [A-Za-z0-9._-], not starting with '.', and not a mode
//!                word of export names ("private", "persistent"); it names a directory of
//!                the server's write caches
//! ```
//!
//! Both are checked once, when the value is made ([`VdiskName::new`], [`DeviceName::new`],
//! `FromStr`), so code holding one never checks again.

use std::fmt;
use std::str::FromStr;

use crate::mac::Mac;

/// Export names that start with this are device-login sessions (no vDisk name may).
pub const SESSION_EXPORT_PREFIX: &str = "ferry-s-";

/// The longest vDisk name, in bytes.
pub const VDISK_NAME_BYTES_MAX: usize = 200;
/// The longest device name, in bytes.
pub const DEVICE_NAME_BYTES_MAX: usize = 64;

/// What is wrong with a name. The messages are the server's (they reach NBD clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// A device name has a byte other than `[A-Za-z0-9._-]`.
    #[error("{}", self.reason())]
    InvalidDeviceChar,
    /// A device name is empty or longer than [`DEVICE_NAME_BYTES_MAX`].
    #[error("{}", self.reason())]
    InvalidDeviceLength,
    /// A vDisk name has '/', '\\', '@', '+' or a control character.
    #[error("{}", self.reason())]
    InvalidVdiskChar,
    /// A vDisk name is empty or longer than [`VDISK_NAME_BYTES_MAX`].
    #[error("{}", self.reason())]
    InvalidVdiskLength,
    /// A device name starts with '.'.
    #[error("{}", self.reason())]
    LeadingDotDevice,
    /// A vDisk name starts with '.'.
    #[error("{}", self.reason())]
    LeadingDotVdisk,
    /// A device name is `private` or `persistent`.
    #[error("{}", self.reason())]
    ReservedDeviceName,
    /// A vDisk name starts with [`SESSION_EXPORT_PREFIX`].
    #[error("{}", self.reason())]
    ReservedVdiskPrefix,
}

impl NameError {
    /// The message, as a static string (for error types that keep a `&'static str`).
    pub fn reason(self) -> &'static str {
        match self {
            NameError::InvalidDeviceChar => {
                "a device name has only letters, digits, '.', '_' and '-'"
            }
            NameError::InvalidDeviceLength => "a device name has 1 to 64 bytes",
            NameError::InvalidVdiskChar => {
                "a vdisk name has no '/', '\\', '@', '+' or control characters"
            }
            NameError::InvalidVdiskLength => "a vdisk name has 1 to 200 bytes",
            NameError::LeadingDotDevice => "a device name does not start with '.'",
            NameError::LeadingDotVdisk => "a vdisk name does not start with '.'",
            NameError::ReservedDeviceName => "'private' and 'persistent' are export modes",
            NameError::ReservedVdiskPrefix => {
                "a vdisk name does not start with 'ferry-s-' (session exports)"
            }
        }
    }
}

/// Checks the rules every name of the farm follows (the vDisk rules but the session
/// prefix): 1 to `bytes_max` bytes, not starting with '.', without '/', '\\', '@', '+' or
/// control characters. The farm applies it to the names of all its objects, so that any
/// of them can become a file or export name.
///
/// # Errors
/// [`NameError::InvalidVdiskLength`], [`NameError::LeadingDotVdisk`],
/// [`NameError::InvalidVdiskChar`].
pub fn check_plain_name(name: &str, bytes_max: usize) -> Result<(), NameError> {
    if name.is_empty() || name.len() > bytes_max {
        return Err(NameError::InvalidVdiskLength);
    }
    if name.starts_with('.') {
        return Err(NameError::LeadingDotVdisk);
    }
    if name
        .chars()
        .any(|c| matches!(c, '/' | '\\' | '@' | '+') || c.is_control())
    {
        return Err(NameError::InvalidVdiskChar);
    }
    Ok(())
}

/// A vDisk's name (rules in the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VdiskName(String);

impl VdiskName {
    /// Checks `name`.
    ///
    /// # Errors
    /// [`NameError`]: the first rule `name` breaks.
    pub fn new(name: &str) -> Result<VdiskName, NameError> {
        check_plain_name(name, VDISK_NAME_BYTES_MAX)?;
        if name.starts_with(SESSION_EXPORT_PREFIX) {
            return Err(NameError::ReservedVdiskPrefix);
        }
        Ok(VdiskName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VdiskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for VdiskName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<VdiskName, NameError> {
        VdiskName::new(s)
    }
}

/// A device's name in export names and write-cache directories (rules in the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceName(String);

impl DeviceName {
    /// Checks `name`.
    ///
    /// # Errors
    /// [`NameError`]: the first rule `name` breaks.
    pub fn new(name: &str) -> Result<DeviceName, NameError> {
        if name.is_empty() || name.len() > DEVICE_NAME_BYTES_MAX {
            return Err(NameError::InvalidDeviceLength);
        }
        if name.starts_with('.') {
            return Err(NameError::LeadingDotDevice);
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(NameError::InvalidDeviceChar);
        }
        if name == "private" || name == "persistent" {
            return Err(NameError::ReservedDeviceName);
        }
        Ok(DeviceName(name.to_string()))
    }

    /// The name a logged-in device's write cache has on the server: its MAC with '-' for
    /// ':' (`aa-bb-cc-dd-ee-ff`).
    pub fn of_mac(mac: Mac) -> DeviceName {
        DeviceName(mac.to_string().replace(':', "-"))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for DeviceName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<DeviceName, NameError> {
        DeviceName::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vdisk_name_with_plus_is_invalid() {
        assert_eq!(VdiskName::new("a+b"), Err(NameError::InvalidVdiskChar));
    }

    #[test]
    fn vdisk_name_of_201_bytes_is_too_long() {
        let long = "a".repeat(VDISK_NAME_BYTES_MAX + 1);
        assert_eq!(VdiskName::new(&long), Err(NameError::InvalidVdiskLength));
    }

    #[test]
    fn hidden_vdisk_name_is_invalid() {
        assert_eq!(VdiskName::new(".golden"), Err(NameError::LeadingDotVdisk));
    }

    #[test]
    fn vdisk_name_with_the_session_prefix_is_reserved() {
        assert_eq!(
            VdiskName::new("ferry-s-golden"),
            Err(NameError::ReservedVdiskPrefix)
        );
    }

    #[test]
    fn vdisk_name_may_have_dots_spaces_and_unicode() {
        assert!(VdiskName::new("win10 22h2.é").is_ok());
    }

    #[test]
    fn mac_style_device_name_is_valid() {
        assert!(DeviceName::new("00-15-5d-01-02-03").is_ok());
    }

    #[test]
    fn device_name_with_slash_is_invalid() {
        assert_eq!(DeviceName::new("../etc"), Err(NameError::LeadingDotDevice));
        assert_eq!(DeviceName::new("a/b"), Err(NameError::InvalidDeviceChar));
    }

    #[test]
    fn mode_words_are_not_device_names() {
        assert_eq!(
            DeviceName::new("persistent"),
            Err(NameError::ReservedDeviceName)
        );
    }

    #[test]
    fn device_name_of_a_mac_uses_dashes() {
        let mac: Mac = "AA:bb:CC:00:00:01".parse().unwrap();
        assert_eq!(DeviceName::of_mac(mac).as_str(), "aa-bb-cc-00-00-01");
    }
}
