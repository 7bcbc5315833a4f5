//! Ferry's target device agent: attaches a vDisk from Ferry servers over NBD, puts the
//! device's write cache over it, and exports the result as a local NBD server on a unix
//! socket (for qemu, fio, nbdfuse, or the kernel's nbd-client).
//!
//! # Layout
//!
//! ```text
//!   guest / qemu / fio ──NBD/unix──► nbd_server (the same server code as `ferry server`)
//!                                        │ TargetSource: one export
//!                                        ▼
//!                                  stats::Counted        bytes, IOPS, boot time
//!                                        ▼
//!             ram | ram-overflow | disk:  write_cache::WriteCache ──► overflow file
//!                                        ▼
//!                                  remote::Remote        failover + replay log
//!                                        ▼
//!                                  client::Connection    pipelined NBD over TCP
//!                                        ▼
//!                                  ferry server  NAME | NAME+DEV[+persistent] | NAME+private
//! ```
//!
//! In the server modes there is no local cache: the export is the server's write cache
//! (`NAME+DEV`, `NAME+DEV+persistent`) or the vDisk itself (`NAME+private`).
//!
//! `daemon.rs` runs it all with a control socket (`control.rs`) that answers `status` and
//! `mark-booted`.

#![warn(missing_docs)]

pub mod boot;
pub mod client;
pub mod control;
pub mod daemon;
pub mod login;
pub mod remote;
pub mod stats;

pub use daemon::{AgentConfig, AgentError, run};
pub use stats::Status;

/// A write-cache mode (DESIGN.md, "Write-cache modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Device RAM, fixed budget.
    Ram,
    /// Device RAM, overflow to a local file.
    RamOverflow,
    /// A local file only.
    Disk,
    /// The server's per-device cache, discarded on disconnect.
    Server,
    /// The server's per-device cache, kept.
    ServerPersistent,
    /// The vDisk itself (maintenance; one device).
    Private,
}

impl CacheMode {
    /// Every mode, in the order of the docs.
    pub const ALL: [CacheMode; 6] = [
        CacheMode::Ram,
        CacheMode::RamOverflow,
        CacheMode::Disk,
        CacheMode::Server,
        CacheMode::ServerPersistent,
        CacheMode::Private,
    ];

    /// The name used on the command line and in status.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Ram => "ram",
            CacheMode::RamOverflow => "ram-overflow",
            CacheMode::Disk => "disk",
            CacheMode::Server => "server",
            CacheMode::ServerPersistent => "server-persistent",
            CacheMode::Private => "private",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<CacheMode> {
        CacheMode::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The local write-cache mode, for the modes that keep writes on the device.
    pub fn local(self) -> Option<write_cache::Mode> {
        match self {
            CacheMode::Ram => Some(write_cache::Mode::Ram),
            CacheMode::RamOverflow => Some(write_cache::Mode::RamOverflow),
            CacheMode::Disk => Some(write_cache::Mode::Disk),
            _ => None,
        }
    }

    /// The server export this mode attaches for `vdisk` and `device`.
    pub fn export_name(self, vdisk: &str, device: &str) -> String {
        match self {
            CacheMode::Server => format!("{vdisk}+{device}"),
            CacheMode::ServerPersistent => format!("{vdisk}+{device}+persistent"),
            CacheMode::Private => format!("{vdisk}+private"),
            _ => vdisk.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_name_parses_back() {
        for m in CacheMode::ALL {
            assert_eq!(CacheMode::parse(m.name()), Some(m));
        }
    }

    #[test]
    fn server_persistent_attaches_the_persistent_export() {
        assert_eq!(
            CacheMode::ServerPersistent.export_name("golden", "pc1"),
            "golden+pc1+persistent"
        );
    }

    #[test]
    fn local_modes_attach_the_read_only_export() {
        assert_eq!(
            CacheMode::RamOverflow.export_name("golden", "pc1"),
            "golden"
        );
    }
}
