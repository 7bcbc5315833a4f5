//! The client's side of the codec: framing of what a server sends, so a client can read a
//! fixed header, learn how many bytes follow, and read a read reply's data straight into
//! its own buffer.
//!
//! ```text
//! option reply  : u64 NBD_OPT_REPLY_MAGIC | u32 option | u32 type | u32 len | data
//! simple reply  : u32 NBD_SIMPLE_REPLY_MAGIC | u32 error | u64 cookie | [read data]
//! chunk         : u32 NBD_STRUCTURED_REPLY_MAGIC | u16 flags | u16 type | u64 cookie
//!                 | u32 len | payload
//! ```
//!
//! The same checks as the server's parsers apply: magic numbers, a cap on every length a
//! peer sends ([`MAX_OPTION_REPLY_LEN`], [`MAX_CHUNK_META_LEN`]), and chunk payloads decoded
//! by [`parse_chunk_payload`] except `NBD_REPLY_TYPE_OFFSET_DATA`, whose data the caller
//! reads itself after [`OFFSET_DATA_PREFIX_LEN`] bytes of offset.

use crate::consts::{
    NBD_OPT_REPLY_MAGIC, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, NBD_SIMPLE_REPLY_MAGIC,
    NBD_STRUCTURED_REPLY_MAGIC,
};
use crate::option::{MAX_OPTION_LEN, OPTION_REPLY_HEADER_LEN, OptionError};
use crate::reply::{CHUNK_HEADER_LEN, ChunkPayload, ReplyError, SIMPLE_REPLY_LEN};
use crate::wire::Reader;

/// The longest option reply payload a client accepts.
pub const MAX_OPTION_REPLY_LEN: u32 = MAX_OPTION_LEN;
/// The longest payload of a chunk other than `NBD_REPLY_TYPE_OFFSET_DATA` a client accepts
/// (block status replies of up to 2^16 descriptors, error messages).
pub const MAX_CHUNK_META_LEN: u32 = 4 + 8 * (1 << 16);
/// Bytes of offset before the data of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk.
pub const OFFSET_DATA_PREFIX_LEN: usize = 8;
/// Bytes a client reads first: enough for the magic of either reply kind and all of a
/// simple reply.
pub const REPLY_PREFIX_LEN: usize = SIMPLE_REPLY_LEN;

/// The fixed header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option answered.
    pub option: u32,
    /// `NBD_REP_*`.
    pub reply_type: u32,
    /// Payload bytes that follow.
    pub len: u32,
}

impl OptionReplyHeader {
    /// Parses the 20-byte header.
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`, `TooLong` past [`MAX_OPTION_REPLY_LEN`].
    pub fn parse(buf: &[u8]) -> Result<OptionReplyHeader, OptionError> {
        let mut r = Reader::new(buf);
        let magic = r.u64()?;
        if magic != NBD_OPT_REPLY_MAGIC {
            return Err(OptionError::InvalidMagic { actual: magic });
        }
        let option = r.u32()?;
        let reply_type = r.u32()?;
        let len = r.u32()?;
        if len > MAX_OPTION_REPLY_LEN {
            return Err(OptionError::TooLong { option, len });
        }
        Ok(OptionReplyHeader {
            option,
            reply_type,
            len,
        })
    }

    /// Total bytes of the message, header included.
    pub fn message_len(&self) -> usize {
        OPTION_REPLY_HEADER_LEN + self.len as usize
    }
}

/// The header of a transmission reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    /// A simple reply; a successful read's data (the request's length) follows.
    Simple {
        /// 0 or an `NBD_E*` value.
        error: u32,
        /// The request's cookie.
        cookie: u64,
    },
    /// A structured reply chunk; `len` bytes of payload follow.
    Chunk {
        /// `NBD_REPLY_FLAG_DONE`: the last chunk of this cookie.
        done: bool,
        /// `NBD_REPLY_TYPE_*`.
        kind: u16,
        /// The request's cookie.
        cookie: u64,
        /// Payload bytes.
        len: u32,
    },
}

impl ReplyHeader {
    /// Parses a reply header from the start of `buf`. Returns it and its length (16 for a
    /// simple reply, 20 for a chunk).
    ///
    /// # Errors
    /// `Truncated` (read `need` more bytes and call again), `InvalidMagic`, and
    /// `InvalidChunk` for a non-data chunk longer than [`MAX_CHUNK_META_LEN`].
    pub fn parse(buf: &[u8]) -> Result<(ReplyHeader, usize), ReplyError> {
        let mut r = Reader::new(buf);
        match r.u32()? {
            NBD_SIMPLE_REPLY_MAGIC => {
                let error = r.u32()?;
                let cookie = r.u64()?;
                Ok((ReplyHeader::Simple { error, cookie }, SIMPLE_REPLY_LEN))
            }
            NBD_STRUCTURED_REPLY_MAGIC => {
                let flags = r.u16()?;
                let kind = r.u16()?;
                let cookie = r.u64()?;
                let len = r.u32()?;
                if kind != NBD_REPLY_TYPE_OFFSET_DATA && len > MAX_CHUNK_META_LEN {
                    return Err(ReplyError::InvalidChunk {
                        kind,
                        what: "payload over the client's limit",
                    });
                }
                if kind == NBD_REPLY_TYPE_OFFSET_DATA && (len as usize) <= OFFSET_DATA_PREFIX_LEN {
                    return Err(ReplyError::InvalidChunk {
                        kind,
                        what: "no data",
                    });
                }
                let header = ReplyHeader::Chunk {
                    done: flags & NBD_REPLY_FLAG_DONE != 0,
                    kind,
                    cookie,
                    len,
                };
                Ok((header, CHUNK_HEADER_LEN))
            }
            actual => Err(ReplyError::InvalidMagic { actual }),
        }
    }

    /// The cookie.
    pub fn cookie(&self) -> u64 {
        match *self {
            ReplyHeader::Simple { cookie, .. } | ReplyHeader::Chunk { cookie, .. } => cookie,
        }
    }
}

/// Decodes the payload of a chunk of type `kind` (any type but `NBD_REPLY_TYPE_OFFSET_DATA`,
/// whose data the caller reads in place; for it, pass the 8-byte offset prefix and get the
/// offset with empty data).
///
/// # Errors
/// `InvalidChunk`, `Truncated`.
pub fn parse_chunk_payload(kind: u16, payload: &[u8]) -> Result<ChunkPayload, ReplyError> {
    if kind == NBD_REPLY_TYPE_OFFSET_DATA {
        let mut r = Reader::new(payload);
        let offset = r.u64()?;
        return Ok(ChunkPayload::OffsetData {
            offset,
            data: Vec::new(),
        });
    }
    crate::reply::parse_payload(kind, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{NBD_EIO, NBD_OPT_GO, NBD_REP_ACK};
    use crate::option::OptionReply;
    use crate::reply::{Chunk, SimpleReply, encode_offset_data_header};

    #[test]
    fn simple_reply_header_round_trips() {
        let mut out = Vec::new();
        SimpleReply {
            error: NBD_EIO,
            cookie: 42,
        }
        .encode(&mut out);
        let (h, n) = ReplyHeader::parse(&out).unwrap();
        assert_eq!(
            h,
            ReplyHeader::Simple {
                error: NBD_EIO,
                cookie: 42
            }
        );
        assert_eq!(n, 16);
    }

    #[test]
    fn chunk_header_after_prefix_needs_four_more_bytes() {
        let mut out = Vec::new();
        encode_offset_data_header(7, 4096, 512, true, &mut out).unwrap();
        let err = ReplyHeader::parse(&out[..REPLY_PREFIX_LEN]).unwrap_err();
        assert_eq!(err, ReplyError::Truncated { need: 4 });
    }

    #[test]
    fn offset_data_header_gives_payload_length() {
        let mut out = Vec::new();
        encode_offset_data_header(7, 4096, 512, true, &mut out).unwrap();
        let (h, n) = ReplyHeader::parse(&out).unwrap();
        assert_eq!(n, 20);
        assert_eq!(
            h,
            ReplyHeader::Chunk {
                done: true,
                kind: NBD_REPLY_TYPE_OFFSET_DATA,
                cookie: 7,
                len: 520
            }
        );
        let p = parse_chunk_payload(NBD_REPLY_TYPE_OFFSET_DATA, &out[20..28]).unwrap();
        assert_eq!(
            p,
            ChunkPayload::OffsetData {
                offset: 4096,
                data: Vec::new()
            }
        );
    }

    #[test]
    fn oversized_error_chunk_is_refused() {
        let mut out = Vec::new();
        Chunk {
            done: true,
            cookie: 1,
            payload: ChunkPayload::None,
        }
        .encode(&mut out)
        .unwrap();
        // Type NBD_REPLY_TYPE_ERROR with a 1 GiB length.
        out[6..8].copy_from_slice(&0x8001u16.to_be_bytes());
        out[16..20].copy_from_slice(&(1u32 << 30).to_be_bytes());
        assert!(matches!(
            ReplyHeader::parse(&out),
            Err(ReplyError::InvalidChunk { .. })
        ));
    }

    #[test]
    fn option_reply_header_gives_message_length() {
        let mut out = Vec::new();
        OptionReply::Ack.encode(NBD_OPT_GO, &mut out);
        let h = OptionReplyHeader::parse(&out).unwrap();
        assert_eq!(
            (h.option, h.reply_type, h.message_len()),
            (NBD_OPT_GO, NBD_REP_ACK, out.len())
        );
    }

    #[test]
    fn option_reply_over_limit_is_too_long() {
        let mut out = Vec::new();
        OptionReply::Ack.encode(NBD_OPT_GO, &mut out);
        out[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            OptionReplyHeader::parse(&out),
            Err(OptionError::TooLong { .. })
        ));
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the client parsers.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..64), kind: u16) {
            let _ = ReplyHeader::parse(&data);
            let _ = OptionReplyHeader::parse(&data);
            let _ = parse_chunk_payload(kind, &data);
        }
    }
}
