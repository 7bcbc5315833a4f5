//! Transmission replies: the simple reply and structured reply chunks ("Simple reply
//! message", "Structured reply chunk message", "Structured reply types").
//!
//! ```text
//! simple:     u32 NBD_SIMPLE_REPLY_MAGIC | u32 error | u64 cookie | [read data]
//! structured: u32 NBD_STRUCTURED_REPLY_MAGIC | u16 flags | u16 type | u64 cookie | u32 length
//!             | payload:
//!   NONE          (empty)
//!   OFFSET_DATA   u64 offset | data
//!   OFFSET_HOLE   u64 offset | u32 hole size
//!   BLOCK_STATUS  u32 context id | n × (u32 length | u32 status flags)
//!   ERROR         u32 error | u16 message length | message
//!   ERROR_OFFSET  u32 error | u16 message length | message | u64 offset
//! ```
//!
//! Read data is not copied through this codec on the server's hot path:
//! [`encode_offset_data_header`] writes the 28 bytes before the data and the caller writes the
//! data after them.

use crate::consts::{
    MAX_STRING_LEN, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_BLOCK_STATUS, NBD_REPLY_TYPE_ERROR,
    NBD_REPLY_TYPE_ERROR_OFFSET, NBD_REPLY_TYPE_NONE, NBD_REPLY_TYPE_OFFSET_DATA,
    NBD_REPLY_TYPE_OFFSET_HOLE, NBD_SIMPLE_REPLY_MAGIC, NBD_STRUCTURED_REPLY_MAGIC,
};
use crate::wire::{Reader, clamp};

/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Bytes before the data of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk (header + offset).
pub const OFFSET_DATA_HEADER_LEN: usize = CHUNK_HEADER_LEN + 8;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// A chunk's payload does not fit its type.
    #[error("invalid {kind} chunk: {what}")]
    InvalidChunk {
        /// The chunk type.
        kind: u16,
        /// What was wrong.
        what: &'static str,
    },
    /// The magic was not a reply magic.
    #[error("invalid reply magic {actual:#010x}")]
    InvalidMagic {
        /// What was received.
        actual: u32,
    },
    /// A chunk would need a length field over 2^32 - 1.
    #[error("chunk payload of {len} bytes does not fit a 32-bit length")]
    TooLarge {
        /// Payload bytes.
        len: usize,
    },
    /// The message is shorter than its layout.
    #[error("reply truncated: need {need} more bytes")]
    Truncated {
        /// Missing bytes.
        need: usize,
    },
}

impl From<crate::wire::Short> for ReplyError {
    fn from(s: crate::wire::Short) -> Self {
        ReplyError::Truncated { need: s.need }
    }
}

/// A simple reply header (read data, if any, follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// `NBD_E*` or 0.
    pub error: u32,
    /// The request's cookie.
    pub cookie: u64,
}

impl SimpleReply {
    /// Appends the 16 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.error.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
    }

    /// Parses the 16 bytes.
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`.
    pub fn parse(buf: &[u8]) -> Result<SimpleReply, ReplyError> {
        let mut r = Reader::new(buf);
        let magic = r.u32()?;
        if magic != NBD_SIMPLE_REPLY_MAGIC {
            return Err(ReplyError::InvalidMagic { actual: magic });
        }
        Ok(SimpleReply {
            error: r.u32()?,
            cookie: r.u64()?,
        })
    }
}

/// One block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Extent length in bytes (nonzero).
    pub len: u32,
    /// Status flags of the context (`NBD_STATE_HOLE` | `NBD_STATE_ZERO` for
    /// `base:allocation`).
    pub flags: u32,
}

/// The payload of a structured reply chunk, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkPayload {
    /// `NBD_REPLY_TYPE_NONE`.
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`.
    OffsetData {
        /// Export offset of the data.
        offset: u64,
        /// The data (at least one byte).
        data: Vec<u8>,
    },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
    OffsetHole {
        /// Export offset of the hole.
        offset: u64,
        /// Hole size (nonzero).
        len: u32,
    },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
    BlockStatus {
        /// The metadata context id.
        context_id: u32,
        /// At least one descriptor.
        descriptors: Vec<Descriptor>,
    },
    /// `NBD_REPLY_TYPE_ERROR`.
    Error {
        /// `NBD_E*` (nonzero).
        error: u32,
        /// Message for humans (clamped to 4096 bytes when encoded).
        message: String,
    },
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
    ErrorOffset {
        /// `NBD_E*` (nonzero).
        error: u32,
        /// Message for humans.
        message: String,
        /// Where the error happened.
        offset: u64,
    },
}

impl ChunkPayload {
    /// The chunk type.
    pub fn kind(&self) -> u16 {
        match self {
            ChunkPayload::None => NBD_REPLY_TYPE_NONE,
            ChunkPayload::OffsetData { .. } => NBD_REPLY_TYPE_OFFSET_DATA,
            ChunkPayload::OffsetHole { .. } => NBD_REPLY_TYPE_OFFSET_HOLE,
            ChunkPayload::BlockStatus { .. } => NBD_REPLY_TYPE_BLOCK_STATUS,
            ChunkPayload::Error { .. } => NBD_REPLY_TYPE_ERROR,
            ChunkPayload::ErrorOffset { .. } => NBD_REPLY_TYPE_ERROR_OFFSET,
        }
    }
}

/// One structured reply chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// `NBD_REPLY_FLAG_DONE` on the last chunk of a reply.
    pub done: bool,
    /// The request's cookie.
    pub cookie: u64,
    /// Type and payload.
    pub payload: ChunkPayload,
}

fn put_chunk_header(out: &mut Vec<u8>, done: bool, kind: u16, cookie: u64, len: u32) {
    out.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Appends the 28 bytes that precede `data_len` bytes of read data in an
/// `NBD_REPLY_TYPE_OFFSET_DATA` chunk.
///
/// # Errors
/// `TooLarge` when `data_len + 8` does not fit 32 bits.
pub fn encode_offset_data_header(
    cookie: u64,
    offset: u64,
    data_len: usize,
    done: bool,
    out: &mut Vec<u8>,
) -> Result<(), ReplyError> {
    let len = data_len
        .checked_add(8)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(ReplyError::TooLarge { len: data_len })?;
    put_chunk_header(out, done, NBD_REPLY_TYPE_OFFSET_DATA, cookie, len);
    out.extend_from_slice(&offset.to_be_bytes());
    Ok(())
}

fn put_message(out: &mut Vec<u8>, error: u32, message: &str) {
    let m = clamp(message);
    out.extend_from_slice(&error.to_be_bytes());
    // At most 4096 bytes after clamping, so the conversion is exact.
    debug_assert!(
        m.len() <= MAX_STRING_LEN,
        "a clamped message is at most 4096 bytes"
    );
    let n = u16::try_from(m.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(m.as_bytes());
}

impl Chunk {
    /// Appends the chunk.
    ///
    /// # Errors
    /// `TooLarge` when the payload does not fit a 32-bit length.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ReplyError> {
        let mut p = Vec::new();
        match &self.payload {
            ChunkPayload::None => {}
            ChunkPayload::OffsetData { offset, data } => {
                return encode_offset_data_header(self.cookie, *offset, data.len(), self.done, out)
                    .map(|()| out.extend_from_slice(data));
            }
            ChunkPayload::OffsetHole { offset, len } => {
                p.extend_from_slice(&offset.to_be_bytes());
                p.extend_from_slice(&len.to_be_bytes());
            }
            ChunkPayload::BlockStatus {
                context_id,
                descriptors,
            } => {
                p.extend_from_slice(&context_id.to_be_bytes());
                for d in descriptors {
                    p.extend_from_slice(&d.len.to_be_bytes());
                    p.extend_from_slice(&d.flags.to_be_bytes());
                }
            }
            ChunkPayload::Error { error, message } => put_message(&mut p, *error, message),
            ChunkPayload::ErrorOffset {
                error,
                message,
                offset,
            } => {
                put_message(&mut p, *error, message);
                p.extend_from_slice(&offset.to_be_bytes());
            }
        }
        let len = u32::try_from(p.len()).map_err(|_| ReplyError::TooLarge { len: p.len() })?;
        put_chunk_header(out, self.done, self.payload.kind(), self.cookie, len);
        out.extend_from_slice(&p);
        Ok(())
    }

    /// Parses one whole chunk at the start of `buf`, returning it and the bytes it took.
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`, `InvalidChunk`.
    pub fn parse(buf: &[u8]) -> Result<(Chunk, usize), ReplyError> {
        let mut r = Reader::new(buf);
        let magic = r.u32()?;
        if magic != NBD_STRUCTURED_REPLY_MAGIC {
            return Err(ReplyError::InvalidMagic { actual: magic });
        }
        let flags = r.u16()?;
        let kind = r.u16()?;
        let cookie = r.u64()?;
        let len = r.u32()? as usize;
        let payload = parse_payload(kind, r.bytes(len)?)?;
        let chunk = Chunk {
            done: flags & NBD_REPLY_FLAG_DONE != 0,
            cookie,
            payload,
        };
        Ok((chunk, CHUNK_HEADER_LEN + len))
    }
}

fn parse_message(kind: u16, p: &mut Reader<'_>) -> Result<(u32, String), ReplyError> {
    let error = p.u32()?;
    let n = usize::from(p.u16()?);
    let bad = |what| ReplyError::InvalidChunk { kind, what };
    if error == 0 {
        return Err(bad("zero error"));
    }
    if n > MAX_STRING_LEN {
        return Err(bad("message too long"));
    }
    let message = String::from_utf8(p.bytes(n)?.to_vec()).map_err(|_| bad("message not utf-8"))?;
    Ok((error, message))
}

pub(crate) fn parse_payload(kind: u16, data: &[u8]) -> Result<ChunkPayload, ReplyError> {
    let bad = |what| ReplyError::InvalidChunk { kind, what };
    let mut p = Reader::new(data);
    let payload = match kind {
        NBD_REPLY_TYPE_NONE => ChunkPayload::None,
        NBD_REPLY_TYPE_OFFSET_DATA => {
            let offset = p.u64()?;
            let d = p.rest();
            if d.is_empty() {
                return Err(bad("no data"));
            }
            ChunkPayload::OffsetData {
                offset,
                data: d.to_vec(),
            }
        }
        NBD_REPLY_TYPE_OFFSET_HOLE => ChunkPayload::OffsetHole {
            offset: p.u64()?,
            len: p.u32()?,
        },
        NBD_REPLY_TYPE_BLOCK_STATUS => {
            let context_id = p.u32()?;
            if p.remaining() == 0 || !p.remaining().is_multiple_of(8) {
                return Err(bad("length is not 4 + a positive multiple of 8"));
            }
            let mut descriptors = Vec::with_capacity(p.remaining() / 8);
            while p.remaining() > 0 {
                descriptors.push(Descriptor {
                    len: p.u32()?,
                    flags: p.u32()?,
                });
            }
            ChunkPayload::BlockStatus {
                context_id,
                descriptors,
            }
        }
        NBD_REPLY_TYPE_ERROR => {
            let (error, message) = parse_message(kind, &mut p)?;
            ChunkPayload::Error { error, message }
        }
        NBD_REPLY_TYPE_ERROR_OFFSET => {
            let (error, message) = parse_message(kind, &mut p)?;
            ChunkPayload::ErrorOffset {
                error,
                message,
                offset: p.u64()?,
            }
        }
        _ => return Err(bad("unknown type")),
    };
    if p.remaining() != 0 {
        return Err(bad("trailing bytes"));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{NBD_EINVAL, NBD_STATE_HOLE, NBD_STATE_ZERO};

    #[test]
    fn none_chunk_is_20_bytes_with_done() {
        let mut out = Vec::new();
        Chunk {
            done: true,
            cookie: 9,
            payload: ChunkPayload::None,
        }
        .encode(&mut out)
        .unwrap();
        assert_eq!(out.len(), CHUNK_HEADER_LEN);
        assert_eq!(&out[4..6], &NBD_REPLY_FLAG_DONE.to_be_bytes());
    }

    #[test]
    fn block_status_hole_zero_round_trips() {
        let c = Chunk {
            done: true,
            cookie: 1,
            payload: ChunkPayload::BlockStatus {
                context_id: 1,
                descriptors: vec![Descriptor {
                    len: 65536,
                    flags: NBD_STATE_HOLE | NBD_STATE_ZERO,
                }],
            },
        };
        let mut out = Vec::new();
        c.encode(&mut out).unwrap();
        assert_eq!(Chunk::parse(&out).unwrap(), (c, out.len()));
    }

    #[test]
    fn error_chunk_with_zero_error_is_invalid() {
        let mut out = Vec::new();
        Chunk {
            done: true,
            cookie: 1,
            payload: ChunkPayload::Error {
                error: NBD_EINVAL,
                message: String::new(),
            },
        }
        .encode(&mut out)
        .unwrap();
        out[20..24].copy_from_slice(&[0; 4]);
        assert!(matches!(
            Chunk::parse(&out),
            Err(ReplyError::InvalidChunk { .. })
        ));
    }

    #[test]
    fn offset_data_header_precedes_data() {
        let mut out = Vec::new();
        encode_offset_data_header(3, 4096, 512, true, &mut out).unwrap();
        assert_eq!(out.len(), OFFSET_DATA_HEADER_LEN);
        assert_eq!(&out[16..20], &520u32.to_be_bytes());
    }
}
