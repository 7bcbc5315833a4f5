//! The device key in a TPM (`agent::tpm` over `tpm_proto`'s commands) against a real TPM
//! 2.0: `swtpm socket --tpm2` on a unix socket of the test's own (raw TPM commands; its
//! control channel on another socket), its state in a temporary directory.
//!
//! A fresh TPM holds no key; a key stored reads back; a second store replaces it; the key
//! survives a restart of the TPM (its NV state); an index of another size is an error, not
//! a key. `swtpm` follows the tool rule (docs/testing.md): missing, the test says so and
//! returns; under `CI=true` it fails.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent::tpm::{KEY_BYTES, Tpm, TpmError};

/// A hang guard for swtpm's start, not a measure.
const START_WAIT: Duration = Duration::from_secs(20);

fn have_swtpm() -> bool {
    let ok = Command::new("swtpm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "swtpm is required under CI (Debian package swtpm)"
        );
        eprintln!("swtpm not found: skipping");
    }
    ok
}

/// A `swtpm socket --tpm2` whose state is in `dir`; killed when dropped.
struct Swtpm {
    child: Child,
}

impl Swtpm {
    fn start(dir: &Path) -> (Swtpm, UnixStream) {
        let sock = dir.join("tpm.sock");
        let ctrl = dir.join("ctrl.sock");
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(&ctrl);
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2"])
            .arg(format!("--tpmstate=dir={}", dir.display()))
            .arg(format!("--server=type=unixio,path={}", sock.display()))
            .arg(format!("--ctrl=type=unixio,path={}", ctrl.display()))
            .args(["--flags", "not-need-init,startup-clear"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start swtpm");
        let s = Swtpm { child };
        let start = Instant::now();
        loop {
            if let Ok(c) = UnixStream::connect(&sock) {
                c.set_read_timeout(Some(START_WAIT)).unwrap();
                return (s, c);
            }
            assert!(start.elapsed() < START_WAIT, "swtpm did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_key_stored_in_the_tpm_reads_back_is_replaced_and_survives_a_restart() {
    if !have_swtpm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (tpm_proc, io) = Swtpm::start(dir.path());
    let mut tpm = Tpm::new(io);
    // Started already (startup-clear): a second Startup is not an error.
    tpm.startup().unwrap();
    assert_eq!(tpm.load_key().unwrap(), None, "a fresh TPM holds no key");
    let first = [0x5a; KEY_BYTES];
    tpm.store_key(&first).unwrap();
    assert_eq!(tpm.load_key().unwrap().as_deref(), Some(&first[..]));
    let second: Vec<u8> = (0..32).collect();
    tpm.store_key(&second).unwrap();
    assert_eq!(tpm.load_key().unwrap(), Some(second.clone()));
    assert!(matches!(
        tpm.store_key(&[1; 16]),
        Err(TpmError::NotAKey(16))
    ));
    drop(tpm);
    drop(tpm_proc);

    // The TPM's NV state outlives a power cycle.
    let (_tpm_proc, io) = Swtpm::start(dir.path());
    let mut tpm = Tpm::new(io);
    assert_eq!(tpm.load_key().unwrap(), Some(second));
}
