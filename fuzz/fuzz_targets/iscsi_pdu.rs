//! Fuzzes the iSCSI PDU frame (`iscsi_proto::pdu`) and the login/text key lists
//! (`iscsi_proto::text`): bytes as an initiator's connection delivers them.
//!
//! Input: one byte choosing the digests, then a PDU (48-byte header, AHS, digests, data).
//!
//! Must hold: no panic; `check` never says a PDU is longer than the buffer once it says it
//! is complete; a parsed PDU re-encodes to bytes that parse to the same PDU; a key list
//! that parses re-encodes to one that parses to the same pairs, and negotiating it answers
//! at most one value per key offered and never a first burst above the burst.
//!
//! Seed corpus: login, text, SCSI command and NOP-Out PDUs as libiscsi's `iscsi-ls` and
//! open-iscsi send them (laid out by the unit tests' builders).
#![no_main]

use iscsi_proto::params::{Params, TargetLimits, negotiate};
use iscsi_proto::pdu::{Digests, Pdu, check};
use iscsi_proto::text::{encode_pairs, parse_pairs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let d = Digests {
        header: sel & 1 != 0,
        data: sel & 2 != 0,
    };
    if let Ok(n) = check(rest, d, 8192) {
        assert!(n <= rest.len());
    }
    if let Ok((p, n)) = Pdu::parse(rest, d, 8192) {
        assert!(n <= rest.len());
        let again = p.encode(d);
        assert_eq!(Pdu::parse(&again, d, 8192).map(|x| x.0), Ok(p.clone()));
        if let Ok(pairs) = parse_pairs(&p.data) {
            assert_eq!(parse_pairs(&encode_pairs(&pairs)).as_ref(), Ok(&pairs));
            let mut params = Params::default();
            let answer = negotiate(&pairs, &TargetLimits::default(), &mut params);
            assert!(params.first_burst <= params.max_burst);
            assert!(answer.len() <= pairs.len());
        }
    }
});
