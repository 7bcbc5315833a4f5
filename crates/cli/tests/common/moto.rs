//! moto's S3 server for end-to-end tests: one per test on a free loopback port, with bucket
//! [`BUCKET`] made, killed when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use interop::require;

use super::{Proc, free_port};

/// The bucket every test uses.
pub const BUCKET: &str = "vdisks";

/// moto's server, from `FERRY_MOTO` or the PATH; `None` (after the tool rule) when absent.
pub fn moto_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FERRY_MOTO").map(PathBuf::from)
        && p.is_file()
    {
        return Some(p);
    }
    require("moto_server").then(|| PathBuf::from("moto_server"))
}

/// A running moto S3 server on a free loopback port, killed when dropped.
pub struct Moto {
    _proc: Proc,
    pub port: u16,
}

impl Moto {
    /// Starts moto; `no_auth` requests pass unsigned checks before it enforces credentials
    /// (`None`: it never does).
    pub fn start(dir: &Path, no_auth: Option<u32>) -> Option<Moto> {
        let bin = moto_path()?;
        let port = free_port();
        let mut cmd = Command::new(bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        if let Some(n) = no_auth {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", n.to_string());
        }
        let mut proc = Proc::spawn(&mut cmd, dir.join(format!("moto-{port}.log")));
        proc.wait_until("moto accepting", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        let m = Moto { _proc: proc, port };
        let (status, body) = m.http("PUT", &format!("/{BUCKET}"), b"");
        assert_eq!(status, 200, "create bucket: {body}");
        Some(m)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One unsigned HTTP/1.1 request; the status and body.
    pub fn http(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect moto");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            self.port,
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut text = Vec::new();
        s.read_to_end(&mut text).expect("read moto reply");
        let text = String::from_utf8_lossy(&text).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, text)
    }
}
