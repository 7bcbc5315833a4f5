//! A read-only TFTP server for network boot, so plain PXE firmware can fetch iPXE (Debian's
//! `undionly.kpxe`, `snponly.efi`) and chain into Ferry's HTTP boot.
//!
//! Protocol: RFC 1350 (octet mode only: netascii and mail requests are refused with ERROR 4),
//! the option extension of RFC 2347 with blksize (RFC 2348), timeout and tsize (RFC 2349) and
//! windowsize (RFC 7440). Write requests are answered with ERROR 2.
//!
//! # Layout
//!
//! ```text
//! packet    PURE. Parse and encode RRQ, WRQ, DATA, ACK, ERROR, OACK; named limits.
//! options   PURE. The option list, known options and their ranges, negotiate().
//! sender    PURE. One transfer's window / retransmission / rollover state machine (takes now),
//!           with the first packet's rules (sent alone, never on a timer, a short deadline).
//! config    Config: the server's settings and limits, their defaults.
//! counters  Atomic counters and their snapshot; the token bucket for logs and replies.
//! source    FileSource trait, TftpFile, DirSource (openat2 RESOLVE_BENEATH, regular files).
//! shared    What the listener and transfers share: slots (limits, unacknowledged ones
//!           apart), reply and log buckets, the per-client refusal log
//!           (contract::refusal_log).
//! server    The listening socket: judge each datagram, take a slot, spawn transfers.
//! transfer  One transfer on its own socket: open, negotiate, drive the sender.
//! ```
//!
//! `packet`, `options` and `sender` do no I/O and use no clock of their own; `server` and
//! `transfer` are the only modules that touch sockets (`shared` sends ERROR replies for them).
#![forbid(unsafe_code)]
#![warn(missing_docs, clippy::cast_possible_truncation)]

pub mod config;
pub mod counters;
pub mod options;
pub mod packet;
pub mod sender;
pub mod server;
mod shared;
pub mod source;
mod transfer;

pub use counters::{Counters, RateLimit, Rejected, Snapshot};
pub use options::{Bounds, Negotiated, Options, OptionsError, negotiate};
pub use packet::{ErrorCode, Mode, Packet, PacketError, Request};
pub use sender::{AckOutcome, GiveUp, Params as SenderParams, Sender, Transmit};
pub use server::{Config, Server};
pub use source::{DirSource, FileSource, OpenError, ReadAt, TftpFile};
