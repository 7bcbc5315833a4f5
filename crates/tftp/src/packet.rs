//! TFTP packets (RFC 1350 §5, RFC 2347 §2 and §3): parse one datagram into a [`Packet`] and
//! encode a packet into a caller-owned buffer. Pure: no sockets, no clock.
//!
//! ```text
//!  2 bytes   string   1   string  1  [string 1 string 1]...
//!  | 01/02 | filename | 0 | mode | 0 | opt1 | 0 | value1 | 0 | ...     RRQ / WRQ (+ options)
//!  | 03 | block# (2) | data (0..=blksize) |                           DATA
//!  | 04 | block# (2) |                                                ACK
//!  | 05 | error code (2) | message | 0 |                              ERROR
//!  | 06 | opt1 | 0 | value1 | 0 | ...                                 OACK
//! ```
//!
//! Every field is checked: a request is at most [`MAX_REQUEST_LEN`] bytes (RFC 2347 §2), its
//! file name at most [`MAX_FILENAME_LEN`] bytes of UTF-8, DATA carries at most
//! [`crate::options::BLKSIZE_MAX`] bytes, and ACK is exactly four bytes. The option list is
//! parsed by [`crate::options`].

use crate::options::{Options, OptionsError};

/// RRQ: read request.
pub const OPCODE_RRQ: u16 = 1;
/// WRQ: write request.
pub const OPCODE_WRQ: u16 = 2;
/// DATA: one block of the file.
pub const OPCODE_DATA: u16 = 3;
/// ACK: acknowledges a block (or, with block 0, an OACK).
pub const OPCODE_ACK: u16 = 4;
/// ERROR: ends the transfer.
pub const OPCODE_ERROR: u16 = 5;
/// OACK: the options the server accepted (RFC 2347).
pub const OPCODE_OACK: u16 = 6;

/// The longest request (RRQ or WRQ with its options), RFC 2347 §2: "the request packet
/// must not exceed 512 octets".
pub const MAX_REQUEST_LEN: usize = 512;
/// The longest file name accepted.
pub const MAX_FILENAME_LEN: usize = 255;
/// The longest error message parsed or sent (longer ones are cut when encoding).
pub const MAX_ERROR_MESSAGE_LEN: usize = 255;
/// The longest mode string ("netascii" is the longest RFC 1350 knows).
pub const MAX_MODE_LEN: usize = 16;
/// The largest datagram a peer may send: the header and the largest block.
pub const MAX_PACKET_LEN: usize = 4 + crate::options::BLKSIZE_MAX as usize;

/// The transfer mode of a request (RFC 1350 §5; compared case-insensitively).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// "octet": raw bytes. The only mode the server serves.
    Octet,
    /// "netascii": text with CR LF line ends. Refused by the server.
    Netascii,
    /// "mail": obsolete (RFC 1350). Refused by the server.
    Mail,
}

impl Mode {
    /// The mode's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Octet => "octet",
            Mode::Netascii => "netascii",
            Mode::Mail => "mail",
        }
    }
}

/// An RRQ or WRQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The file name as sent (UTF-8, non-empty, at most [`MAX_FILENAME_LEN`] bytes).
    pub filename: String,
    /// The transfer mode.
    pub mode: Mode,
    /// The options the client asked for (unknown ones left out, RFC 2347 §2).
    pub options: Options,
}

/// A TFTP error code (RFC 1350 §5, RFC 2347 §2 for 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 0: not defined, see the message.
    NotDefined,
    /// 1: file not found.
    FileNotFound,
    /// 2: access violation.
    AccessViolation,
    /// 3: disk full or allocation exceeded.
    DiskFull,
    /// 4: illegal TFTP operation.
    IllegalOperation,
    /// 5: unknown transfer ID.
    UnknownTid,
    /// 6: file already exists.
    FileExists,
    /// 7: no such user.
    NoSuchUser,
    /// 8: the transfer is ended because of option negotiation.
    OptionRefused,
    /// Any other value.
    Other(u16),
}

impl ErrorCode {
    /// The code's value on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::NotDefined => 0,
            ErrorCode::FileNotFound => 1,
            ErrorCode::AccessViolation => 2,
            ErrorCode::DiskFull => 3,
            ErrorCode::IllegalOperation => 4,
            ErrorCode::UnknownTid => 5,
            ErrorCode::FileExists => 6,
            ErrorCode::NoSuchUser => 7,
            ErrorCode::OptionRefused => 8,
            ErrorCode::Other(v) => v,
        }
    }

    /// The code for a value on the wire.
    pub fn from_u16(v: u16) -> ErrorCode {
        match v {
            0 => ErrorCode::NotDefined,
            1 => ErrorCode::FileNotFound,
            2 => ErrorCode::AccessViolation,
            3 => ErrorCode::DiskFull,
            4 => ErrorCode::IllegalOperation,
            5 => ErrorCode::UnknownTid,
            6 => ErrorCode::FileExists,
            7 => ErrorCode::NoSuchUser,
            8 => ErrorCode::OptionRefused,
            v => ErrorCode::Other(v),
        }
    }
}

/// One TFTP datagram. DATA borrows its payload from the parsed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Read request.
    Rrq(Request),
    /// Write request.
    Wrq(Request),
    /// A block of data; a block shorter than the block size ends the file.
    Data {
        /// Block number (wraps from 65535 to 0 on long files).
        block: u16,
        /// The block's bytes.
        data: &'a [u8],
    },
    /// Acknowledgement of `block`.
    Ack {
        /// Block number acknowledged.
        block: u16,
    },
    /// Error; ends the transfer.
    Error {
        /// The code.
        code: ErrorCode,
        /// The message (invalid UTF-8 replaced, at most [`MAX_ERROR_MESSAGE_LEN`] bytes).
        message: String,
    },
    /// Option acknowledgement.
    Oack(Options),
}

/// Why a datagram is not a valid TFTP packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// DATA longer than the largest block size.
    #[error("data block of {len} bytes is longer than {max}")]
    DataTooLong {
        /// Payload length.
        len: usize,
        /// [`crate::options::BLKSIZE_MAX`].
        max: usize,
    },
    /// The file name is empty.
    #[error("empty file name")]
    EmptyFilename,
    /// The error message is not NUL-terminated or too long.
    #[error("error message is not a NUL-terminated string of at most {max} bytes")]
    ErrorMessage {
        /// [`MAX_ERROR_MESSAGE_LEN`].
        max: usize,
    },
    /// The file name is longer than the limit.
    #[error("file name of {len} bytes is longer than {max}")]
    FilenameTooLong {
        /// Length before the NUL (or of the rest of the packet without one).
        len: usize,
        /// [`MAX_FILENAME_LEN`].
        max: usize,
    },
    /// A string field has no terminating NUL.
    #[error("{field} is not NUL-terminated")]
    MissingNul {
        /// Which field.
        field: &'static str,
    },
    /// A string field is not UTF-8.
    #[error("{field} is not UTF-8")]
    NotUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// The mode is longer than any mode RFC 1350 defines.
    #[error("mode of {len} bytes is longer than {max}")]
    ModeTooLong {
        /// Length before the NUL (or of the rest of the packet without one).
        len: usize,
        /// [`MAX_MODE_LEN`].
        max: usize,
    },
    /// The option list is invalid.
    #[error("options")]
    Options(#[from] OptionsError),
    /// A request longer than RFC 2347 allows.
    #[error("request of {len} bytes is longer than {max}")]
    RequestTooLong {
        /// Datagram length.
        len: usize,
        /// [`MAX_REQUEST_LEN`].
        max: usize,
    },
    /// Shorter than its opcode's fixed fields.
    #[error("packet of {len} bytes is too short")]
    TooShort {
        /// Datagram length.
        len: usize,
    },
    /// Bytes after the fixed fields of an ACK.
    #[error("{extra} bytes after the ack")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// An opcode RFC 1350 and RFC 2347 do not define.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// A mode other than octet, netascii or mail (the value clipped).
    #[error("unknown mode {0:?}")]
    UnknownMode(String),
}

/// Splits `buf` at its first NUL: the string before it and the rest after it.
pub(crate) fn take_cstr<'a>(
    buf: &'a [u8],
    field: &'static str,
    max: usize,
) -> Result<(&'a [u8], &'a [u8]), PacketError> {
    match buf.iter().position(|&b| b == 0) {
        Some(n) if n <= max => Ok((&buf[..n], &buf[n + 1..])),
        Some(n) => Err(too_long(field, n, max)),
        None if buf.len() > max => Err(too_long(field, buf.len(), max)),
        None => Err(PacketError::MissingNul { field }),
    }
}

fn too_long(field: &'static str, len: usize, max: usize) -> PacketError {
    match field {
        "file name" => PacketError::FilenameTooLong { len, max },
        "error message" => PacketError::ErrorMessage { max },
        _ => PacketError::ModeTooLong { len, max },
    }
}

/// `s` cut to at most `max` characters, for messages and logs of peer-sent strings.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl<'a> Packet<'a> {
    /// Parses one datagram.
    ///
    /// # Errors
    /// [`PacketError`] naming the first field that is wrong.
    pub fn parse(buf: &'a [u8]) -> Result<Packet<'a>, PacketError> {
        if buf.len() < 2 {
            return Err(PacketError::TooShort { len: buf.len() });
        }
        let opcode = u16::from_be_bytes([buf[0], buf[1]]);
        let body = &buf[2..];
        match opcode {
            OPCODE_RRQ | OPCODE_WRQ => {
                if buf.len() > MAX_REQUEST_LEN {
                    return Err(PacketError::RequestTooLong {
                        len: buf.len(),
                        max: MAX_REQUEST_LEN,
                    });
                }
                let req = parse_request(body)?;
                Ok(if opcode == OPCODE_RRQ {
                    Packet::Rrq(req)
                } else {
                    Packet::Wrq(req)
                })
            }
            OPCODE_DATA => {
                let (block, data) = block_and_rest(buf)?;
                if data.len() > crate::options::BLKSIZE_MAX as usize {
                    return Err(PacketError::DataTooLong {
                        len: data.len(),
                        max: crate::options::BLKSIZE_MAX as usize,
                    });
                }
                Ok(Packet::Data { block, data })
            }
            OPCODE_ACK => {
                let (block, rest) = block_and_rest(buf)?;
                if !rest.is_empty() {
                    return Err(PacketError::TrailingBytes { extra: rest.len() });
                }
                Ok(Packet::Ack { block })
            }
            OPCODE_ERROR => {
                let (code, rest) = block_and_rest(buf)?;
                let (msg, _trailing) = take_cstr(rest, "error message", MAX_ERROR_MESSAGE_LEN)?;
                let mut message = String::from_utf8_lossy(msg).into_owned();
                let mut end = message.len().min(MAX_ERROR_MESSAGE_LEN);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                message.truncate(end);
                Ok(Packet::Error {
                    code: ErrorCode::from_u16(code),
                    message,
                })
            }
            OPCODE_OACK => Ok(Packet::Oack(Options::parse(body)?)),
            other => Err(PacketError::UnknownOpcode(other)),
        }
    }

    /// Appends the packet's bytes to `out`. An error message is cut to
    /// [`MAX_ERROR_MESSAGE_LEN`] bytes and at its first NUL.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Packet::Rrq(r) => encode_request(OPCODE_RRQ, r, out),
            Packet::Wrq(r) => encode_request(OPCODE_WRQ, r, out),
            Packet::Data { block, data } => {
                encode_data_header(*block, out);
                out.extend_from_slice(data);
            }
            Packet::Ack { block } => {
                out.extend_from_slice(&OPCODE_ACK.to_be_bytes());
                out.extend_from_slice(&block.to_be_bytes());
            }
            Packet::Error { code, message } => encode_error(*code, message, out),
            Packet::Oack(o) => {
                out.extend_from_slice(&OPCODE_OACK.to_be_bytes());
                o.encode(out);
            }
        }
    }
}

/// Appends a DATA header (opcode and block number); the caller appends the block.
pub fn encode_data_header(block: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&OPCODE_DATA.to_be_bytes());
    out.extend_from_slice(&block.to_be_bytes());
}

/// Appends an ERROR packet; `message` is cut at its first NUL and to
/// [`MAX_ERROR_MESSAGE_LEN`] bytes (on a character boundary).
pub fn encode_error(code: ErrorCode, message: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&OPCODE_ERROR.to_be_bytes());
    out.extend_from_slice(&code.to_u16().to_be_bytes());
    let msg = message.split('\0').next().unwrap_or("");
    let mut end = msg.len().min(MAX_ERROR_MESSAGE_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&msg.as_bytes()[..end]);
    out.push(0);
}

fn encode_request(opcode: u16, r: &Request, out: &mut Vec<u8>) {
    out.extend_from_slice(&opcode.to_be_bytes());
    out.extend_from_slice(r.filename.as_bytes());
    out.push(0);
    out.extend_from_slice(r.mode.as_str().as_bytes());
    out.push(0);
    r.options.encode(out);
}

/// The u16 after the opcode and the bytes after it.
fn block_and_rest(buf: &[u8]) -> Result<(u16, &[u8]), PacketError> {
    if buf.len() < 4 {
        return Err(PacketError::TooShort { len: buf.len() });
    }
    Ok((u16::from_be_bytes([buf[2], buf[3]]), &buf[4..]))
}

fn parse_request(body: &[u8]) -> Result<Request, PacketError> {
    let (name, rest) = take_cstr(body, "file name", MAX_FILENAME_LEN)?;
    if name.is_empty() {
        return Err(PacketError::EmptyFilename);
    }
    let filename = std::str::from_utf8(name)
        .map_err(|_| PacketError::NotUtf8 { field: "file name" })?
        .to_string();
    let (mode, rest) = take_cstr(rest, "mode", MAX_MODE_LEN)?;
    let mode = std::str::from_utf8(mode).map_err(|_| PacketError::NotUtf8 { field: "mode" })?;
    let mode = if mode.eq_ignore_ascii_case("octet") {
        Mode::Octet
    } else if mode.eq_ignore_ascii_case("netascii") {
        Mode::Netascii
    } else if mode.eq_ignore_ascii_case("mail") {
        Mode::Mail
    } else {
        return Err(PacketError::UnknownMode(clip(mode, MAX_MODE_LEN)));
    };
    let options = Options::parse(rest)?;
    Ok(Request {
        filename,
        mode,
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(p: &Packet<'_>) {
        let mut buf = Vec::new();
        p.encode(&mut buf);
        assert_eq!(&Packet::parse(&buf).unwrap(), p);
    }

    fn rrq(name: &str, mode: &str, opts: &[(&str, &str)]) -> Vec<u8> {
        let mut b = vec![0, 1];
        for s in [name, mode] {
            b.extend_from_slice(s.as_bytes());
            b.push(0);
        }
        for (k, v) in opts {
            b.extend_from_slice(k.as_bytes());
            b.push(0);
            b.extend_from_slice(v.as_bytes());
            b.push(0);
        }
        b
    }

    #[test]
    fn round_trips() {
        let opts = Options {
            blksize: Some(1468),
            timeout: Some(3),
            tsize: Some(0),
            windowsize: Some(16),
        };
        round_trip(&Packet::Rrq(Request {
            filename: "pxelinux.cfg/default".into(),
            mode: Mode::Octet,
            options: opts,
        }));
        round_trip(&Packet::Wrq(Request {
            filename: "a".into(),
            mode: Mode::Netascii,
            options: Options::default(),
        }));
        round_trip(&Packet::Data {
            block: 65535,
            data: &[1, 2, 3],
        });
        round_trip(&Packet::Data {
            block: 0,
            data: &[],
        });
        round_trip(&Packet::Ack { block: 7 });
        round_trip(&Packet::Error {
            code: ErrorCode::UnknownTid,
            message: "unknown transfer ID".into(),
        });
        round_trip(&Packet::Error {
            code: ErrorCode::Other(99),
            message: String::new(),
        });
        round_trip(&Packet::Oack(opts));
    }

    #[test]
    fn parses_a_request_with_mixed_case_and_unknown_options() {
        let b = rrq(
            "undionly.kpxe",
            "OcTeT",
            &[("BLKSIZE", "1432"), ("multicast", ""), ("TSize", "0")],
        );
        let Packet::Rrq(r) = Packet::parse(&b).unwrap() else {
            panic!("not an RRQ")
        };
        assert_eq!(r.filename, "undionly.kpxe");
        assert_eq!(r.mode, Mode::Octet);
        assert_eq!(r.options.blksize, Some(1432));
        assert_eq!(r.options.tsize, Some(0));
        assert_eq!(r.options.windowsize, None);
    }

    #[test]
    fn refuses_bad_requests() {
        assert_eq!(Packet::parse(&[0]), Err(PacketError::TooShort { len: 1 }));
        assert_eq!(
            Packet::parse(&[0, 9, 1, 2]),
            Err(PacketError::UnknownOpcode(9))
        );
        assert_eq!(
            Packet::parse(&rrq("", "octet", &[])),
            Err(PacketError::EmptyFilename)
        );
        assert_eq!(
            Packet::parse(&rrq("a", "binary", &[])),
            Err(PacketError::UnknownMode("binary".into()))
        );
        assert_eq!(
            Packet::parse(b"\0\x01name"),
            Err(PacketError::MissingNul { field: "file name" })
        );
        assert_eq!(
            Packet::parse(b"\0\x01name\0octet"),
            Err(PacketError::MissingNul { field: "mode" })
        );
        assert_eq!(
            Packet::parse(b"\0\x01\xff\0octet\0"),
            Err(PacketError::NotUtf8 { field: "file name" })
        );
        let long = "x".repeat(MAX_FILENAME_LEN + 1);
        assert_eq!(
            Packet::parse(&rrq(&long, "octet", &[])),
            Err(PacketError::FilenameTooLong {
                len: MAX_FILENAME_LEN + 1,
                max: MAX_FILENAME_LEN
            })
        );
        let mut big = rrq("a", "octet", &[]);
        big.resize(MAX_REQUEST_LEN + 1, 0);
        assert!(matches!(
            Packet::parse(&big),
            Err(PacketError::RequestTooLong { .. })
        ));
        assert_eq!(
            Packet::parse(&[0, 4, 0, 1, 0]),
            Err(PacketError::TrailingBytes { extra: 1 })
        );
        assert_eq!(
            Packet::parse(&[0, 4, 0]),
            Err(PacketError::TooShort { len: 3 })
        );
        let mut data = vec![0, 3, 0, 1];
        data.resize(MAX_PACKET_LEN + 1, 0);
        assert!(matches!(
            Packet::parse(&data),
            Err(PacketError::DataTooLong { .. })
        ));
        assert_eq!(
            Packet::parse(&[0, 5, 0, 1, b'x']),
            Err(PacketError::MissingNul {
                field: "error message"
            })
        );
    }

    #[test]
    fn error_messages_are_cut_when_encoded() {
        let mut b = Vec::new();
        encode_error(ErrorCode::NotDefined, &"é".repeat(200), &mut b);
        assert!(b.len() <= 4 + MAX_ERROR_MESSAGE_LEN + 1);
        assert!(matches!(Packet::parse(&b), Ok(Packet::Error { .. })));
        b.clear();
        encode_error(ErrorCode::NotDefined, "a\0b", &mut b);
        assert_eq!(b, [0, 5, 0, 0, b'a', 0]);
    }

    #[test]
    fn clip_cuts_on_characters() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("ééé", 2), "éé…");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            if let Ok(p) = Packet::parse(&bytes) {
                let mut again = Vec::new();
                p.encode(&mut again);
                proptest::prop_assert_eq!(Packet::parse(&again).unwrap(), p);
            }
        }
    }
}
