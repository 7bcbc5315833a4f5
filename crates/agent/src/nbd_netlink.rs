//! Sends the NBD driver's netlink messages (`nbd_proto::netlink`, the codec): gives
//! `/dev/nbdN` the agent's socket with `NBD_CMD_CONNECT`, so that no thread of the agent
//! waits in the kernel (see `nbd_proto::netlink` for why: systemd's shutdown stops and
//! continues every process, and the ioctl interface takes that for a reason to shut the
//! device's sockets down).

use std::os::fd::{AsFd, RawFd};

use nbd_proto::netlink::{
    REPLY_BYTES_MAX, Reply, ReplyError, connect_request, family_request, read_reply,
};

/// Why the driver was not given the socket through netlink.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The kernel has no `nbd` generic netlink family (an old kernel, or no nbd module):
    /// the ioctl interface is the one left.
    #[error("the kernel has no nbd netlink family")]
    NoFamily,
    /// The kernel refused the connect (the device in use, say).
    #[error("NBD_CMD_CONNECT: {0}")]
    Refused(std::io::Error),
    /// The netlink socket failed.
    #[error("netlink: {0}")]
    Io(std::io::Error),
    /// The kernel's reply could not be read.
    #[error("netlink reply: {0}")]
    Reply(#[from] ReplyError),
}

/// Gives `/dev/nbdINDEX` the connected socket `fd` (the driver takes its own reference):
/// `size` bytes in blocks of `block`, the export's transmission `flags`.
///
/// # Errors
/// [`NetlinkError::NoFamily`] when the kernel has no netlink interface for NBD (use the
/// ioctls); the kernel's refusal, or the socket's failure, otherwise.
pub fn connect(
    index: u32,
    fd: RawFd,
    size: u64,
    block: u64,
    flags: u64,
) -> Result<(), NetlinkError> {
    use rustix::net::{AddressFamily, SocketType, netlink};
    let sock = rustix::net::socket(
        AddressFamily::NETLINK,
        SocketType::RAW,
        Some(netlink::GENERIC),
    )
    .map_err(|e| NetlinkError::Io(e.into()))?;
    let kernel = netlink::SocketAddrNetlink::new(0, 0);
    let ask = |request: &[u8], seq: u32| -> Result<Reply, NetlinkError> {
        rustix::net::sendto(
            sock.as_fd(),
            request,
            rustix::net::SendFlags::empty(),
            &kernel,
        )
        .map_err(|e| NetlinkError::Io(e.into()))?;
        let mut buf = vec![0u8; REPLY_BYTES_MAX];
        loop {
            let (n, _) =
                rustix::net::recv(sock.as_fd(), &mut buf[..], rustix::net::RecvFlags::empty())
                    .map_err(|e| NetlinkError::Io(e.into()))?;
            match read_reply(&buf[..n], seq) {
                Err(ReplyError::NoAnswer(_)) => continue,
                other => return Ok(other?),
            }
        }
    };
    let family = match ask(&family_request(1), 1)? {
        Reply::Family(id) => id,
        Reply::Refused(_) | Reply::Ack => return Err(NetlinkError::NoFamily),
    };
    let fd =
        u32::try_from(fd).map_err(|_| NetlinkError::Io(std::io::ErrorKind::InvalidInput.into()))?;
    match ask(
        &connect_request(family, 2, index, fd, size, block, flags),
        2,
    )? {
        Reply::Ack | Reply::Family(_) => Ok(()),
        Reply::Refused(errno) => Err(NetlinkError::Refused(std::io::Error::from_raw_os_error(
            errno,
        ))),
    }
}
