//! Pure codec of the NBD protocol, server and client side: the fixed newstyle handshake, options and
//! their replies, transmission requests, simple and structured replies, and metadata
//! context queries. Specified by `doc/proto.md` of github.com/NetworkBlockDevice/nbd.
//!
//! What it is not: no sockets, no tokio, no clock. Parsers take `&[u8]` and return typed
//! values or typed errors; encoders append to a caller-owned `Vec<u8>`. The server crate
//! does the I/O and decides policy (which exports exist, which flags to advertise).
//!
//! # Layout
//!
//! ```text
//! consts     spec constants (NBDMAGIC, NBD_OPT_*, NBD_CMD_*, NBD_E*, ...)
//! handshake  greeting, client flags, NBD_OPT_EXPORT_NAME reply
//! option     option header (length cap), client options, option replies
//! meta       meta context queries, base:allocation
//! request    28-byte request header, check() for stream framing
//! reply      simple reply, structured reply chunks
//! client     the client's framing: option reply and reply headers, chunk payloads
//! netlink    the Linux NBD driver's generic netlink messages (NBD_CMD_CONNECT), and its
//!            replies
//! wire       (private) bounds-checked big-endian reader, protocol strings
//! ```
//!
//! Modules use `consts` and `wire` (which uses only `consts`); beyond those, `option` uses
//! `meta`, and `client` uses `option` and `reply`. No two modules use each other;
//! `netlink` uses none.
#![forbid(unsafe_code)]
#![warn(missing_docs, clippy::cast_possible_truncation)]

pub mod client;
pub mod consts;
pub mod handshake;
pub mod meta;
pub mod netlink;
pub mod option;
pub mod reply;
pub mod request;
mod wire;

pub use consts::*;
pub use handshake::{ClientFlags, ExportNameReply, HandshakeError, ServerGreeting};
pub use meta::{BASE_ALLOCATION, MetaContext, MetaError, MetaQuery};
pub use option::{
    ClientOption, Info, InfoRequest, MAX_OPTION_LEN, OptionError, OptionHeader, OptionReply,
};
pub use reply::{Chunk, ChunkPayload, Descriptor, ReplyError, SimpleReply};
pub use request::{Command, CommandFlags, REQUEST_LEN, Request, RequestError};
