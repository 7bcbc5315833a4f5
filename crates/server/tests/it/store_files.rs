//! Hostile files in and around the store: a FIFO named as a vDisk or as a parent, parent
//! locators naming paths outside the store, and symlinks out of it. Every open answers at
//! once with an error (no thread waits on a FIFO), refusals read the same whether or not
//! the outside path exists, and healthy exports keep opening.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use block_cache::BlockCache;
use common::{Raw, Server};
use disk::vhdx::CreateOptions;
use nbd_proto::option::OptionReply;
use nbd_proto::{ClientOption, InfoRequest};
use nbd_server::{ExportSource, OpenError};
use server::exports::{Registry, RegistryConfig};

const MIB: u64 = 1 << 20;
/// How long a hang guard waits before it declares an open blocked (an open that does not
/// block returns at once; this only turns a hang into a failure).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// An 8 MiB image with its first 2 MiB written.
fn make(path: &Path) {
    let f = std::fs::File::create_new(path).unwrap();
    let storage: Arc<dyn disk::Storage> = Arc::new(disk::FileStorage::new(f));
    let opts = CreateOptions {
        size: 8 * MIB,
        block_size: MIB as u32,
        ..CreateOptions::default()
    };
    disk::vhdx::create(&storage, &opts).unwrap();
    let writable = disk::open::OpenOptions {
        writable: true,
        format: None,
    };
    let chain = disk::open::open(path, writable).unwrap();
    chain.top().write_at(&vec![0x5a; 2 << 20], 0).unwrap();
    chain.close().unwrap();
}

/// A differencing `child` whose parent locator names `parent` (made for the purpose; the
/// caller may then remove or replace it).
fn child_of(parent: &Path, child: &Path) {
    make(parent);
    disk::version::new_version(parent, child).unwrap();
}

fn fifo(p: &Path) {
    let _ = std::fs::remove_file(p);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// Releases any thread blocked opening these FIFOs (a non-blocking writer open wakes a
/// blocked reader), so a failing test ends instead of hanging the server's shutdown.
struct FifoGuard(Vec<PathBuf>);

impl Drop for FifoGuard {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        for p in &self.0 {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(p);
        }
    }
}

/// A temp dir with `store/` (a healthy `golden.vhdx`), `outside/` and `wc/`.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for d in ["store", "outside"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        make(&dir.path().join("store/golden.vhdx"));
        Fixture { dir }
    }

    fn store(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path().join("store")).unwrap()
    }

    fn outside(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path().join("outside")).unwrap()
    }

    fn registry(&self) -> Arc<Registry> {
        let config = RegistryConfig {
            store_dir: self.store(),
            write_cache_dir: self.dir.path().join("wc"),
        };
        let reg = Registry::new(config, BlockCache::new(64 * MIB, 64 << 10).unwrap()).unwrap();
        reg.set_busy_wait(Duration::ZERO);
        Arc::new(reg)
    }
}

/// `reg.open(name)`'s error text, failing the test if the open blocks or succeeds.
fn open_err(reg: &Arc<Registry>, name: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let (r, n) = (reg.clone(), name.to_string());
    std::thread::spawn(move || tx.send(r.open(&n, &nbd_server::Peer::new(None, true)).map(|_| ())));
    match rx.recv_timeout(HANG_GUARD) {
        Ok(Err(OpenError::Other(m) | OpenError::NotFound(m))) => m,
        Ok(Err(e)) => panic!("{name}: unexpected error {e}"),
        Ok(Ok(())) => panic!("{name}: opened"),
        Err(_) => panic!("{name}: the open blocked"),
    }
}

/// GO `export` on a fresh connection; the final reply.
fn go(server: &Server, export: &str) -> OptionReply {
    let mut c = Raw::connect(server.addr);
    c.flags();
    c.option(&ClientOption::Go(InfoRequest {
        name: export.to_string(),
        requests: vec![],
    }));
    c.option_replies().pop().unwrap()
}

/// A vDisk whose parent is a FIFO in the store, and a FIFO named as a vDisk: GO of each,
/// many times and in every mode, answers an error (none waits on the FIFO), and a
/// healthy export still opens afterwards.
#[test]
fn fifo_as_parent_or_as_vdisk_answers_go_with_an_error() {
    let fx = Fixture::new();
    let store = fx.store();
    child_of(&store.join("p.vhdx"), &store.join("evil.vhdx"));
    fifo(&store.join("p.vhdx"));
    let server = Server::start(fx.registry());
    let _guard = FifoGuard(vec![store.join("p.vhdx")]);
    for round in 0..8 {
        for name in ["evil", "p", "evil+pc-01", "evil+private", "p+private"] {
            let r = go(&server, name);
            assert!(
                matches!(r, OptionReply::Error { .. }),
                "round {round}, {name}: {r:?}"
            );
        }
    }
    assert_eq!(go(&server, "golden"), OptionReply::Ack);
    assert_eq!(go(&server, "golden@0"), OptionReply::Ack);
}

/// The refusal of a parent outside the store reads the same whether the path exists (here
/// a file that is not an image) or not, in every mode: a vDisk cannot probe the host.
#[test]
fn outside_parents_read_the_same_whether_or_not_they_exist() {
    let fx = Fixture::new();
    let (store, out) = (fx.store(), fx.outside());
    child_of(&out.join("there.vhdx"), &store.join("a.vhdx"));
    child_of(&out.join("gone.vhdx"), &store.join("b.vhdx"));
    std::fs::write(out.join("there.vhdx"), b"not an image").unwrap();
    std::fs::remove_file(out.join("gone.vhdx")).unwrap();
    let reg = fx.registry();
    for mode in ["", "+pc-01", "+private"] {
        let a = open_err(&reg, &format!("a{mode}"));
        let b = open_err(&reg, &format!("b{mode}"));
        assert!(a.contains("there.vhdx: outside"), "{mode}: {a}");
        let norm =
            |s: &str, top: &str, parent: &str| s.replace(top, "TOP").replace(parent, "PARENT");
        assert_eq!(
            norm(&a, "a.vhdx", "there.vhdx"),
            norm(&b, "b.vhdx", "gone.vhdx"),
            "mode {mode:?}"
        );
    }
}

/// A symlink in the store to a FIFO outside it, as a vDisk and as the parent a locator
/// names, is refused without being opened.
#[test]
fn symlink_out_of_the_store_is_refused_without_opening_it() {
    let fx = Fixture::new();
    let (store, out) = (fx.store(), fx.outside());
    fifo(&out.join("pipe"));
    std::os::unix::fs::symlink(out.join("pipe"), store.join("s.vhdx")).unwrap();
    child_of(&store.join("plink.avhdx.tmp"), &store.join("evil2.vhdx"));
    // The child's parent locator names `plink.avhdx.tmp`; it becomes a symlink out.
    std::fs::remove_file(store.join("plink.avhdx.tmp")).unwrap();
    std::os::unix::fs::symlink(out.join("pipe"), store.join("plink.avhdx.tmp")).unwrap();
    let reg = fx.registry();
    let _guard = FifoGuard(vec![out.join("pipe")]);
    // The symlinked vDisk is not one: the store skips it when it scans.
    for name in ["s", "s+pc-01", "s+private"] {
        let e = open_err(&reg, name);
        assert!(e.contains("no vdisk named"), "{name}: {e}");
    }
    for name in ["evil2", "evil2+pc-01", "evil2+private"] {
        let e = open_err(&reg, name);
        assert!(e.contains("plink.avhdx.tmp: outside"), "{name}: {e}");
    }
    let h = reg
        .open("golden", &nbd_server::Peer::new(None, true))
        .unwrap();
    assert_eq!(h.device.size(), 8 * MIB);
}
