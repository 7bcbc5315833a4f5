//! Fuzzes the TPM 2.0 response decoder (`tpm_proto`): the bytes a TPM (`/dev/tpmrm0`, or
//! anything posing as one) answers to the boot agent's NV commands.
//!
//! Input: `tag u16 | responseSize u32 | responseCode u32 | [parameterSize u32] | …`, all
//! big-endian (TCG TPM 2.0 Library, Part 1, 18: the response structure).
//!
//! Must hold: no panic; `response_len` accepts only sizes from the header's 10 bytes to
//! `RESPONSE_BYTES_MAX`, and a parsed response's parameters and an NV_Read's data lie
//! within those bytes; a response that decodes had success as its code; the commands the
//! agent encodes carry their own length in their header.
//!
//! Seed corpus: responses of `swtpm socket --tpm2` to `tpm_proto`'s commands (the agent's
//! tests/tpm.rs exchange), and the TPM's error answers (index missing, NV defined).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpm_proto::{
    FERRY_NV_INDEX, HEADER_BYTES, RESPONSE_BYTES_MAX, parse_nv_read, parse_response, response_len,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(len) = response_len(data) {
        assert!((HEADER_BYTES..=RESPONSE_BYTES_MAX).contains(&len));
    }
    if let Ok(r) = parse_response(data) {
        let len = response_len(data).unwrap();
        assert!(r.parameters.len() + HEADER_BYTES <= len);
        assert_eq!(&data[6..10], &[0, 0, 0, 0], "only success decodes");
    }
    if let Ok(nv) = parse_nv_read(data) {
        assert!(nv.len() + HEADER_BYTES + 2 <= data.len());
        assert!(nv.len() <= usize::from(u16::MAX));
    }
    // The commands, with the input's first bytes as password and data.
    let cut = data.len().min(80);
    let (auth, rest) = data.split_at(cut.min(data.first().map_or(0, |b| usize::from(*b) % 80)));
    let mut cmd = Vec::new();
    for encoded in [
        tpm_proto::nv_write(&mut cmd, FERRY_NV_INDEX, auth, rest, 0).map(|()| cmd.clone()),
        {
            cmd.clear();
            tpm_proto::nv_read(&mut cmd, FERRY_NV_INDEX, auth, rest.len(), 0).map(|()| cmd.clone())
        },
    ]
    .into_iter()
    .flatten()
    {
        let said = u32::from_be_bytes([encoded[2], encoded[3], encoded[4], encoded[5]]);
        assert_eq!(said as usize, encoded.len(), "a command's size field is its length");
    }
});
