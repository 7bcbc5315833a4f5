//! iSCSI's wire format (RFC 7143), pure: no sockets, no clock. The target in `ferry server`
//! (issue 32, part 3) reads PDUs with [`pdu::check`] and [`pdu::Pdu::parse`], answers with
//! [`pdu::Pdu::encode`], and negotiates with [`text`].
//!
//! # Layout
//!
//! ```text
//! pdu    the frame: 48-byte basic header segment, additional header segments, header
//!        and data digests (CRC32C), the data segment padded to 4 bytes; opcodes; limits
//! text   login and text key=value lists (NUL-separated): parse, encode, limits
//! params operational parameter negotiation, the target's side (RFC 7143 §13's rules)
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, clippy::cast_possible_truncation)]

pub mod params;
pub mod pdu;
pub mod text;

pub use pdu::{Digests, Opcode, Pdu, PduError, check};
pub use text::{TextError, parse_pairs};
