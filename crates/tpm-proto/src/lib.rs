//! The few TPM 2.0 commands Ferry needs to keep a device's key in a machine's TPM: an NV
//! index defined, written and read under a password session, and undefined again. Pure:
//! commands are encoded into bytes and responses decoded from bytes; the caller moves them
//! (`/dev/tpmrm0`, or a `swtpm` socket in tests). No file, socket or clock here.
//!
//! ```text
//!   command  = header ‖ handles ‖ [authorizationSize ‖ session] ‖ parameters
//!   header   = tag u16 ‖ commandSize u32 ‖ commandCode u32           (all big-endian)
//!   session  = TPM_RS_PW u32 ‖ nonce TPM2B(0) ‖ attributes u8 ‖ hmac TPM2B(password)
//!   response = tag u16 ‖ responseSize u32 ‖ responseCode u32 ‖ [parameterSize u32] ‖ …
//! ```
//!
//! Names and numbers are the TCG's: *Trusted Platform Module Library, Part 2: Structures*
//! (TPM_ST, TPM_CC, TPM_RH, TPMA_NV) and *Part 3: Commands* (the command layouts: 31.3
//! TPM2_NV_DefineSpace, 31.4 TPM2_NV_UndefineSpace, 31.6 TPM2_NV_Write, 31.13 TPM2_NV_Read).
//! Every TPM integer is big-endian.
//!
//! # Design notes
//!
//! Only a password session (`TPM_RS_PW`) is spoken: no HMAC or policy session, so no
//! session key, no nonce and no cryptography here. The index is an ordinary one,
//! `AUTHREAD | AUTHWRITE | NO_DA`: whoever knows its password (Ferry uses none: the TPM is
//! the machine's own, and root on the machine is trusted anyway) may read it on that
//! machine only; nobody reads it over the network, which is the point. A policy bound to
//! PCRs (readable only before the root is switched to) would be stronger and is left out.
//! Every length read from a response is checked against the response's own length and a
//! named limit before it is used.

use thiserror::Error;

/// `TPM_ST_NO_SESSIONS`: a command or response with no authorization area.
pub const TPM_ST_NO_SESSIONS: u16 = 0x8001;
/// `TPM_ST_SESSIONS`: a command or response with an authorization area.
pub const TPM_ST_SESSIONS: u16 = 0x8002;
/// `TPM_CC_NV_UndefineSpace`.
pub const TPM_CC_NV_UNDEFINE_SPACE: u32 = 0x0000_0122;
/// `TPM_CC_NV_DefineSpace`.
pub const TPM_CC_NV_DEFINE_SPACE: u32 = 0x0000_012A;
/// `TPM_CC_NV_Write`.
pub const TPM_CC_NV_WRITE: u32 = 0x0000_0137;
/// `TPM_CC_Startup`.
pub const TPM_CC_STARTUP: u32 = 0x0000_0144;
/// `TPM_CC_NV_Read`.
pub const TPM_CC_NV_READ: u32 = 0x0000_014E;
/// `TPM_RH_OWNER`: the owner hierarchy, which NV_DefineSpace is authorized by.
pub const TPM_RH_OWNER: u32 = 0x4000_0001;
/// `TPM_RS_PW`: the password authorization session.
pub const TPM_RS_PW: u32 = 0x4000_0009;
/// `TPM_SU_CLEAR`: the Startup type of a reset.
pub const TPM_SU_CLEAR: u16 = 0x0000;
/// `TPM_ALG_SHA256`: the index's name algorithm.
pub const TPM_ALG_SHA256: u16 = 0x000B;
/// `TPMA_NV_AUTHWRITE` (bit 2): writes are authorized by the index's password.
pub const TPMA_NV_AUTHWRITE: u32 = 1 << 2;
/// `TPMA_NV_AUTHREAD` (bit 18): reads are authorized by the index's password.
pub const TPMA_NV_AUTHREAD: u32 = 1 << 18;
/// `TPMA_NV_NO_DA` (bit 25): a wrong password does not count towards dictionary-attack
/// lockout.
pub const TPMA_NV_NO_DA: u32 = 1 << 25;
/// `TPM_RC_SUCCESS`.
pub const TPM_RC_SUCCESS: u32 = 0;
/// `TPM_RC_NV_DEFINED` (`RC_VER1 + 0x04C`): the index exists already.
pub const TPM_RC_NV_DEFINED: u32 = 0x0000_014C;
/// `TPM_RC_HANDLE` (`RC_FMT1 + 0x00B`), the low bits of a format-1 code naming a handle
/// that does not exist (its handle number in bits 8 to 10).
pub const TPM_RC_HANDLE: u32 = 0x0000_008B;
/// The first ordinary NV index the owner may define (Part 2, 7.2: `0x01000000`).
pub const NV_INDEX_FIRST: u32 = 0x0100_0000;
/// The last one (`0x01FFFFFF`).
pub const NV_INDEX_LAST: u32 = 0x01FF_FFFF;
/// The NV index Ferry keeps a device key in ("FER" in its low bytes).
pub const FERRY_NV_INDEX: u32 = 0x0146_4552;
/// The most bytes of an index Ferry defines, writes or reads at once (TPMs take at least
/// 512 per NV_Write; a key is 32).
pub const NV_DATA_BYTES_MAX: u16 = 512;
/// The most bytes of a password (the longest digest, SHA-512's).
pub const AUTH_BYTES_MAX: usize = 64;
/// The most bytes of a response read (the TPM's own command and response buffers are 4096).
pub const RESPONSE_BYTES_MAX: usize = 4096;
/// The bytes of a command's or response's header.
pub const HEADER_BYTES: usize = 10;

/// A command that cannot be encoded, or a response that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// A password longer than [`AUTH_BYTES_MAX`].
    #[error("a TPM password has at most {AUTH_BYTES_MAX} bytes, not {0}")]
    AuthTooLong(usize),
    /// Fewer bytes than the header or the response's own size says.
    #[error("a TPM response of {have} bytes, {need} needed")]
    Incomplete {
        /// Bytes there.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// An index outside the owner's ordinary range.
    #[error("NV index {0:#010x} is not an ordinary owner index")]
    InvalidIndex(u32),
    /// A size in a response that does not fit in it.
    #[error("a TPM response's {field} says {len} bytes, beyond its end")]
    InvalidLength {
        /// Which length.
        field: &'static str,
        /// What it says.
        len: usize,
    },
    /// A response tag that is neither [`TPM_ST_SESSIONS`] nor [`TPM_ST_NO_SESSIONS`].
    #[error("a TPM response tag {0:#06x}")]
    InvalidTag(u16),
    /// NV data longer than [`NV_DATA_BYTES_MAX`].
    #[error("NV data has at most {NV_DATA_BYTES_MAX} bytes, not {0}")]
    NvDataTooLong(usize),
    /// A response's size beyond [`RESPONSE_BYTES_MAX`] (or below its header).
    #[error("a TPM response size of {0} bytes")]
    ResponseSize(usize),
    /// The TPM refused the command with this response code.
    #[error("the TPM answered {0:#010x}")]
    Tpm(u32),
}

impl Error {
    /// True for the TPM's answer that a handle (here: the NV index) does not exist.
    pub fn is_missing_handle(&self) -> bool {
        // A format-1 code (bit 7) whose error number (bits 0 to 5) is TPM_RC_HANDLE's.
        matches!(self, Error::Tpm(rc) if rc & 0x80 != 0 && rc & 0x3F == TPM_RC_HANDLE & 0x3F)
    }
}

/// An encoder of one command into a caller-owned buffer (its size patched at the end).
struct Writer<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    fn new(out: &'a mut Vec<u8>, tag: u16, code: u32) -> Writer<'a> {
        let start = out.len();
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&code.to_be_bytes());
        Writer { out, start }
    }

    fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }

    fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_be_bytes());
        self
    }

    fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A `TPM2B_*`: a u16 size, then the bytes (callers bound them first).
    fn sized(&mut self, bytes: &[u8]) -> &mut Self {
        let len = u16::try_from(bytes.len()).expect("callers bound TPM2B contents");
        self.u16(len);
        self.out.extend_from_slice(bytes);
        self
    }

    /// The authorization area of one password session (Part 1, 19.8.4).
    fn password_session(&mut self, password: &[u8]) -> &mut Self {
        let session_bytes = 4 + 2 + 1 + 2 + password.len();
        let session_bytes = u32::try_from(session_bytes).expect("bounded by AUTH_BYTES_MAX");
        self.u32(session_bytes)
            .u32(TPM_RS_PW)
            .sized(&[])
            .u8(0x01) // continueSession (a password session ignores it)
            .sized(password)
    }

    fn finish(&mut self) {
        let len = u32::try_from(self.out.len() - self.start).expect("commands are small");
        self.out[self.start + 2..self.start + 6].copy_from_slice(&len.to_be_bytes());
    }
}

fn check_index(index: u32) -> Result<(), Error> {
    if (NV_INDEX_FIRST..=NV_INDEX_LAST).contains(&index) {
        Ok(())
    } else {
        Err(Error::InvalidIndex(index))
    }
}

fn check_auth(auth: &[u8]) -> Result<(), Error> {
    if auth.len() > AUTH_BYTES_MAX {
        return Err(Error::AuthTooLong(auth.len()));
    }
    Ok(())
}

fn check_data(len: usize) -> Result<u16, Error> {
    u16::try_from(len)
        .ok()
        .filter(|&n| n <= NV_DATA_BYTES_MAX)
        .ok_or(Error::NvDataTooLong(len))
}

/// `TPM2_Startup(TPM_SU_CLEAR)` (Part 3, 9.3): a TPM just powered on (a simulator) wants it
/// first; a machine's firmware has sent it already (the TPM then answers
/// `TPM_RC_INITIALIZE`, which the caller ignores).
pub fn startup_clear(out: &mut Vec<u8>) {
    let mut w = Writer::new(out, TPM_ST_NO_SESSIONS, TPM_CC_STARTUP);
    w.u16(TPM_SU_CLEAR);
    w.finish();
}

/// `TPM2_NV_DefineSpace` (Part 3, 31.3): an ordinary index `index` of `size` bytes,
/// `AUTHREAD | AUTHWRITE | NO_DA`, password `auth`, authorized by the owner's password
/// `owner_auth`.
///
/// # Errors
/// [`Error::InvalidIndex`], [`Error::AuthTooLong`], [`Error::NvDataTooLong`].
pub fn nv_define_space(
    out: &mut Vec<u8>,
    index: u32,
    auth: &[u8],
    size: usize,
    owner_auth: &[u8],
) -> Result<(), Error> {
    check_index(index)?;
    check_auth(auth)?;
    check_auth(owner_auth)?;
    let size = check_data(size)?;
    let mut public = Vec::with_capacity(14);
    public.extend_from_slice(&index.to_be_bytes());
    public.extend_from_slice(&TPM_ALG_SHA256.to_be_bytes());
    let attributes = TPMA_NV_AUTHWRITE | TPMA_NV_AUTHREAD | TPMA_NV_NO_DA;
    public.extend_from_slice(&attributes.to_be_bytes());
    public.extend_from_slice(&0u16.to_be_bytes()); // authPolicy: empty
    public.extend_from_slice(&size.to_be_bytes());
    let mut w = Writer::new(out, TPM_ST_SESSIONS, TPM_CC_NV_DEFINE_SPACE);
    w.u32(TPM_RH_OWNER)
        .password_session(owner_auth)
        .sized(auth)
        .sized(&public);
    w.finish();
    Ok(())
}

/// `TPM2_NV_UndefineSpace` (Part 3, 31.4) of `index`, authorized by the owner's password.
///
/// # Errors
/// [`Error::InvalidIndex`], [`Error::AuthTooLong`].
pub fn nv_undefine_space(out: &mut Vec<u8>, index: u32, owner_auth: &[u8]) -> Result<(), Error> {
    check_index(index)?;
    check_auth(owner_auth)?;
    let mut w = Writer::new(out, TPM_ST_SESSIONS, TPM_CC_NV_UNDEFINE_SPACE);
    w.u32(TPM_RH_OWNER).u32(index).password_session(owner_auth);
    w.finish();
    Ok(())
}

/// `TPM2_NV_Write` (Part 3, 31.6) of `data` at `offset` into `index`, authorized by the
/// index's own password `auth`.
///
/// # Errors
/// [`Error::InvalidIndex`], [`Error::AuthTooLong`], [`Error::NvDataTooLong`].
pub fn nv_write(
    out: &mut Vec<u8>,
    index: u32,
    auth: &[u8],
    data: &[u8],
    offset: u16,
) -> Result<(), Error> {
    check_index(index)?;
    check_auth(auth)?;
    check_data(data.len())?;
    let mut w = Writer::new(out, TPM_ST_SESSIONS, TPM_CC_NV_WRITE);
    w.u32(index)
        .u32(index)
        .password_session(auth)
        .sized(data)
        .u16(offset);
    w.finish();
    Ok(())
}

/// `TPM2_NV_Read` (Part 3, 31.13) of `size` bytes at `offset` of `index`, authorized by
/// the index's own password `auth`; [`parse_nv_read`] decodes the answer.
///
/// # Errors
/// [`Error::InvalidIndex`], [`Error::AuthTooLong`], [`Error::NvDataTooLong`].
pub fn nv_read(
    out: &mut Vec<u8>,
    index: u32,
    auth: &[u8],
    size: usize,
    offset: u16,
) -> Result<(), Error> {
    check_index(index)?;
    check_auth(auth)?;
    let size = check_data(size)?;
    let mut w = Writer::new(out, TPM_ST_SESSIONS, TPM_CC_NV_READ);
    w.u32(index)
        .u32(index)
        .password_session(auth)
        .u16(size)
        .u16(offset);
    w.finish();
    Ok(())
}

/// The whole length of the response whose first bytes are `head` (at least
/// [`HEADER_BYTES`]), so that a reader knows how much more to read.
///
/// # Errors
/// [`Error::Incomplete`] for fewer than [`HEADER_BYTES`]; [`Error::ResponseSize`] for a
/// size below the header or above [`RESPONSE_BYTES_MAX`].
pub fn response_len(head: &[u8]) -> Result<usize, Error> {
    let h = head.get(..HEADER_BYTES).ok_or(Error::Incomplete {
        have: head.len(),
        need: HEADER_BYTES,
    })?;
    let len = u32::from_be_bytes([h[2], h[3], h[4], h[5]]);
    let len = usize::try_from(len).map_err(|_| Error::ResponseSize(usize::MAX))?;
    if !(HEADER_BYTES..=RESPONSE_BYTES_MAX).contains(&len) {
        return Err(Error::ResponseSize(len));
    }
    Ok(len)
}

/// A successful response's parameter area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'a> {
    /// The parameters (after the handles; without the sessions' answer).
    pub parameters: &'a [u8],
}

/// Decodes a response to a command with no response handles (all of this crate's).
///
/// # Errors
/// [`Error::Tpm`] for a response code other than success; the decoding errors for bytes
/// that are not a response.
pub fn parse_response(bytes: &[u8]) -> Result<Response<'_>, Error> {
    let len = response_len(bytes)?;
    let bytes = bytes.get(..len).ok_or(Error::Incomplete {
        have: bytes.len(),
        need: len,
    })?;
    let tag = u16::from_be_bytes([bytes[0], bytes[1]]);
    let code = u32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
    if code != TPM_RC_SUCCESS {
        return Err(Error::Tpm(code));
    }
    let rest = &bytes[HEADER_BYTES..];
    match tag {
        TPM_ST_NO_SESSIONS => Ok(Response { parameters: rest }),
        TPM_ST_SESSIONS => {
            let size = rest.get(..4).ok_or(Error::Incomplete {
                have: bytes.len(),
                need: HEADER_BYTES + 4,
            })?;
            let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            let parameters =
                rest.get(4..)
                    .and_then(|r| r.get(..size))
                    .ok_or(Error::InvalidLength {
                        field: "parameterSize",
                        len: size,
                    })?;
            Ok(Response { parameters })
        }
        other => Err(Error::InvalidTag(other)),
    }
}

/// The data of a successful `TPM2_NV_Read` response.
///
/// # Errors
/// As [`parse_response`]; [`Error::InvalidLength`] for data that does not fit.
pub fn parse_nv_read(bytes: &[u8]) -> Result<&[u8], Error> {
    let p = parse_response(bytes)?.parameters;
    let size = p.get(..2).ok_or(Error::InvalidLength {
        field: "TPM2B_MAX_NV_BUFFER",
        len: 2,
    })?;
    let size = usize::from(u16::from_be_bytes([size[0], size[1]]));
    p.get(2..2 + size).ok_or(Error::InvalidLength {
        field: "TPM2B_MAX_NV_BUFFER",
        len: size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_clear_is_the_spec_s_twelve_bytes() {
        let mut out = Vec::new();
        startup_clear(&mut out);
        // tag 8001, size 12, TPM_CC_Startup, TPM_SU_CLEAR.
        assert_eq!(out, [0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x44, 0, 0]);
    }

    #[test]
    fn nv_read_has_both_handles_an_empty_password_session_and_size_offset() {
        let mut out = Vec::new();
        nv_read(&mut out, FERRY_NV_INDEX, &[], 32, 0).unwrap();
        let want: Vec<u8> = [
            &[0x80, 0x02][..],         // TPM_ST_SESSIONS
            &[0, 0, 0, 35],            // commandSize
            &[0, 0, 0x01, 0x4E],       // TPM_CC_NV_Read
            &[0x01, 0x46, 0x45, 0x52], // authHandle: the index
            &[0x01, 0x46, 0x45, 0x52], // nvIndex
            &[0, 0, 0, 9],             // authorizationSize
            &[0x40, 0, 0, 0x09],       // TPM_RS_PW
            &[0, 0],                   // nonce: empty
            &[0x01],                   // continueSession
            &[0, 0],                   // hmac: the (empty) password
            &[0, 32],                  // size
            &[0, 0],                   // offset
        ]
        .concat();
        assert_eq!(out, want);
    }

    #[test]
    fn nv_define_space_carries_the_public_area() {
        let mut out = Vec::new();
        nv_define_space(&mut out, FERRY_NV_INDEX, b"pw", 32, &[]).unwrap();
        let tail: Vec<u8> = [
            &[0, 2, b'p', b'w'][..],   // auth
            &[0, 14],                  // TPM2B_NV_PUBLIC size
            &[0x01, 0x46, 0x45, 0x52], // nvIndex
            &[0, 0x0B],                // TPM_ALG_SHA256
            &[0x02, 0x04, 0x00, 0x04], // NO_DA | AUTHREAD | AUTHWRITE
            &[0, 0],                   // authPolicy
            &[0, 32],                  // dataSize
        ]
        .concat();
        assert!(out.ends_with(&tail), "{out:02x?}");
        assert_eq!(response_len(&out).unwrap(), out.len());
    }

    #[test]
    fn bad_inputs_are_refused_before_encoding() {
        let mut out = Vec::new();
        assert_eq!(
            nv_read(&mut out, 0x8100_0001, &[], 32, 0),
            Err(Error::InvalidIndex(0x8100_0001))
        );
        assert_eq!(
            nv_write(&mut out, FERRY_NV_INDEX, &[0; 65], &[], 0),
            Err(Error::AuthTooLong(65))
        );
        assert_eq!(
            nv_write(&mut out, FERRY_NV_INDEX, &[], &[0; 513], 0),
            Err(Error::NvDataTooLong(513))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn an_nv_read_response_gives_its_data() {
        // A TPM's answer: header, parameterSize 6, TPM2B of 4 bytes, the session's answer.
        let resp = [
            0x80, 0x02, 0, 0, 0, 25, 0, 0, 0, 0, //
            0, 0, 0, 6, 0, 4, 1, 2, 3, 4, //
            0, 0, 1, 0, 0,
        ];
        assert_eq!(parse_nv_read(&resp).unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn error_codes_and_broken_responses_are_errors() {
        // TPM_RC_HANDLE for handle 1: the index is not defined.
        let missing = [0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x8B];
        let e = parse_response(&missing).unwrap_err();
        assert_eq!(e, Error::Tpm(0x18B));
        assert!(e.is_missing_handle());
        assert!(!Error::Tpm(TPM_RC_NV_DEFINED).is_missing_handle());
        assert!(matches!(
            parse_response(&missing[..9]),
            Err(Error::Incomplete { .. })
        ));
        let huge = [0x80, 0x01, 0, 1, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse_response(&huge), Err(Error::ResponseSize(65536)));
        let lying = [0x80, 0x02, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0];
        assert!(matches!(
            parse_nv_read(&lying),
            Err(Error::InvalidLength { .. })
        ));
        let tag = [0x12, 0x34, 0, 0, 0, 10, 0, 0, 0, 0];
        assert_eq!(parse_response(&tag), Err(Error::InvalidTag(0x1234)));
    }
}
