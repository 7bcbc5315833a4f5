//! The server against real TFTP clients: tftp-hpa's `tftp` (RFC 1350, no options, 512-byte
//! blocks) and `curl tftp://` (which negotiates blksize and tsize), files of several sizes
//! (empty, one block, exact multiples of the block size, more than 65535 blocks so the block
//! number rolls over), compared byte for byte; and Debian's iPXE `undionly.kpxe` served from
//! /usr/lib/ipxe as `--tftp-root /usr/lib/ipxe` would.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{TestServer, pattern, require};
use tftp::Config;

/// Sizes served: empty, short, one block and a bit, exact multiples of 512 and of 1468.
const SIZES: [usize; 8] = [0, 1, 511, 512, 513, 4 * 512, 3 * 1468, 100_000];
/// More than 65535 blocks of 512 bytes (block numbers roll over), not a multiple of 512.
const BIG: usize = 65_600 * 512 + 77;

fn tftp_hpa(server: &TestServer, file: &str, dest: &Path) -> std::process::Output {
    Command::new("tftp")
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &server.port(),
            "-c",
            "get",
            file,
        ])
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .expect("run tftp")
}

fn curl(server: &TestServer, file: &str, blksize: u32, dest: &Path) -> std::process::Output {
    Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "120",
            "--tftp-blksize",
            &blksize.to_string(),
        ])
        .arg(format!("tftp://127.0.0.1:{}/{file}", server.port()))
        .arg("-o")
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .expect("run curl")
}

fn assert_same(out: &std::process::Output, got: &Path, want: &[u8], what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read(got).unwrap_or_default();
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert!(got == want, "{what}: content differs");
}

fn root_with_sizes(dir: &Path) {
    for (i, size) in SIZES.iter().enumerate() {
        std::fs::write(dir.join(format!("f{size}.bin")), pattern(*size, i as u64)).unwrap();
    }
}

#[test]
fn tftp_hpa_fetches_files_of_every_size() {
    if !require("tftp") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    root_with_sizes(t.path());
    let server = TestServer::dir(t.path(), Config::default());
    let out_dir = tempfile::tempdir().unwrap();
    for (i, size) in SIZES.iter().enumerate() {
        let dest = out_dir.path().join(format!("hpa{size}"));
        let out = tftp_hpa(&server, &format!("f{size}.bin"), &dest);
        assert_same(
            &out,
            &dest,
            &pattern(*size, i as u64),
            &format!("tftp {size}"),
        );
    }
    let s = server.wait_for("all transfers complete", |s| {
        s.transfers_completed == SIZES.len() as u64
    });
    assert_eq!(s.transfers_failed, 0);
    assert!(s.bytes_sent >= SIZES.iter().sum::<usize>() as u64);
}

#[test]
fn curl_fetches_files_with_negotiated_block_sizes() {
    if !require("curl") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    root_with_sizes(t.path());
    let server = TestServer::dir(t.path(), Config::default());
    let out_dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for blksize in [512, 1468, 8192, 65464] {
        for (i, size) in SIZES.iter().enumerate() {
            let dest = out_dir.path().join(format!("curl{blksize}_{size}"));
            let out = curl(&server, &format!("f{size}.bin"), blksize, &dest);
            let what = format!("curl blksize {blksize} size {size}");
            assert_same(&out, &dest, &pattern(*size, i as u64), &what);
            n += 1;
        }
    }
    let s = server.wait_for("all transfers complete", |s| s.transfers_completed == n);
    assert_eq!(s.transfers_failed, 0);
}

#[test]
fn block_numbers_roll_over_past_65535() {
    let have_tftp = require("tftp");
    let have_curl = require("curl");
    if !have_tftp && !have_curl {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let want = pattern(BIG, 7);
    std::fs::write(t.path().join("big.bin"), &want).unwrap();
    let server = TestServer::dir(t.path(), Config::default());
    let out_dir = tempfile::tempdir().unwrap();
    if have_tftp {
        let dest = out_dir.path().join("hpa");
        let out = tftp_hpa(&server, "big.bin", &dest);
        assert_same(&out, &dest, &want, "tftp-hpa, 512-byte blocks");
    }
    if have_curl {
        let dest = out_dir.path().join("curl");
        let out = curl(&server, "big.bin", 512, &dest);
        assert_same(&out, &dest, &want, "curl, blksize 512");
    }
}

#[test]
fn serves_debian_ipxe_undionly_kpxe() {
    let src = Path::new("/usr/lib/ipxe/undionly.kpxe");
    if !src.is_file() && !common::missing("Debian's ipxe package (/usr/lib/ipxe/undionly.kpxe)") {
        return;
    }
    if !require("tftp") {
        return;
    }
    let want = std::fs::read(src).unwrap();
    let server = TestServer::dir(Path::new("/usr/lib/ipxe"), Config::default());
    let out_dir = tempfile::tempdir().unwrap();
    let dest = out_dir.path().join("undionly.kpxe");
    let out = tftp_hpa(&server, "undionly.kpxe", &dest);
    assert_same(&out, &dest, &want, "undionly.kpxe");
}
