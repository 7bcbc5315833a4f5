//! Gives the agent's export to the Linux kernel's NBD driver as a block device
//! (`/dev/nbdN`), the way `nbd-client` does: the agent connects to its own export socket,
//! negotiates (without structured replies, which the driver does not read), and hands the
//! connected socket to the driver: through the driver's netlink interface
//! (`crate::nbd_netlink`), which nothing in the agent waits on, so no signal to the agent
//! (systemd's shutdown sends every process SIGSTOP and SIGCONT) shuts the device down; on a
//! kernel without it, with the `NBD_SET_*` ioctls and a thread that sits in `NBD_DO_IT`.
//!
//! ```text
//!   ext4 / systemd ──► /dev/nbd0 (kernel NBD driver) ──unix socket──► agent export
//!                                                                      (write cache,
//!                                                                       failover, TLS)
//! ```
//!
//! The agent stays the NBD server, so every write-cache mode works under the kernel, and a
//! server's loss is the agent's failover, not an I/O error: no request timeout is set
//! (the driver then warns about a slow request and waits, it does not fail it).

// The NBD driver's interface is ioctls, which are unsafe calls; each is documented.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use rustix::ioctl::{IntegerSetter, NoArg, Opcode, ioctl, opcode};

use crate::handshake::{ExportInfo, negotiate_simple};

/// The NBD driver's ioctl group (`linux/nbd.h`).
const NBD_GROUP: u8 = 0xab;
const NBD_SET_SOCK: Opcode = opcode::none(NBD_GROUP, 0);
const NBD_SET_BLKSIZE: Opcode = opcode::none(NBD_GROUP, 1);
const NBD_DO_IT: Opcode = opcode::none(NBD_GROUP, 3);
const NBD_CLEAR_SOCK: Opcode = opcode::none(NBD_GROUP, 4);
const NBD_CLEAR_QUE: Opcode = opcode::none(NBD_GROUP, 5);
const NBD_SET_SIZE_BLOCKS: Opcode = opcode::none(NBD_GROUP, 7);
const NBD_SET_FLAGS: Opcode = opcode::none(NBD_GROUP, 10);

/// The logical block size given to the driver: 512, the sector size of the partition
/// tables of captured disks (a 4096-byte block would make the kernel look for a GPT
/// header at byte 4096). The page cache still sends requests of many sectors.
pub const KERNEL_BLOCK_BYTES: u64 = 512;

/// Why the kernel could not be given the device.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The agent's export socket refused or failed.
    #[error("connect to the agent's export {path}: {source}")]
    Connect {
        /// The export socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The NBD negotiation with the agent's export failed.
    #[error("negotiate with the agent's export: {0}")]
    Negotiate(String),
    /// The export's size is not a whole number of blocks.
    #[error("the vDisk's size {0} bytes is not a multiple of {KERNEL_BLOCK_BYTES}")]
    Size(u64),
    /// The device node could not be opened (no `nbd` module, or no such device).
    #[error("open {path} (is the nbd module loaded?): {source}")]
    Open {
        /// The device node.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The driver's netlink interface refused the socket (the device in use, say).
    #[error("give {path} to the kernel through netlink: {reason}")]
    Netlink {
        /// The device node.
        path: PathBuf,
        /// The kernel's answer.
        reason: String,
    },
    /// An ioctl failed (the device is in use by another client, say).
    #[error("{what} on {path}: {source}")]
    Ioctl {
        /// Which ioctl.
        what: &'static str,
        /// The device node.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A block device the kernel serves from the agent's export.
#[derive(Debug)]
pub struct KernelDisk {
    /// The device node.
    pub device: PathBuf,
    /// What the export said about itself.
    pub info: ExportInfo,
    /// The thread in `NBD_DO_IT` (the ioctl interface); it ends when the connection does.
    /// `None` through netlink, where no thread waits: the driver holds the socket.
    pub thread: Option<JoinHandle<Result<(), KernelError>>>,
    /// The agent's end of the socket the driver was given through netlink (kept open for
    /// the device's life; the driver holds its own reference as well).
    pub socket: Option<UnixStream>,
}

/// Connects to the agent's export at `socket` (export `export`, "" for the default),
/// negotiates, and makes `device` (e.g. `/dev/nbd0`) serve it. Returns once the kernel has
/// the socket; partitions appear as `/dev/nbd0p1`… soon after (the driver scans them).
///
/// # Errors
/// [`KernelError`], naming the step.
pub fn attach(socket: &Path, export: &str, device: &Path) -> Result<KernelDisk, KernelError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| KernelError::Connect {
        path: socket.to_path_buf(),
        source,
    })?;
    let info =
        negotiate_simple(&mut stream, export).map_err(|f| KernelError::Negotiate(f.to_string()))?;
    if !info.size.is_multiple_of(KERNEL_BLOCK_BYTES) {
        return Err(KernelError::Size(info.size));
    }
    if let Some(index) = device_index(device) {
        match crate::nbd_netlink::connect(
            index,
            stream.as_raw_fd(),
            info.size,
            KERNEL_BLOCK_BYTES,
            u64::from(info.flags),
        ) {
            Ok(()) => {
                return Ok(KernelDisk {
                    device: device.to_path_buf(),
                    info,
                    thread: None,
                    socket: Some(stream),
                });
            }
            Err(crate::nbd_netlink::NetlinkError::NoFamily) => {
                tracing::info!("no nbd netlink interface in this kernel: the NBD ioctls instead");
            }
            Err(e) => {
                return Err(KernelError::Netlink {
                    path: device.to_path_buf(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map_err(|source| KernelError::Open {
            path: device.to_path_buf(),
            source,
        })?;
    let path = device.to_path_buf();
    let fail = |what: &'static str| {
        let path = path.clone();
        move |e: rustix::io::Errno| KernelError::Ioctl {
            what,
            path,
            source: e.into(),
        }
    };
    // A device left over from a failed attempt: drop its old socket first.
    clear(&file);
    set::<NBD_SET_BLKSIZE>(&file, KERNEL_BLOCK_BYTES as usize).map_err(fail("NBD_SET_BLKSIZE"))?;
    let blocks = usize::try_from(info.size / KERNEL_BLOCK_BYTES).unwrap_or(usize::MAX);
    set::<NBD_SET_SIZE_BLOCKS>(&file, blocks).map_err(fail("NBD_SET_SIZE_BLOCKS"))?;
    set::<NBD_SET_FLAGS>(&file, usize::from(info.flags)).map_err(fail("NBD_SET_FLAGS"))?;
    let fd = usize::try_from(stream.as_raw_fd()).expect("an open fd is not negative");
    set::<NBD_SET_SOCK>(&file, fd).map_err(fail("NBD_SET_SOCK"))?;
    let thread_path = path.clone();
    let thread = std::thread::Builder::new()
        .name("ferry-nbd-do-it".into())
        .spawn(move || {
            // The socket must stay open while the kernel uses it.
            let _stream = stream;
            // SAFETY: NBD_DO_IT takes no argument; `file` is the open device node.
            let r = unsafe { ioctl(&file, NoArg::<NBD_DO_IT>::new()) };
            clear(&file);
            r.map(|_| ()).map_err(|e| KernelError::Ioctl {
                what: "NBD_DO_IT",
                path: thread_path,
                source: e.into(),
            })
        })
        .map_err(|source| KernelError::Ioctl {
            what: "spawn the NBD_DO_IT thread",
            path: path.clone(),
            source,
        })?;
    Ok(KernelDisk {
        device: path,
        info,
        thread: Some(thread),
        socket: None,
    })
}

/// The `N` of a `/dev/nbdN` path.
fn device_index(device: &Path) -> Option<u32> {
    device
        .file_name()?
        .to_str()?
        .strip_prefix("nbd")?
        .parse()
        .ok()
}

/// One `NBD_SET_*` ioctl with an integer argument.
fn set<const OP: Opcode>(file: &File, value: usize) -> Result<(), rustix::io::Errno> {
    // SAFETY: every NBD_SET_* opcode used here takes an unsigned long by value, and
    // `value` is a plain integer (a size, a count, flags or a file descriptor this process
    // holds open).
    unsafe { ioctl(file, IntegerSetter::<OP>::new_usize(value)) }
}

/// Drops a device's queue and socket (harmless on a device that has none).
fn clear(file: &File) {
    // SAFETY: NBD_CLEAR_QUE and NBD_CLEAR_SOCK take no argument.
    unsafe {
        let _ = ioctl(file, NoArg::<NBD_CLEAR_QUE>::new());
        let _ = ioctl(file, NoArg::<NBD_CLEAR_SOCK>::new());
    }
}
