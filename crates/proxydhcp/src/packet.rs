//! The DHCP packet (RFC 2131 §2, the BOOTP layout of RFC 951) and its options (RFC 2132):
//! parse and encode over bytes, nothing else.
//!
//! ```text
//!   0      op htype hlen hops | xid (4) | secs (2) flags (2) | ciaddr yiaddr siaddr giaddr
//!   28     chaddr (16) | sname (64) | file (128)
//!   236    magic cookie 99.130.83.99 | options: code len value … 255 (0 pads)
//! ```
//!
//! Options are kept in the order received, each at most once (a repeated code is joined, as
//! RFC 3396 says for long options). Option overload (52), which moves options into `sname`
//! and `file`, is not followed: a proxy needs nothing a PXE client would put there.

use std::net::Ipv4Addr;

/// The fixed part before the options, with the magic cookie.
pub const HEADER_BYTES: usize = 240;
/// The largest packet read or written (an Ethernet MTU's UDP payload).
pub const PACKET_BYTES_MAX: usize = 1472;
/// The most distinct options one packet may carry.
pub const OPTIONS_MAX: usize = 64;
/// The magic cookie that starts the options.
pub const MAGIC: [u8; 4] = [99, 130, 83, 99];

/// `op` of a request (client to server).
pub const BOOTREQUEST: u8 = 1;
/// `op` of a reply (server to client).
pub const BOOTREPLY: u8 = 2;
/// The broadcast bit of `flags`.
pub const FLAG_BROADCAST: u16 = 0x8000;

/// Option codes this crate reads or writes (RFC 2132, RFC 4578, PXE 2.1).
pub mod code {
    /// Pad.
    pub const PAD: u8 = 0;
    /// Vendor-specific information (PXE's sub-options).
    pub const VENDOR: u8 = 43;
    /// DHCP message type.
    pub const MESSAGE_TYPE: u8 = 53;
    /// Server identifier.
    pub const SERVER_ID: u8 = 54;
    /// Parameter request list.
    pub const PARAMETER_LIST: u8 = 55;
    /// Vendor class identifier (`PXEClient:Arch:…`).
    pub const VENDOR_CLASS: u8 = 60;
    /// TFTP server name.
    pub const TFTP_SERVER: u8 = 66;
    /// Boot file name.
    pub const BOOTFILE: u8 = 67;
    /// User class (iPXE sends `iPXE`).
    pub const USER_CLASS: u8 = 77;
    /// Client system architecture (RFC 4578 §2.1).
    pub const CLIENT_ARCH: u8 = 93;
    /// Client network interface identifier (RFC 4578 §2.2).
    pub const CLIENT_NDI: u8 = 94;
    /// Client machine identifier, the UUID/GUID (RFC 4578 §2.3).
    pub const CLIENT_UUID: u8 = 97;
    /// iPXE's encapsulated options (present in every iPXE request).
    pub const IPXE: u8 = 175;
    /// End.
    pub const END: u8 = 255;
}

/// DHCP message types (option 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// DHCPDISCOVER.
    Discover,
    /// DHCPOFFER.
    Offer,
    /// DHCPREQUEST.
    Request,
    /// DHCPDECLINE.
    Decline,
    /// DHCPACK.
    Ack,
    /// DHCPNAK.
    Nak,
    /// DHCPRELEASE.
    Release,
    /// DHCPINFORM.
    Inform,
}

impl MessageType {
    /// The type of option 53's value.
    pub fn from_u8(v: u8) -> Option<MessageType> {
        Some(match v {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            4 => MessageType::Decline,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            8 => MessageType::Inform,
            _ => return None,
        })
    }

    /// Option 53's value.
    pub fn to_u8(self) -> u8 {
        match self {
            MessageType::Discover => 1,
            MessageType::Offer => 2,
            MessageType::Request => 3,
            MessageType::Decline => 4,
            MessageType::Ack => 5,
            MessageType::Nak => 6,
            MessageType::Release => 7,
            MessageType::Inform => 8,
        }
    }
}

/// Why bytes are not a DHCP packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than the fixed part and the cookie.
    #[error("{0} bytes: shorter than a DHCP packet ({HEADER_BYTES})")]
    Short(usize),
    /// Longer than [`PACKET_BYTES_MAX`].
    #[error("{0} bytes: longer than {PACKET_BYTES_MAX}")]
    Long(usize),
    /// Not Ethernet (`htype` 1, `hlen` 6).
    #[error("hardware type {0} length {1}: only Ethernet (1, 6) is served")]
    Hardware(u8, u8),
    /// The magic cookie is missing.
    #[error("no DHCP magic cookie")]
    NoMagic,
    /// An option runs past the end.
    #[error("option {0} runs past the packet's end")]
    Truncated(u8),
    /// More than [`OPTIONS_MAX`] distinct options.
    #[error("more than {OPTIONS_MAX} options")]
    TooManyOptions,
    /// `op` is neither 1 nor 2.
    #[error("op {0} is neither request nor reply")]
    Op(u8),
}

/// A DHCP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// [`BOOTREQUEST`] or [`BOOTREPLY`].
    pub op: u8,
    /// Relay hops.
    pub hops: u8,
    /// The transaction id.
    pub xid: u32,
    /// Seconds since the client began.
    pub secs: u16,
    /// Flags ([`FLAG_BROADCAST`]).
    pub flags: u16,
    /// The client's address when it has one.
    pub ciaddr: Ipv4Addr,
    /// The address offered (a proxy offers none: 0.0.0.0).
    pub yiaddr: Ipv4Addr,
    /// The next server (TFTP).
    pub siaddr: Ipv4Addr,
    /// The relay agent.
    pub giaddr: Ipv4Addr,
    /// The client's MAC.
    pub mac: [u8; 6],
    /// The server host name (NUL-padded text, at most 63 bytes).
    pub sname: Vec<u8>,
    /// The boot file name (NUL-padded text, at most 127 bytes).
    pub file: Vec<u8>,
    /// Options in order, without pad and end.
    pub options: Vec<(u8, Vec<u8>)>,
}

fn ip(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

fn text(field: &[u8]) -> Vec<u8> {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    field[..end].to_vec()
}

/// Parses one packet.
///
/// # Errors
/// [`PacketError`] naming what is wrong.
pub fn parse(b: &[u8]) -> Result<Packet, PacketError> {
    if b.len() < HEADER_BYTES {
        return Err(PacketError::Short(b.len()));
    }
    if b.len() > PACKET_BYTES_MAX {
        return Err(PacketError::Long(b.len()));
    }
    if b[0] != BOOTREQUEST && b[0] != BOOTREPLY {
        return Err(PacketError::Op(b[0]));
    }
    if b[1] != 1 || b[2] != 6 {
        return Err(PacketError::Hardware(b[1], b[2]));
    }
    if b[236..240] != MAGIC {
        return Err(PacketError::NoMagic);
    }
    let mut options: Vec<(u8, Vec<u8>)> = Vec::new();
    let mut at = HEADER_BYTES;
    while at < b.len() {
        let c = b[at];
        if c == code::PAD {
            at += 1;
            continue;
        }
        if c == code::END {
            break;
        }
        let len = usize::from(*b.get(at + 1).ok_or(PacketError::Truncated(c))?);
        let value = b
            .get(at + 2..at + 2 + len)
            .ok_or(PacketError::Truncated(c))?;
        if let Some((_, v)) = options.iter_mut().find(|(k, _)| *k == c) {
            v.extend_from_slice(value);
        } else if options.len() >= OPTIONS_MAX {
            return Err(PacketError::TooManyOptions);
        } else {
            options.push((c, value.to_vec()));
        }
        at += 2 + len;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&b[28..34]);
    Ok(Packet {
        op: b[0],
        hops: b[3],
        xid: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        secs: u16::from_be_bytes([b[8], b[9]]),
        flags: u16::from_be_bytes([b[10], b[11]]),
        ciaddr: ip(b, 12),
        yiaddr: ip(b, 16),
        siaddr: ip(b, 20),
        giaddr: ip(b, 24),
        mac,
        sname: text(&b[44..108]),
        file: text(&b[108..236]),
        options,
    })
}

impl Packet {
    /// The value of option `code`, if present.
    pub fn option(&self, code: u8) -> Option<&[u8]> {
        self.options
            .iter()
            .find(|(k, _)| *k == code)
            .map(|(_, v)| v.as_slice())
    }

    /// The message type (option 53), if present and known.
    pub fn message_type(&self) -> Option<MessageType> {
        match self.option(code::MESSAGE_TYPE) {
            Some([v]) => MessageType::from_u8(*v),
            _ => None,
        }
    }

    /// The bytes of this packet: the fixed part, the cookie, the options (values longer
    /// than 255 bytes split over repeated codes, RFC 3396), the end option, padded to the
    /// BOOTP minimum of 300 bytes. `sname` and `file` are cut to 63 and 127 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        b[0] = self.op;
        b[1] = 1;
        b[2] = 6;
        b[3] = self.hops;
        b[4..8].copy_from_slice(&self.xid.to_be_bytes());
        b[8..10].copy_from_slice(&self.secs.to_be_bytes());
        b[10..12].copy_from_slice(&self.flags.to_be_bytes());
        b[12..16].copy_from_slice(&self.ciaddr.octets());
        b[16..20].copy_from_slice(&self.yiaddr.octets());
        b[20..24].copy_from_slice(&self.siaddr.octets());
        b[24..28].copy_from_slice(&self.giaddr.octets());
        b[28..34].copy_from_slice(&self.mac);
        let sname = &self.sname[..self.sname.len().min(63)];
        b[44..44 + sname.len()].copy_from_slice(sname);
        let file = &self.file[..self.file.len().min(127)];
        b[108..108 + file.len()].copy_from_slice(file);
        b[236..240].copy_from_slice(&MAGIC);
        for (c, v) in &self.options {
            if v.is_empty() {
                b.extend_from_slice(&[*c, 0]);
            }
            for part in v.chunks(255) {
                b.push(*c);
                b.push(u8::try_from(part.len()).unwrap_or(255));
                b.extend_from_slice(part);
            }
        }
        b.push(code::END);
        if b.len() < 300 {
            b.resize(300, 0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn discover() -> Packet {
        Packet {
            op: BOOTREQUEST,
            hops: 0,
            xid: 0x1234_5678,
            secs: 4,
            flags: FLAG_BROADCAST,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            sname: Vec::new(),
            file: Vec::new(),
            options: vec![
                (code::MESSAGE_TYPE, vec![1]),
                (
                    code::VENDOR_CLASS,
                    b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
                ),
                (code::CLIENT_ARCH, vec![0, 0]),
            ],
        }
    }

    #[test]
    fn a_packet_round_trips_and_is_at_least_300_bytes() {
        let p = discover();
        let b = p.encode();
        assert_eq!(b.len(), 300);
        assert_eq!(parse(&b).unwrap(), p);
        assert_eq!(p.message_type(), Some(MessageType::Discover));
    }

    #[test]
    fn bad_packets_say_what_is_wrong() {
        let b = discover().encode();
        assert_eq!(parse(&b[..239]), Err(PacketError::Short(239)));
        let mut no_magic = b.clone();
        no_magic[236] = 0;
        assert_eq!(parse(&no_magic), Err(PacketError::NoMagic));
        let mut token_ring = b.clone();
        token_ring[1] = 6;
        assert_eq!(parse(&token_ring), Err(PacketError::Hardware(6, 6)));
        let mut cut = b[..HEADER_BYTES].to_vec();
        cut.extend_from_slice(&[code::VENDOR_CLASS, 9, b'P']);
        assert_eq!(parse(&cut), Err(PacketError::Truncated(60)));
        let mut many = b[..HEADER_BYTES].to_vec();
        for c in 1..=u8::try_from(OPTIONS_MAX + 1).unwrap() {
            many.extend_from_slice(&[c, 0]);
        }
        assert_eq!(parse(&many), Err(PacketError::TooManyOptions));
        assert_eq!(parse(&vec![0u8; 2000]), Err(PacketError::Long(2000)));
    }

    #[test]
    fn a_repeated_option_is_joined_and_a_long_one_is_split() {
        let mut p = discover();
        p.options.push((code::VENDOR, vec![7u8; 300]));
        let b = p.encode();
        assert_eq!(parse(&b).unwrap().option(code::VENDOR).unwrap().len(), 300);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn a_valid_head_with_any_options_parses_or_is_refused(tail in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut b = discover().encode()[..HEADER_BYTES].to_vec();
            b.extend_from_slice(&tail);
            if let Ok(p) = parse(&b) {
                prop_assert!(p.options.len() <= OPTIONS_MAX);
            }
        }
    }
}
