//! The NBD server against real clients: nbdinfo, nbdcopy, qemu-img, qemu-io and fio, over a
//! VHDX chain made with the disk library and served through a tiny in-test `ExportSource`.
//!
//! A missing tool skips a test on a developer's machine and fails it under `CI=true`.

use crate::common;

use std::sync::atomic::Ordering;

use common::{Chain, SIZE, Server, read, tool};
use disk::ExtentKind;
use interop::{MIB, open_ro, pattern, require, require_all, run_ok};
use nbd_proto::{NBD_STATE_HOLE, NBD_STATE_ZERO};
use nbd_server::ServerConfig;

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not json ({e}): {out}"))
}

/// Merges adjacent `(offset, len, flags)` runs with equal flags.
fn merge(runs: impl IntoIterator<Item = (u64, u64, u32)>) -> Vec<(u64, u64, u32)> {
    let mut out: Vec<(u64, u64, u32)> = Vec::new();
    for (o, l, f) in runs {
        match out.last_mut() {
            Some(last) if last.2 == f && last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l, f)),
        }
    }
    out
}

#[test]
fn nbdinfo_shows_size_and_base_allocation() {
    if !require("nbdinfo") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let v = json(&run_ok(
        tool("nbdinfo").arg("--json").arg(srv.uri("golden")),
    ));
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], SIZE);
    assert_eq!(e["is_read_only"], true);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB);
    assert_eq!(v["structured"], true);
    assert!(
        e["contexts"]
            .as_array()
            .unwrap()
            .contains(&"base:allocation".into()),
        "{e}"
    );
}

#[test]
fn nbdinfo_map_matches_chain_extents() {
    if !require("nbdinfo") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let v = json(&run_ok(
        tool("nbdinfo")
            .args(["--map", "--json"])
            .arg(srv.uri("golden")),
    ));
    let got = merge(v.as_array().unwrap().iter().map(|x| {
        (
            x["offset"].as_u64().unwrap(),
            x["length"].as_u64().unwrap(),
            x["type"].as_u64().unwrap() as u32,
        )
    }));
    let dev = open_ro(&chain.top).top();
    let want = merge(
        disk::device::extents(dev.as_ref(), 0, SIZE)
            .unwrap()
            .into_iter()
            .map(|x| {
                let f = match x.kind {
                    ExtentKind::Data => 0,
                    ExtentKind::Zero => NBD_STATE_ZERO,
                    ExtentKind::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
                };
                (x.offset, x.len, f)
            }),
    );
    assert_eq!(got, want);
    // The chain has data and zero runs, so the map is not trivially "all data". (The disk
    // library reports unallocated blocks of a base as Zero, so this chain has no Hole.)
    for f in [0, NBD_STATE_ZERO] {
        assert!(
            want.iter().any(|r| r.2 == f),
            "no extent with flags {f}: {want:?}"
        );
    }
}

#[test]
fn nbdinfo_lists_exports_and_serves_unix_socket() {
    if !require("nbdinfo") {
        return;
    }
    let chain = Chain::new();
    let sock = chain.dir.path().join("nbd.sock");
    let cfg = ServerConfig {
        nbd_socket: Some(sock.clone()),
        ..ServerConfig::default()
    };
    let srv = Server::start_with(chain.source(), cfg);
    let v = json(&run_ok(
        tool("nbdinfo").args(["--list", "--json"]).arg(srv.uri("")),
    ));
    let mut names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["device", "golden", "golden@0"]);
    let uri = format!("nbd+unix:///golden?socket={}", sock.display());
    let size = run_ok(tool("nbdinfo").arg("--size").arg(uri));
    assert_eq!(size.trim(), SIZE.to_string());
}

#[test]
fn nbdcopy_equals_convert_to_raw() {
    if !require("nbdcopy") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    for (export, raw) in [("golden", &chain.top_raw), ("golden@0", &chain.base_raw)] {
        let out = chain.dir.path().join(format!("{export}.copy"));
        std::fs::File::create(&out).unwrap();
        run_ok(tool("nbdcopy").arg(srv.uri(export)).arg(&out));
        assert!(
            read(&out) == read(raw),
            "nbdcopy of {export} differs from convert"
        );
    }
}

#[test]
fn qemu_img_convert_equals_convert_to_raw() {
    if !require("qemu-img") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let out = chain.dir.path().join("qemu.raw");
    run_ok(
        tool("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(srv.uri("golden"))
            .arg(&out),
    );
    assert!(
        read(&out) == read(&chain.top_raw),
        "qemu-img convert differs"
    );
}

#[test]
fn twenty_concurrent_nbdcopy_clients_all_equal() {
    if !require("nbdcopy") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let outs: Vec<_> = (0..20)
        .map(|i| chain.dir.path().join(format!("c{i}.raw")))
        .collect();
    let children: Vec<_> = outs
        .iter()
        .map(|o| {
            std::fs::File::create(o).unwrap();
            tool("nbdcopy")
                .arg(srv.uri("golden"))
                .arg(o)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let want = read(&chain.top_raw);
    for o in &outs {
        assert!(read(o) == want, "{} differs", o.display());
    }
    // nbdcopy opens several connections to a multi-conn export.
    assert!(srv.metrics.opened.load(Ordering::SeqCst) >= 20);
}

#[test]
fn qemu_io_writes_and_reads_writable_export() {
    if !require("qemu-io") {
        return;
    }
    let chain = Chain::new();
    let src = chain.source();
    let mut srv = Server::start(src.clone());
    let uri = srv.uri("device");
    let cmds = [
        "write -P 0xab 1M 64k",
        "read -P 0xab 1M 64k",
        "write -f -P 0xcd 5M 4k", // FUA
        "write -z 40M 1M",        // WRITE_ZEROES
        "read -P 0 40M 1M",
        "discard 60M 1M", // TRIM
        "flush",
    ];
    let mut c = tool("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = run_ok(c.arg(&uri));
    assert!(!out.contains("fail") && !out.contains("error"), "{out}");
    // The server releases the first connection's handle after the client has gone; the
    // export admits one writer, so wait for that release before connecting again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while src.released.load(std::sync::atomic::Ordering::SeqCst)
        < src.opened.load(std::sync::atomic::Ordering::SeqCst)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "first connection never released"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A second connection sees the writes.
    let out = run_ok(
        tool("qemu-io")
            .args([
                "-r",
                "-f",
                "raw",
                "-c",
                "read -P 0xab 1M 64k",
                "-c",
                "read -P 0xcd 5M 4k",
            ])
            .arg(&uri),
    );
    assert!(!out.contains("fail"), "{out}");
    // After a graceful stop the writes are in the image, and each connection was released.
    srv.stop();
    let dev = open_ro(&chain.rw).top();
    let mut buf = vec![0u8; 64 << 10];
    dev.read_at(&mut buf, MIB).unwrap();
    assert!(buf.iter().all(|&b| b == 0xab));
    let mut buf = vec![1u8; MIB as usize];
    dev.read_at(&mut buf, 40 * MIB).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    let opened = src.opened.load(Ordering::SeqCst);
    assert!(opened >= 2);
    assert_eq!(src.released.load(Ordering::SeqCst), opened);
}

#[test]
fn writes_on_read_only_export_fail_with_eperm_via_qemu_io() {
    if !require("qemu-io") {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let out = interop::run(
        tool("qemu-io")
            .args(["-f", "raw", "-c", "write -P 1 0 4k"])
            .arg(srv.uri("golden")),
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        // qemu refuses to open a READ_ONLY export for writing; the server's own EPERM is
        // checked on the raw wire in nbd_hostile.rs.
        !out.status.success() && text.contains("Permission denied"),
        "{text}"
    );
    // The image is untouched.
    let dev = open_ro(&chain.top).top();
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, pattern(3 * MIB as usize, 1)[..4096]);
}

#[test]
fn fio_randwrite_verify_passes() {
    if !require_all(&["fio"]) {
        return;
    }
    let chain = Chain::new();
    let srv = Server::start(chain.source());
    let out = run_ok(
        tool("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
                "--size=16M",
                "--iodepth=16",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                // No verify-state file in the working directory (the crate's source tree).
                "--verify_state_save=0",
                "--output-format=json",
            ])
            .arg(format!("--uri={}", srv.uri("device"))),
    );
    let v = json(&out[out.find('{').unwrap()..]);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= 16 * MIB);
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 16 * MIB,
        "verify read back"
    );
}
