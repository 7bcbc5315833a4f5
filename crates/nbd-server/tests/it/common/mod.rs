//! Shared fixtures of the nbd-server tests: an in-memory device, a small `ExportSource` that
//! records who asked, a server on 127.0.0.1:0 on its own runtime, a blocking raw client over
//! any stream (plain TCP or rustls), and a CA with server and client certificates made with
//! rcgen.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use disk::BlockDevice;
use disk::device::{Geometry, check_bounds};
use nbd_proto::option::OptionReply;
use nbd_proto::{
    ClientFlags, ClientOption, Command, CommandFlags, InfoRequest, Request, ServerGreeting,
    SimpleReply,
};
use nbd_server::{
    ExportHandle, ExportInfo, ExportSource, Listener, NbdMetrics, OpenError, Peer, ServerConfig,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio_util::sync::CancellationToken;

/// Size of the in-memory export.
pub const SIZE: u64 = 4 << 20;

/// Whether tests run under CI (a missing tool then fails the test).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A byte vector as a writable block device.
#[derive(Debug)]
pub struct MemDisk(pub Mutex<Vec<u8>>);

impl MemDisk {
    pub fn new() -> Arc<MemDisk> {
        let bytes = (0..SIZE).map(|i| (i % 251) as u8).collect();
        Arc::new(MemDisk(Mutex::new(bytes)))
    }
}

impl BlockDevice for MemDisk {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: SIZE,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }
    fn format(&self) -> &'static str {
        "mem"
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        check_bounds(SIZE, offset, buf.len() as u64)?;
        let o = offset as usize;
        buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> disk::Result<()> {
        check_bounds(SIZE, offset, buf.len() as u64)?;
        let o = offset as usize;
        self.0.lock().unwrap()[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn can_write(&self) -> bool {
        true
    }
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }
}

/// Exports "mem" (anyone), "secret" (TLS only: `TlsRequired` otherwise) and "denied"
/// (`Forbidden`), all over one [`MemDisk`]. Records every peer that opened or listed, and
/// hands `revoke` to every handle.
pub struct Source {
    pub disk: Arc<MemDisk>,
    pub peers: Mutex<Vec<Peer>>,
    pub revoke: CancellationToken,
    pub released: Arc<AtomicU64>,
}

impl Source {
    pub fn new() -> Arc<Source> {
        Arc::new(Source {
            disk: MemDisk::new(),
            peers: Mutex::new(Vec::new()),
            revoke: CancellationToken::new(),
            released: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn last_peer(&self) -> Peer {
        self.peers.lock().unwrap().last().cloned().expect("a peer")
    }
}

impl ExportSource for Source {
    fn list(&self, peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        self.peers.lock().unwrap().push(peer.clone());
        Ok(["mem", "secret"]
            .iter()
            .map(|n| ExportInfo {
                name: (*n).into(),
                description: String::new(),
                size: SIZE,
            })
            .collect())
    }

    fn open(&self, name: &str, peer: &Peer) -> Result<ExportHandle, OpenError> {
        self.peers.lock().unwrap().push(peer.clone());
        match name {
            "mem" => {}
            "secret" if peer.tls => {}
            "secret" => return Err(OpenError::TlsRequired("secret needs TLS".into())),
            "denied" => return Err(OpenError::Forbidden("not for you".into())),
            _ => return Err(OpenError::NotFound(name.into())),
        }
        let released = Arc::clone(&self.released);
        Ok(ExportHandle {
            device: Arc::clone(&self.disk) as Arc<dyn BlockDevice>,
            writable: true,
            release: Some(Box::new(move || {
                released.fetch_add(1, Ordering::SeqCst);
            })),
            revoked: Some(self.revoke.clone()),
        })
    }
}

/// Metrics that record protocol errors.
#[derive(Default)]
pub struct Counts {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    pub protocol_errors: Mutex<Vec<&'static str>>,
}

impl NbdMetrics for Counts {
    fn connection_opened(&self) {
        self.opened.fetch_add(1, Ordering::SeqCst);
    }
    fn connection_closed(&self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
    fn request(&self, _kind: &'static str, _bytes: u64, _latency: Duration, _ok: bool) {}
    fn protocol_error(&self, what: &'static str) {
        self.protocol_errors.lock().unwrap().push(what);
    }
}

impl Counts {
    pub fn protocol_errors(&self) -> Vec<&'static str> {
        self.protocol_errors.lock().unwrap().clone()
    }
}

/// A server on 127.0.0.1:0 on its own runtime; stopped (gracefully) on drop.
pub struct Server {
    pub addr: SocketAddr,
    pub metrics: Arc<Counts>,
    /// The server's runtime (its tasks can be counted).
    pub runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(source: Arc<dyn ExportSource>, mut config: ServerConfig) -> Server {
        config.nbd_listen = Some("127.0.0.1:0".parse().unwrap());
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
                let handle = tokio::runtime::Handle::current();
                addr_tx.send((l.local_addr().unwrap(), handle)).unwrap();
                l.serve(source, m, stopped).await;
            });
        });
        let (addr, runtime) = addr_rx.recv().unwrap();
        Server {
            addr,
            metrics,
            runtime,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

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

// ---------------------------------------------------------------------------------------------
// A blocking raw client over any stream.
// ---------------------------------------------------------------------------------------------

/// A raw blocking client over `S` (a `TcpStream`, a `UnixStream` or a rustls stream).
pub struct Client<S> {
    pub s: S,
}

/// Connects over TCP with a read timeout, so a server that never answers fails the test.
pub fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

impl<S: Read + Write> Client<S> {
    /// Reads the greeting and sends the client flags.
    pub fn greet(s: S) -> Client<S> {
        let mut c = Client { s };
        let g = c.read_n(18);
        ServerGreeting::parse(&g).unwrap();
        let mut v = Vec::new();
        ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        }
        .encode(&mut v);
        c.send(&v);
        c
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
        self.s.flush().unwrap();
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).unwrap();
        v
    }

    /// True when the server closed the connection (EOF or reset).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ),
        }
    }

    pub fn option(&mut self, o: &ClientOption) {
        let mut v = Vec::new();
        o.encode(&mut v);
        self.send(&v);
    }

    /// Reads option replies up to and including the final one.
    pub fn option_replies(&mut self) -> Vec<OptionReply> {
        let mut out = Vec::new();
        loop {
            let mut head = self.read_n(20);
            let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
            head.extend(self.read_n(len));
            let (_, r) = OptionReply::parse(&head).unwrap();
            let last = matches!(r, OptionReply::Ack | OptionReply::Error { .. });
            out.push(r);
            if last {
                return out;
            }
        }
    }

    /// Sends `o` and returns its final reply: `Ok(())` for ACK, `Err(code)` for an error.
    pub fn ask(&mut self, o: &ClientOption) -> Result<(), u32> {
        self.option(o);
        match self.option_replies().pop() {
            Some(OptionReply::Ack) => Ok(()),
            Some(OptionReply::Error { code, .. }) => Err(code),
            r => panic!("unexpected final reply {r:?}"),
        }
    }

    /// `NBD_OPT_GO` for `name`.
    pub fn go(&mut self, name: &str) -> Result<(), u32> {
        self.ask(&ClientOption::Go(InfoRequest {
            name: name.into(),
            requests: vec![],
        }))
    }

    pub fn request(&mut self, command: Command, cookie: u64, offset: u64, len: u32) {
        let mut v = Vec::new();
        Request {
            flags: CommandFlags(0),
            command,
            cookie,
            offset,
            len,
        }
        .encode(&mut v);
        self.send(&v);
    }

    /// Reads one simple reply: (error, cookie, `read_len` bytes of data on success).
    pub fn simple_reply(&mut self, read_len: usize) -> (u32, u64, Vec<u8>) {
        let h = self.read_n(16);
        let r = SimpleReply::parse(&h).unwrap();
        let data = if r.error == 0 {
            self.read_n(read_len)
        } else {
            Vec::new()
        };
        (r.error, r.cookie, data)
    }

    /// Reads `len` bytes at `offset` (simple replies).
    pub fn read_at(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(Command::Read, 7, offset, len);
        let (err, cookie, data) = self.simple_reply(len as usize);
        assert_eq!((err, cookie), (0, 7));
        data
    }
}

// ---------------------------------------------------------------------------------------------
// TLS: a CA, a server certificate for 127.0.0.1/localhost, a client certificate.
// ---------------------------------------------------------------------------------------------

/// PEM and DER of a test PKI.
pub struct Pki {
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    pub server_pem: String,
    pub server_der: CertificateDer<'static>,
    pub server_key_pem: String,
    pub server_key_der: Vec<u8>,
    pub client_pem: String,
    pub client_der: CertificateDer<'static>,
    pub client_key_pem: String,
    pub client_key_der: Vec<u8>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose, SanType,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ferry test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let mut sp = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        sp.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        sp.distinguished_name.push(DnType::CommonName, "localhost");
        sp.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().unwrap();
        let server = sp.signed_by(&server_key, &issuer).unwrap();

        let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
        cp.distinguished_name.push(DnType::CommonName, "device-1");
        cp.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().unwrap();
        let client = cp.signed_by(&client_key, &issuer).unwrap();

        Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            server_pem: server.pem(),
            server_der: server.der().clone(),
            server_key_pem: server_key.serialize_pem(),
            server_key_der: server_key.serialize_der(),
            client_pem: client.pem(),
            client_der: client.der().clone(),
            client_key_pem: client_key.serialize_pem(),
            client_key_der: client_key.serialize_der(),
        }
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        roots
    }

    /// A server configuration that verifies client certificates against the CA when one is
    /// presented, and admits clients without one.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.roots()),
            provider(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone()));
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.server_der.clone()], key)
            .unwrap();
        Arc::new(cfg)
    }

    /// A client configuration trusting the CA, presenting the client certificate if `auth`.
    pub fn client_config(&self, auth: bool) -> Arc<rustls::ClientConfig> {
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots());
        let cfg = if auth {
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.client_key_der.clone()));
            b.with_client_auth_cert(vec![self.client_der.clone()], key)
                .unwrap()
        } else {
            b.with_no_client_auth()
        };
        Arc::new(cfg)
    }

    /// Writes the files libnbd and qemu look for in a certificate directory (keys 0600).
    pub fn write_dir(&self, dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let files = [
            ("ca-cert.pem", &self.ca_pem, false),
            ("server-cert.pem", &self.server_pem, false),
            ("server-key.pem", &self.server_key_pem, true),
            ("client-cert.pem", &self.client_pem, false),
            ("client-key.pem", &self.client_key_pem, true),
        ];
        for (name, pem, secret) in files {
            let p = dir.join(name);
            std::fs::write(&p, pem).unwrap();
            let mode = if secret { 0o600 } else { 0o644 };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        dir.to_path_buf()
    }
}

/// A TLS client stream over `tcp`, after the server acknowledged STARTTLS.
pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Sends STARTTLS on a plaintext client, expects the ACK, and runs the TLS handshake.
pub fn starttls(mut c: Client<TcpStream>, cfg: Arc<rustls::ClientConfig>) -> Client<TlsStream> {
    assert_eq!(c.ask(&ClientOption::StartTls), Ok(()));
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, c.s);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    Client { s }
}

/// A configuration with TLS from `pki` in `mode`.
pub fn tls_config(pki: &Pki, mode: nbd_server::TlsMode) -> ServerConfig {
    ServerConfig {
        tls: Some(pki.server_config()),
        tls_mode: mode,
        ..ServerConfig::default()
    }
}

/// Waits (at most `limit`) until `f` holds.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
