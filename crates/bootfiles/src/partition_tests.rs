//! Unit tests of the MBR and GPT codec over hand-built sectors.

use super::*;

const DISK: u64 = 64 << 20;
const SS: u32 = 512;

fn mbr(entries: &[(u8, u8, u32, u32)]) -> Vec<u8> {
    let mut s = vec![0u8; 512];
    s[440..444].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    for (i, &(status, kind, lba, n)) in entries.iter().enumerate() {
        let e = &mut s[446 + 16 * i..462 + 16 * i];
        e[0] = status;
        e[4] = kind;
        e[8..12].copy_from_slice(&lba.to_le_bytes());
        e[12..16].copy_from_slice(&n.to_le_bytes());
    }
    s[510..512].copy_from_slice(&MBR_SIGNATURE);
    s
}

/// A GPT of `DISK` bytes: (header sector, entries array) with `parts` = (start, end, name).
fn gpt(parts: &[(u64, u64, &str)]) -> (Vec<u8>, Vec<u8>) {
    let mut array = vec![0u8; 128 * 128];
    for (i, &(start, end, name)) in parts.iter().enumerate() {
        let e = &mut array[128 * i..128 * (i + 1)];
        e[0..16].copy_from_slice(&Guid::LINUX_FS.0);
        e[16..32].copy_from_slice(&[i as u8 + 1; 16]);
        e[32..40].copy_from_slice(&start.to_le_bytes());
        e[40..48].copy_from_slice(&end.to_le_bytes());
        for (k, u) in name.encode_utf16().enumerate() {
            e[56 + 2 * k..58 + 2 * k].copy_from_slice(&u.to_le_bytes());
        }
    }
    let mut h = vec![0u8; 512];
    h[0..8].copy_from_slice(GPT_SIGNATURE);
    h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
    h[12..16].copy_from_slice(&92u32.to_le_bytes());
    h[24..32].copy_from_slice(&1u64.to_le_bytes());
    h[32..40].copy_from_slice(&(DISK / 512 - 1).to_le_bytes());
    h[40..48].copy_from_slice(&34u64.to_le_bytes());
    h[48..56].copy_from_slice(&(DISK / 512 - 34).to_le_bytes());
    h[56..72].copy_from_slice(&[7u8; 16]);
    h[72..80].copy_from_slice(&2u64.to_le_bytes());
    h[80..84].copy_from_slice(&128u32.to_le_bytes());
    h[84..88].copy_from_slice(&128u32.to_le_bytes());
    h[88..92].copy_from_slice(&crc32(&array).to_le_bytes());
    reseal(&mut h);
    (h, array)
}

fn reseal(h: &mut [u8]) {
    h[16..20].fill(0);
    let c = crc32(&h[..92]);
    h[16..20].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn no_signature_is_no_table() {
    assert_eq!(parse_mbr(&[0u8; 512], SS, DISK), Ok(Sector0::NoTable));
}

#[test]
fn mbr_lists_primaries_with_linux_partuuids() {
    let s = mbr(&[
        (0x80, 0x83, 2048, 4096),
        (0, 0, 0, 0),
        (0, 0x05, 8192, 100),
        (0, 0x83, 10000, 2000),
    ]);
    let Ok(Sector0::Mbr {
        disk_signature,
        partitions,
    }) = parse_mbr(&s, SS, DISK)
    else {
        panic!("not an mbr");
    };
    assert_eq!(disk_signature, 0xdead_beef);
    let got: Vec<_> = partitions
        .iter()
        .map(|p| (p.number, p.start, p.len, p.partuuid.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (1, 2048 * 512, 4096 * 512, "deadbeef-01"),
            (4, 10000 * 512, 2000 * 512, "deadbeef-04")
        ]
    );
}

#[test]
fn mbr_bad_status_and_past_end_are_errors() {
    let s = mbr(&[(0x12, 0x83, 2048, 4096)]);
    assert_eq!(
        parse_mbr(&s, SS, DISK),
        Err(MbrError::BadStatus {
            slot: 1,
            status: 0x12
        })
    );
    let s = mbr(&[(0, 0x83, 2048, u32::MAX)]);
    assert!(matches!(
        parse_mbr(&s, SS, DISK),
        Err(MbrError::PastEnd { number: 1, .. })
    ));
    assert_eq!(
        parse_mbr(&[0; 10], SS, DISK),
        Err(MbrError::Short { len: 10 })
    );
    assert_eq!(parse_mbr(&s, 1024, DISK), Err(MbrError::SectorSize(1024)));
}

#[test]
fn protective_mbr_says_gpt() {
    let s = mbr(&[(0, MBR_TYPE_PROTECTIVE, 1, u32::MAX)]);
    assert_eq!(parse_mbr(&s, SS, DISK), Ok(Sector0::Protective));
}

#[test]
fn gpt_round_trip_gives_numbers_partuuids_and_names() {
    let (h, a) = gpt(&[(2048, 4095, "boot"), (4096, 100_000, "")]);
    let header = parse_gpt_header(&h, SS, DISK).unwrap();
    assert_eq!(header.entries_span(SS), (1024, 128 * 128));
    assert_eq!(header.disk_guid.0, [7u8; 16]);
    let parts = parse_gpt_entries(&header, &a, SS).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(
        (parts[0].number, parts[0].start, parts[0].len),
        (1, 2048 * 512, 2048 * 512)
    );
    assert_eq!(parts[0].name.as_deref(), Some("boot"));
    assert_eq!(parts[0].partuuid, "01010101-0101-0101-0101-010101010101");
    assert_eq!(parts[0].part_type, PartType::Gpt(Guid::LINUX_FS));
    assert_eq!(parts[1].name, None);
}

#[test]
fn guid_displays_mixed_endian() {
    assert_eq!(
        Guid::LINUX_FS.to_string(),
        "0fc63daf-8483-4772-8e79-3d69d8477de4"
    );
}

#[test]
fn gpt_header_checks_each_field() {
    let (h, _) = gpt(&[]);
    let mut bad = h.clone();
    bad[0] = b'X';
    assert_eq!(
        parse_gpt_header(&bad, SS, DISK),
        Err(GptError::BadSignature)
    );
    let mut bad = h.clone();
    bad[60] ^= 1;
    assert!(matches!(
        parse_gpt_header(&bad, SS, DISK),
        Err(GptError::HeaderCrc { .. })
    ));
    let cases: [(usize, &[u8], GptError); 6] = [
        (12, &8u32.to_le_bytes(), GptError::HeaderSize(8)),
        (24, &5u64.to_le_bytes(), GptError::MyLba(5)),
        (80, &1000u32.to_le_bytes(), GptError::EntryCount(1000)),
        (84, &100u32.to_le_bytes(), GptError::EntrySize(100)),
        (
            72,
            &30u64.to_le_bytes(),
            GptError::EntriesOutside {
                lba: 30,
                bytes: 128 * 128,
            },
        ),
        (
            48,
            &(DISK / 512).to_le_bytes(),
            GptError::UsableRange {
                first: 34,
                last: DISK / 512,
                sectors: DISK / 512,
            },
        ),
    ];
    for (at, value, want) in cases {
        let mut bad = h.clone();
        bad[at..at + value.len()].copy_from_slice(value);
        if at == 12 {
            // The size is checked before the crc, which covers header_size bytes.
            assert_eq!(parse_gpt_header(&bad, SS, DISK), Err(want));
            continue;
        }
        reseal(&mut bad);
        assert_eq!(parse_gpt_header(&bad, SS, DISK), Err(want), "field at {at}");
    }
    assert!(matches!(
        parse_gpt_header(&h[..100], SS, DISK),
        Err(GptError::Short { .. })
    ));
}

#[test]
fn gpt_entries_crc_bounds_and_overlap_are_checked() {
    let (h, mut a) = gpt(&[(2048, 4095, "a")]);
    let header = parse_gpt_header(&h, SS, DISK).unwrap();
    a[100] ^= 1;
    assert!(matches!(
        parse_gpt_entries(&header, &a, SS),
        Err(GptError::EntriesCrc { .. })
    ));
    assert!(matches!(
        parse_gpt_entries(&header, &a[..10], SS),
        Err(GptError::Short { .. })
    ));

    for (parts, want) in [
        (vec![(10, 4095, "")], "outside"),
        (vec![(4095, 2048, "")], "outside"),
        (vec![(2048, DISK / 512, "")], "outside"),
        (vec![(2048, 4095, ""), (4000, 5000, "")], "overlap"),
    ] {
        let (h, a) = gpt(&parts);
        let header = parse_gpt_header(&h, SS, DISK).unwrap();
        let got = parse_gpt_entries(&header, &a, SS).unwrap_err();
        match want {
            "outside" => assert!(
                matches!(got, GptError::PartitionOutside { number: 1, .. }),
                "{got}"
            ),
            _ => assert_eq!(got, GptError::Overlap { a: 1, b: 2 }),
        }
    }
}
