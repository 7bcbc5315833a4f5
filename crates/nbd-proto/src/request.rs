//! Transmission requests ("Request message", "Request types", "Command flags").
//!
//! ```text
//! C: u32 NBD_REQUEST_MAGIC | u16 flags | u16 type | u64 cookie | u64 offset | u32 length
//!    [length bytes of data, NBD_CMD_WRITE only]
//! ```

use std::io::Cursor;

use crate::consts::{
    DEFAULT_MAX_PAYLOAD, NBD_CMD_BLOCK_STATUS, NBD_CMD_CACHE, NBD_CMD_DISC, NBD_CMD_FLAG_DF,
    NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_FLAG_FUA, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_FLAG_REQ_ONE,
    NBD_CMD_FLUSH, NBD_CMD_READ, NBD_CMD_TRIM, NBD_CMD_WRITE, NBD_CMD_WRITE_ZEROES,
    NBD_REQUEST_MAGIC,
};
use crate::wire::{Reader, Short};

/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;
/// The largest write payload [`Request::check`] accepts (2^25 bytes, the spec's default
/// maximum payload).
pub const MAX_PAYLOAD: u32 = DEFAULT_MAX_PAYLOAD;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not enough bytes buffered yet for a whole request: read more.
    #[error("incomplete request")]
    Incomplete,
    /// The magic was not `NBD_REQUEST_MAGIC`; the stream is out of sync.
    #[error("invalid request magic {actual:#010x}")]
    InvalidMagic {
        /// What was received.
        actual: u32,
    },
    /// A write declares more payload than [`MAX_PAYLOAD`].
    #[error("write payload of {len} bytes over the limit of {MAX_PAYLOAD}")]
    PayloadTooLarge {
        /// Declared length.
        len: u32,
    },
}

/// The request type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`.
    Write,
    /// `NBD_CMD_DISC`.
    Disc,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// Anything else (the server replies `NBD_EINVAL`).
    Unknown(u16),
}

impl Command {
    /// From the wire value.
    pub fn from_u16(v: u16) -> Command {
        match v {
            NBD_CMD_READ => Command::Read,
            NBD_CMD_WRITE => Command::Write,
            NBD_CMD_DISC => Command::Disc,
            NBD_CMD_FLUSH => Command::Flush,
            NBD_CMD_TRIM => Command::Trim,
            NBD_CMD_CACHE => Command::Cache,
            NBD_CMD_WRITE_ZEROES => Command::WriteZeroes,
            NBD_CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// The wire value.
    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => NBD_CMD_READ,
            Command::Write => NBD_CMD_WRITE,
            Command::Disc => NBD_CMD_DISC,
            Command::Flush => NBD_CMD_FLUSH,
            Command::Trim => NBD_CMD_TRIM,
            Command::Cache => NBD_CMD_CACHE,
            Command::WriteZeroes => NBD_CMD_WRITE_ZEROES,
            Command::BlockStatus => NBD_CMD_BLOCK_STATUS,
            Command::Unknown(v) => v,
        }
    }

    /// A short name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Command::Read => "read",
            Command::Write => "write",
            Command::Disc => "disc",
            Command::Flush => "flush",
            Command::Trim => "trim",
            Command::Cache => "cache",
            Command::WriteZeroes => "write_zeroes",
            Command::BlockStatus => "block_status",
            Command::Unknown(_) => "unknown",
        }
    }

    /// The command flags documented for this command (`NBD_CMD_FLAG_FUA` is valid on all).
    pub fn allowed_flags(self) -> u16 {
        NBD_CMD_FLAG_FUA
            | match self {
                Command::Read => NBD_CMD_FLAG_DF,
                Command::WriteZeroes => NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
                Command::BlockStatus => NBD_CMD_FLAG_REQ_ONE,
                _ => 0,
            }
    }
}

/// The 16 bits of command flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandFlags(pub u16);

impl CommandFlags {
    /// `NBD_CMD_FLAG_FUA`.
    pub fn fua(self) -> bool {
        self.0 & NBD_CMD_FLAG_FUA != 0
    }
    /// `NBD_CMD_FLAG_NO_HOLE`.
    pub fn no_hole(self) -> bool {
        self.0 & NBD_CMD_FLAG_NO_HOLE != 0
    }
    /// `NBD_CMD_FLAG_DF`.
    pub fn df(self) -> bool {
        self.0 & NBD_CMD_FLAG_DF != 0
    }
    /// `NBD_CMD_FLAG_REQ_ONE`.
    pub fn req_one(self) -> bool {
        self.0 & NBD_CMD_FLAG_REQ_ONE != 0
    }
    /// `NBD_CMD_FLAG_FAST_ZERO`.
    pub fn fast_zero(self) -> bool {
        self.0 & NBD_CMD_FLAG_FAST_ZERO != 0
    }
}

/// One request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: CommandFlags,
    /// Request type.
    pub command: Command,
    /// Opaque cookie echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub len: u32,
}

impl Request {
    /// Parses a request header.
    ///
    /// # Errors
    /// `InvalidMagic`.
    pub fn parse(buf: &[u8; REQUEST_LEN]) -> Result<Request, RequestError> {
        let mut r = Reader::new(buf);
        // The reads below cannot fail: the array holds exactly the 28 bytes they consume.
        let field = |s: Short| -> RequestError {
            unreachable!("a {REQUEST_LEN}-byte request header is never short ({s:?})")
        };
        let magic = r.u32().map_err(field)?;
        if magic != NBD_REQUEST_MAGIC {
            return Err(RequestError::InvalidMagic { actual: magic });
        }
        let req = Request {
            flags: CommandFlags(r.u16().map_err(field)?),
            command: Command::from_u16(r.u16().map_err(field)?),
            cookie: r.u64().map_err(field)?,
            offset: r.u64().map_err(field)?,
            len: r.u32().map_err(field)?,
        };
        debug_assert_eq!(r.remaining(), 0, "a request header is read whole");
        Ok(req)
    }

    /// Checks that `cur` holds a whole request (header and any write payload) from its
    /// position, and advances past it.
    ///
    /// # Errors
    /// `Incomplete` (read more and retry), `InvalidMagic`, `PayloadTooLarge`.
    pub fn check(cur: &mut Cursor<&[u8]>) -> Result<Request, RequestError> {
        let buf = *cur.get_ref();
        let start = usize::try_from(cur.position()).unwrap_or(usize::MAX);
        let rest = buf.get(start..).unwrap_or(&[]);
        let Some(head) = rest.first_chunk::<REQUEST_LEN>() else {
            return Err(RequestError::Incomplete);
        };
        let req = Request::parse(head)?;
        let payload = req.payload_len();
        if payload > MAX_PAYLOAD {
            return Err(RequestError::PayloadTooLarge { len: payload });
        }
        let total = REQUEST_LEN + payload as usize;
        if rest.len() < total {
            return Err(RequestError::Incomplete);
        }
        debug_assert!(
            start + total <= buf.len(),
            "a whole request lies in the buffer"
        );
        cur.set_position((start + total) as u64);
        Ok(req)
    }

    /// Bytes of data following the header on the wire (the length of a write, else 0).
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.len
        } else {
            0
        }
    }

    /// Flags set that are not documented for this command.
    pub fn unknown_flags(&self) -> u16 {
        self.flags.0 & !self.command.allowed_flags()
    }

    /// `offset + len`, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.len))
    }

    /// Appends the 28-byte header (the client's side).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.0.to_be_bytes());
        out.extend_from_slice(&self.command.to_u16().to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
        // Paired with `parse`, which reads exactly this many bytes.
        debug_assert_eq!(
            out.len() - start,
            REQUEST_LEN,
            "a request header is 28 bytes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(len: u32) -> Request {
        Request {
            flags: CommandFlags(0),
            command: Command::Read,
            cookie: 7,
            offset: 512,
            len,
        }
    }

    #[test]
    fn check_short_header_is_incomplete() {
        let mut v = Vec::new();
        read(4096).encode(&mut v);
        let mut cur = Cursor::new(&v[..27]);
        assert_eq!(Request::check(&mut cur), Err(RequestError::Incomplete));
    }

    #[test]
    fn check_write_without_payload_is_incomplete() {
        let mut v = Vec::new();
        Request {
            command: Command::Write,
            ..read(8)
        }
        .encode(&mut v);
        v.extend_from_slice(&[1; 7]);
        let mut cur = Cursor::new(&v[..]);
        assert_eq!(Request::check(&mut cur), Err(RequestError::Incomplete));
    }

    #[test]
    fn check_advances_past_header_and_payload() {
        let mut v = Vec::new();
        Request {
            command: Command::Write,
            ..read(8)
        }
        .encode(&mut v);
        v.extend_from_slice(&[1; 8]);
        let mut cur = Cursor::new(&v[..]);
        Request::check(&mut cur).unwrap();
        assert_eq!(cur.position(), 36);
    }

    #[test]
    fn check_huge_write_is_rejected_before_buffering() {
        let mut v = Vec::new();
        Request {
            command: Command::Write,
            ..read(u32::MAX)
        }
        .encode(&mut v);
        let mut cur = Cursor::new(&v[..]);
        assert_eq!(
            Request::check(&mut cur),
            Err(RequestError::PayloadTooLarge { len: u32::MAX })
        );
    }

    #[test]
    fn parse_bad_magic_is_invalid() {
        let mut v = Vec::new();
        read(1).encode(&mut v);
        v[3] = 0;
        let head: [u8; REQUEST_LEN] = v.try_into().unwrap();
        assert!(matches!(
            Request::parse(&head),
            Err(RequestError::InvalidMagic { .. })
        ));
    }

    #[test]
    fn req_one_on_read_is_unknown_flag() {
        let r = Request {
            flags: CommandFlags(NBD_CMD_FLAG_REQ_ONE),
            ..read(1)
        };
        assert_eq!(r.unknown_flags(), NBD_CMD_FLAG_REQ_ONE);
    }
}
