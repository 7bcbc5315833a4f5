//! End-to-end test of `ferry server --tftp-listen --tftp-root`: the real binary serves a
//! directory over TFTP on a loopback port, `curl tftp://` fetches a file (negotiating blksize
//! and tsize) and the bytes match, `/metrics` counts the transfer, and SIGTERM stops it with
//! exit 0. Also: `--tftp-listen` without `--tftp-root` is a usage error.
//!
//! Tool rule (STYLE.md §6): a missing client skips a test with a printed reason on a
//! developer's machine and fails it under `CI=true`.

use std::io::{Read, Write};
use std::net::TcpStream;

mod common;

use common::{Proc, WAIT, ferry, free_port, path_str, tool};
use interop::{pattern, require};

/// A UDP port free now (and reserved for this test process).
fn free_udp_port() -> u16 {
    free_port()
}

fn metrics(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read metrics response");
    text
}

#[test]
fn server_serves_a_file_over_tftp_to_curl() {
    if !require("curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let root = dir.path().join("tftp");
    std::fs::create_dir(&store).unwrap();
    std::fs::create_dir(&root).unwrap();
    let want = pattern(300_000, 5);
    std::fs::write(root.join("undionly.kpxe"), &want).unwrap();
    let (nbd_port, metrics_port, tftp_port) = (free_port(), free_port(), free_udp_port());
    let log = dir.path().join("server.log");
    let mut proc = Proc::spawn(
        ferry()
            .args(["server", "--store", path_str(&store)])
            .arg(format!("--nbd-listen=127.0.0.1:{nbd_port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .arg(format!("--tftp-listen=127.0.0.1:{tftp_port}"))
            .args(["--tftp-root", path_str(&root)])
            .arg("--cache-ram=16M"),
        log.clone(),
    );
    proc.wait_until("TFTP listening", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("TFTP listening"))
    });
    let dest = dir.path().join("got.kpxe");
    let out = tool("curl")
        .args(["-sS", "--max-time", "60", "--tftp-blksize", "1468"])
        .arg(format!("tftp://127.0.0.1:{tftp_port}/undionly.kpxe"))
        .arg("-o")
        .arg(&dest)
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        proc.log_text()
    );
    assert!(std::fs::read(&dest).unwrap() == want, "content differs");
    // A path out of the root is refused.
    let out = tool("curl")
        .args(["-sS", "--max-time", "60", "--path-as-is"])
        .arg(format!("tftp://127.0.0.1:{tftp_port}/../store"))
        .arg("-o")
        .arg(dir.path().join("nope"))
        .output()
        .expect("run curl");
    assert!(!out.status.success());
    // The server counts after the last ACK arrives; wait for it.
    let start = std::time::Instant::now();
    let text = loop {
        let text = metrics(metrics_port);
        if text.contains("ferry_tftp_transfers_completed_total 1\n") {
            break text;
        }
        assert!(start.elapsed() < WAIT, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        text.contains("ferry_tftp_bytes_sent_total 300000\n"),
        "{text}"
    );
    assert!(
        text.contains("ferry_tftp_rejected_total{reason=\"path_refused\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("ferry_nbd_connections_total"), "{text}");
    proc.stop();
}

#[test]
fn tftp_listen_needs_a_root() {
    let out = ferry()
        .args([
            "server",
            "--store",
            "/nonexistent",
            "--tftp-listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run ferry");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tftp-root"));
}
