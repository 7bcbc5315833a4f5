use super::*;
use proptest::prelude::*;

fn sample() -> Manifest {
    of_bytes("win.vhdx", MIN_CHUNK_SIZE, &vec![7u8; 10_000]).unwrap()
}

#[test]
fn round_trip() {
    let m = sample();
    assert_eq!(m.chunks.len(), 3);
    assert_eq!(Manifest::parse(m.encode().as_bytes()).unwrap(), m);
}

#[test]
fn empty_object_has_no_chunks() {
    let m = of_bytes("e.vhdx", CHUNK_SIZE, &[]).unwrap();
    assert_eq!(m.chunks.len(), 0);
    assert_eq!(Manifest::parse(m.encode().as_bytes()).unwrap(), m);
}

#[test]
fn chunk_check_finds_a_changed_byte() {
    let data = vec![1u8; 9000];
    let m = of_bytes("a.vhdx", MIN_CHUNK_SIZE, &data).unwrap();
    let (s, e) = m.chunk_range(1);
    assert!(m.check_chunk(1, &data[s as usize..e as usize]).is_ok());
    let mut bad = data[s as usize..e as usize].to_vec();
    bad[5] ^= 1;
    assert!(m.check_chunk(1, &bad).is_err());
    // The short last chunk must have its exact length.
    assert!(m.check_chunk(2, &data[8192..]).is_ok());
    assert!(m.check_chunk(3, &[]).is_err());
}

#[test]
fn wrong_algorithm_count_and_trailing_text_are_refused() {
    let text = sample().encode();
    let alg = text.replace("algorithm blake3", "algorithm sha1");
    assert!(matches!(
        Manifest::parse(alg.as_bytes()),
        Err(ManifestError::Algorithm(_))
    ));
    let count = text.replace("chunks 3", "chunks 2");
    assert!(matches!(
        Manifest::parse(count.as_bytes()),
        Err(ManifestError::ChunkCount { .. })
    ));
    let trailing = format!("{text}x\n");
    assert!(matches!(
        Manifest::parse(trailing.as_bytes()),
        Err(ManifestError::Trailing(_))
    ));
    let no_newline = text.trim_end();
    assert!(Manifest::parse(no_newline.as_bytes()).is_err());
}

#[test]
fn names_are_checked() {
    for bad in ["", ".hidden", "a/b", "a b", "..", &"x".repeat(256)] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
    assert!(check_name("win11.2.avhdx").is_ok());
}

#[test]
fn huge_sizes_are_refused_before_allocation() {
    let text = sample()
        .encode()
        .replace("size 10000", "size 18446744073709551615");
    assert!(matches!(
        Manifest::parse(text.as_bytes()),
        Err(ManifestError::TooLarge(_))
    ));
}

#[test]
fn differing_chunks_names_them() {
    let a = of_bytes("a.vhdx", MIN_CHUNK_SIZE, &vec![0u8; 3 * 4096]).unwrap();
    let mut d = vec![0u8; 4 * 4096];
    d[4096] = 1;
    let b = of_bytes("a.vhdx", MIN_CHUNK_SIZE, &d).unwrap();
    assert_eq!(a.differing_chunks(&b), vec![1, 3]);
}

proptest! {
    #[test]
    fn builder_pieces_do_not_matter(data in proptest::collection::vec(any::<u8>(), 0..40_000),
                                    cut in 0usize..40_000) {
        let whole = of_bytes("p.vhdx", MIN_CHUNK_SIZE, &data).unwrap();
        let cut = cut.min(data.len());
        let mut b = Builder::new("p.vhdx", MIN_CHUNK_SIZE).unwrap();
        b.update(&data[..cut]).unwrap();
        b.update(&data[cut..]).unwrap();
        let pieces = b.finish().unwrap();
        prop_assert_eq!(&pieces, &whole);
        prop_assert_eq!(Manifest::parse(whole.encode().as_bytes()).unwrap(), whole);
    }

    #[test]
    fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let _ = Manifest::parse(&data);
    }

    #[test]
    fn mutated_manifests_never_panic(pos in 0usize..500, byte in any::<u8>()) {
        let mut t = sample().encode().into_bytes();
        let p = pos % t.len();
        t[p] = byte;
        if let Ok(m) = Manifest::parse(&t) {
            prop_assert_eq!(m.chunks.len() as u64, chunk_count(m.size, m.chunk_size));
        }
    }
}
