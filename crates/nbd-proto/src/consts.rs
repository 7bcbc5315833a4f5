//! The protocol's constants, by their names in the NBD protocol document
//! (`doc/proto.md` of github.com/NetworkBlockDevice/nbd, section "Values").
//!
//! Every multi-byte field of the protocol is big-endian ("network byte order").

/// First 8 bytes the server sends (`INIT_PASSWD`). ASCII "NBDMAGIC".
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// Newstyle magic, sent by the server after [`NBDMAGIC`] and by the client before every
/// option. ASCII "IHAVEOPT".
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply ("Fixed newstyle negotiation").
pub const NBD_OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request ("Request message").
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply ("Simple reply message"); formerly `NBD_REPLY_MAGIC`.
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk ("Structured reply chunk message").
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (16 bits, server → client).
/// Server supports fixed newstyle.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits, client → server).
/// Client speaks fixed newstyle.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client does not want the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags (16 bits).
/// Always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// The export is read-only.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// `NBD_CMD_FLUSH` is supported.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_CMD_FLAG_FUA` is supported.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// The export behaves like a rotational medium.
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// `NBD_CMD_TRIM` is supported.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// `NBD_CMD_WRITE_ZEROES` (and `NBD_CMD_FLAG_NO_HOLE`) is supported.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_CMD_FLAG_DF` is supported on reads (structured replies only).
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
/// Flushes are visible across all connections to the export.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// `NBD_CMD_RESIZE` (experimental extension).
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
/// `NBD_CMD_CACHE` is understood.
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
/// `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Option types.
/// Choose an export and enter transmission (no error possible).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Abort the negotiation.
pub const NBD_OPT_ABORT: u32 = 2;
/// List the exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Withdrawn `PEEK_EXPORT` extension.
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
/// Upgrade to TLS.
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Ask about an export.
pub const NBD_OPT_INFO: u32 = 6;
/// Ask about an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Use structured replies.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// List metadata contexts.
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Select metadata contexts.
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
/// Extended headers (experimental extension).
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types.
/// Success, no data.
pub const NBD_REP_ACK: u32 = 1;
/// One export of a `NBD_OPT_LIST`.
pub const NBD_REP_SERVER: u32 = 2;
/// One information item of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const NBD_REP_INFO: u32 = 3;
/// One metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks an error reply.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Unknown option.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
/// Forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
/// Syntactically or semantically invalid.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
/// Not supported on this platform.
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
/// TLS required first.
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
/// No such export.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
/// The server is shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
/// The client must request `NBD_INFO_BLOCK_SIZE`.
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
/// The request or the reply is too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

// Information types (`NBD_REP_INFO`).
/// Size and transmission flags.
pub const NBD_INFO_EXPORT: u16 = 0;
/// Canonical export name.
pub const NBD_INFO_NAME: u16 = 1;
/// Human-readable description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Block size constraints.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// Request types.
/// Read.
pub const NBD_CMD_READ: u16 = 0;
/// Write (payload follows the header).
pub const NBD_CMD_WRITE: u16 = 1;
/// Disconnect (no reply).
pub const NBD_CMD_DISC: u16 = 2;
/// Flush.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Trim (discard).
pub const NBD_CMD_TRIM: u16 = 4;
/// Cache (prefetch hint).
pub const NBD_CMD_CACHE: u16 = 5;
/// Write zeroes.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Block status query.
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
/// Resize (experimental extension).
pub const NBD_CMD_RESIZE: u16 = 8;

// Command flags.
/// Force unit access: persist before replying.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Write zeroes must not punch a hole.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Don't fragment the read reply.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// One extent per context in block status.
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Fail write zeroes fast unless it is fast.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Payload length flag (experimental extended headers).
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and types.
/// Final chunk of a structured reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// Empty final chunk.
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Data at an offset.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Zeros at an offset.
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Block status descriptors of one context.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Bit 15 marks an error chunk.
pub const NBD_REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
/// Error without an offset.
pub const NBD_REPLY_TYPE_ERROR: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 1;
/// Error at an offset.
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = NBD_REPLY_TYPE_FLAG_ERROR | 2;

// `base:allocation` status flags.
/// The extent is not allocated.
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// The extent reads as zeros.
pub const NBD_STATE_ZERO: u32 = 1 << 1;

// Error values ("Error values"): the only ones a server may send.
/// Operation not permitted.
pub const NBD_EPERM: u32 = 1;
/// Input/output error.
pub const NBD_EIO: u32 = 5;
/// Cannot allocate memory.
pub const NBD_ENOMEM: u32 = 12;
/// Invalid argument.
pub const NBD_EINVAL: u32 = 22;
/// No space left on device.
pub const NBD_ENOSPC: u32 = 28;
/// Value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Operation not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

/// The longest string the protocol allows (export names, queries, messages), in bytes.
pub const MAX_STRING_LEN: usize = 4096;
/// The default minimum block size a server supports ("Size constraints").
pub const DEFAULT_MIN_BLOCK_SIZE: u32 = 1;
/// The default preferred block size ("Size constraints").
pub const DEFAULT_PREFERRED_BLOCK_SIZE: u32 = 4096;
/// The largest request payload every server should accept, 2^25 bytes ("Size constraints").
pub const DEFAULT_MAX_PAYLOAD: u32 = 1 << 25;
/// The most descriptors a server should put in one block status chunk.
pub const MAX_BLOCK_STATUS_EXTENTS: usize = 1 << 20;
