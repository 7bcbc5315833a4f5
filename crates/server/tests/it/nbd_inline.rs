//! Requests the device completes in memory (a RAM write cache here, the target's device) are
//! served from the connection's read buffer in batches, their replies encoded and written by
//! the reader itself (`transmission::serve_buffered`). These tests send whole pipelines in
//! one write, so that path serves most of them, mixed with requests it must leave to the
//! slow path (uncached reads, flush, errors found by validation), and check every reply.

use crate::common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::{Chain, Raw, SIZE, Server, req};
use interop::{MIB, pattern};
use nbd_proto::reply::{CHUNK_HEADER_LEN, Chunk, ChunkPayload, SimpleReply};
use nbd_proto::{Command, NBD_EINVAL, NBD_ENOSPC, NBD_SIMPLE_REPLY_MAGIC};
use nbd_server::{ExportHandle, ExportInfo, ExportSource, OpenError, Peer, ServerConfig};
use write_cache::{Config, Mode, WriteCache};

/// RAM budget of the cache: 64 blocks of 4 KiB.
const RAM_BLOCKS: u64 = 64;
const BLOCK: u64 = 4096;

/// One export, "cache": a RAM write cache over the test chain's newest version.
struct CacheSource {
    cache: Arc<WriteCache>,
}

impl ExportSource for CacheSource {
    fn list(&self, _peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
        Ok(vec![ExportInfo {
            name: "cache".into(),
            description: "RAM write cache".into(),
            size: SIZE,
        }])
    }

    fn open(&self, _name: &str, _peer: &Peer) -> Result<ExportHandle, OpenError> {
        Ok(ExportHandle {
            device: self.cache.clone(),
            writable: true,
            release: None,
            revoked: None,
        })
    }
}

fn start(chain: &Chain) -> (Server, Arc<WriteCache>) {
    start_with(chain, ServerConfig::default())
}

fn start_with(chain: &Chain, config: ServerConfig) -> (Server, Arc<WriteCache>) {
    let golden = interop::open_ro(&chain.top).top();
    let cache_config = Config {
        mode: Mode::Ram,
        ram_bytes_max: RAM_BLOCKS * BLOCK,
        ..Config::default()
    };
    let cache = Arc::new(WriteCache::new(golden, cache_config, None).unwrap());
    let src = Arc::new(CacheSource {
        cache: Arc::clone(&cache),
    });
    (Server::start_with(src, config), cache)
}

/// Reads `n` simple replies in any order; `read_len(cookie)` is the data a successful reply
/// to that cookie carries. Returns cookie → (error, data).
fn simple_replies(
    c: &mut Raw,
    n: usize,
    read_len: impl Fn(u64) -> usize,
) -> HashMap<u64, (u32, Vec<u8>)> {
    let mut out = HashMap::new();
    for _ in 0..n {
        let mut h = [0u8; 16];
        c.s.read_exact(&mut h).unwrap();
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            NBD_SIMPLE_REPLY_MAGIC
        );
        let r = SimpleReply::parse(&h).unwrap();
        let mut data = vec![0u8; if r.error == 0 { read_len(r.cookie) } else { 0 }];
        c.s.read_exact(&mut data).unwrap();
        assert!(
            out.insert(r.cookie, (r.error, data)).is_none(),
            "cookie {} twice",
            r.cookie
        );
    }
    out
}

/// The golden image's bytes (the chain's newest version).
fn golden(chain: &Chain, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    disk::BlockDevice::read_at(
        interop::open_ro(&chain.top).top().as_ref(),
        &mut buf,
        offset,
    )
    .unwrap();
    buf
}

#[test]
fn a_pipeline_of_cached_writes_and_reads_matches_the_model() {
    let chain = Chain::new();
    let (srv, cache) = start(&chain);
    let mut c = Raw::go(srv.addr, "cache", false);
    // Round 1, in one write: the budget's 64 whole-block writes (inline), a flush (slow
    // path), a 65th block (ENOSPC, inline), a read past the end (EINVAL from validation), and
    // a partial write of a cached block (inline, in place).
    let mut wire = Vec::new();
    for i in 0..RAM_BLOCKS {
        req(Command::Write, i, MIB + i * BLOCK, BLOCK as u32).encode(&mut wire);
        wire.extend(pattern(BLOCK as usize, 100 + i));
    }
    req(Command::Flush, 500, 0, 0).encode(&mut wire);
    req(Command::Write, 501, 8 * MIB, BLOCK as u32).encode(&mut wire);
    wire.extend(pattern(BLOCK as usize, 501));
    req(Command::Read, 502, SIZE - 512, 4096).encode(&mut wire);
    req(Command::Write, 503, MIB + 512, 1024).encode(&mut wire);
    wire.extend([0xab; 1024]);
    c.send(&wire);
    let r = simple_replies(&mut c, RAM_BLOCKS as usize + 4, |_| 0);
    for i in 0..RAM_BLOCKS {
        assert_eq!(r[&i].0, 0, "write {i}");
    }
    assert_eq!(r[&500].0, 0, "flush");
    assert_eq!(r[&501].0, NBD_ENOSPC, "write over the RAM budget");
    assert_eq!(r[&502].0, NBD_EINVAL, "read past the end");
    assert_eq!(r[&503].0, 0, "partial write of a cached block");
    assert_eq!(cache.usage().enospc, 1);

    // Round 2, in one write: every cached block (inline reads) and golden ranges the cache
    // does not hold (the blocking pool reads them from the chain).
    let mut wire = Vec::new();
    for i in 0..RAM_BLOCKS {
        req(Command::Read, 1000 + i, MIB + i * BLOCK, BLOCK as u32).encode(&mut wire);
    }
    req(Command::Read, 2000, 0, 4096).encode(&mut wire);
    req(Command::Read, 2001, 8 * MIB, 4096).encode(&mut wire);
    req(Command::Read, 2002, MIB - 2048, 4096).encode(&mut wire);
    c.send(&wire);
    let r = simple_replies(&mut c, RAM_BLOCKS as usize + 3, |_| 4096);
    let mut first = pattern(BLOCK as usize, 100);
    first[512..1536].fill(0xab);
    for i in 0..RAM_BLOCKS {
        let want = if i == 0 {
            first.clone()
        } else {
            pattern(BLOCK as usize, 100 + i)
        };
        assert!(r[&(1000 + i)] == (0, want), "cached block {i}");
    }
    assert!(r[&2000] == (0, golden(&chain, 0, 4096)), "golden block 0");
    assert!(
        r[&2001] == (0, golden(&chain, 8 * MIB, 4096)),
        "the refused write left a trace"
    );
    // Half golden, half the first cached block.
    let mut want = golden(&chain, MIB - 2048, 2048);
    want.extend(&first[..2048]);
    assert!(
        r[&2002] == (0, want),
        "read across the golden and a cached block"
    );
    // Every request was counted once, the three errors as failures.
    let total = 2 * RAM_BLOCKS + 7;
    assert_eq!(srv.metrics.requests.load(Ordering::SeqCst), total);
    assert_eq!(srv.metrics.failed.load(Ordering::SeqCst), 2);
}

#[test]
fn a_structured_read_of_cached_zeros_is_a_hole_and_data_is_data() {
    let chain = Chain::new();
    let (srv, _cache) = start(&chain);
    let mut c = Raw::go(srv.addr, "cache", true);
    let mut wire = Vec::new();
    req(Command::Write, 1, 2 * MIB, BLOCK as u32).encode(&mut wire);
    wire.extend(vec![0u8; BLOCK as usize]);
    req(Command::Write, 2, 2 * MIB + BLOCK, BLOCK as u32).encode(&mut wire);
    wire.extend(pattern(BLOCK as usize, 2));
    c.send(&wire);
    // Replies to writes are simple even on a structured connection.
    let r = simple_replies(&mut c, 2, |_| 0);
    assert_eq!((r[&1].0, r[&2].0), (0, 0));
    let mut wire = Vec::new();
    req(Command::Read, 3, 2 * MIB, BLOCK as u32).encode(&mut wire);
    req(Command::Read, 4, 2 * MIB + BLOCK, BLOCK as u32).encode(&mut wire);
    c.send(&wire);
    let mut seen = HashMap::new();
    for _ in 0..2 {
        let mut h = vec![0u8; CHUNK_HEADER_LEN];
        c.s.read_exact(&mut h).unwrap();
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        c.s.read_exact(&mut body).unwrap();
        h.extend(body);
        let (ch, _) = Chunk::parse(&h).unwrap();
        assert!(ch.done);
        seen.insert(ch.cookie, ch.payload);
    }
    assert_eq!(
        seen[&3],
        ChunkPayload::OffsetHole {
            offset: 2 * MIB,
            len: BLOCK as u32
        }
    );
    match &seen[&4] {
        ChunkPayload::OffsetData { offset, data } => {
            assert_eq!(*offset, 2 * MIB + BLOCK);
            assert!(data == &pattern(BLOCK as usize, 2), "data of block 2");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_client_that_never_reads_stalls_its_batches_and_shutdown_still_completes() {
    let chain = Chain::new();
    // The client has drain_timeout to read its last replies once the server stops.
    let config = ServerConfig {
        drain_timeout: std::time::Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let (mut srv, _cache) = start_with(&chain, config);
    let mut c = Raw::go(srv.addr, "cache", false);
    c.request(&req(Command::Write, 1, 0, BLOCK as u32));
    c.send(&pattern(BLOCK as usize, 1));
    assert_eq!(simple_replies(&mut c, 1, |_| 0)[&1].0, 0);
    // 200,000 cached 4 KiB reads (800 MiB of replies), never read: the reader blocks writing
    // its batch once the socket is full and stops reading requests.
    let mut s = c.s.try_clone().unwrap();
    let flood = std::thread::spawn(move || {
        let mut v = Vec::new();
        for i in 0..200_000u64 {
            req(Command::Read, 10 + i, 0, BLOCK as u32).encode(&mut v);
        }
        let _ = s.write_all(&v);
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let served = srv.metrics.requests.load(Ordering::SeqCst);
    assert!(
        served < 100_000,
        "{served} requests served to a client that reads nothing"
    );
    let t = std::time::Instant::now();
    srv.stop();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    drop(c);
    flood.join().unwrap();
}
