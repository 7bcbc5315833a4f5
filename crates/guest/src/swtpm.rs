//! A TPM 2.0 for a test machine: `swtpm socket --tpm2` (Debian's `swtpm`) with its state in
//! a directory of the test's, reached by QEMU's `tpm-tis` device over swtpm's control
//! socket ([`Swtpm::qemu_args`]). Started once per boot: the state directory is the
//! machine's TPM chip, so what a boot keeps in it is there at the next boot.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{GuestError, io_err};

/// How long swtpm may take to open its control socket: a hang guard, not a measure.
const LISTEN_WAIT: Duration = Duration::from_secs(20);

/// A running swtpm; stopped when dropped (its state stays in the directory).
#[derive(Debug)]
pub struct Swtpm {
    child: Child,
    ctrl: PathBuf,
}

impl Swtpm {
    /// Starts swtpm with its state in `state_dir` (created when missing; an empty one is a
    /// TPM fresh from the factory).
    ///
    /// # Errors
    /// swtpm cannot be started, or does not open its control socket within 20 s.
    pub fn start(state_dir: &Path) -> Result<Swtpm, GuestError> {
        std::fs::create_dir_all(state_dir)
            .map_err(io_err(format!("create {}", state_dir.display())))?;
        let ctrl = state_dir.join("swtpm-ctrl.sock");
        let _ = std::fs::remove_file(&ctrl);
        let mut cmd = Command::new("swtpm");
        cmd.args(["socket", "--tpm2"])
            .arg(format!("--tpmstate=dir={}", state_dir.display()))
            .arg(format!("--ctrl=type=unixio,path={}", ctrl.display()))
            .arg(format!(
                "--log=file={},level=1",
                state_dir.join("swtpm.log").display()
            ))
            .stdin(Stdio::null());
        let shown = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .map_err(|source| GuestError::Spawn { cmd: shown, source })?;
        let mut tpm = Swtpm { child, ctrl };
        let start = Instant::now();
        while !tpm.ctrl.exists() {
            if let Ok(Some(status)) = tpm.child.try_wait() {
                return Err(GuestError::Invalid(format!(
                    "swtpm exited ({status}) before opening {}",
                    tpm.ctrl.display()
                )));
            }
            if start.elapsed() > LISTEN_WAIT {
                return Err(GuestError::Invalid(format!(
                    "swtpm did not open {} in {LISTEN_WAIT:?}",
                    tpm.ctrl.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(tpm)
    }

    /// QEMU's arguments for a `tpm-tis` device backed by this swtpm.
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-chardev".into(),
            format!("socket,id=chrtpm,path={}", self.ctrl.display()),
            "-tpmdev".into(),
            "emulator,id=tpm0,chardev=chrtpm".into(),
            "-device".into(),
            "tpm-tis,tpmdev=tpm0".into(),
        ]
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
