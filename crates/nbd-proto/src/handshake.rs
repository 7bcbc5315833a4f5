//! The start of the fixed newstyle handshake ("Newstyle negotiation"): the server's greeting,
//! the client's flags, and the reply that ends `NBD_OPT_EXPORT_NAME`.
//!
//! ```text
//! S: u64 NBDMAGIC | u64 IHAVEOPT | u16 handshake flags        (ServerGreeting, 18 bytes)
//! C: u32 client flags                                          (ClientFlags, 4 bytes)
//! ...options...
//! S: u64 size | u16 transmission flags | [124 zero bytes]      (ExportNameReply)
//! ```

use crate::consts::{
    IHAVEOPT, NBD_FLAG_C_FIXED_NEWSTYLE, NBD_FLAG_C_NO_ZEROES, NBD_FLAG_NO_ZEROES, NBDMAGIC,
};
use crate::wire::Reader;

/// Bytes of the server greeting.
pub const GREETING_LEN: usize = 18;
/// Bytes of the client flags.
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NBD_FLAG_C_NO_ZEROES`.
pub const EXPORT_NAME_PADDING: usize = 124;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// A magic number was not the spec's.
    #[error("invalid magic {actual:#018x} (expected {expected:#018x})")]
    InvalidMagic {
        /// The spec's value.
        expected: u64,
        /// What was received.
        actual: u64,
    },
    /// The message is shorter than its fixed layout.
    #[error("handshake message truncated: {got} bytes, need {need}")]
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The client set a flag the server did not offer or that does not exist; the server must
    /// drop the connection.
    #[error("unknown or unoffered client flags {flags:#010x}")]
    UnknownClientFlags {
        /// The flags as sent.
        flags: u32,
    },
}

/// The server's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerGreeting {
    /// `NBD_FLAG_FIXED_NEWSTYLE` | `NBD_FLAG_NO_ZEROES` for this server.
    pub handshake_flags: u16,
}

impl ServerGreeting {
    /// Appends the 18 bytes of the greeting.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&self.handshake_flags.to_be_bytes());
    }

    /// Parses a greeting (the client's view).
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`.
    pub fn parse(buf: &[u8]) -> Result<ServerGreeting, HandshakeError> {
        let mut r = Reader::new(buf);
        let short = |_| HandshakeError::Truncated {
            need: GREETING_LEN,
            got: buf.len(),
        };
        let m1 = r.u64().map_err(short)?;
        expect_magic(NBDMAGIC, m1)?;
        let m2 = r.u64().map_err(short)?;
        expect_magic(IHAVEOPT, m2)?;
        let handshake_flags = r.u16().map_err(short)?;
        Ok(ServerGreeting { handshake_flags })
    }
}

fn expect_magic(expected: u64, actual: u64) -> Result<(), HandshakeError> {
    if expected == actual {
        Ok(())
    } else {
        Err(HandshakeError::InvalidMagic { expected, actual })
    }
}

/// The client's flags, validated against what the server offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
    pub fixed_newstyle: bool,
    /// `NBD_FLAG_C_NO_ZEROES`.
    pub no_zeroes: bool,
}

impl ClientFlags {
    /// Parses the 4 bytes the client sends, given the server's handshake flags.
    ///
    /// # Errors
    /// `Truncated`; `UnknownClientFlags` for any undefined bit, or `NBD_FLAG_C_NO_ZEROES`
    /// when the server did not offer `NBD_FLAG_NO_ZEROES`.
    pub fn parse(buf: &[u8], offered: u16) -> Result<ClientFlags, HandshakeError> {
        let flags = Reader::new(buf)
            .u32()
            .map_err(|_| HandshakeError::Truncated {
                need: CLIENT_FLAGS_LEN,
                got: buf.len(),
            })?;
        let known = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;
        let no_zeroes = flags & NBD_FLAG_C_NO_ZEROES != 0;
        if flags & !known != 0 || (no_zeroes && offered & NBD_FLAG_NO_ZEROES == 0) {
            return Err(HandshakeError::UnknownClientFlags { flags });
        }
        Ok(ClientFlags {
            fixed_newstyle: flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0,
            no_zeroes,
        })
    }

    /// The wire value.
    pub fn bits(&self) -> u32 {
        let mut f = 0;
        if self.fixed_newstyle {
            f |= NBD_FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            f |= NBD_FLAG_C_NO_ZEROES;
        }
        f
    }

    /// Appends the 4 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bits().to_be_bytes());
    }
}

/// The server's answer to `NBD_OPT_EXPORT_NAME`, which enters transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReply {
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub transmission_flags: u16,
}

impl ExportNameReply {
    /// Appends the reply: 10 bytes, plus 124 zero bytes unless the client negotiated
    /// `NBD_FLAG_C_NO_ZEROES`.
    pub fn encode(&self, no_zeroes: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.transmission_flags.to_be_bytes());
        if !no_zeroes {
            out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING]);
        }
    }

    /// Parses the first 10 bytes of the reply (the client's view).
    ///
    /// # Errors
    /// `Truncated`.
    pub fn parse(buf: &[u8]) -> Result<ExportNameReply, HandshakeError> {
        let mut r = Reader::new(buf);
        let short = |_| HandshakeError::Truncated {
            need: 10,
            got: buf.len(),
        };
        Ok(ExportNameReply {
            size: r.u64().map_err(short)?,
            transmission_flags: r.u16().map_err(short)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::NBD_FLAG_FIXED_NEWSTYLE;

    #[test]
    fn greeting_starts_with_nbdmagic_ihaveopt() {
        let mut out = Vec::new();
        ServerGreeting {
            handshake_flags: NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES,
        }
        .encode(&mut out);
        assert_eq!(&out[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(&out[16..], &[0, 3]);
    }

    #[test]
    fn client_flags_unknown_bit_is_rejected() {
        let err = ClientFlags::parse(&[0, 0, 0, 4], NBD_FLAG_NO_ZEROES).unwrap_err();
        assert_eq!(err, HandshakeError::UnknownClientFlags { flags: 4 });
    }

    #[test]
    fn client_flags_no_zeroes_without_offer_is_rejected() {
        let err = ClientFlags::parse(&[0, 0, 0, 2], NBD_FLAG_FIXED_NEWSTYLE).unwrap_err();
        assert_eq!(err, HandshakeError::UnknownClientFlags { flags: 2 });
    }

    #[test]
    fn export_name_reply_pads_unless_no_zeroes() {
        let r = ExportNameReply {
            size: 1 << 20,
            transmission_flags: 3,
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        r.encode(false, &mut a);
        r.encode(true, &mut b);
        assert_eq!((a.len(), b.len()), (134, 10));
        assert_eq!(ExportNameReply::parse(&b).unwrap(), r);
    }
}
