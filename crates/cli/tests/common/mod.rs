//! Helpers shared by the end-to-end tests of the `ferry` binary (`server`, `target`,
//! `target_login`): the binary itself, free loopback ports, tools with no stdin, and child
//! processes that are killed if a test fails before stopping them.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use interop::run_ok;

pub mod boot;
pub mod console;
pub mod docs_run;
pub mod farm;
pub mod moto;
pub mod netns;
pub mod pg_cluster;

/// How long a process may take to start accepting, or to exit after SIGTERM.
pub const WAIT: Duration = Duration::from_secs(30);

/// The `ferry` binary under test, without the environment that would point it at another
/// farm (`FERRY_TOKEN`, `FERRY_API`, `FERRY_FARM_KEY`, `FERRY_DB`).
pub fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.env_remove("FERRY_TOKEN")
        .env_remove("FERRY_API")
        .env_remove("FERRY_FARM_KEY")
        .env_remove("FERRY_DB");
    c
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

pub use interop::free_port;

/// A peer tool with no stdin.
pub fn tool(name: &str) -> Command {
    let mut c = Command::new(name);
    c.stdin(Stdio::null());
    c
}

/// A child process killed (not gracefully) if a test fails before `stop`.
pub struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its stderr in `log`.
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create log"))
            .spawn()
            .expect("spawn ferry");
        Proc {
            child: Some(child),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `ready()`; fails if the process exits first.
    pub fn wait_until(&mut self, what: &str, ready: impl Fn() -> bool) {
        let start = Instant::now();
        while !ready() {
            let exited = self.child.as_mut().and_then(|c| c.try_wait().unwrap());
            assert!(
                exited.is_none(),
                "exited ({exited:?}) before {what}: {}",
                self.log_text()
            );
            assert!(start.elapsed() < WAIT, "never {what}: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash or a pulled cable.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM; asserts exit status 0.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        run_ok(Command::new("kill").args(["-TERM", &child.id().to_string()]));
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < WAIT,
                "no exit after SIGTERM: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "exit {status}: {}", self.log_text());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The text of `GET /metrics` from a server's metrics endpoint on loopback `port`.
pub fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read metrics response");
    text
}

/// The value of the unlabelled series `name` in a `/metrics` text.
pub fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {name} in:\n{text}"))
}
