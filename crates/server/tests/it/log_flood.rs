//! Finding M of issue 30: 20,000 bad NBD option requests from one client wrote 12.7 MB of log
//! in 0.9 s (one INFO line each, from the export registry). Here one client sends 20,000
//! `NBD_OPT_GO` for an export the registry does not have, over 20 connections, to an NBD
//! listener over the real [`Registry`]; everything the process logs (every target, debug
//! and up) is formatted as `ferry server` would and its bytes counted: a few lines per
//! client per interval, a summary of the rest, and the refusals counted for metrics.
//! One test: it installs the process-wide subscriber.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use block_cache::BlockCache;
use contract::refusal_log::{INTERVAL_DEFAULT, LINES_PER_CLIENT_DEFAULT, SUMMARY_CLIENTS_MAX};
use nbd_proto::option::OptionReply;
use nbd_proto::{ClientFlags, ClientOption, InfoRequest, ServerGreeting};
use nbd_server::{Listener, NoMetrics, ServerConfig};
use server::exports::{Registry, RegistryConfig};

/// Refused options sent, as in the finding.
const OPTIONS: usize = 20_000;
/// Connections they are spread over (each below `MAX_OPTIONS_PER_HANDSHAKE`).
const CONNECTIONS: usize = 20;
/// A generous length of one formatted log line.
const LINE_BYTES_MAX: u64 = 1024;

/// Counts the bytes written to it.
#[derive(Clone, Default)]
struct Bytes(Arc<AtomicU64>);

impl Write for Bytes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(buf.len() as u64, Ordering::SeqCst);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A listener over a registry of an empty store, on its own runtime.
fn serve(dir: &std::path::Path) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    std::fs::create_dir(dir.join("store")).unwrap();
    let config = RegistryConfig {
        store_dir: dir.join("store"),
        write_cache_dir: dir.join("wc"),
    };
    let registry = Registry::new(config, BlockCache::new(1 << 20, 64 << 10).unwrap()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let config = ServerConfig {
                nbd_listen: Some("127.0.0.1:0".parse().unwrap()),
                ..ServerConfig::default()
            };
            let l = Listener::bind(config).await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            l.serve(Arc::new(registry), Arc::new(NoMetrics), stopped)
                .await;
        });
    });
    (addr_rx.recv().unwrap(), stop)
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).unwrap();
    v
}

/// Sends `n` GOs for a missing export on one connection (pipelined); each is refused.
fn refused_gos(addr: SocketAddr, n: usize) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    ServerGreeting::parse(&read_n(&mut s, 18)).unwrap();
    let mut out = Vec::new();
    ClientFlags {
        fixed_newstyle: true,
        no_zeroes: true,
    }
    .encode(&mut out);
    for _ in 0..n {
        ClientOption::Go(InfoRequest {
            name: "missing".into(),
            requests: vec![],
        })
        .encode(&mut out);
    }
    s.write_all(&out).unwrap();
    for _ in 0..n {
        let mut head = read_n(&mut s, 20);
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        head.extend(read_n(&mut s, len));
        let (_, reply) = OptionReply::parse(&head).unwrap();
        // Not found, or refused before that to a caller without TLS: refused either way.
        assert!(matches!(reply, OptionReply::Error { .. }), "{reply:?}");
    }
}

#[test]
fn twenty_thousand_refused_options_from_one_client_write_a_bounded_log() {
    let bytes = Bytes::default();
    let writer = bytes.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .init();
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = serve(dir.path());
    let before = nbd_server::refusal_totals();
    let start = Instant::now();
    for _ in 0..CONNECTIONS {
        refused_gos(addr, OPTIONS / CONNECTIONS);
    }
    let elapsed = start.elapsed();
    let _ = stop.send(());
    let logged = bytes.0.load(Ordering::SeqCst);
    eprintln!("{OPTIONS} refused options in {elapsed:?}: {logged} bytes of log");
    // Per interval: the client's lines, the summaries; per connection a line or two.
    let intervals = elapsed
        .as_secs_f64()
        .div_euclid(INTERVAL_DEFAULT.as_secs_f64()) as u64
        + 2;
    let per_interval = u64::from(LINES_PER_CLIENT_DEFAULT) + SUMMARY_CLIENTS_MAX as u64 + 1;
    let lines = intervals * per_interval + 2 * CONNECTIONS as u64;
    assert!(
        logged <= lines * LINE_BYTES_MAX,
        "{logged} bytes of log for {OPTIONS} refusals (bound {})",
        lines * LINE_BYTES_MAX
    );
    // Every refusal is counted for metrics (other tests in this process may add some).
    let counted = nbd_server::refusal_totals().refused - before.refused;
    assert!(counted >= OPTIONS as u64, "{counted} refusals counted");
}
