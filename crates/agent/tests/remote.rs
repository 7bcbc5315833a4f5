//! The NBD client and failover against Ferry's own NBD server in this process (no external
//! tools): pipelined requests from many threads over one connection, structured replies
//! with holes, server errors, and failover with replay when a server goes away.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent::client::Connection;
use agent::remote::{Remote, RemoteConfig, Replay};
use disk::FastPath as _;
use disk::device::{Geometry, check_bounds};
use disk::{BlockDevice, ErrorKind};
use nbd_server::{
    ExportHandle, ExportInfo, ExportSource, Listener, NoMetrics, OpenError, Peer, ServerConfig,
};
use parking_lot::Mutex;

/// Size of the test disk.
const SIZE: u64 = 8 << 20;

/// A RAM disk shared by the servers of a test (as servers share a store). Bytes start as
/// `i % 251` in the first half and zeros (holes) in the second.
#[derive(Debug)]
struct MemDisk {
    data: Mutex<Vec<u8>>,
    flushes: AtomicU64,
}

impl MemDisk {
    fn new() -> Arc<MemDisk> {
        let data = (0..SIZE)
            .map(|i| if i < SIZE / 2 { (i % 251) as u8 } else { 0 })
            .collect();
        Arc::new(MemDisk {
            data: Mutex::new(data),
            flushes: AtomicU64::new(0),
        })
    }
}

impl BlockDevice for MemDisk {
    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        None
    }

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
        let d = self.data.lock();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> disk::Result<()> {
        check_bounds(SIZE, offset, buf.len() as u64)?;
        let mut d = self.data.lock();
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> disk::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn can_write(&self) -> bool {
        true
    }
}

struct Source(Arc<MemDisk>);

impl ExportSource for Source {
    fn list(&self, _peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        Ok(vec![ExportInfo {
            name: "golden".into(),
            description: "test".into(),
            size: SIZE,
        }])
    }
    fn open(&self, name: &str, _peer: &Peer) -> Result<ExportHandle, OpenError> {
        if name != "golden" {
            return Err(OpenError::NotFound(name.into()));
        }
        Ok(ExportHandle {
            device: Arc::clone(&self.0) as Arc<dyn BlockDevice>,
            writable: true,
            release: None,
            revoked: None,
        })
    }
}

/// A server on 127.0.0.1:0 on its own runtime; `stop` shuts it down gracefully.
struct Server {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(disk: &Arc<MemDisk>) -> Server {
        let source = Arc::new(Source(Arc::clone(disk)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
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
                tx.send(l.local_addr().unwrap()).unwrap();
                l.serve(source, Arc::new(NoMetrics), stopped).await;
            });
        });
        let addr = rx.recv().unwrap().to_string();
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect(addr: &str) -> Connection {
    Connection::connect(
        addr,
        "golden",
        Duration::from_secs(5),
        Duration::from_secs(10),
        None,
    )
    .unwrap()
}

fn remote(servers: Vec<String>, replay: Replay) -> Arc<Remote> {
    remote_with_log(servers, replay, 1 << 20)
}

fn remote_with_log(servers: Vec<String>, replay: Replay, replay_bytes_max: u64) -> Arc<Remote> {
    Remote::connect(RemoteConfig {
        servers,
        export: "golden".into(),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        failover_timeout: Duration::from_secs(10),
        replay,
        replay_bytes_max,
        tls: None,
        relogin: None,
        refresh: None,
    })
    .unwrap()
}

#[test]
fn handshake_reports_size_and_description() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let c = connect(&srv.addr);
    assert_eq!(c.info.size, SIZE);
    assert_eq!(c.info.description, "test");
}

#[test]
fn unknown_export_is_a_handshake_error() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let e = Connection::connect(
        &srv.addr,
        "nope",
        Duration::from_secs(5),
        Duration::from_secs(5),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
}

/// Eight threads share one connection; each writes and reads back its own 64 KiB stripes,
/// so replies must be matched to requests by cookie.
#[test]
fn pipelined_requests_from_threads_get_their_own_replies() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let c = Arc::new(connect(&srv.addr));
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                for round in 0..50u64 {
                    let offset = (round * 8 + u64::from(t)) * 65536 % SIZE;
                    let data = vec![t.wrapping_mul(31).wrapping_add(round as u8) | 1; 65536];
                    c.write(&data, offset).unwrap();
                    let mut back = vec![0u8; 65536];
                    c.read(&mut back, offset).unwrap();
                    assert_eq!(back, data, "thread {t} round {round}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// The server answers all-zero reads with a structured hole chunk; the client fills zeros.
#[test]
fn hole_reply_reads_as_zeros_and_data_as_data() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let c = connect(&srv.addr);
    let mut buf = vec![7u8; 8192];
    c.read(&mut buf, SIZE / 2).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    c.read(&mut buf, 1000).unwrap();
    // Byte 1000 of the disk is 1000 % 251 = 247.
    assert_eq!(buf[0], 247);
}

#[test]
fn read_past_the_end_is_a_server_error() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let r = remote(vec![srv.addr.clone()], Replay::None);
    let mut buf = vec![0u8; 4096];
    // The Remote checks bounds itself; the raw connection gets the server's EINVAL.
    assert_eq!(
        r.read_at(&mut buf, SIZE).unwrap_err().kind(),
        ErrorKind::OutOfBounds
    );
    let c = connect(&srv.addr);
    let e = c.read(&mut buf, SIZE).unwrap_err();
    assert!(!e.is_transient(), "{e}");
}

/// Server A holds writes that were never flushed when it goes away; B serves the same
/// disk. The replay log re-sends them, and reads go on without an error.
#[test]
fn failover_replays_unflushed_writes_and_keeps_reading() {
    let disk_a = MemDisk::new();
    // B serves a separate copy of the disk as it was before the writes: only the replay
    // can put them there.
    let disk_b = MemDisk::new();
    let a = Server::start(&disk_a);
    let b = Server::start(&disk_b);
    let r = remote(vec![a.addr.clone(), b.addr.clone()], Replay::UntilFlush);
    r.write_at(&[0xAA; 4096], 0).unwrap();
    r.flush().unwrap();
    // Flushed writes are durable on the shared store: B's copy gets them "from storage".
    disk_b.write_at(&[0xAA; 4096], 0).unwrap();
    r.write_at(&[0xBB; 4096], 8192).unwrap();
    a.stop();
    let mut buf = vec![0u8; 4096];
    r.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, vec![0xBB; 4096]);
    r.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![0xAA; 4096]);
    assert_eq!(r.server(), b.addr);
    let c = r.counters();
    assert_eq!(c.failovers.load(Ordering::Relaxed), 1);
    // Only the write after the flush was replayed.
    assert_eq!(c.replayed.load(Ordering::Relaxed), 1);
}

/// An idle device whose server goes away moves by itself (no request needed), to a server
/// its login never named but the farm offered later (a server that joined).
#[test]
fn an_idle_device_moves_at_once_to_a_server_the_farm_offered_since() {
    let disk = MemDisk::new();
    let a = Server::start(&disk);
    let b = Server::start(&disk);
    let refresh = Arc::new(agent::remote::ServerRefresh::default());
    let r = Remote::connect(RemoteConfig {
        servers: vec![a.addr.clone()],
        export: "golden".into(),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        failover_timeout: Duration::from_secs(10),
        replay: Replay::None,
        replay_bytes_max: 0,
        tls: None,
        relogin: None,
        refresh: Some(Arc::clone(&refresh)),
    })
    .unwrap();
    let a_addr = a.addr.clone();
    refresh.offer(vec![
        agent::server_list::Offered {
            address: b.addr.clone(),
            serving: true,
        },
        agent::server_list::Offered {
            address: a_addr.clone(),
            serving: true,
        },
    ]);
    a.stop();
    // A hang guard, not a measure: the idle watch looks every 100 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while r.server() != b.addr {
        assert!(
            std::time::Instant::now() < deadline,
            "still on {}",
            r.server()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(r.counters().failovers.load(Ordering::Relaxed), 1);
    assert_eq!(r.servers(), Some(vec![b.addr.clone(), a_addr]));
    let mut buf = vec![0u8; 4096];
    r.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        buf[..251],
        (0..251).map(|i| i as u8).collect::<Vec<_>>()[..]
    );
}

/// With every server gone, a request fails (EIO) after the failover timeout instead of
/// hanging.
#[test]
fn no_server_left_fails_the_request() {
    let disk = MemDisk::new();
    let a = Server::start(&disk);
    let r = Remote::connect(RemoteConfig {
        servers: vec![a.addr.clone()],
        export: "golden".into(),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(5),
        failover_timeout: Duration::from_millis(500),
        replay: Replay::None,
        replay_bytes_max: 0,
        tls: None,
        relogin: None,
        refresh: None,
    })
    .unwrap();
    a.stop();
    let mut buf = vec![0u8; 512];
    let e = r.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
}

/// `server` mode keeps every write since attach; once that is more than the log holds, a
/// server loss fails I/O instead of continuing on a server that lacks the writes.
#[test]
fn overflowed_replay_log_fails_io_on_failover() {
    let disk_a = MemDisk::new();
    let disk_b = MemDisk::new();
    let a = Server::start(&disk_a);
    let b = Server::start(&disk_b);
    // Two 4 KiB writes do not fit.
    let r = remote_with_log(vec![a.addr.clone(), b.addr.clone()], Replay::All, 6144);
    r.write_at(&[1; 4096], 0).unwrap();
    r.write_at(&[2; 4096], 4096).unwrap();
    a.stop();
    let mut buf = vec![0u8; 4096];
    assert_eq!(r.read_at(&mut buf, 0).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(r.counters().failovers.load(Ordering::Relaxed), 0);
}

/// In `server` mode a flush does not drop the log (the server cache goes with the
/// connection): after a loss, B receives every write since attach.
#[test]
fn server_mode_replays_flushed_writes_too() {
    let disk_a = MemDisk::new();
    let disk_b = MemDisk::new();
    let a = Server::start(&disk_a);
    let b = Server::start(&disk_b);
    let r = remote(vec![a.addr.clone(), b.addr.clone()], Replay::All);
    r.write_at(&[3; 4096], 0).unwrap();
    r.flush().unwrap();
    r.write_at(&[4; 4096], 4096).unwrap();
    a.stop();
    let mut buf = vec![0u8; 8192];
    r.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..4096], &[3; 4096][..]);
    assert_eq!(&buf[4096..], &[4; 4096][..]);
    assert_eq!(r.counters().replayed.load(Ordering::Relaxed), 2);
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Submitted calls (no thread waits on the reply) read the disk and write it, and a
/// write acknowledged that way is in the replay log: after A goes, the submitted read
/// gives up (`None`), the blocking read fails over to B and the replay puts the write
/// there.
#[test]
fn submitted_writes_are_logged_and_replayed_after_failover() {
    let disk_a = MemDisk::new();
    let disk_b = MemDisk::new();
    let a = Server::start(&disk_a);
    let b = Server::start(&disk_b);
    let r = remote(vec![a.addr.clone(), b.addr.clone()], Replay::UntilFlush);
    let data = block_on(r.submit_read(1000, 4096).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(data[0], 247);
    assert_eq!(data.len(), 4096);
    // Past the end: not submitted, the blocking call reports the error.
    assert!(r.submit_read(SIZE, 4096).is_none());
    block_on(r.submit_write(&[0xCC; 4096], 65536).unwrap())
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 4096];
    disk_a.read_at(&mut buf, 65536).unwrap();
    assert_eq!(buf, vec![0xCC; 4096]);
    a.stop();
    let lost = r.submit_read(65536, 4096).map(block_on);
    assert!(matches!(lost, None | Some(None)), "{lost:?}");
    r.read_at(&mut buf, 65536).unwrap();
    assert_eq!(buf, vec![0xCC; 4096]);
    disk_b.read_at(&mut buf, 65536).unwrap();
    assert_eq!(buf, vec![0xCC; 4096], "the replay wrote B");
    assert_eq!(r.server(), b.addr);
    assert_eq!(r.counters().replayed.load(Ordering::Relaxed), 1);
}

/// A submitted write that takes the log over its budget flushes it (on the blocking pool):
/// the server saw the flush and nothing is left to replay.
#[test]
fn submitted_write_over_the_log_budget_flushes() {
    let disk_a = MemDisk::new();
    let disk_b = MemDisk::new();
    let a = Server::start(&disk_a);
    let b = Server::start(&disk_b);
    // Two 4 KiB writes do not fit.
    let r = remote_with_log(
        vec![a.addr.clone(), b.addr.clone()],
        Replay::UntilFlush,
        6144,
    );
    block_on(async {
        for (i, byte) in [5u8, 6].into_iter().enumerate() {
            let w = r.submit_write(&[byte; 4096], i as u64 * 4096).unwrap();
            w.await.unwrap().unwrap();
        }
    });
    assert_eq!(disk_a.flushes.load(Ordering::Relaxed), 1);
    a.stop();
    let mut buf = vec![0u8; 4096];
    r.read_at(&mut buf, 0).unwrap();
    assert_eq!(r.server(), b.addr);
    assert_eq!(r.counters().replayed.load(Ordering::Relaxed), 0);
}

/// A TCP relay in front of `upstream` that, once `stall` is set, stops reading what the
/// client sends (a server that stopped reading its socket).
fn stalling_relay(upstream: String, stall: Arc<std::sync::atomic::AtomicBool>) -> String {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = std::net::TcpStream::connect(upstream).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
        });
        let (mut client, mut server) = (client, server);
        let mut buf = vec![0u8; 4096];
        loop {
            if stall.load(Ordering::Acquire) {
                // Keep both sockets open and read nothing more.
                std::thread::sleep(Duration::from_secs(120));
                return;
            }
            client
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            match client.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => server.write_all(&buf[..n]).unwrap(),
                Err(_) => {}
            }
        }
    });
    addr
}

/// A server that stops reading its socket makes a large write block in the send; the send
/// has the request timeout too, so the call fails as a lost connection (then the device
/// fails over) instead of hanging, on both the blocking and the submitted path.
#[test]
fn a_send_to_a_server_that_stopped_reading_times_out() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    for submitted in [false, true] {
        let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relay = stalling_relay(srv.addr.clone(), Arc::clone(&stall));
        let c = Connection::connect(
            &relay,
            "golden",
            Duration::from_secs(5),
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        let mut buf = vec![0u8; 4096];
        c.read(&mut buf, 0).unwrap();
        stall.store(true, Ordering::Release);
        // Far more than the socket buffers on both sides of the relay hold.
        let data = vec![7u8; 64 << 20];
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = if submitted {
                block_on(c.submit(0, data.len() as u32, Some(&data))).map(drop)
            } else {
                c.write(&data, 0)
            };
            let mut buf = vec![0u8; 4096];
            let after = c.read(&mut buf, 0);
            let _ = tx.send((r, after));
        });
        let (r, after) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the write returned");
        let e = r.unwrap_err();
        assert!(e.is_transient(), "submitted {submitted}: {e}");
        let e = after.expect_err("the connection was shut down");
        assert!(e.is_transient(), "submitted {submitted}: {e}");
    }
}

/// When the runtime that runs a connection's reader goes away (the agent stopping), the
/// requests waiting on that reader fail at once as a lost connection instead of waiting
/// for their timeout.
#[test]
fn a_dropped_runtime_fails_the_requests_waiting_on_its_reader() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relay = stalling_relay(srv.addr.clone(), Arc::clone(&stall));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let c = rt
        .block_on(rt.spawn_blocking(move || {
            Connection::connect(
                &relay,
                "golden",
                Duration::from_secs(5),
                Duration::from_secs(600),
                None,
            )
        }))
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 4096];
    c.read(&mut buf, 0).unwrap();
    // The next request reaches the relay and stays there: no reply will come. (The relay
    // notices `stall` between reads of at most 20 ms.)
    stall.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(200));
    let c = Arc::new(c);
    let waiting = Arc::clone(&c);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let _ = tx.send(waiting.read(&mut buf, 4096));
    });
    // Give the request time to be sent and registered, then stop the runtime.
    std::thread::sleep(Duration::from_millis(300));
    rt.shutdown_background();
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the waiting request was failed before its 600 s timeout");
    let e = r.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(c.is_dead());
}

/// A submitted write whose caller drops it halfway through the send (part of the payload
/// on the wire, the rest not) shuts the connection down: the server would read the next
/// request from the middle of the payload. The request timeout is far away, so only the
/// send's own guard can notice.
#[test]
fn a_submit_dropped_mid_send_shuts_the_connection_down() {
    let disk = MemDisk::new();
    let srv = Server::start(&disk);
    let stall = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relay = stalling_relay(srv.addr.clone(), Arc::clone(&stall));
    let c = Connection::connect(
        &relay,
        "golden",
        Duration::from_secs(5),
        Duration::from_secs(600),
        None,
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    c.read(&mut buf, 0).unwrap();
    stall.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(100));
    // Far more than the socket buffers on both sides of the relay hold.
    let data = vec![7u8; 64 << 20];
    let cut = block_on(async {
        tokio::time::timeout(
            Duration::from_secs(1),
            c.submit(0, data.len() as u32, Some(&data)),
        )
        .await
    });
    assert!(cut.is_err(), "the send blocked until the caller gave up");
    assert!(c.is_dead(), "a send cut short shut the connection down");
    let e = c
        .read(&mut buf, 0)
        .expect_err("no request goes out on a stream out of step");
    assert!(e.is_transient(), "{e}");
}
