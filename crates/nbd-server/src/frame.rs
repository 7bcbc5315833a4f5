//! The result of one request (`Frame`) and its encoding into reply bytes, simple or
//! structured. Shared by the reader's batches, the request tasks and the writer task.

use disk::device::Piece;
use nbd_proto::Request;
use nbd_proto::reply::{Chunk, ChunkPayload, Descriptor, SimpleReply, encode_offset_data_header};
use tokio::sync::OwnedSemaphorePermit;

use crate::errno::to_nbd_errno;

/// The result of one request, before encoding.
#[derive(Debug)]
pub(crate) enum Frame {
    /// Success without data.
    Ok,
    /// Read data.
    Data { offset: u64, data: Vec<u8> },
    /// Read data as pieces of the device's own buffers (a block cache's entries), written
    /// to the socket without a copy into a reply buffer.
    Shared {
        offset: u64,
        len: usize,
        pieces: Vec<Piece>,
    },
    /// A read that returned only zeros (structured replies only).
    Hole { offset: u64, len: u32 },
    /// Failure.
    Error { errno: u32, message: String },
    /// `base:allocation` descriptors.
    BlockStatus {
        context_id: u32,
        descriptors: Vec<Descriptor>,
    },
}

/// A reply on its way to the writer, with the budget it holds until written.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The request's cookie.
    pub cookie: u64,
    /// Whether the request was a read (a structured `Ok` is then an empty chunk).
    pub is_read: bool,
    /// The result to encode.
    pub frame: Frame,
    /// The request's slot, released once the reply is written.
    pub _slot: OwnedSemaphorePermit,
    /// The request's payload bytes, released once the reply is written.
    pub _bytes: Option<OwnedSemaphorePermit>,
}

/// A failure reply with `errno` (`NBD_E*`) and a message for the client.
pub(crate) fn error(errno: u32, message: impl Into<String>) -> Frame {
    Frame::Error {
        errno,
        message: message.into(),
    }
}

/// The error reply to `req` whose disk call failed with `err`, logged.
pub(crate) fn disk_error(req: &Request, err: &disk::Error) -> Frame {
    tracing::warn!(command = req.command.name(), offset = req.offset, len = req.len,
        error = %contract::ErrorChain(err), "disk call failed");
    error(to_nbd_errno(err), err.to_string())
}

/// Encodes a reply's header into `head`; returns the data to write after it, if any.
pub(crate) fn encode_frame<'a>(
    cookie: u64,
    is_read: bool,
    frame: &'a Frame,
    structured: bool,
    head: &mut Vec<u8>,
) -> Option<&'a [u8]> {
    let chunk = |payload| Chunk {
        done: true,
        cookie,
        payload,
    };
    let simple = |error| SimpleReply { error, cookie };
    // Chunk payloads here are bounded (descriptors, 4096-byte messages), so encoding cannot
    // fail; a failure is a bug (asserted in debug builds), reported as a dropped reply by
    // the client's timeout in release builds.
    let put = |c: Chunk, head: &mut Vec<u8>| {
        if let Err(e) = c.encode(head) {
            debug_assert!(false, "reply not encodable: {e}");
            tracing::error!(error = %e, "reply not encodable");
        }
    };
    // Read data is at most MAX_PAYLOAD bytes (the request's check): its header encodes.
    let data_header = |offset: u64, len: usize, head: &mut Vec<u8>| {
        let r = encode_offset_data_header(cookie, offset, len, true, head);
        debug_assert!(
            r.is_ok(),
            "read data of {len} bytes has an encodable header"
        );
    };
    match frame {
        Frame::Ok if structured && is_read => put(chunk(ChunkPayload::None), head),
        Frame::Ok => simple(0).encode(head),
        Frame::Data { offset, data } => {
            if structured {
                data_header(*offset, data.len(), head);
            } else {
                simple(0).encode(head);
            }
            return Some(data);
        }
        Frame::Shared { offset, len, .. } => {
            if structured {
                data_header(*offset, *len, head);
            } else {
                simple(0).encode(head);
            }
        }
        Frame::Hole { offset, len } => put(
            chunk(ChunkPayload::OffsetHole {
                offset: *offset,
                len: *len,
            }),
            head,
        ),
        Frame::Error { errno, message } if structured => put(
            chunk(ChunkPayload::Error {
                error: *errno,
                message: message.clone(),
            }),
            head,
        ),
        Frame::Error { errno, .. } => simple(*errno).encode(head),
        Frame::BlockStatus {
            context_id,
            descriptors,
        } => put(
            chunk(ChunkPayload::BlockStatus {
                context_id: *context_id,
                descriptors: descriptors.clone(),
            }),
            head,
        ),
    }
    None
}
