//! The NBD driver's netlink interface (`linux/nbd-netlink.h`, generic netlink family
//! `nbd`, Linux 4.12 and later): `NBD_CMD_CONNECT` hands the driver its socket and returns;
//! no thread waits in the kernel. The ioctl interface keeps a thread in `NBD_DO_IT`, and any
//! signal to it, even the `SIGSTOP`/`SIGCONT` pair systemd's shutdown sends to every
//! process before it remounts the root read-only (excluded `@` daemons included), makes
//! the driver shut the device's sockets down: the last writes of a maintenance machine
//! failed with I/O errors (issue 31). Through netlink a signal to the agent only pauses it.
//!
//! The messages are built and read here, without I/O ([`family_request`],
//! [`connect_request`], [`read_reply`]); the boot agent's `agent::nbd_netlink` sends them.
//!
//! ```text
//!   nlmsghdr(16) │ genlmsghdr(4) │ nlattr(4) payload pad4 │ nlattr …
//!   CTRL_CMD_GETFAMILY "nbd" ──► family id ──► NBD_CMD_CONNECT {index, size, block size,
//!                                               server flags, sockets {item {fd}}} ──► ACK
//! ```

/// `NLMSG_ERROR`: an error or (error 0) an acknowledgement.
const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// The generic netlink controller's family id.
const GENL_ID_CTRL: u16 = 16;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// An attribute whose payload is attributes.
const NLA_F_NESTED: u16 = 1 << 15;
const NBD_GENL_FAMILY_NAME: &str = "nbd";
const NBD_GENL_VERSION: u8 = 1;
const NBD_CMD_CONNECT: u8 = 1;
const NBD_ATTR_INDEX: u16 = 1;
const NBD_ATTR_SIZE_BYTES: u16 = 2;
const NBD_ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const NBD_ATTR_SERVER_FLAGS: u16 = 5;
const NBD_ATTR_SOCKETS: u16 = 7;
const NBD_SOCK_ITEM: u16 = 1;
const NBD_SOCK_FD: u16 = 1;
/// The largest reply read (the controller's family reply is well under a page).
pub const REPLY_BYTES_MAX: usize = 16 << 10;

/// What a reply said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The request was done (an `NLMSG_ERROR` of 0).
    Ack,
    /// The controller named the family's id.
    Family(u16),
    /// The kernel refused, with this errno.
    Refused(i32),
}

/// Why a reply could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Shorter than its header says, or than a header.
    #[error("a truncated netlink message")]
    Truncated,
    /// Nothing this request waits for.
    #[error("no answer to request {0} in the reply")]
    NoAnswer(u32),
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = u16::try_from(4 + payload.len()).expect("a small attribute");
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn message(kind: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = u32::try_from(16 + 4 + attrs.len()).expect("a small message");
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, version, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

/// The controller request for the `nbd` family's id.
pub fn family_request(seq: u32) -> Vec<u8> {
    let mut attrs = Vec::new();
    put_attr(
        &mut attrs,
        CTRL_ATTR_FAMILY_NAME,
        format!("{NBD_GENL_FAMILY_NAME}\0").as_bytes(),
    );
    message(
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
        &attrs,
    )
}

/// `NBD_CMD_CONNECT` of device `index` (`/dev/nbdINDEX`) over the connected socket `fd`,
/// `size` bytes in blocks of `block`, with the export's transmission `flags`.
pub fn connect_request(
    family: u16,
    seq: u32,
    index: u32,
    fd: u32,
    size: u64,
    block: u64,
    flags: u64,
) -> Vec<u8> {
    let mut attrs = Vec::new();
    put_attr(&mut attrs, NBD_ATTR_INDEX, &index.to_ne_bytes());
    put_attr(&mut attrs, NBD_ATTR_SIZE_BYTES, &size.to_ne_bytes());
    put_attr(&mut attrs, NBD_ATTR_BLOCK_SIZE_BYTES, &block.to_ne_bytes());
    put_attr(&mut attrs, NBD_ATTR_SERVER_FLAGS, &flags.to_ne_bytes());
    let mut sock = Vec::new();
    put_attr(&mut sock, NBD_SOCK_FD, &fd.to_ne_bytes());
    let mut item = Vec::new();
    put_attr(&mut item, NBD_SOCK_ITEM | NLA_F_NESTED, &sock);
    put_attr(&mut attrs, NBD_ATTR_SOCKETS | NLA_F_NESTED, &item);
    message(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        NBD_CMD_CONNECT,
        NBD_GENL_VERSION,
        &attrs,
    )
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads the answer to request `seq` in `buf` (one datagram of the kernel's): an error or
/// acknowledgement, or the controller's family id.
///
/// # Errors
/// [`ReplyError`]: a message runs past the datagram, or none answers `seq`.
pub fn read_reply(buf: &[u8], seq: u32) -> Result<Reply, ReplyError> {
    let mut at = 0usize;
    while at + 16 <= buf.len() {
        let len = u32_at(buf, at).ok_or(ReplyError::Truncated)? as usize;
        let kind = u16_at(buf, at + 4).ok_or(ReplyError::Truncated)?;
        let mseq = u32_at(buf, at + 8).ok_or(ReplyError::Truncated)?;
        if len < 16 || at + len > buf.len() {
            return Err(ReplyError::Truncated);
        }
        let body = &buf[at + 16..at + len];
        if mseq == seq {
            match kind {
                NLMSG_ERROR => {
                    let e = u32_at(body, 0).ok_or(ReplyError::Truncated)?;
                    let e = i32::from_ne_bytes(e.to_ne_bytes());
                    // The kernel sends a negative errno; any other non-zero value is a
                    // refusal too, never an overflow.
                    let errno = i32::try_from(e.unsigned_abs()).unwrap_or(i32::MAX);
                    return Ok(if e == 0 {
                        Reply::Ack
                    } else {
                        Reply::Refused(errno)
                    });
                }
                NLMSG_DONE => {}
                GENL_ID_CTRL => {
                    if let Some(id) = family_id(body.get(4..).ok_or(ReplyError::Truncated)?) {
                        return Ok(Reply::Family(id));
                    }
                }
                _ => {}
            }
        }
        at += len.next_multiple_of(4);
    }
    Err(ReplyError::NoAnswer(seq))
}

/// `CTRL_ATTR_FAMILY_ID` among the attributes `attrs`.
fn family_id(attrs: &[u8]) -> Option<u16> {
    let mut at = 0usize;
    while at + 4 <= attrs.len() {
        let len = usize::from(u16_at(attrs, at)?);
        let kind = u16_at(attrs, at + 2)? & !NLA_F_NESTED;
        if len < 4 || at + len > attrs.len() {
            return None;
        }
        if kind == CTRL_ATTR_FAMILY_ID {
            return u16_at(attrs, at + 4);
        }
        at += len.next_multiple_of(4);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_request_carries_the_device_the_sizes_and_the_socket_nested() {
        let m = connect_request(28, 7, 0, 5, 1 << 30, 512, 0x4d);
        assert_eq!(u32_at(&m, 0).unwrap() as usize, m.len());
        assert_eq!(u16_at(&m, 4), Some(28));
        assert_eq!(u16_at(&m, 6), Some(NLM_F_REQUEST | NLM_F_ACK));
        assert_eq!(u32_at(&m, 8), Some(7));
        assert_eq!(m[16], NBD_CMD_CONNECT);
        // index (8) + size (12) + block (12) + flags (12) + sockets (4 + 4 + 8).
        assert_eq!(m.len(), 20 + 8 + 12 + 12 + 12 + 16);
        let sockets = &m[m.len() - 16..];
        assert_eq!(u16_at(sockets, 2), Some(NBD_ATTR_SOCKETS | NLA_F_NESTED));
        assert_eq!(u16_at(sockets, 6), Some(NBD_SOCK_ITEM | NLA_F_NESTED));
        assert_eq!(u16_at(sockets, 10), Some(NBD_SOCK_FD));
        assert_eq!(u32_at(sockets, 12), Some(5));
    }

    fn reply(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(16 + body.len()).unwrap();
        let mut m = Vec::new();
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn replies_are_read_for_their_request_only() {
        let mut attrs = vec![3, 0, 0, 0];
        put_attr(&mut attrs, CTRL_ATTR_FAMILY_NAME, b"nbd\0");
        put_attr(&mut attrs, CTRL_ATTR_FAMILY_ID, &29u16.to_ne_bytes());
        let family = reply(GENL_ID_CTRL, 1, &attrs);
        assert_eq!(read_reply(&family, 1), Ok(Reply::Family(29)));
        assert_eq!(read_reply(&family, 2), Err(ReplyError::NoAnswer(2)));
        let ack = reply(NLMSG_ERROR, 2, &0i32.to_ne_bytes());
        let busy = reply(NLMSG_ERROR, 2, &(-16i32).to_ne_bytes());
        let both = [family.clone(), ack].concat();
        assert_eq!(read_reply(&both, 2), Ok(Reply::Ack));
        assert_eq!(read_reply(&busy, 2), Ok(Reply::Refused(16)));
        assert_eq!(
            read_reply(&busy[..busy.len() - 1], 2),
            Err(ReplyError::Truncated)
        );
        let mut lying = busy.clone();
        lying[0] = 200;
        assert_eq!(read_reply(&lying, 2), Err(ReplyError::Truncated));
        assert_eq!(read_reply(&[], 2), Err(ReplyError::NoAnswer(2)));
        // Found by the fuzz target: i32::MIN is a refusal, not an overflow.
        let min = reply(NLMSG_ERROR, 2, &i32::MIN.to_ne_bytes());
        assert_eq!(read_reply(&min, 2), Ok(Reply::Refused(i32::MAX)));
        // Found by the fuzz target: i32::MIN is a refusal, not an overflow.
        let min = reply(NLMSG_ERROR, 2, &i32::MIN.to_ne_bytes());
        assert_eq!(read_reply(&min, 2), Ok(Reply::Refused(i32::MAX)));
    }
}
