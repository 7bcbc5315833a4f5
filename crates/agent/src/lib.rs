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
//!                                  stats::IoCounted      bytes, IOPS, boot time
//!                                        ▼
//!             ram | ram-overflow | disk:  write_cache::WriteCache ──► overflow file
//!                                        ▼
//!             (--host-cache, prefetch) host_read::HostCached ──► host_cache (per host)
//!                                        ▼    ▲ prefetch::Prefetch: the boot set, ahead
//!                                  remote::Remote        failover + replay log
//!                                        ▼
//!                                  client::Connection    pipelined NBD over TCP or TLS
//!                                        │ handshake.rs: greeting, STARTTLS, GO
//!                                        ▼
//!                                  ferry server  NAME | NAME+DEV[+persistent] | NAME+private
//! ```
//!
//! In the server modes there is no local cache: the export is the server's write cache
//! (`NAME+DEV`, `NAME+DEV+persistent`) or the vDisk itself (`NAME+private`). Export names,
//! cache modes, MACs and the login wire format are the `contract` crate's, shared with the
//! server and the farm.
//!
//! The boot set comes from the farm after device login (`boot_set_fetch.rs`).
//!
//! `daemon.rs` runs it all with a control socket (`control.rs`) that answers `status` and
//! `mark-booted`. `kernel.rs` gives the export to the kernel's NBD driver as `/dev/nbdN`
//! (through its netlink interface, `nbd_netlink.rs`, or its ioctls); `report.rs` posts the
//! agent's counters to the farm.

#![warn(missing_docs)]

pub mod boot;
pub mod boot_set_fetch;
pub mod client;
pub mod control;
pub mod daemon;
pub mod grant;
mod handshake;
pub mod host_read;
pub mod kernel;
pub mod login;
pub mod nbd_netlink;
pub mod prefetch;
pub mod remote;
pub mod report;
pub mod server_list;
pub mod stats;
pub mod tpm;

pub use daemon::{AgentConfig, AgentError, HostCacheConfig, VersionIdentity, run};
pub use stats::Status;

/// Where the device's writes go: the `contract` crate's mode, shared with the farm (which
/// spells it `ram_overflow`, `server_persistent`); the agent shows [`CacheMode::cli_name`].
pub use contract::CacheMode;

/// The local write-cache mode of `mode`, for the modes that keep writes on the device.
pub fn local_mode(mode: CacheMode) -> Option<write_cache::Mode> {
    match mode {
        CacheMode::Ram => Some(write_cache::Mode::Ram),
        CacheMode::RamOverflow => Some(write_cache::Mode::RamOverflow),
        CacheMode::Disk => Some(write_cache::Mode::Disk),
        CacheMode::Server | CacheMode::ServerPersistent | CacheMode::Private => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_modes_are_the_ones_contract_calls_local() {
        for m in CacheMode::ALL {
            assert_eq!(local_mode(m).is_some(), m.is_local(), "{}", m.cli_name());
        }
    }
}
