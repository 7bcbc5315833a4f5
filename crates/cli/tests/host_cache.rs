//! End-to-end tests of the host read cache (issue 21, item 4): a real `ferry server` on
//! loopback and real `ferry target` agents sharing one cache directory, read with nbdcopy.
//!
//! - agents of random vDisks and versions share one small cache (evicting) and each reads
//!   its own bytes (seeded; `FERRY_TEST_SEED=N` replays a seed);
//! - an agent SIGKILLed mid-read leaves the cache consistent: the next agent reads right;
//! - N agents reading one version make the server read it ≈ once (its metrics, not time);
//! - the cache file is 0600, and a cache of another user is refused.
//!
//! Each test names its vDisks apart from the others': two tests' servers that raced for
//! one free port would otherwise serve each other's bytes under one name.
//!
//! Tool rule (STYLE.md §6): a missing tool skips with a printed reason on a developer's
//! machine and fails under `CI=true`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

mod common;

use common::{Proc, ferry, free_port, path_str, tool};
use interop::{MIB, create_vhdx, dynamic, require, run_ok, session};
use rand::rngs::StdRng as SmallRng;
use rand::{Rng, SeedableRng};

/// A store directory with vDisks whose bytes the test knows.
struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("store")).expect("create store");
        std::fs::create_dir(dir.path().join("hc")).expect("create cache dir");
        Store { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cache_dir(&self) -> PathBuf {
        self.scratch("hc")
    }

    /// Writes `NAME.vhdx` (version 0) or `NAME.N.avhdx` (a version with no parent, as a
    /// merged version is) of `size` bytes with random extents; returns its bytes.
    fn version(&self, name: &str, version: u32, size: u64, rng: &mut SmallRng) -> Vec<u8> {
        let file = match version {
            0 => format!("{name}.vhdx"),
            n => format!("{name}.{n}.avhdx"),
        };
        let path = self.path().join(file);
        create_vhdx(&path, &dynamic(size, MIB as u32));
        let mut bytes = vec![0u8; size as usize];
        session(&path, |d| {
            for _ in 0..rng.gen_range(2..6) {
                let len = rng.gen_range(1..=16) * 64 * 1024;
                let at = rng.gen_range(0..(size - len) / 4096) * 4096;
                let data: Vec<u8> = (0..len).map(|_| rng.r#gen()).collect();
                d.write_at(&data, at).unwrap();
                bytes[at as usize..(at + len) as usize].copy_from_slice(&data);
            }
        });
        bytes
    }
}

/// `ferry server --store` on a free port, with metrics; (process, address, metrics port).
fn server(store: &Store) -> (Proc, String, u16) {
    let (port, metrics) = (free_port(), free_port());
    let mut p = Proc::spawn(
        ferry()
            .args(["server", "--store", path_str(&store.path())])
            .arg(format!("--nbd-listen=127.0.0.1:{port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}")),
        store.scratch(&format!("server-{port}.log")),
    );
    p.wait_until("accepting", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
            && TcpStream::connect(("127.0.0.1", metrics)).is_ok()
    });
    (p, format!("127.0.0.1:{port}"), metrics)
}

/// `ferry_nbd_bytes_total{type="read"}`: bytes the server sent in read replies.
fn server_read_bytes(metrics: u16) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", metrics)).expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ferry_nbd_bytes_total{type=\"read\"} "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// A running agent on `vdisk` (NAME@N) reading through the host cache in `cache`.
struct Target {
    proc: Proc,
    socket: PathBuf,
}

impl Target {
    fn start(store: &Store, server: &str, vdisk: &str, tag: &str, cache: &Path) -> Target {
        let socket = store.scratch(&format!("{tag}.sock"));
        let mut cmd = Target::command(server, vdisk, &socket, cache, "4M");
        let mut proc = Proc::spawn(&mut cmd, store.scratch(&format!("target-{tag}.log")));
        let ctl = PathBuf::from(format!("{}.ctl", path_str(&socket)));
        proc.wait_until("exporting", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() && ctl.exists()
        });
        Target { proc, socket }
    }

    fn command(
        server: &str,
        vdisk: &str,
        socket: &Path,
        cache: &Path,
        size: &str,
    ) -> std::process::Command {
        let mut cmd = ferry();
        cmd.args([
            "target", "--server", server, "--vdisk", vdisk, "--cache", "ram",
        ])
        .args(["--ram", "16M", "--device", "pc"])
        .arg(format!("--host-cache={}", path_str(cache)))
        .args(["--host-cache-size", size])
        .arg(format!("--export=unix:{}", path_str(socket)));
        cmd
    }

    /// Copies the whole disk out with nbdcopy and returns its bytes.
    fn read_all(&self, out: &Path) -> Vec<u8> {
        run_ok(
            tool("nbdcopy")
                .arg(format!("nbd+unix:///?socket={}", path_str(&self.socket)))
                .arg(out),
        );
        std::fs::read(out).expect("read copy")
    }

    fn status(&self) -> serde_json::Value {
        let out = run_ok(
            ferry()
                .args(["target", "status", "--json"])
                .arg(format!("--export=unix:{}", path_str(&self.socket))),
        );
        serde_json::from_str(&out).expect("status is JSON")
    }
}

fn seed() -> u64 {
    std::env::var("FERRY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

#[test]
fn agents_of_random_vdisks_and_versions_sharing_a_cache_each_read_their_own_bytes() {
    if !require("nbdcopy") {
        return;
    }
    let seed = seed();
    eprintln!("FERRY_TEST_SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let store = Store::new();
    // 2–3 vDisks of 1–3 versions, 4–12 MiB each: far more than the 4 MiB cache holds.
    let mut disks = Vec::new();
    for d in 0..rng.gen_range(2..=3) {
        let name = format!("vd{d}");
        for v in 0..rng.gen_range(1..=3u32) {
            let size = rng.gen_range(4..=12) * MIB;
            disks.push((
                format!("{name}@{v}"),
                store.version(&name, v, size, &mut rng),
            ));
        }
    }
    let (_srv, addr, _) = server(&store);
    // Two rounds, so the second reads what the first left in the cache.
    for round in 0..2 {
        let agents: Vec<_> = disks
            .iter()
            .enumerate()
            .map(|(i, (vdisk, _))| {
                let t = Target::start(
                    &store,
                    &addr,
                    vdisk,
                    &format!("r{round}-{i}"),
                    &store.cache_dir(),
                );
                (t, i)
            })
            .collect();
        let reads: Vec<_> = agents
            .into_iter()
            .map(|(t, i)| {
                let out = store.scratch(&format!("r{round}-{i}.raw"));
                std::thread::spawn(move || (t.read_all(&out), t, i))
            })
            .collect();
        for r in reads {
            let (got, t, i) = r.join().expect("reader");
            let (vdisk, want) = &disks[i];
            assert!(
                got == *want,
                "seed {seed}: {vdisk} read other bytes (round {round})"
            );
            let st = t.status();
            assert!(st["host_cache"]["misses"].as_u64().unwrap() > 0, "{st}");
            t.proc.stop();
        }
    }
}

#[test]
fn an_agent_killed_mid_read_leaves_the_cache_consistent() {
    if !require("nbdcopy") {
        return;
    }
    let mut rng = SmallRng::seed_from_u64(seed());
    let store = Store::new();
    let want = store.version("killed", 0, 64 * MIB, &mut rng);
    let (_srv, addr, _) = server(&store);
    let a = Target::start(&store, &addr, "killed@0", "a", &store.cache_dir());
    let socket = a.socket.clone();
    let copy = std::thread::spawn(move || {
        tool("nbdcopy")
            .arg(format!("nbd+unix:///?socket={}", path_str(&socket)))
            .arg("null:")
            .output()
    });
    // Wait for reads through the cache to have begun, then kill the agent mid-read.
    let mut begun = false;
    for _ in 0..2000 {
        let st = a.status();
        if st["host_cache"]["server_bytes"].as_u64().unwrap_or(0) > 0 {
            begun = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(begun, "no read reached the host cache");
    a.proc.kill();
    let _ = copy.join();
    let b = Target::start(&store, &addr, "killed@0", "b", &store.cache_dir());
    let got = b.read_all(&store.scratch("b.raw"));
    if got != want {
        let bad: Vec<usize> = (0..got.len() / 4096)
            .filter(|p| got[p * 4096..(p + 1) * 4096] != want[p * 4096..(p + 1) * 4096])
            .take(20)
            .collect();
        panic!(
            "the agent after the kill read other bytes ({} of {}); pages {bad:?}; {}",
            got.len(),
            want.len(),
            b.proc.log_text()
        );
    }
    let st = b.status();
    assert_eq!(st["host_cache"]["torn"], 0, "{st}");
    b.proc.stop();
}

#[test]
fn n_agents_reading_one_version_make_the_server_read_it_once() {
    if !require("nbdcopy") {
        return;
    }
    const AGENTS: usize = 4;
    let mut rng = SmallRng::seed_from_u64(seed());
    let store = Store::new();
    let size = 24 * MIB;
    let want = store.version("shared", 0, size, &mut rng);
    let (_srv, addr, metrics) = server(&store);
    // A cache that holds the whole version (24 MiB of 64 KiB blocks, with headers).
    let agents: Vec<Target> = (0..AGENTS)
        .map(|i| {
            let socket = store.scratch(&format!("n{i}.sock"));
            let mut cmd = Target::command(&addr, "shared@0", &socket, &store.cache_dir(), "32M");
            let mut proc = Proc::spawn(&mut cmd, store.scratch(&format!("target-n{i}.log")));
            proc.wait_until("exporting", || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            });
            Target { proc, socket }
        })
        .collect();
    let before = server_read_bytes(metrics);
    let reads: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let out = store.scratch(&format!("n{i}.raw"));
            std::thread::spawn(move || (t.read_all(&out), t))
        })
        .collect();
    let mut host_hits = 0;
    for r in reads {
        let (got, t) = r.join().expect("reader");
        assert!(got == want, "an agent read other bytes");
        host_hits = host_hits.max(t.status()["host_cache"]["host_hits"].as_u64().unwrap());
        t.proc.stop();
    }
    let served = server_read_bytes(metrics) - before;
    // Once would be `size`; a few blocks may be fetched twice when two claims cross.
    assert!(
        served <= size + size / 4,
        "{AGENTS} agents made the server send {served} bytes for a {size}-byte version"
    );
    assert!(
        served >= size,
        "the server sent {served} bytes, less than the version"
    );
    assert!(host_hits > 0);
}

#[test]
fn the_cache_file_is_0600_and_another_user_s_cache_is_refused() {
    if !require("nbdcopy") {
        return;
    }
    let mut rng = SmallRng::seed_from_u64(seed());
    let store = Store::new();
    store.version("perm", 0, 4 * MIB, &mut rng);
    let (_srv, addr, _) = server(&store);
    let t = Target::start(&store, &addr, "perm@0", "p", &store.cache_dir());
    let uid = rustix::process::geteuid().as_raw();
    let file = store.cache_dir().join(format!("ferry-host-cache-{uid}"));
    let mode = std::fs::metadata(&file)
        .expect("cache file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    t.proc.stop();
    if uid != 0 {
        eprintln!("not root: cannot give the cache file to another user here");
        return;
    }
    // 65534: nobody.
    std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
    let socket = store.scratch("q.sock");
    let out = Target::command(&addr, "perm@0", &socket, &store.cache_dir(), "4M")
        .output()
        .expect("run ferry target");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an agent used another user's cache: {err}"
    );
    assert!(err.contains("belongs to uid 65534"), "{err}");
}
