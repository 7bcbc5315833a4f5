//! Helpers shared by the TFTP server's tests: a server on a loopback port in its own runtime
//! thread, a raw UDP client speaking through the crate's codec, file patterns, and the tool
//! rule for real clients (a missing tool skips a test with a printed reason on a developer's
//! machine and FAILS it under `CI=true`).

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tftp::{Config, Counters, DirSource, FileSource, Packet, Server, Snapshot};

/// How long a raw client waits for one packet before the test fails.
pub const RECV_WAIT: Duration = Duration::from_secs(20);

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Applies the tool rule to a missing prerequisite `what`; returns false to skip.
pub fn missing(what: &str) -> bool {
    if on_ci() {
        panic!("{what} is required under CI=true (.ci/run installs it)");
    }
    eprintln!("SKIPPED: {what} is not available on this machine");
    false
}

/// True when `tool` is on PATH; otherwise [`missing`].
pub fn require(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    found || missing(&format!("the tool `{tool}`"))
}

/// A server on 127.0.0.1 serving a directory, running in a thread of its own; stopped when
/// dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn dir(root: &Path, config: Config) -> TestServer {
        TestServer::start(Arc::new(DirSource::new(root).expect("open root")), config)
    }

    pub fn start(source: Arc<dyn FileSource>, config: Config) -> TestServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let server = rt
            .block_on(Server::bind("127.0.0.1:0".parse().unwrap(), source, config))
            .expect("bind");
        let addr = server.local_addr().unwrap();
        let counters = server.counters();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(server.run(async {
                let _ = rx.await;
            }));
        });
        TestServer {
            addr,
            counters,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> String {
        self.addr.port().to_string()
    }

    pub fn snapshot(&self) -> Snapshot {
        self.counters.snapshot()
    }

    /// Waits until `cond` holds on the counters (they are updated after packets are sent).
    pub fn wait_for(&self, what: &str, cond: impl Fn(&Snapshot) -> bool) -> Snapshot {
        let start = std::time::Instant::now();
        loop {
            let s = self.snapshot();
            if cond(&s) {
                return s;
            }
            assert!(start.elapsed() < RECV_WAIT, "never {what}: {s:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Deterministic content: `len` bytes from `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A TFTP client on a raw UDP socket.
pub struct Raw {
    pub sock: UdpSocket,
}

impl Raw {
    pub fn new() -> Raw {
        Raw::bound("127.0.0.1:0")
    }

    pub fn bound(addr: &str) -> Raw {
        let sock = UdpSocket::bind(addr).expect("bind raw client");
        sock.set_read_timeout(Some(RECV_WAIT)).unwrap();
        Raw { sock }
    }

    pub fn send(&self, bytes: &[u8], to: SocketAddr) {
        self.sock.send_to(bytes, to).expect("send");
    }

    pub fn send_packet(&self, p: &Packet<'_>, to: SocketAddr) {
        let mut b = Vec::new();
        p.encode(&mut b);
        self.send(&b, to);
    }

    /// The next datagram and its sender.
    pub fn recv(&self) -> (Vec<u8>, SocketAddr) {
        let mut buf = vec![0u8; 70_000];
        let (n, from) = self.sock.recv_from(&mut buf).expect("no packet in time");
        buf.truncate(n);
        (buf, from)
    }

    /// Waits up to `wait` for a datagram.
    pub fn try_recv(&self, wait: Duration) -> Option<(Vec<u8>, SocketAddr)> {
        self.sock.set_read_timeout(Some(wait)).unwrap();
        let mut buf = vec![0u8; 70_000];
        let r = self.sock.recv_from(&mut buf).ok().map(|(n, from)| {
            buf.truncate(n);
            (buf, from)
        });
        self.sock.set_read_timeout(Some(RECV_WAIT)).unwrap();
        r
    }

    /// The next packet, which must be an ERROR: its code.
    pub fn expect_error(&self) -> u16 {
        let (b, _) = self.recv();
        match Packet::parse(&b) {
            Ok(Packet::Error { code, .. }) => code.to_u16(),
            other => panic!("expected an ERROR, got {other:?}"),
        }
    }
}

/// An RRQ in octet mode with `options`.
pub fn rrq(name: &str, options: tftp::Options) -> Vec<u8> {
    let mut b = Vec::new();
    Packet::Rrq(tftp::Request {
        filename: name.into(),
        mode: tftp::Mode::Octet,
        options,
    })
    .encode(&mut b);
    b
}
