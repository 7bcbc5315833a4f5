//! TLS with real clients: libnbd's `nbdinfo`/`nbdcopy` (`nbds://` with a certificate
//! directory) and qemu's `qemu-img`/`qemu-io` (`tls-creds-x509`), against an in-process
//! server in TLS-required mode; and a plaintext client refused by it. A missing tool fails
//! the test under `CI=true` and skips it (with the reason) otherwise.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Pki, SIZE, Server, Source, ci, tls_config};
use nbd_server::TlsMode;

/// Whether `tool` runs; panics under CI when it does not.
fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(!ci(), "{tool} is required under CI=true");
        eprintln!("skipping: {tool} is not installed");
    }
    ok
}

/// `tool` under `timeout`, so a hung client fails the test instead of hanging it.
fn run(tool: &str, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .args(["-k", "5", "120", tool])
        .args(args)
        .output()
        .unwrap();
    eprintln!(
        "{tool} {args:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn nbds(srv: &Server, dir: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{}/mem?tls-certificates={}",
        srv.addr.port(),
        dir.display()
    )
}

fn qemu_args(srv: &Server, dir: &Path) -> (String, String) {
    (
        format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            dir.display()
        ),
        format!(
            "driver=nbd,host=127.0.0.1,port={},export=mem,tls-creds=tls0",
            srv.addr.port()
        ),
    )
}

#[test]
fn nbdinfo_and_nbdcopy_over_tls() {
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write_dir(dir.path());
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let out = run("nbdinfo", &["--size", &nbds(&srv, dir.path())]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        SIZE.to_string()
    );
    let peer = src.last_peer();
    assert!(peer.tls);
    assert_eq!(peer.client_cert.as_deref(), Some(pki.client_der.as_ref()));
    let copy = dir.path().join("copy.raw");
    let out = run(
        "nbdcopy",
        &[&nbds(&srv, dir.path()), copy.to_str().unwrap()],
    );
    assert!(out.status.success());
    assert!(std::fs::read(&copy).unwrap() == *src.disk.0.lock().unwrap());
}

#[test]
fn qemu_img_and_qemu_io_over_tls() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    pki.write_dir(dir.path());
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let (object, image) = qemu_args(&srv, dir.path());
    let out = run(
        "qemu-img",
        &[
            "info",
            "--output=json",
            "--object",
            &object,
            "--image-opts",
            &image,
        ],
    );
    assert!(out.status.success());
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(
        info.contains(&format!("\"virtual-size\": {SIZE}")),
        "{info}"
    );
    let out = run(
        "qemu-io",
        &[
            "--object",
            &object,
            "--image-opts",
            &image,
            "-c",
            "write -P 0xab 65536 65536",
            "-c",
            "read -P 0xab 65536 65536",
        ],
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("verification failed"), "{stdout}");
    assert!(
        src.disk.0.lock().unwrap()[65536..131072]
            .iter()
            .all(|&b| b == 0xab)
    );
    assert!(src.last_peer().tls);
}

#[test]
fn plaintext_clients_are_refused_by_a_tls_required_server() {
    if !have("nbdinfo") || !have("qemu-img") {
        return;
    }
    let pki = Pki::new();
    let src = Source::new();
    let srv = Server::start(src.clone(), tls_config(&pki, TlsMode::Required));
    let uri = format!("nbd://127.0.0.1:{}/mem", srv.addr.port());
    assert!(!run("nbdinfo", &["--size", &uri]).status.success());
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export=mem",
        srv.addr.port()
    );
    assert!(
        !run("qemu-img", &["info", "--image-opts", &image])
            .status
            .success()
    );
    // The source was never asked for the export.
    assert!(src.peers.lock().unwrap().is_empty());
}
