//! Option haggling ("Fixed newstyle negotiation", "Option types", "Option reply types").
//!
//! ```text
//! C: u64 IHAVEOPT | u32 option | u32 length | length bytes of data     (OptionHeader + payload)
//! S: u64 NBD_OPT_REPLY_MAGIC | u32 option | u32 reply type | u32 length | data  (OptionReply)
//! ```
//!
//! [`OptionHeader::parse`] enforces [`MAX_OPTION_LEN`] before anyone allocates a payload
//! buffer; [`ClientOption::parse`] then decodes the payload of the options this server knows.

use crate::consts::{
    IHAVEOPT, NBD_INFO_BLOCK_SIZE, NBD_INFO_DESCRIPTION, NBD_INFO_EXPORT, NBD_INFO_NAME,
    NBD_OPT_ABORT, NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST,
    NBD_OPT_LIST_META_CONTEXT, NBD_OPT_REPLY_MAGIC, NBD_OPT_SET_META_CONTEXT, NBD_OPT_STARTTLS,
    NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, NBD_REP_ERR_INVALID, NBD_REP_ERR_TOO_BIG,
    NBD_REP_FLAG_ERROR, NBD_REP_INFO, NBD_REP_META_CONTEXT, NBD_REP_SERVER,
};
use crate::meta::{MetaError, MetaQuery};
use crate::wire::{Reader, clamp, parse_string, put_str32};

/// Bytes of an option header.
pub const OPTION_HEADER_LEN: usize = 16;
/// Bytes of an option reply header.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// The longest option payload this server reads, in bytes. Every option it understands fits
/// in far less (an export name is at most 4096 bytes); a longer one is answered with
/// `NBD_REP_ERR_TOO_BIG` and the connection is dropped without reading the payload.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// The most information requests one `NBD_OPT_INFO`/`NBD_OPT_GO` may carry.
pub const MAX_INFO_REQUESTS: usize = 64;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The option header's magic was not `IHAVEOPT`.
    #[error("invalid option magic {actual:#018x}")]
    InvalidMagic {
        /// What was received.
        actual: u64,
    },
    /// An option field is inconsistent with the option's length.
    #[error("option {option}: invalid payload ({what})")]
    InvalidPayload {
        /// The option.
        option: u32,
        /// What was wrong.
        what: &'static str,
    },
    /// A string is not UTF-8, contains NUL, or is longer than 4096 bytes.
    #[error("option {option}: invalid string")]
    InvalidString {
        /// The option.
        option: u32,
    },
    /// A meta context query list is malformed.
    #[error("option {option}: {source}")]
    Meta {
        /// The option.
        option: u32,
        /// What was wrong.
        source: MetaError,
    },
    /// The option declares more data than [`MAX_OPTION_LEN`].
    #[error("option {option}: length {len} over the limit of {MAX_OPTION_LEN}")]
    TooLong {
        /// The option.
        option: u32,
        /// The declared length.
        len: u32,
    },
    /// The message is shorter than its fixed layout.
    #[error("option message truncated: need {need} more bytes")]
    Truncated {
        /// Missing bytes.
        need: usize,
    },
    /// The option must carry no data but did.
    #[error("option {option}: unexpected {len} bytes of data")]
    UnexpectedData {
        /// The option.
        option: u32,
        /// Bytes sent.
        len: usize,
    },
    /// A reply's type is not one this codec knows.
    #[error("unknown option reply type {reply_type:#010x}")]
    UnknownReply {
        /// The reply type.
        reply_type: u32,
    },
}

impl OptionError {
    /// The `NBD_REP_ERR_*` a server answers this error with.
    pub fn reply_type(&self) -> u32 {
        match self {
            OptionError::TooLong { .. } => NBD_REP_ERR_TOO_BIG,
            _ => NBD_REP_ERR_INVALID,
        }
    }

    /// True when the byte stream cannot be trusted any more and the connection must close.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            OptionError::InvalidMagic { .. } | OptionError::TooLong { .. }
        )
    }
}

impl From<crate::wire::Short> for OptionError {
    fn from(s: crate::wire::Short) -> Self {
        OptionError::Truncated { need: s.need }
    }
}

/// The fixed 16 bytes before an option's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// `NBD_OPT_*`.
    pub option: u32,
    /// Bytes of data that follow; at most [`MAX_OPTION_LEN`] once parsed.
    pub len: u32,
}

impl OptionHeader {
    /// Parses and validates an option header.
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`, `TooLong` (the caller must not read the payload).
    pub fn parse(buf: &[u8]) -> Result<OptionHeader, OptionError> {
        let mut r = Reader::new(buf);
        let magic = r.u64()?;
        if magic != IHAVEOPT {
            return Err(OptionError::InvalidMagic { actual: magic });
        }
        let option = r.u32()?;
        let len = r.u32()?;
        if len > MAX_OPTION_LEN {
            return Err(OptionError::TooLong { option, len });
        }
        Ok(OptionHeader { option, len })
    }

    /// Appends the 16 bytes (the client's side).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&self.option.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }

    /// The payload length as a `usize` (lossless: at most [`MAX_OPTION_LEN`] after `parse`).
    pub fn payload_len(&self) -> usize {
        self.len as usize
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" is the default export).
    pub name: String,
    /// `NBD_INFO_*` items the client asks for.
    pub requests: Vec<u16>,
}

/// A decoded client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`.
    ExportName(String),
    /// `NBD_OPT_ABORT` (any data is ignored, as the spec asks).
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaQuery),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaQuery),
    /// Any other option; the server answers `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

impl ClientOption {
    /// Decodes `payload`, the data of an option whose header was `header`.
    ///
    /// # Errors
    /// `UnexpectedData`, `InvalidPayload`, `InvalidString`, `Meta`, `Truncated`.
    pub fn parse(header: OptionHeader, payload: &[u8]) -> Result<ClientOption, OptionError> {
        let option = header.option;
        let no_data = |o: ClientOption| {
            if payload.is_empty() {
                Ok(o)
            } else {
                Err(OptionError::UnexpectedData {
                    option,
                    len: payload.len(),
                })
            }
        };
        match option {
            NBD_OPT_EXPORT_NAME => parse_string(payload)
                .map(ClientOption::ExportName)
                .ok_or(OptionError::InvalidString { option }),
            NBD_OPT_ABORT => Ok(ClientOption::Abort),
            NBD_OPT_LIST => no_data(ClientOption::List),
            NBD_OPT_STARTTLS => no_data(ClientOption::StartTls),
            NBD_OPT_INFO => Ok(ClientOption::Info(parse_info(option, payload)?)),
            NBD_OPT_GO => Ok(ClientOption::Go(parse_info(option, payload)?)),
            NBD_OPT_STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let q = MetaQuery::parse(payload)
                    .map_err(|source| OptionError::Meta { option, source })?;
                Ok(if option == NBD_OPT_LIST_META_CONTEXT {
                    ClientOption::ListMetaContext(q)
                } else {
                    ClientOption::SetMetaContext(q)
                })
            }
            other => Ok(ClientOption::Unknown(other)),
        }
    }

    /// The option code.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => NBD_OPT_EXPORT_NAME,
            ClientOption::Abort => NBD_OPT_ABORT,
            ClientOption::List => NBD_OPT_LIST,
            ClientOption::StartTls => NBD_OPT_STARTTLS,
            ClientOption::Info(_) => NBD_OPT_INFO,
            ClientOption::Go(_) => NBD_OPT_GO,
            ClientOption::StructuredReply => NBD_OPT_STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => NBD_OPT_LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => NBD_OPT_SET_META_CONTEXT,
            ClientOption::Unknown(o) => *o,
        }
    }

    /// Appends header and data (the client's side; used by tests and fuzzers).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        match self {
            ClientOption::ExportName(n) => data.extend_from_slice(n.as_bytes()),
            ClientOption::Info(r) | ClientOption::Go(r) => {
                put_str32(&mut data, &r.name);
                let n = u16::try_from(r.requests.len()).unwrap_or(u16::MAX);
                data.extend_from_slice(&n.to_be_bytes());
                for q in r.requests.iter().take(usize::from(n)) {
                    data.extend_from_slice(&q.to_be_bytes());
                }
            }
            ClientOption::ListMetaContext(q) | ClientOption::SetMetaContext(q) => {
                q.encode(&mut data);
            }
            _ => {}
        }
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        OptionHeader {
            option: self.code(),
            len,
        }
        .encode(out);
        out.extend_from_slice(&data);
    }
}

fn parse_info(option: u32, payload: &[u8]) -> Result<InfoRequest, OptionError> {
    let mut r = Reader::new(payload);
    let name_len = r.u32()? as usize;
    // "MUST be no larger than the option data length - 6".
    if name_len > payload.len().saturating_sub(6) {
        return Err(OptionError::InvalidPayload {
            option,
            what: "name length past the option data",
        });
    }
    let name = parse_string(r.bytes(name_len)?).ok_or(OptionError::InvalidString { option })?;
    let n = usize::from(r.u16()?);
    if n > MAX_INFO_REQUESTS || r.remaining() != n * 2 {
        return Err(OptionError::InvalidPayload {
            option,
            what: "information request count does not match the length",
        });
    }
    let mut requests = Vec::with_capacity(n);
    for _ in 0..n {
        requests.push(r.u16()?);
    }
    Ok(InfoRequest { name, requests })
}

/// One `NBD_REP_INFO` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Bytes.
        size: u64,
        /// Transmission flags.
        transmission_flags: u16,
    },
    /// `NBD_INFO_NAME`.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`.
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload size.
        max: u32,
    },
}

/// One server reply during option haggling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionReply {
    /// `NBD_REP_ACK`.
    Ack,
    /// `NBD_REP_SERVER`: one export of a list.
    Server {
        /// Export name.
        name: String,
        /// Description for humans (may be empty).
        description: String,
    },
    /// `NBD_REP_INFO`.
    Info(Info),
    /// `NBD_REP_META_CONTEXT`.
    MetaContext {
        /// Context id (0 in `NBD_OPT_LIST_META_CONTEXT` replies).
        id: u32,
        /// Context name.
        name: String,
    },
    /// An `NBD_REP_ERR_*` with a message for humans.
    Error {
        /// The reply type (bit 31 set).
        code: u32,
        /// Message (clamped to 4096 bytes when encoded).
        message: String,
    },
}

impl OptionReply {
    /// Appends the reply to `option` (header and data).
    pub fn encode(&self, option: u32, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        let reply_type = match self {
            OptionReply::Ack => NBD_REP_ACK,
            OptionReply::Server { name, description } => {
                put_str32(&mut data, clamp(name));
                data.extend_from_slice(clamp(description).as_bytes());
                NBD_REP_SERVER
            }
            OptionReply::Info(info) => {
                encode_info(info, &mut data);
                NBD_REP_INFO
            }
            OptionReply::MetaContext { id, name } => {
                data.extend_from_slice(&id.to_be_bytes());
                data.extend_from_slice(clamp(name).as_bytes());
                NBD_REP_META_CONTEXT
            }
            OptionReply::Error { code, message } => {
                data.extend_from_slice(clamp(message).as_bytes());
                *code | NBD_REP_FLAG_ERROR
            }
        };
        out.extend_from_slice(&NBD_OPT_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&reply_type.to_be_bytes());
        // Data is bounded by the clamped strings: at most 4 + 2 * 4096 bytes.
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&data);
    }

    /// Parses one whole reply (the client's view), returning the option it answers.
    ///
    /// # Errors
    /// `Truncated`, `InvalidMagic`, `InvalidPayload`, `InvalidString`, `UnknownReply`.
    pub fn parse(buf: &[u8]) -> Result<(u32, OptionReply), OptionError> {
        let mut r = Reader::new(buf);
        let magic = r.u64()?;
        if magic != NBD_OPT_REPLY_MAGIC {
            return Err(OptionError::InvalidMagic { actual: magic });
        }
        let option = r.u32()?;
        let reply_type = r.u32()?;
        let len = r.u32()? as usize;
        let data = r.bytes(len)?;
        let bad_str = OptionError::InvalidString { option };
        let reply = match reply_type {
            NBD_REP_ACK if data.is_empty() => OptionReply::Ack,
            NBD_REP_SERVER => {
                let mut d = Reader::new(data);
                let n = d.u32()? as usize;
                let name = parse_string(d.bytes(n)?).ok_or(bad_str.clone())?;
                let description = parse_string(d.rest()).ok_or(bad_str)?;
                OptionReply::Server { name, description }
            }
            NBD_REP_INFO => OptionReply::Info(parse_info_item(option, data)?),
            NBD_REP_META_CONTEXT => {
                let mut d = Reader::new(data);
                let id = d.u32()?;
                let name = parse_string(d.rest()).ok_or(bad_str)?;
                OptionReply::MetaContext { id, name }
            }
            code if code & NBD_REP_FLAG_ERROR != 0 => OptionReply::Error {
                code,
                message: parse_string(data).ok_or(bad_str)?,
            },
            _ => return Err(OptionError::UnknownReply { reply_type }),
        };
        Ok((option, reply))
    }
}

fn encode_info(info: &Info, data: &mut Vec<u8>) {
    match info {
        Info::Export {
            size,
            transmission_flags,
        } => {
            data.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
            data.extend_from_slice(&size.to_be_bytes());
            data.extend_from_slice(&transmission_flags.to_be_bytes());
        }
        Info::Name(n) => {
            data.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
            data.extend_from_slice(clamp(n).as_bytes());
        }
        Info::Description(d) => {
            data.extend_from_slice(&NBD_INFO_DESCRIPTION.to_be_bytes());
            data.extend_from_slice(clamp(d).as_bytes());
        }
        Info::BlockSize {
            min,
            preferred,
            max,
        } => {
            data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
            data.extend_from_slice(&min.to_be_bytes());
            data.extend_from_slice(&preferred.to_be_bytes());
            data.extend_from_slice(&max.to_be_bytes());
        }
    }
}

fn parse_info_item(option: u32, data: &[u8]) -> Result<Info, OptionError> {
    let mut d = Reader::new(data);
    let kind = d.u16()?;
    let fixed = |want: usize| {
        if data.len() == want {
            Ok(())
        } else {
            Err(OptionError::InvalidPayload {
                option,
                what: "information length",
            })
        }
    };
    let bad_str = OptionError::InvalidString { option };
    Ok(match kind {
        NBD_INFO_EXPORT => {
            fixed(12)?;
            Info::Export {
                size: d.u64()?,
                transmission_flags: d.u16()?,
            }
        }
        NBD_INFO_NAME => Info::Name(parse_string(d.rest()).ok_or(bad_str)?),
        NBD_INFO_DESCRIPTION => Info::Description(parse_string(d.rest()).ok_or(bad_str)?),
        NBD_INFO_BLOCK_SIZE => {
            fixed(14)?;
            Info::BlockSize {
                min: d.u32()?,
                preferred: d.u32()?,
                max: d.u32()?,
            }
        }
        _ => {
            return Err(OptionError::InvalidPayload {
                option,
                what: "unknown information type",
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(option: u32, len: u32) -> Vec<u8> {
        let mut v = Vec::new();
        OptionHeader { option, len }.encode(&mut v);
        v
    }

    #[test]
    fn header_over_limit_is_too_long() {
        // 1 GiB: the server must refuse before allocating anything.
        let err = OptionHeader::parse(&header(NBD_OPT_GO, 1 << 30)).unwrap_err();
        assert_eq!(
            err,
            OptionError::TooLong {
                option: NBD_OPT_GO,
                len: 1 << 30
            }
        );
        assert!(err.is_fatal());
        assert_eq!(err.reply_type(), NBD_REP_ERR_TOO_BIG);
    }

    #[test]
    fn header_bad_magic_is_fatal() {
        let mut h = header(NBD_OPT_GO, 0);
        h[0] ^= 1;
        assert!(OptionHeader::parse(&h).unwrap_err().is_fatal());
    }

    #[test]
    fn go_name_length_past_data_is_invalid() {
        // name_len 100 but only 6 bytes of data.
        let payload = [0, 0, 0, 100, 0, 0];
        let h = OptionHeader {
            option: NBD_OPT_GO,
            len: 6,
        };
        let err = ClientOption::parse(h, &payload).unwrap_err();
        assert_eq!(err.reply_type(), NBD_REP_ERR_INVALID);
    }

    #[test]
    fn list_with_data_is_unexpected() {
        let h = OptionHeader {
            option: NBD_OPT_LIST,
            len: 1,
        };
        assert_eq!(
            ClientOption::parse(h, &[7]).unwrap_err(),
            OptionError::UnexpectedData {
                option: NBD_OPT_LIST,
                len: 1
            }
        );
    }

    #[test]
    fn unknown_option_parses_as_unknown() {
        let h = OptionHeader {
            option: 0x1234,
            len: 3,
        };
        assert_eq!(
            ClientOption::parse(h, b"abc").unwrap(),
            ClientOption::Unknown(0x1234)
        );
    }

    #[test]
    fn info_export_reply_is_12_bytes_of_data() {
        let mut out = Vec::new();
        OptionReply::Info(Info::Export {
            size: 4096,
            transmission_flags: 1,
        })
        .encode(NBD_OPT_GO, &mut out);
        assert_eq!(out.len(), OPTION_REPLY_HEADER_LEN + 12);
        assert_eq!(&out[16..20], &12u32.to_be_bytes());
    }
}
