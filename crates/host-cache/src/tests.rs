//! Unit and property tests of the slot protocol over real mappings (a temporary directory
//! stands in for /dev/shm; two handles on one file stand in for two agents).

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use proptest::prelude::*;

use super::*;
use crate::layout::slot;

const BLOCK: u64 = 64 << 10;

fn key(name: &str, version: u64) -> VersionKey {
    VersionKey::new(&VersionIdentity {
        vdisk: name,
        version,
        size_bytes: 1 << 30,
        extra: b"",
    })
}

/// The bytes of block `b` of `k`: distinct for every key and block.
fn bytes_of(k: VersionKey, b: u64, len: usize) -> Vec<u8> {
    let seed = k.lo ^ k.hi.rotate_left(7) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|i| (seed.rotate_left((i % 61) as u32) as u8) ^ (i as u8))
        .collect()
}

fn fill(c: &HostCache, k: VersionKey, b: u64) -> bool {
    match c.claim(k, b) {
        Claim::Mine(f) => f.commit(&bytes_of(k, b, BLOCK as usize)),
        _ => false,
    }
}

#[test]
fn a_fill_is_read_by_another_handle_and_not_by_another_version() {
    let dir = tempfile::tempdir().unwrap();
    let a = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap();
    let b = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap();
    let (v1, v2) = (key("golden", 1), key("golden", 2));
    assert!(fill(&a, v1, 7));
    let mut got = vec![0u8; 4096];
    assert_eq!(b.read(v1, 7, 8192, &mut got), Lookup::Hit);
    assert_eq!(got, bytes_of(v1, 7, BLOCK as usize)[8192..8192 + 4096]);
    assert_eq!(b.read(v2, 7, 8192, &mut got), Lookup::Miss);
    assert_eq!(b.counters().host_fills, 1);
}

#[test]
fn a_corrupted_page_is_a_miss_not_wrong_bytes() {
    let c = HostCache::private(4 << 20, BLOCK).unwrap();
    let k = key("golden", 1);
    assert!(fill(&c, k, 3));
    let s = (0..c.geo.slots)
        .find(|&s| c.holds(s, k, 3))
        .expect("the filled slot");
    c.region.words()[c.geo.data_word(s) + 1].fetch_xor(1, Ordering::Relaxed);
    let mut got = vec![0u8; 512];
    assert_eq!(c.read(k, 3, 0, &mut got), Lookup::Miss);
    assert_eq!(c.counters().torn, 1);
    // The torn slot was emptied: the block can be filled again.
    assert!(fill(&c, k, 3));
}

#[test]
fn a_fill_of_a_dead_process_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let a = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap();
    let k = key("golden", 1);
    let Claim::Mine(f) = a.claim(k, 9) else {
        panic!("first claim")
    };
    let s = f.slot();
    // As if killed mid-fill: the slot stays odd, and its filler's pid is gone.
    std::mem::forget(f);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    a.region.words()[a.geo.slot_word(s, slot::LEN_PID)].store(u64::from(dead), Ordering::SeqCst);
    let b = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap();
    let mut got = vec![0u8; 4096];
    assert_eq!(b.read(k, 9, 0, &mut got), Lookup::Filling);
    assert!(b.wait_fill(k, 9), "a dead filler is not waited for");
    assert!(fill(&b, k, 9));
    assert_eq!(b.read(k, 9, 0, &mut got), Lookup::Hit);
    assert_eq!(b.counters().stolen, 1);
}

#[test]
fn a_live_fill_is_waited_for_not_duplicated() {
    let c = HostCache::private(4 << 20, BLOCK).unwrap();
    let k = key("golden", 1);
    let Claim::Mine(_f) = c.claim(k, 5) else {
        panic!("first claim")
    };
    assert!(matches!(c.claim(k, 5), Claim::Filling));
}

#[test]
fn a_file_open_to_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap());
    let path = dir
        .path()
        .join(file_name(rustix::process::geteuid().as_raw()));
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o606)).unwrap();
    let e = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap_err();
    assert!(matches!(e, OpenError::OpenToOthers { .. }), "{e}");
}

#[test]
fn a_symlink_in_place_of_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(file_name(rustix::process::geteuid().as_raw()));
    std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
    let e = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap_err();
    assert!(matches!(e, OpenError::NotRegular(_)), "{e}");
}

#[test]
fn an_existing_cache_keeps_its_creator_s_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let a = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap();
    let b = HostCache::open(dir.path(), 64 << 20, 4096).unwrap();
    assert_eq!(a.geometry(), b.geometry());
}

#[test]
fn a_short_last_block_reads_back_and_refuses_reads_past_it() {
    let c = HostCache::private(4 << 20, BLOCK).unwrap();
    let k = key("small", 1);
    let Claim::Mine(f) = c.claim(k, 0) else {
        panic!("claim")
    };
    assert!(f.commit(&bytes_of(k, 0, 6144)));
    let mut got = vec![0u8; 2048];
    assert_eq!(c.read(k, 0, 4096, &mut got), Lookup::Hit);
    assert_eq!(got, bytes_of(k, 0, 6144)[4096..]);
    assert_eq!(c.read(k, 0, 6144, &mut got), Lookup::Miss);
}

#[derive(Debug, Clone)]
enum Op {
    Fill {
        agent: bool,
        vdisk: u8,
        version: u8,
        block: u64,
    },
    Read {
        agent: bool,
        vdisk: u8,
        version: u8,
        block: u64,
        page: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<bool>(), 0u8..3, 1u8..4, 0u64..40).prop_map(|(agent, vdisk, version, block)| {
            Op::Fill {
                agent,
                vdisk,
                version,
                block,
            }
        }),
        (any::<bool>(), 0u8..3, 1u8..4, 0u64..40, 0u64..16).prop_map(
            |(agent, vdisk, version, block, page)| Op::Read {
                agent,
                vdisk,
                version,
                block,
                page
            }
        ),
    ]
}

proptest! {
    /// Two agents share a cache too small for every block of three vDisks in three
    /// versions: every hit returns the bytes of the version and block asked for.
    #[test]
    fn agents_of_many_versions_each_read_their_own_bytes(ops in proptest::collection::vec(op(), 1..300)) {
        let dir = tempfile::tempdir().unwrap();
        // 1 MiB: two sets of 8 slots of 64 KiB.
        let agents = [
            HostCache::open(dir.path(), 1 << 20, BLOCK).unwrap(),
            HostCache::open(dir.path(), 1 << 20, BLOCK).unwrap(),
        ];
        let k = |d: u8, v: u8| key(&format!("vd{d}"), u64::from(v));
        for o in ops {
            match o {
                Op::Fill { agent, vdisk, version, block } => {
                    fill(&agents[usize::from(agent)], k(vdisk, version), block);
                }
                Op::Read { agent, vdisk, version, block, page } => {
                    let key = k(vdisk, version);
                    let mut got = vec![0u8; 4096];
                    let at = (page * 4096) as usize;
                    if agents[usize::from(agent)].read(key, block, at, &mut got) == Lookup::Hit {
                        prop_assert_eq!(&got[..], &bytes_of(key, block, BLOCK as usize)[at..at + 4096]);
                    }
                }
            }
        }
    }
}

#[test]
fn a_cache_made_by_another_user_is_refused() {
    if rustix::process::geteuid().as_raw() != 0 {
        // Making a file of another user needs root (chown); the CLI test covers refusal too.
        eprintln!("not root: cannot make another user's file here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    drop(HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap());
    let path = dir.path().join(file_name(0));
    // 65534: nobody.
    std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
    let e = HostCache::open(dir.path(), 4 << 20, BLOCK).unwrap_err();
    assert!(
        matches!(e, OpenError::ForeignOwner { uid: 65534, .. }),
        "{e}"
    );
}
