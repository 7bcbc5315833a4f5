//! `ferry-boot`: Ferry's agent inside a diskless machine. Run by the initramfs
//! (`boot=ferry`, see `dist/initramfs-tools/`) after the network is up, it logs in to the
//! farm by MAC, attaches the vDisk version with the machine's write cache (`ram`,
//! `ram-overflow` to a local disk, `disk`, or a server mode), gives the kernel
//! `/dev/nbd0`, and keeps serving it after `switch_root` (its `argv[0]` starts with '@',
//! systemd's mark of a root storage daemon it must not kill).
//!
//! ```text
//!   /proc/cmdline ferry.* ─┐
//!   /etc/ferry/boot.conf ──┴─► BootArgs ─► login (ferry.ticket=) ─► AgentConfig
//!        agent::run (unix export, failover, TLS) ◄── kernel::attach ──► /dev/nbd0
//!        writes /run/ferry/ready (or /run/ferry/failed with the reason)
//! ```
//!
//! `BootArgs` and its parser are `contract::boot_args` (pure, fuzzed).
//!
//! Every failure ends in one line on the console saying why (`ferry-boot: cannot boot:
//! …`) and the file `/run/ferry/failed`, which the initramfs script shows and then
//! panics with (the kernel reboots after `panic=N`), never a silent hang.

mod boot;
mod shutdown;

use std::process::ExitCode;

/// mimalloc instead of musl's allocator, which maps and unmaps every buffer over 128 KiB
/// (a page fault per 4 KiB on each request's buffers); see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    boot::main()
}
