//! The iSCSI PDU frame (RFC 7143 §11.2): a 48-byte basic header segment (BHS), additional
//! header segments (AHS, `TotalAHSLength` 4-byte words), a header digest, the data segment
//! padded to a multiple of 4 bytes, a data digest. Digests are CRC32C (§13.1), sent least
//! significant byte first, present when the connection negotiated them ([`Digests`]).
//!
//! ```text
//!   0  .I opcode | F + opcode-specific | opcode-specific (2)
//!   4  TotalAHSLength | DataSegmentLength (3, bytes, without padding)
//!   8  LUN or opcode-specific (8)
//!   16 Initiator Task Tag (4)
//!   20 opcode-specific (28)
//!   48 AHS … [header digest] data segment + pad [data digest]
//! ```
//!
//! [`check`] says whether a buffer holds a whole PDU (and how long it is) from its first
//! 48 bytes, before any allocation, and refuses a data segment longer than the caller's
//! limit, so that a peer cannot make the reader buffer more than it agreed to receive.

/// The basic header segment's length.
pub const BHS_BYTES: usize = 48;
/// The longest AHS: 255 words.
pub const AHS_BYTES_MAX: usize = 255 * 4;
/// The longest data segment the format can say (24 bits).
pub const DATA_SEGMENT_FORMAT_MAX: usize = (1 << 24) - 1;
/// A digest's length.
pub const DIGEST_BYTES: usize = 4;

/// Which digests a connection uses (negotiated at login: `HeaderDigest`, `DataDigest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// CRC32C after the header segments.
    pub header: bool,
    /// CRC32C after a non-empty data segment.
    pub data: bool,
}

/// The opcodes of RFC 7143 §11.2.1.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// 0x00, initiator.
    NopOut,
    /// 0x01.
    ScsiCommand,
    /// 0x02.
    TaskMgmtRequest,
    /// 0x03.
    LoginRequest,
    /// 0x04.
    TextRequest,
    /// 0x05.
    DataOut,
    /// 0x06.
    LogoutRequest,
    /// 0x10.
    SnackRequest,
    /// 0x20, target.
    NopIn,
    /// 0x21.
    ScsiResponse,
    /// 0x22.
    TaskMgmtResponse,
    /// 0x23.
    LoginResponse,
    /// 0x24.
    TextResponse,
    /// 0x25.
    DataIn,
    /// 0x26.
    LogoutResponse,
    /// 0x31.
    R2t,
    /// 0x32.
    AsyncMessage,
    /// 0x3f.
    Reject,
}

const OPCODES: [(u8, Opcode); 18] = [
    (0x00, Opcode::NopOut),
    (0x01, Opcode::ScsiCommand),
    (0x02, Opcode::TaskMgmtRequest),
    (0x03, Opcode::LoginRequest),
    (0x04, Opcode::TextRequest),
    (0x05, Opcode::DataOut),
    (0x06, Opcode::LogoutRequest),
    (0x10, Opcode::SnackRequest),
    (0x20, Opcode::NopIn),
    (0x21, Opcode::ScsiResponse),
    (0x22, Opcode::TaskMgmtResponse),
    (0x23, Opcode::LoginResponse),
    (0x24, Opcode::TextResponse),
    (0x25, Opcode::DataIn),
    (0x26, Opcode::LogoutResponse),
    (0x31, Opcode::R2t),
    (0x32, Opcode::AsyncMessage),
    (0x3f, Opcode::Reject),
];

impl Opcode {
    /// The opcode of byte 0's low six bits.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        OPCODES
            .iter()
            .find(|(c, _)| *c == v & 0x3f)
            .map(|(_, o)| *o)
    }

    /// Its six-bit code.
    pub fn code(self) -> u8 {
        OPCODES
            .iter()
            .find(|(_, o)| *o == self)
            .map_or(0x3f, |(c, _)| *c)
    }

    /// True for the opcodes an initiator sends.
    pub fn from_initiator(self) -> bool {
        self.code() < 0x20
    }
}

/// Why bytes are not (yet) a PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// More bytes are needed: the PDU is this long in all (or at least [`BHS_BYTES`]).
    #[error("incomplete PDU: {0} bytes needed")]
    Incomplete(usize),
    /// The data segment is longer than the receiver's limit.
    #[error("data segment of {len} bytes: longer than the {max} agreed")]
    DataTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An opcode RFC 7143 does not define.
    #[error("opcode {0:#04x} is not defined")]
    Opcode(u8),
    /// The header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest does not match.
    #[error("data digest mismatch")]
    DataDigest,
}

/// CRC32C as iSCSI sends it (§13.1; RFC 3720 appendix B.4's examples).
pub fn digest(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

fn padded(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// The whole length of the PDU starting `buf` (its header read from the first 48 bytes),
/// once `buf` holds it all.
///
/// # Errors
/// [`PduError::Incomplete`] with the length needed; [`PduError::DataTooLong`] when the data
/// segment is longer than `max_data` (checked from the header alone).
pub fn check(buf: &[u8], d: Digests, max_data: usize) -> Result<usize, PduError> {
    if buf.len() < BHS_BYTES {
        return Err(PduError::Incomplete(BHS_BYTES));
    }
    let ahs = usize::from(buf[4]) * 4;
    let data = usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7]);
    if data > max_data {
        return Err(PduError::DataTooLong {
            len: data,
            max: max_data,
        });
    }
    let mut total = BHS_BYTES + ahs + padded(data);
    if d.header {
        total += DIGEST_BYTES;
    }
    if d.data && data > 0 {
        total += DIGEST_BYTES;
    }
    if buf.len() < total {
        return Err(PduError::Incomplete(total));
    }
    Ok(total)
}

/// One PDU: its basic header as sent, its AHS and its data segment (without padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The basic header segment; `TotalAHSLength` and `DataSegmentLength` are set from
    /// `ahs` and `data` by [`Pdu::encode`].
    pub bhs: [u8; BHS_BYTES],
    /// Additional header segments (a multiple of 4 bytes, at most [`AHS_BYTES_MAX`]).
    pub ahs: Vec<u8>,
    /// The data segment.
    pub data: Vec<u8>,
}

impl Pdu {
    /// A PDU of `op` with everything else zero.
    pub fn new(op: Opcode) -> Pdu {
        let mut bhs = [0u8; BHS_BYTES];
        bhs[0] = op.code();
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Reads the PDU at the start of `buf`; returns it and the bytes it took.
    ///
    /// # Errors
    /// As [`check`]; [`PduError::Opcode`]; a digest that does not match.
    pub fn parse(buf: &[u8], d: Digests, max_data: usize) -> Result<(Pdu, usize), PduError> {
        let total = check(buf, d, max_data)?;
        if Opcode::from_u8(buf[0]).is_none() {
            return Err(PduError::Opcode(buf[0] & 0x3f));
        }
        let mut bhs = [0u8; BHS_BYTES];
        bhs.copy_from_slice(&buf[..BHS_BYTES]);
        let ahs_end = BHS_BYTES + usize::from(buf[4]) * 4;
        let mut at = ahs_end;
        if d.header {
            if buf[at..at + DIGEST_BYTES] != digest(&buf[..ahs_end]) {
                return Err(PduError::HeaderDigest);
            }
            at += DIGEST_BYTES;
        }
        let len = usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7]);
        let data = buf[at..at + len].to_vec();
        at += padded(len);
        if d.data && len > 0 {
            if buf[at..at + DIGEST_BYTES] != digest(&buf[at - padded(len)..at]) {
                return Err(PduError::DataDigest);
            }
            at += DIGEST_BYTES;
        }
        debug_assert_eq!(at, total);
        Ok((
            Pdu {
                bhs,
                ahs: buf[BHS_BYTES..ahs_end].to_vec(),
                data,
            },
            total,
        ))
    }

    /// The opcode (`None` for an undefined one, which [`Pdu::parse`] refuses).
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.bhs[0])
    }

    /// The immediate bit.
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }

    /// The final bit.
    pub fn final_bit(&self) -> bool {
        self.bhs[1] & 0x80 != 0
    }

    /// A big-endian u32 of the header at `at`.
    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes([
            self.bhs[at],
            self.bhs[at + 1],
            self.bhs[at + 2],
            self.bhs[at + 3],
        ])
    }

    /// Sets a big-endian u32 of the header at `at`.
    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.bhs[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// The initiator task tag (bytes 16–19).
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    /// The LUN field (bytes 8–15).
    pub fn lun(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bhs[8..16]);
        u64::from_be_bytes(b)
    }

    /// The bytes of this PDU with `d`'s digests: lengths set from `ahs` and `data`, the
    /// data padded with zeros. `ahs` longer than [`AHS_BYTES_MAX`] or not a multiple of 4,
    /// or data past [`DATA_SEGMENT_FORMAT_MAX`], is a caller's bug (asserted).
    pub fn encode(&self, d: Digests) -> Vec<u8> {
        assert!(self.ahs.len() <= AHS_BYTES_MAX && self.ahs.len().is_multiple_of(4));
        assert!(self.data.len() <= DATA_SEGMENT_FORMAT_MAX);
        let mut b = Vec::with_capacity(
            BHS_BYTES + self.ahs.len() + padded(self.data.len()) + 2 * DIGEST_BYTES,
        );
        b.extend_from_slice(&self.bhs);
        b[4] = u8::try_from(self.ahs.len() / 4).unwrap_or(u8::MAX);
        let len = u32::try_from(self.data.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes();
        b[5..8].copy_from_slice(&len[1..]);
        b.extend_from_slice(&self.ahs);
        if d.header {
            let h = digest(&b);
            b.extend_from_slice(&h);
        }
        if !self.data.is_empty() {
            let start = b.len();
            b.extend_from_slice(&self.data);
            b.resize(start + padded(self.data.len()), 0);
            if d.data {
                let h = digest(&b[start..]);
                b.extend_from_slice(&h);
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_digest_is_rfc_3720_s_crc32c_least_significant_byte_first() {
        // RFC 3720 appendix B.4: 32 bytes of zeros, of 0xff, and 0..31.
        assert_eq!(digest(&[0u8; 32]), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(digest(&[0xffu8; 32]), [0x43, 0xab, 0xa8, 0x62]);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(digest(&up), [0x4e, 0x79, 0xdd, 0x46]);
    }

    #[test]
    fn a_pdu_with_ahs_data_and_digests_round_trips() {
        let mut p = Pdu::new(Opcode::LoginRequest);
        p.bhs[0] |= 0x40;
        p.bhs[1] = 0x87;
        p.set_u32(16, 0xdead_beef);
        p.ahs = vec![1, 2, 3, 4];
        p.data = b"InitiatorName=iqn.x\0".to_vec();
        for d in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let b = p.encode(d);
            assert_eq!(b.len() % 4, 0);
            assert_eq!(check(&b, d, 8192), Ok(b.len()));
            let (q, n) = Pdu::parse(&b, d, 8192).unwrap();
            assert_eq!(n, b.len());
            assert_eq!(q.ahs, p.ahs);
            assert_eq!(q.data, p.data);
            assert_eq!(q.itt(), 0xdead_beef);
            assert_eq!(q.opcode(), Some(Opcode::LoginRequest));
            assert!(q.immediate() && q.final_bit());
        }
    }

    #[test]
    fn short_long_and_damaged_pdus_are_refused() {
        let mut p = Pdu::new(Opcode::ScsiCommand);
        p.data = vec![7u8; 100];
        let d = Digests {
            header: true,
            data: true,
        };
        let b = p.encode(d);
        assert_eq!(check(&b[..47], d, 8192), Err(PduError::Incomplete(48)));
        assert_eq!(check(&b[..60], d, 8192), Err(PduError::Incomplete(b.len())));
        assert_eq!(
            check(&b, d, 64),
            Err(PduError::DataTooLong { len: 100, max: 64 })
        );
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert_eq!(Pdu::parse(&bad, d, 8192), Err(PduError::HeaderDigest));
        let mut bad = b.clone();
        bad[60] ^= 1;
        assert_eq!(Pdu::parse(&bad, d, 8192), Err(PduError::DataDigest));
        let mut bad = b;
        bad[0] = 0x3e;
        assert_eq!(
            Pdu::parse(&bad, Digests::default(), 1 << 20),
            Err(PduError::Opcode(0x3e))
        );
    }

    #[test]
    fn opcodes_map_both_ways() {
        for (c, o) in OPCODES {
            assert_eq!(Opcode::from_u8(c), Some(o));
            assert_eq!(o.code(), c);
            assert_eq!(o.from_initiator(), c < 0x20);
        }
        assert_eq!(Opcode::from_u8(0x07), None);
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600), h: bool, dd: bool) {
            let d = Digests { header: h, data: dd };
            if let Ok((p, n)) = Pdu::parse(&b, d, 512) {
                prop_assert!(n <= b.len());
                prop_assert_eq!(Pdu::parse(&p.encode(d), d, 512).map(|x| x.0), Ok(p));
            }
        }
    }
}
