//! Shared fixtures of the NBD server tests: a VHDX chain made with the disk library, a tiny
//! `ExportSource` over `disk::open::open`, counting metrics, a server on 127.0.0.1:0 in a
//! background runtime, and a minimal raw NBD client built on the `nbd_proto` codec.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use disk::open::{self, Format, OpenOptions};
use disk::ops::NoProgress;
use disk::ops::convert::{ConvertOptions, convert};
use interop::{MIB, create_vhdx, dynamic, pattern, session};
use nbd_proto::option::OptionReply;
use nbd_proto::reply::{CHUNK_HEADER_LEN, Chunk, SimpleReply};
use nbd_proto::{
    ClientFlags, ClientOption, InfoRequest, MetaQuery, NBD_SIMPLE_REPLY_MAGIC,
    NBD_STRUCTURED_REPLY_MAGIC, Request, ServerGreeting,
};
use nbd_server::{
    ExportHandle, ExportInfo, ExportSource, Listener, NbdMetrics, OpenError, Peer, ServerConfig,
};

/// Virtual size of the test chain.
pub const SIZE: u64 = 64 * MIB;

/// A base image and a differencing version, with holes, data and zeroed ranges, plus a
/// writable child for write tests and raw conversions of both chains.
pub struct Chain {
    pub dir: tempfile::TempDir,
    pub base: PathBuf,
    pub top: PathBuf,
    pub rw: PathBuf,
    pub base_raw: PathBuf,
    pub top_raw: PathBuf,
}

impl Chain {
    pub fn new() -> Chain {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("golden.vhdx");
        let top = dir.path().join("golden.1.avhdx");
        let rw = dir.path().join("device.avhdx");
        create_vhdx(&base, &dynamic(SIZE, MIB as u32));
        session(&base, |d| {
            d.write_at(&pattern(3 * MIB as usize, 1), 0).unwrap();
            d.write_at(&pattern(8192, 2), 10 * MIB + 4096).unwrap();
            d.write_at(&pattern(MIB as usize, 3), 40 * MIB).unwrap();
        });
        disk::version::new_version(&base, &top).unwrap();
        session(&top, |d| {
            d.write_at(&pattern(4096, 4), MIB + 512).unwrap();
            d.write_zeroes(40 * MIB, MIB / 2).unwrap();
            d.write_at(&pattern(2 * MIB as usize, 5), 60 * MIB).unwrap();
        });
        disk::version::new_version(&top, &rw).unwrap();
        let base_raw = dir.path().join("base.raw");
        let top_raw = dir.path().join("top.raw");
        let raw = ConvertOptions {
            format: Some(Format::Raw),
            flatten: true,
            ..ConvertOptions::default()
        };
        convert(&base, &base_raw, &raw, &NoProgress).unwrap();
        convert(&top, &top_raw, &raw, &NoProgress).unwrap();
        Chain {
            dir,
            base,
            top,
            rw,
            base_raw,
            top_raw,
        }
    }

    /// Export names: "golden" (newest version), "golden@0" (the base), "device" (writable).
    pub fn source(&self) -> Arc<TestSource> {
        let mut exports = HashMap::new();
        exports.insert("golden".to_string(), (self.top.clone(), false));
        exports.insert("golden@0".to_string(), (self.base.clone(), false));
        exports.insert("device".to_string(), (self.rw.clone(), true));
        Arc::new(TestSource {
            exports,
            opened: AtomicU64::new(0),
            released: Arc::new(AtomicU64::new(0)),
            writer_busy: Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Exports over image paths. A writable export admits one connection at a time (`Busy`).
pub struct TestSource {
    exports: HashMap<String, (PathBuf, bool)>,
    /// How many handles were opened.
    pub opened: AtomicU64,
    /// How many handles were released.
    pub released: Arc<AtomicU64>,
    writer_busy: Arc<AtomicBool>,
}

impl ExportSource for TestSource {
    fn list(&self, _peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        let mut v: Vec<ExportInfo> = self
            .exports
            .iter()
            .map(|(name, (path, _))| ExportInfo {
                name: name.clone(),
                description: format!("test image {}", path.display()),
                size: SIZE,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    fn open(&self, name: &str, _peer: &Peer) -> Result<ExportHandle, OpenError> {
        let Some((path, writable)) = self.exports.get(name) else {
            return Err(OpenError::NotFound(name.to_string()));
        };
        let busy = Arc::clone(&self.writer_busy);
        if *writable && busy.swap(true, Ordering::SeqCst) {
            return Err(OpenError::Busy(name.to_string()));
        }
        let chain = open::open(
            path,
            OpenOptions {
                writable: *writable,
                format: None,
            },
        )
        .map_err(|e| {
            busy.store(false, Ordering::SeqCst);
            OpenError::Other(e.to_string())
        })?;
        let device = chain.top();
        self.opened.fetch_add(1, Ordering::SeqCst);
        let released = Arc::clone(&self.released);
        let w = *writable;
        Ok(ExportHandle {
            device,
            writable: w,
            release: Some(Box::new(move || {
                if w {
                    chain.close().expect("close writable chain");
                    busy.store(false, Ordering::SeqCst);
                }
                released.fetch_add(1, Ordering::SeqCst);
            })),
            revoked: None,
        })
    }
}

/// Metrics that count.
#[derive(Default)]
pub struct Counts {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub protocol_errors: Mutex<Vec<&'static str>>,
}

impl NbdMetrics for Counts {
    fn connection_opened(&self) {
        self.opened.fetch_add(1, Ordering::SeqCst);
    }
    fn connection_closed(&self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
    fn request(&self, _kind: &'static str, _bytes: u64, _latency: Duration, ok: bool) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if !ok {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn protocol_error(&self, what: &'static str) {
        self.protocol_errors.lock().unwrap().push(what);
    }
}

impl Counts {
    pub fn protocol_errors(&self) -> Vec<&'static str> {
        self.protocol_errors.lock().unwrap().clone()
    }
}

/// A server running on its own runtime; stopped (gracefully) on drop.
pub struct Server {
    pub addr: SocketAddr,
    pub socket: Option<PathBuf>,
    pub metrics: Arc<Counts>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(source: Arc<dyn ExportSource>) -> Server {
        Server::start_with(source, ServerConfig::default())
    }

    pub fn start_with(source: Arc<dyn ExportSource>, mut config: ServerConfig) -> Server {
        init_tracing();
        config.nbd_listen = Some("127.0.0.1:0".parse().unwrap());
        let socket = config.nbd_socket.clone();
        let metrics = Arc::new(Counts::default());
        let m: Arc<dyn NbdMetrics> = metrics.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = Listener::bind(config).await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                l.serve(source, m, stopped).await;
            });
        });
        let addr = addr_rx.recv().unwrap();
        Server {
            addr,
            socket,
            metrics,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr)
    }

    /// Stops the server and waits until every connection has finished.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// `tool` under `timeout`, so a hung client fails the test instead of hanging it.
pub fn tool(name: &str) -> std::process::Command {
    let mut c = std::process::Command::new("timeout");
    c.args(["-k", "5", "300", name]);
    c
}

/// Reads a whole file.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

// ---------------------------------------------------------------------------------------------
// A minimal raw client over the codec, for hostile-input tests.
// ---------------------------------------------------------------------------------------------

/// A raw blocking connection.
pub struct Raw {
    pub s: TcpStream,
}

/// A reply as the raw client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple { error: u32, cookie: u64 },
    Chunk(Chunk),
}

impl Raw {
    /// Connects and reads the greeting.
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = Raw { s };
        let g = r.read_n(18);
        ServerGreeting::parse(&g).unwrap();
        r
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).unwrap();
        v
    }

    /// True when the server closed the connection (EOF or reset) before sending anything.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    pub fn flags(&mut self) {
        let mut v = Vec::new();
        ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        }
        .encode(&mut v);
        self.send(&v);
    }

    pub fn option(&mut self, o: &ClientOption) {
        let mut v = Vec::new();
        o.encode(&mut v);
        self.send(&v);
    }

    /// Reads one option reply.
    pub fn option_reply(&mut self) -> (u32, OptionReply) {
        let mut head = self.read_n(20);
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        head.extend(self.read_n(len));
        OptionReply::parse(&head).unwrap()
    }

    /// Reads option replies up to and including the final one.
    pub fn option_replies(&mut self) -> Vec<OptionReply> {
        let mut out = Vec::new();
        loop {
            let (_, r) = self.option_reply();
            let last = matches!(r, OptionReply::Ack | OptionReply::Error { .. });
            out.push(r);
            if last {
                return out;
            }
        }
    }

    /// Flags, optionally structured replies + base:allocation, then GO `export`.
    pub fn go(addr: SocketAddr, export: &str, structured: bool) -> Raw {
        let mut c = Raw::connect(addr);
        c.flags();
        if structured {
            c.option(&ClientOption::StructuredReply);
            assert_eq!(c.option_replies(), vec![OptionReply::Ack]);
            c.option(&ClientOption::SetMetaContext(MetaQuery {
                export: export.to_string(),
                queries: vec!["base:allocation".to_string()],
            }));
            let r = c.option_replies();
            assert_eq!(r.last(), Some(&OptionReply::Ack), "{r:?}");
        }
        c.option(&ClientOption::Go(InfoRequest {
            name: export.to_string(),
            requests: vec![],
        }));
        let r = c.option_replies();
        assert_eq!(r.last(), Some(&OptionReply::Ack), "{r:?}");
        c
    }

    pub fn request(&mut self, r: &Request) {
        let mut v = Vec::new();
        r.encode(&mut v);
        self.send(&v);
    }

    /// Reads one reply; `read_len` is the data length a successful simple read carries.
    pub fn reply(&mut self, read_len: usize) -> (Reply, Vec<u8>) {
        let head = self.read_n(4);
        let magic = u32::from_be_bytes(head[..4].try_into().unwrap());
        match magic {
            NBD_SIMPLE_REPLY_MAGIC => {
                let mut h = head;
                h.extend(self.read_n(12));
                let r = SimpleReply::parse(&h).unwrap();
                let data = if r.error == 0 {
                    self.read_n(read_len)
                } else {
                    Vec::new()
                };
                (
                    Reply::Simple {
                        error: r.error,
                        cookie: r.cookie,
                    },
                    data,
                )
            }
            NBD_STRUCTURED_REPLY_MAGIC => {
                let mut h = head;
                h.extend(self.read_n(CHUNK_HEADER_LEN - 4));
                let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
                h.extend(self.read_n(len));
                let (c, _) = Chunk::parse(&h).unwrap();
                (Reply::Chunk(c), Vec::new())
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }
}

/// A request with no flags.
pub fn req(command: nbd_proto::Command, cookie: u64, offset: u64, len: u32) -> Request {
    Request {
        flags: nbd_proto::CommandFlags(0),
        command,
        cookie,
        offset,
        len,
    }
}
