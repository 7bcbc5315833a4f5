//! Test doubles for Ferry: a simulated disk and seeded randomness.
//!
//! This crate is a dev-dependency only. It implements the traits of the I/O crates so that
//! production code runs unchanged under simulation (STYLE.md §1 rule 4, §6 "Storage faults").
//!
//! * [`SimDisk`]: a [`disk::Storage`] with separate live and durable images. It can crash
//!   (keeping a random subset of unflushed writes, the last one possibly torn at a 512-byte
//!   sector boundary), fail the Nth mutating op with `ErrorKind::Io`, or cut the power at op N.
//! * [`FastProbe`]: a device whose every [`disk::FastPath`] answers and is counted, and
//!   [`check_fast_paths`], which proves over it that a decorator passes each fast path of
//!   the device below it on, answers it or declines it, as its test expects.
//! * [`seed_from_env`] and [`sim_rng`]: every simulation test draws its randomness from one
//!   printed seed, so `SIM_SEED=n cargo test ...` replays a failure.
//!
//! ```
//! use disk::Storage;
//! use testkit::{SimDisk, seed_from_env, sim_rng};
//!
//! let mut rng = sim_rng(seed_from_env(42));
//! let d = SimDisk::new();
//! d.write_at(b"flushed", 0).unwrap();
//! d.flush().unwrap();
//! d.write_at(b"maybe", 0).unwrap();
//! let after = d.crash(&mut rng);
//! let bytes = after.live_bytes();
//! assert!(bytes.ends_with(b"ed"), "the flushed tail of the sector survives either way");
//! ```

#![warn(missing_docs)]

mod image;
mod probe;
mod sim_disk;

pub use probe::{
    Expect, Fast, FastProbe, Moved, WRITE_AT, block_on, call_fast_path, check_fast_paths,
    device_types,
};
pub use sim_disk::{CrashModel, LEN_MAX, SECTOR_BYTES, SimDisk};

/// The environment variable that names the sample vectors' directory when the repository is
/// not checked out beside `shared/` (as CI does it).
pub const VECTORS_VAR: &str = "FERRY_VECTORS";

/// The shared sample images (`shared/vectors`, see its README): `FERRY_VECTORS` when set,
/// else `../shared/vectors` beside the repository.
pub fn vectors_dir() -> std::path::PathBuf {
    std::env::var_os(VECTORS_VAR).map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors"),
        std::path::PathBuf::from,
    )
}

/// The environment variable that fixes the seed of a simulation test.
pub const SEED_VAR: &str = "SIM_SEED";

/// The RNG simulation tests use. Outcomes for a seed are stable for a given `rand` version
/// (pinned by Cargo.lock), which is what replaying a failure needs.
pub type SimRng = rand::rngs::StdRng;

/// A [`SimRng`] from a seed.
pub fn sim_rng(seed: u64) -> SimRng {
    rand::SeedableRng::seed_from_u64(seed)
}

/// The seed for a simulation test: `SIM_SEED` when set, else `default`. Prints
/// `SIM_SEED=n` to stderr, which the test harness shows when the test fails, so the run can
/// be replayed with `SIM_SEED=n cargo test <name>`.
///
/// # Panics
/// When `SIM_SEED` is set but is not a decimal or `0x`-prefixed hexadecimal `u64`: a typo must
/// not silently run a different seed.
pub fn seed_from_env(default: u64) -> u64 {
    let value = std::env::var(SEED_VAR).ok();
    let seed = parse_seed(value.as_deref(), default)
        .unwrap_or_else(|| panic!("{SEED_VAR}={value:?} is not a u64"));
    eprintln!("{SEED_VAR}={seed}");
    seed
}

/// The seed `value` names (`None` when unset means `default`); `None` when it does not parse.
fn parse_seed(value: Option<&str>, default: u64) -> Option<u64> {
    let Some(v) = value.map(str::trim) else {
        return Some(default);
    };
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_seed_uses_default() {
        assert_eq!(parse_seed(None, 42), Some(42));
    }

    #[test]
    fn decimal_and_hex_seeds_parse() {
        assert_eq!(parse_seed(Some("17"), 0), Some(17));
        assert_eq!(parse_seed(Some("0x11"), 0), Some(17));
    }

    #[test]
    fn garbage_seed_is_refused() {
        assert_eq!(parse_seed(Some("seventeen"), 0), None);
    }

    #[test]
    fn same_seed_same_stream() {
        use rand::Rng;
        let a: u64 = sim_rng(5).r#gen();
        let b: u64 = sim_rng(5).r#gen();
        assert_eq!(a, b);
    }
}
