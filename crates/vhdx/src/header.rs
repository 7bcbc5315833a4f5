//! The VHDX header (MS-VHDX 2.2.2): two 4 KiB copies at 64 KiB and 128 KiB; the valid one
//! with the higher sequence number is current.

use crate::crc::crc32c_with_hole;
use crate::{Guid, MIB, le_u16, le_u32, le_u64, put_u16, put_u32, put_u64};

/// `"head"` as a little-endian u32.
pub const HEADER_SIGNATURE: u32 = 0x6461_6568;
/// The size of the header structure covered by the checksum.
pub const HEADER_LEN: usize = 4096;

/// Errors decoding one header copy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// Both copies are invalid.
    #[error("no valid header: header 1: {first}; header 2: {second}")]
    BothInvalid {
        /// Why the first failed.
        first: Box<Error>,
        /// Why the second failed.
        second: Box<Error>,
    },
    /// Both copies are valid with the same sequence number but different contents.
    #[error("headers 1 and 2 both have sequence number {seq} but differ")]
    EqualSequenceDiffer {
        /// The shared sequence number.
        seq: u64,
    },
    /// The CRC-32C does not match.
    #[error("bad header checksum: stored {stored:#010x}, computed {computed:#010x}")]
    InvalidChecksum {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// The log offset or length is not 1 MiB aligned or the log overlaps the first 1 MiB.
    #[error("bad log placement: offset {offset:#x}, length {length:#x}")]
    InvalidLogPlacement {
        /// LogOffset.
        offset: u64,
        /// LogLength.
        length: u32,
    },
    /// Not "head".
    #[error("bad header signature {found:#010x}")]
    InvalidSignature {
        /// What was found.
        found: u32,
    },
    /// Version or LogVersion is not what this implementation knows.
    #[error("unsupported header version {version} / log version {log_version}")]
    UnsupportedVersion {
        /// Version (must be 1).
        version: u16,
        /// LogVersion (must be 0).
        log_version: u16,
    },
    /// Fewer than 4 KiB given.
    #[error("header truncated: {len} bytes")]
    Truncated {
        /// Bytes given.
        len: usize,
    },
}

/// One decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// SequenceNumber: the copy with the larger one is current.
    pub sequence_number: u64,
    /// FileWriteGuid: changed on the first metadata write after open.
    pub file_write_guid: Guid,
    /// DataWriteGuid: changed before the first user-visible data change; children link to it.
    pub data_write_guid: Guid,
    /// LogGuid: zero means the log is empty (clean).
    pub log_guid: Guid,
    /// LogLength in bytes (multiple of 1 MiB).
    pub log_length: u32,
    /// LogOffset in bytes (multiple of 1 MiB, at least 1 MiB).
    pub log_offset: u64,
}

impl Header {
    /// Parses and validates one 4 KiB header copy.
    ///
    /// # Errors
    /// Signature, checksum, version and log placement are all checked.
    pub fn parse(b: &[u8]) -> Result<Header, Error> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated { len: b.len() });
        }
        let b = &b[..HEADER_LEN];
        let sig = le_u32(b, 0);
        if sig != HEADER_SIGNATURE {
            return Err(Error::InvalidSignature { found: sig });
        }
        let stored = le_u32(b, 4);
        let computed = crc32c_with_hole(b, 4);
        if stored != computed {
            return Err(Error::InvalidChecksum { stored, computed });
        }
        let log_version = le_u16(b, 64);
        let version = le_u16(b, 66);
        if version != 1 || log_version != 0 {
            return Err(Error::UnsupportedVersion {
                version,
                log_version,
            });
        }
        let h = Header {
            sequence_number: le_u64(b, 8),
            file_write_guid: Guid::read(b, 16),
            data_write_guid: Guid::read(b, 32),
            log_guid: Guid::read(b, 48),
            log_length: le_u32(b, 68),
            log_offset: le_u64(b, 72),
        };
        let len = u64::from(h.log_length);
        if !h.log_offset.is_multiple_of(MIB)
            || len % MIB != 0
            || (len != 0 && h.log_offset < MIB)
            || h.log_offset.checked_add(len).is_none()
        {
            return Err(Error::InvalidLogPlacement {
                offset: h.log_offset,
                length: h.log_length,
            });
        }
        Ok(h)
    }

    /// Encodes into a 4 KiB buffer, checksum included.
    pub fn encode(&self, out: &mut [u8]) {
        let b = &mut out[..HEADER_LEN];
        b.fill(0);
        put_u32(b, 0, HEADER_SIGNATURE);
        put_u64(b, 8, self.sequence_number);
        self.file_write_guid.write(b, 16);
        self.data_write_guid.write(b, 32);
        self.log_guid.write(b, 48);
        put_u16(b, 64, 0);
        put_u16(b, 66, 1);
        put_u32(b, 68, self.log_length);
        put_u64(b, 72, self.log_offset);
        let crc = crc32c_with_hole(b, 4);
        put_u32(b, 4, crc);
    }

    /// Encodes into a fresh 4 KiB vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN];
        self.encode(&mut v);
        v
    }
}

/// Which copy is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The copy at 64 KiB.
    First,
    /// The copy at 128 KiB.
    Second,
}

impl Slot {
    /// The other slot: where the next update goes.
    pub fn other(self) -> Slot {
        match self {
            Slot::First => Slot::Second,
            Slot::Second => Slot::First,
        }
    }

    /// The file offset of this slot.
    pub fn offset(self) -> u64 {
        match self {
            Slot::First => crate::HEADER1_OFFSET,
            Slot::Second => crate::HEADER2_OFFSET,
        }
    }
}

/// The result of choosing between the two copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    /// The current header.
    pub header: Header,
    /// Where it is.
    pub slot: Slot,
    /// True when the other copy is invalid or older (a repair may rewrite it).
    pub other_stale: bool,
}

/// Chooses the current header from the two raw 4 KiB copies (MS-VHDX 2.2.2.1).
///
/// Two valid copies with equal sequence numbers are accepted only when byte-identical
/// (Disk2VHD writes them so).
///
/// # Errors
/// When neither copy is valid, or both are valid with equal sequence but differ.
pub fn choose(first: &[u8], second: &[u8]) -> Result<Current, Error> {
    match (Header::parse(first), Header::parse(second)) {
        (Ok(a), Ok(b)) => {
            if a.sequence_number > b.sequence_number {
                Ok(Current {
                    header: a,
                    slot: Slot::First,
                    other_stale: true,
                })
            } else if b.sequence_number > a.sequence_number {
                Ok(Current {
                    header: b,
                    slot: Slot::Second,
                    other_stale: true,
                })
            } else if first[..HEADER_LEN] == second[..HEADER_LEN] {
                Ok(Current {
                    header: a,
                    slot: Slot::First,
                    other_stale: false,
                })
            } else {
                Err(Error::EqualSequenceDiffer {
                    seq: a.sequence_number,
                })
            }
        }
        (Ok(a), Err(_)) => Ok(Current {
            header: a,
            slot: Slot::First,
            other_stale: true,
        }),
        (Err(_), Ok(b)) => Ok(Current {
            header: b,
            slot: Slot::Second,
            other_stale: true,
        }),
        (Err(e1), Err(e2)) => Err(Error::BothInvalid {
            first: Box::new(e1),
            second: Box::new(e2),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            sequence_number: 7,
            file_write_guid: Guid([1; 16]),
            data_write_guid: Guid([2; 16]),
            log_guid: Guid::ZERO,
            log_length: MIB as u32,
            log_offset: MIB,
        }
    }

    #[test]
    fn libvhdi_header_checksum_verifies() {
        let b = include_bytes!("../testdata/image_header.1");
        let h = Header::parse(b).unwrap();
        assert_eq!(h.sequence_number, 6);
        assert_eq!((h.log_offset, h.log_length), (MIB, MIB as u32));
        assert_eq!(le_u32(b, 4), 0x9F69_B235);
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(Header::parse(&h.to_bytes()).unwrap(), h);
    }

    #[test]
    fn flipped_bit_fails_checksum() {
        let mut b = sample().to_bytes();
        b[100] ^= 1;
        assert!(matches!(
            Header::parse(&b),
            Err(Error::InvalidChecksum { .. })
        ));
    }

    #[test]
    fn higher_sequence_wins() {
        let a = sample().to_bytes();
        let b = Header {
            sequence_number: 8,
            ..sample()
        }
        .to_bytes();
        assert_eq!(choose(&a, &b).unwrap().slot, Slot::Second);
    }

    #[test]
    fn identical_equal_sequence_opens() {
        let a = sample().to_bytes();
        assert_eq!(choose(&a, &a).unwrap().slot, Slot::First);
    }

    #[test]
    fn differing_equal_sequence_is_refused() {
        let a = sample().to_bytes();
        let b = Header {
            data_write_guid: Guid([9; 16]),
            ..sample()
        }
        .to_bytes();
        assert_eq!(choose(&a, &b), Err(Error::EqualSequenceDiffer { seq: 7 }));
    }

    #[test]
    fn torn_copy_falls_back_to_other() {
        let a = sample().to_bytes();
        let mut b = Header {
            sequence_number: 8,
            ..sample()
        }
        .to_bytes();
        b[2048..].fill(0xff);
        assert_eq!(choose(&a, &b).unwrap().header.sequence_number, 7);
    }
}
