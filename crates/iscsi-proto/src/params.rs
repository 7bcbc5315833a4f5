//! Operational parameter negotiation, the target's side (RFC 7143 §6.2, §13): the keys an
//! initiator offers in its login (operational stage) or text requests, the values this
//! target answers, and the session's parameters that result. Pure: offers in, answers and
//! parameters out.
//!
//! | key | kind (§13) | range | default |
//! |---|---|---|---|
//! | `HeaderDigest`, `DataDigest` | list | `CRC32C`, `None` | `None` |
//! | `MaxRecvDataSegmentLength` | declarative, each side its own | 512 – 2²⁴−1 | 8192 |
//! | `MaxBurstLength` | minimum | 512 – 2²⁴−1 | 262144 |
//! | `FirstBurstLength` | minimum, ≤ MaxBurstLength | 512 – 2²⁴−1 | 65536 |
//! | `MaxConnections`, `MaxOutstandingR2T` | minimum | 1 – 65535 | 1 |
//! | `DefaultTime2Wait` | maximum | 0 – 3600 | 2 |
//! | `DefaultTime2Retain` | minimum | 0 – 3600 | 20 |
//! | `ErrorRecoveryLevel` | minimum | 0 – 2 | 0 |
//! | `InitialR2T`, `DataPDUInOrder`, `DataSequenceInOrder` | OR | Yes/No | Yes |
//! | `ImmediateData` | AND | Yes/No | Yes |
//!
//! This target runs one connection per session at error recovery level 0 and in-order data,
//! so its own offers are `MaxConnections=1`, `ErrorRecoveryLevel=0` and `Yes` for the two
//! ordering keys: the minimum and OR rules make those the results whatever the initiator
//! offers. A value out of range or malformed is answered `Reject` (§6.2) and the default
//! kept; an unknown key `NotUnderstood`.

/// The smallest and largest data segment and burst lengths (§13.12, 13.13, 13.14).
pub const LENGTH_MIN: u32 = 512;
/// See [`LENGTH_MIN`].
pub const LENGTH_MAX: u32 = (1 << 24) - 1;

/// What this target allows at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLimits {
    /// The longest data segment it receives (declared as its `MaxRecvDataSegmentLength`).
    pub max_recv_data_segment: u32,
    /// The longest burst it accepts or sends.
    pub max_burst: u32,
    /// Whether it offers CRC32C digests.
    pub digests: bool,
}

impl Default for TargetLimits {
    fn default() -> TargetLimits {
        TargetLimits {
            max_recv_data_segment: 262_144,
            max_burst: 1 << 20,
            digests: true,
        }
    }
}

/// A session's operational parameters (the RFC's defaults until negotiated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// CRC32C on headers.
    pub header_digest: bool,
    /// CRC32C on data.
    pub data_digest: bool,
    /// The longest data segment the initiator receives (what this target may send).
    pub initiator_max_recv: u32,
    /// The longest data segment this target receives.
    pub target_max_recv: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// DefaultTime2Wait.
    pub time2wait: u32,
    /// DefaultTime2Retain.
    pub time2retain: u32,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            header_digest: false,
            data_digest: false,
            initiator_max_recv: 8192,
            target_max_recv: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            time2wait: 2,
            time2retain: 20,
        }
    }
}

fn number(v: &str, lo: u32, hi: u32) -> Option<u32> {
    let n: u32 = v.parse().ok()?;
    (lo..=hi).contains(&n).then_some(n)
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn word(b: bool) -> &'static str {
    if b { "Yes" } else { "No" }
}

/// Answers `offers` (in order) under `limits`, updating `p`; returns the answer pairs.
/// The declarative keys of the login (names, session type, alias) are not answered here.
pub fn negotiate(
    offers: &[(String, String)],
    limits: &TargetLimits,
    p: &mut Params,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut first_burst_offer = None;
    for (k, v) in offers {
        match k.as_str() {
            "HeaderDigest" | "DataDigest" => {
                let crc = limits.digests && v.split(',').next() == Some("CRC32C");
                let none = v.split(',').any(|x| x == "None");
                let pick = if crc || (limits.digests && !none && v.contains("CRC32C")) {
                    Some(true)
                } else if none {
                    Some(false)
                } else {
                    None
                };
                match pick {
                    Some(on) => {
                        if k == "HeaderDigest" {
                            p.header_digest = on;
                        } else {
                            p.data_digest = on;
                        }
                        push(&mut out, k, if on { "CRC32C" } else { "None" }.to_owned());
                    }
                    None => push(&mut out, k, "Reject".to_owned()),
                }
            }
            "MaxRecvDataSegmentLength" => match number(v, LENGTH_MIN, LENGTH_MAX) {
                Some(n) => {
                    p.initiator_max_recv = n;
                    p.target_max_recv = limits.max_recv_data_segment;
                    push(&mut out, k, limits.max_recv_data_segment.to_string());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "MaxBurstLength" => match number(v, LENGTH_MIN, LENGTH_MAX) {
                Some(n) => {
                    p.max_burst = n.min(limits.max_burst);
                    push(&mut out, k, p.max_burst.to_string());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "FirstBurstLength" => match number(v, LENGTH_MIN, LENGTH_MAX) {
                Some(n) => {
                    first_burst_offer = Some((out.len(), n));
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "MaxConnections" | "ErrorRecoveryLevel" => {
                let (lo, hi, ours) = if k == "MaxConnections" {
                    (1, 65535, 1)
                } else {
                    (0, 2, 0)
                };
                match number(v, lo, hi) {
                    Some(_) => push(&mut out, k, u32::to_string(&ours)),
                    None => push(&mut out, k, "Reject".to_owned()),
                }
            }
            "MaxOutstandingR2T" => match number(v, 1, 65535) {
                Some(n) => {
                    p.max_outstanding_r2t = n.min(16);
                    push(&mut out, k, p.max_outstanding_r2t.to_string());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "DefaultTime2Wait" => match number(v, 0, 3600) {
                Some(n) => {
                    p.time2wait = n.max(2);
                    push(&mut out, k, p.time2wait.to_string());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "DefaultTime2Retain" => match number(v, 0, 3600) {
                Some(n) => {
                    p.time2retain = n.min(20);
                    push(&mut out, k, p.time2retain.to_string());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "InitialR2T" => match yes_no(v) {
                // OR with this target's Yes.
                Some(_) => {
                    p.initial_r2t = true;
                    push(&mut out, k, "Yes".to_owned());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "ImmediateData" => match yes_no(v) {
                // AND with this target's Yes.
                Some(b) => {
                    p.immediate_data = b;
                    push(&mut out, k, word(b).to_owned());
                }
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "DataPDUInOrder" | "DataSequenceInOrder" => match yes_no(v) {
                Some(_) => push(&mut out, k, "Yes".to_owned()),
                None => push(&mut out, k, "Reject".to_owned()),
            },
            "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" | "AuthMethod"
            | "TargetAlias" | "SendTargets" => {}
            _ => push(&mut out, k, "NotUnderstood".to_owned()),
        }
    }
    if let Some((at, n)) = first_burst_offer {
        // Minimum, and never above the burst (§13.14).
        p.first_burst = n.min(p.max_burst);
        out.insert(
            at,
            ("FirstBurstLength".to_owned(), p.first_burst.to_string()),
        );
    }
    out
}

fn push(out: &mut Vec<(String, String)>, k: &str, v: String) {
    out.push((k.to_owned(), v));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn answer<'a>(a: &'a [(String, String)], k: &str) -> Option<&'a str> {
        a.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
    }

    /// What open-iscsi offers at a normal login (its iscsid.conf defaults).
    #[test]
    fn open_iscsi_s_offer_gets_the_rfc_s_results() {
        let o = offers(&[
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("MaxBurstLength", "16776192"),
            ("FirstBurstLength", "262144"),
            ("MaxConnections", "1"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "1"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("ErrorRecoveryLevel", "0"),
            ("IFMarker", "No"),
        ]);
        let mut p = Params::default();
        let a = negotiate(&o, &TargetLimits::default(), &mut p);
        assert_eq!(answer(&a, "HeaderDigest"), Some("None"));
        assert_eq!(answer(&a, "MaxRecvDataSegmentLength"), Some("262144"));
        assert_eq!(p.initiator_max_recv, 262_144);
        assert_eq!((p.max_burst, p.first_burst), (1 << 20, 262_144));
        assert!(p.initial_r2t, "OR with the target's Yes");
        assert!(p.immediate_data);
        assert_eq!(answer(&a, "InitialR2T"), Some("Yes"));
        assert_eq!(answer(&a, "DefaultTime2Retain"), Some("0"));
        assert_eq!(answer(&a, "IFMarker"), Some("NotUnderstood"));
        assert_eq!(answer(&a, "ErrorRecoveryLevel"), Some("0"));
    }

    #[test]
    fn digests_follow_the_initiator_s_preference_and_the_target_s_support() {
        let mut p = Params::default();
        let a = negotiate(
            &offers(&[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "None,CRC32C"),
            ]),
            &TargetLimits::default(),
            &mut p,
        );
        assert_eq!(answer(&a, "HeaderDigest"), Some("CRC32C"));
        assert_eq!(answer(&a, "DataDigest"), Some("None"));
        assert!(p.header_digest && !p.data_digest);
        let no_crc = TargetLimits {
            digests: false,
            ..TargetLimits::default()
        };
        let mut p = Params::default();
        let a = negotiate(&offers(&[("HeaderDigest", "CRC32C")]), &no_crc, &mut p);
        assert_eq!(answer(&a, "HeaderDigest"), Some("Reject"));
        assert!(!p.header_digest);
    }

    #[test]
    fn out_of_range_or_malformed_values_are_rejected_and_defaults_kept() {
        let mut p = Params::default();
        let a = negotiate(
            &offers(&[
                ("MaxRecvDataSegmentLength", "100"),
                ("MaxBurstLength", "abc"),
                ("ErrorRecoveryLevel", "3"),
                ("ImmediateData", "Maybe"),
                ("DefaultTime2Wait", "3601"),
            ]),
            &TargetLimits::default(),
            &mut p,
        );
        for k in [
            "MaxRecvDataSegmentLength",
            "MaxBurstLength",
            "ErrorRecoveryLevel",
            "ImmediateData",
            "DefaultTime2Wait",
        ] {
            assert_eq!(answer(&a, k), Some("Reject"), "{k}");
        }
        assert_eq!(p, Params::default());
    }

    #[test]
    fn first_burst_never_exceeds_max_burst_and_minimums_and_maximums_apply() {
        let mut p = Params::default();
        let a = negotiate(
            &offers(&[
                ("FirstBurstLength", "1048576"),
                ("MaxBurstLength", "65536"),
                ("MaxOutstandingR2T", "64"),
                ("DefaultTime2Wait", "0"),
                ("ImmediateData", "No"),
                ("MaxConnections", "8"),
            ]),
            &TargetLimits::default(),
            &mut p,
        );
        assert_eq!(answer(&a, "FirstBurstLength"), Some("65536"));
        assert_eq!(a[0].0, "FirstBurstLength", "answered where it was offered");
        assert_eq!(p.max_outstanding_r2t, 16);
        assert_eq!(p.time2wait, 2, "maximum with the target's 2");
        assert!(!p.immediate_data, "AND");
        assert_eq!(answer(&a, "MaxConnections"), Some("1"));
    }
}
