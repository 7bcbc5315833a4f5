//! Nonsense flag values are refused by the argument parser with a message naming the flag
//! and the rule (a usage error, nothing started): zero RAM, zero sizes, zero timeouts.

use std::process::Command;

/// Runs `ferry ARGS` and returns (exit code, stderr).
fn ferry(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("run ferry");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts `args` is refused as a usage error whose message names `flag` and holds `why`.
fn refused(args: &[&str], flag: &str, why: &str) {
    let (code, err) = ferry(args);
    assert!(
        code.is_some_and(|c| c != 0) && err.starts_with("error: invalid value"),
        "{args:?} was not refused by the parser: {err}"
    );
    assert!(
        err.contains(flag) && err.contains(why),
        "{args:?}: the error lacks {flag:?} or {why:?}: {err}"
    );
}

const TARGET: [&str; 5] = ["target", "--server", "127.0.0.1:1", "--vdisk", "golden"];

#[test]
fn target_refuses_zero_ram_sizes_and_timeouts() {
    for (flag, value, why) in [
        ("--ram", "0", "cannot be zero"),
        ("--ram", "0G", "cannot be zero"),
        ("--overflow-max", "0", "cannot be zero"),
        ("--boot-bytes", "0", "cannot be zero"),
        ("--timeout", "0", "at least 1 second"),
        ("--failover-timeout", "0", "at least 1 second"),
        ("--timeout", "soon", "not a whole number"),
    ] {
        let mut args = TARGET.to_vec();
        args.extend([flag, value]);
        refused(&args, flag, why);
    }
}

#[test]
fn server_and_farm_commands_refuse_zero_sizes() {
    refused(
        &["server", "--store", "/nonexistent", "--cache-ram", "0"],
        "--cache-ram",
        "cannot be zero",
    );
    refused(
        &[
            "farm", "vdisk", "add", "golden", "--store", "1", "--size", "0",
        ],
        "--size",
        "cannot be zero",
    );
    refused(
        &[
            "farm",
            "vdisk",
            "add",
            "golden",
            "--store",
            "1",
            "--ram-bytes",
            "0",
        ],
        "--ram-bytes",
        "0 is not in 1..",
    );
    refused(
        &["device", "set", "1", "--ram-bytes", "0"],
        "--ram-bytes",
        "0 is not in 1..",
    );
}
