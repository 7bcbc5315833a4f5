//! The device key in the machine's TPM: read at boot, written after the first ticket login,
//! over any byte stream to a TPM 2.0 (`/dev/tpmrm0`, the kernel's resource manager, or a
//! `swtpm` socket in tests). The commands are `tpm_proto`'s (pure); this is their I/O.
//!
//! ```text
//!   boot agent ── Tpm::load_key ──► NV_Read(FERRY_NV_INDEX, 32) ─► key, or none yet
//!              ── Tpm::store_key ─► NV_UndefineSpace (an old one), NV_DefineSpace,
//!                                   NV_Write(key)
//! ```
//!
//! The index holds the 32 bytes of the device's key, readable on that machine only (an
//! `AUTHREAD` index with an empty password: see `tpm_proto`'s design notes for what a PCR
//! policy would add). Nothing of it crosses the network: the agent proves logins with it.

use std::io::{Read, Write};

use tpm_proto::{
    Error as Proto, FERRY_NV_INDEX, HEADER_BYTES, RESPONSE_BYTES_MAX, parse_nv_read,
    parse_response, response_len,
};

/// The kernel's TPM device with its resource manager.
pub const TPM_DEVICE: &str = "/dev/tpmrm0";
/// Bytes of the key kept.
pub const KEY_BYTES: usize = contract::login::DEVICE_KEY_BYTES;
/// `TPM_RC_INITIALIZE`: Startup was sent already (by the firmware).
const TPM_RC_INITIALIZE: u32 = 0x0000_0100;

/// A TPM command that failed.
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    /// The device or socket failed.
    #[error("TPM I/O")]
    Io(#[from] std::io::Error),
    /// The TPM refused the command, or answered bytes that are not a response.
    #[error("TPM")]
    Proto(#[from] Proto),
    /// The index holds something else than a key.
    #[error("the TPM's Ferry index holds {0} bytes, not a {KEY_BYTES}-byte key")]
    NotAKey(usize),
}

/// A TPM 2.0 reached over `io`.
#[derive(Debug)]
pub struct Tpm<T> {
    io: T,
}

impl<T: Read + Write> Tpm<T> {
    /// The TPM at the other end of `io`.
    pub fn new(io: T) -> Tpm<T> {
        Tpm { io }
    }

    /// Sends `cmd` and returns the whole response (at most `RESPONSE_BYTES_MAX` bytes).
    fn transact(&mut self, cmd: &[u8]) -> Result<Vec<u8>, TpmError> {
        self.io.write_all(cmd)?;
        self.io.flush()?;
        let mut buf = vec![0u8; RESPONSE_BYTES_MAX];
        let mut have = 0;
        let mut need = HEADER_BYTES;
        while have < need {
            let n = self.io.read(&mut buf[have..])?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            have += n;
            if have >= HEADER_BYTES {
                need = response_len(&buf[..have])?;
            }
        }
        buf.truncate(need);
        Ok(buf)
    }

    /// `TPM2_Startup(CLEAR)`, for a TPM nothing started (a simulator); a started one's
    /// `TPM_RC_INITIALIZE` is not an error.
    ///
    /// # Errors
    /// [`TpmError`].
    pub fn startup(&mut self) -> Result<(), TpmError> {
        let mut cmd = Vec::new();
        tpm_proto::startup_clear(&mut cmd);
        match parse_response(&self.transact(&cmd)?) {
            Ok(_) | Err(Proto::Tpm(TPM_RC_INITIALIZE)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The key kept in the TPM; `None` when the index is not defined.
    ///
    /// # Errors
    /// [`TpmError`]; [`TpmError::NotAKey`] for an index of another size.
    pub fn load_key(&mut self) -> Result<Option<Vec<u8>>, TpmError> {
        let mut cmd = Vec::new();
        tpm_proto::nv_read(&mut cmd, FERRY_NV_INDEX, &[], KEY_BYTES, 0)?;
        let resp = self.transact(&cmd)?;
        match parse_nv_read(&resp) {
            Ok(key) if key.len() == KEY_BYTES => Ok(Some(key.to_vec())),
            Ok(other) => Err(TpmError::NotAKey(other.len())),
            Err(e) if e.is_missing_handle() => Ok(None),
            // An index of another size: NV_Read past its end.
            Err(e) => Err(e.into()),
        }
    }

    /// Keeps `key` in the TPM, replacing what the index held.
    ///
    /// # Errors
    /// [`TpmError`]; [`TpmError::NotAKey`] for a key of another size.
    pub fn store_key(&mut self, key: &[u8]) -> Result<(), TpmError> {
        if key.len() != KEY_BYTES {
            return Err(TpmError::NotAKey(key.len()));
        }
        let mut cmd = Vec::new();
        tpm_proto::nv_undefine_space(&mut cmd, FERRY_NV_INDEX, &[])?;
        match parse_response(&self.transact(&cmd)?) {
            Ok(_) => {}
            Err(e) if e.is_missing_handle() => {}
            Err(e) => return Err(e.into()),
        }
        cmd.clear();
        tpm_proto::nv_define_space(&mut cmd, FERRY_NV_INDEX, &[], KEY_BYTES, &[])?;
        parse_response(&self.transact(&cmd)?)?;
        cmd.clear();
        tpm_proto::nv_write(&mut cmd, FERRY_NV_INDEX, &[], key, 0)?;
        parse_response(&self.transact(&cmd)?)?;
        Ok(())
    }
}
