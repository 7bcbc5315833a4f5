//! The file type identifier at offset 0 (MS-VHDX 2.2.1): "vhdxfile" and a creator string.

/// `"vhdxfile"` read as a little-endian u64.
pub const VHDX_SIGNATURE: u64 = 0x656C_6966_7864_6876;
/// Bytes of the identifier structure that carry meaning (signature + 512-byte creator).
pub const IDENT_LEN: usize = 8 + 512;

/// Errors decoding the file type identifier.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The first 8 bytes are not "vhdxfile".
    #[error("not a vhdx file: signature {found:#018x} at offset 0, expected \"vhdxfile\"")]
    InvalidSignature {
        /// What was found.
        found: u64,
    },
    /// Fewer bytes than the structure needs.
    #[error("file identifier truncated: {len} bytes, need {IDENT_LEN}")]
    Truncated {
        /// Bytes given.
        len: usize,
    },
}

/// The file type identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    /// The creator application (informational), UTF-16LE on disk.
    pub creator: String,
}

impl Ident {
    /// Parses the identifier from the first bytes of the file.
    ///
    /// # Errors
    /// [`Error::InvalidSignature`] when the file is not VHDX.
    pub fn parse(b: &[u8]) -> Result<Ident, Error> {
        if b.len() < IDENT_LEN {
            return Err(Error::Truncated { len: b.len() });
        }
        let sig = crate::le_u64(b, 0);
        if sig != VHDX_SIGNATURE {
            return Err(Error::InvalidSignature { found: sig });
        }
        let units: Vec<u16> = b[8..IDENT_LEN]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&u| u != 0)
            .collect();
        Ok(Ident {
            creator: String::from_utf16_lossy(&units),
        })
    }

    /// Encodes into `out` (at least [`IDENT_LEN`] bytes; the rest is left as is).
    pub fn encode(&self, out: &mut [u8]) {
        out[..IDENT_LEN].fill(0);
        crate::put_u64(out, 0, VHDX_SIGNATURE);
        for (i, u) in self.creator.encode_utf16().take(255).enumerate() {
            crate::put_u16(out, 8 + 2 * i, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let id = Ident {
            creator: "Ferry 0.1".into(),
        };
        let mut b = vec![0u8; IDENT_LEN];
        id.encode(&mut b);
        assert_eq!(Ident::parse(&b).unwrap(), id);
    }

    #[test]
    fn libvhdi_sample_parses() {
        let b = include_bytes!("../testdata/file_identifier.1");
        let id = Ident::parse(b).unwrap();
        assert!(
            id.creator.starts_with("Microsoft Windows 10.0.19041"),
            "{}",
            id.creator
        );
    }

    #[test]
    fn wrong_signature_is_refused() {
        let b = vec![0u8; IDENT_LEN];
        assert_eq!(Ident::parse(&b), Err(Error::InvalidSignature { found: 0 }));
    }
}
