//! Helpers for the interop tests: external tools (qemu-img, qemu-io, vhdiinfo, vhdimount),
//! pattern writers, expected-content models, byte-exact comparisons and sha256 over devices.
//!
//! Tool rule (STYLE.md §6, "Interop"): a missing tool skips the test with a printed reason on
//! a developer's machine, and FAILS it under CI (`CI=true`), where `.ci/run` installs them all.
//! Every test therefore starts with `if !require("qemu-img") { return; }`.

#![warn(missing_docs)]

pub mod ports;
pub use ports::free_port;

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use disk::open::{self, Chain, OpenOptions};
use disk::vhdx::{CreateOptions, create};
use disk::{BlockDevice, Error, ErrorKind, FileStorage, Storage};
use sha2::{Digest, Sha256};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// One gibibyte.
pub const GIB: u64 = 1 << 30;
/// The chunk used for streaming reads and comparisons.
pub const CHUNK: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------------------------

fn in_path(tool: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        let p = dir.join(tool);
        std::fs::metadata(&p).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        })
    })
}

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Applies the STYLE.md tool rule to a missing prerequisite: panics when `ci`, otherwise
/// prints why the test is skipped. Returns false (the caller returns early).
fn missing(what: &str, ci: bool) -> bool {
    if ci {
        panic!("{what} is required under CI=true (.ci/run installs it)");
    }
    eprintln!("SKIPPED: {what} is not available on this machine");
    false
}

fn require_in(tool: &str, ci: bool) -> bool {
    if in_path(tool) {
        true
    } else {
        missing(&format!("the tool `{tool}`"), ci)
    }
}

/// True when `tool` is on PATH. When it is not: FAILS the test under `CI=true`, and otherwise
/// prints a reason and returns false so that the test can return early (a skip).
pub fn require(tool: &str) -> bool {
    require_in(tool, on_ci())
}

/// [`require`] for several tools.
pub fn require_all(tools: &[&str]) -> bool {
    tools.iter().all(|t| require(t))
}

/// vhdimount needs FUSE besides the tool itself: `/dev/fuse`, and `fusermount` (fuse 2) or
/// `fusermount3` (fuse3) to unmount.
pub fn require_vhdimount() -> bool {
    if !require("vhdimount") {
        return false;
    }
    if !in_path("fusermount") && !in_path("fusermount3") {
        return missing("the tool `fusermount` or `fusermount3`", on_ci());
    }
    if Path::new("/dev/fuse").exists() {
        true
    } else {
        missing("FUSE (/dev/fuse)", on_ci())
    }
}

/// Runs a command, panicking only when it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command that must succeed; returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qemu-img ARGS`, which must succeed; returns stdout.
pub fn qemu_img<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    run_ok(Command::new("qemu-img").args(args))
}

/// `qemu-img ARGS` whatever the outcome.
pub fn qemu_img_output<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    run(Command::new("qemu-img").args(args))
}

/// Runs `qemu-io -f FMT -c CMD... FILE`. Every command must succeed: qemu-io's exit status is
/// checked and so is its output (older versions print "failed"/"error" and exit 0).
pub fn qemu_io(fmt: &str, file: &Path, cmds: &[String]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", fmt]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    cmd.arg(file);
    let out = run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad = ["failed", "error", "Error"]
        .iter()
        .any(|w| stdout.contains(w) || stderr.contains(w));
    assert!(
        out.status.success() && !bad,
        "{cmd:?}:\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

/// `qemu-img info --output=json` of a file as a JSON value (`extra` goes before the file name,
/// for instance `["-f", "vpc"]`).
pub fn qemu_info(extra: &[&str], file: &Path) -> serde_json::Value {
    let mut args: Vec<&std::ffi::OsStr> = vec!["info".as_ref(), "--output=json".as_ref()];
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    args.push(file.as_os_str());
    let text = qemu_img(&args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("qemu-img info json: {e}: {text}"))
}

/// Asserts `qemu-img check -f vhdx FILE` exits 0 and reports no errors.
pub fn assert_qemu_check_clean(file: &Path) {
    let out = qemu_img_output(&[
        "check".as_ref(),
        "-f".as_ref(),
        "vhdx".as_ref(),
        file.as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("No errors were found"),
        "qemu-img check {}: {}\n{stdout}\n{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts `qemu-img compare -f vhdx -F raw OURS EXPECTED` reports identical content.
pub fn assert_qemu_compare(ours: &Path, expected_raw: &Path) {
    let out = qemu_img_output(&[
        "compare".as_ref(),
        "-f".as_ref(),
        "vhdx".as_ref(),
        "-F".as_ref(),
        "raw".as_ref(),
        ours.as_os_str(),
        expected_raw.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "qemu-img compare {} {}: {}\n{}{}",
        ours.display(),
        expected_raw.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// Patterns and expected content
// ---------------------------------------------------------------------------------------------

/// A deterministic, position-dependent pattern: no two sectors of a write look alike, so a
/// misplaced sector is always noticed (unlike a fill byte).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The expected content of a disk, kept as a sparse raw file (disks here reach 6 GiB).
#[derive(Debug)]
pub struct RawModel {
    path: PathBuf,
    file: File,
    size: u64,
}

impl RawModel {
    /// A new all-zero model of `size` bytes at `path`.
    pub fn new(path: &Path, size: u64) -> RawModel {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        file.set_len(size).unwrap();
        RawModel {
            path: path.to_path_buf(),
            file,
            size,
        }
    }

    /// The model's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The disk size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Records a write.
    pub fn write(&self, offset: u64, data: &[u8]) {
        assert!(
            offset + data.len() as u64 <= self.size,
            "model write past the end"
        );
        self.file.write_all_at(data, offset).unwrap();
    }

    /// Records that a range now reads as zeros.
    pub fn zero(&self, offset: u64, len: u64) {
        let zeros = vec![0u8; CHUNK];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.write(offset + done, &zeros[..n]);
            done += n as u64;
        }
    }

    /// Reads `len` bytes of the model.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.file.read_exact_at(&mut v, offset).unwrap();
        v
    }
}

/// Writes `data` at `offset` to both the device and the model.
pub fn write_both(dev: &dyn BlockDevice, model: &RawModel, offset: u64, data: &[u8]) {
    dev.write_at(data, offset)
        .unwrap_or_else(|e| panic!("write {} bytes at {offset:#x}: {e}", data.len()));
    model.write(offset, data);
}

/// Compares a device with the bytes of `reader(offset, buf)` over the whole device in 1 MiB
/// chunks. Panics naming the first differing byte.
fn compare_with(dev: &dyn BlockDevice, what: &str, mut reader: impl FnMut(&mut [u8], u64)) {
    let size = dev.size();
    let mut a = vec![0u8; CHUNK];
    let mut b = vec![0u8; CHUNK];
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(CHUNK as u64) as usize;
        dev.read_at(&mut a[..n], pos)
            .unwrap_or_else(|e| panic!("ferry read at {pos:#x}: {e}"));
        reader(&mut b[..n], pos);
        if a[..n] != b[..n] {
            let i = a[..n]
                .iter()
                .zip(&b[..n])
                .position(|(x, y)| x != y)
                .expect("a difference");
            panic!(
                "ferry and {what} differ first at byte {:#x}: ferry {:#04x}, {what} {:#04x}",
                pos + i as u64,
                a[i],
                b[i]
            );
        }
        pos += n as u64;
    }
}

/// Asserts that the device reads exactly the bytes of the file at `path` (same length too).
pub fn assert_device_eq_file(dev: &dyn BlockDevice, path: &Path) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let len = f.metadata().unwrap().len();
    assert_eq!(
        dev.size(),
        len,
        "ferry's size versus the length of {}",
        path.display()
    );
    compare_with(dev, &path.display().to_string(), |buf, pos| {
        f.read_exact_at(buf, pos).unwrap()
    });
}

/// Asserts that the device reads exactly the model.
pub fn assert_device_eq_model(dev: &dyn BlockDevice, model: &RawModel) {
    assert_device_eq_file(dev, model.path());
}

/// Asserts that two devices read the same bytes.
pub fn assert_devices_eq(a: &dyn BlockDevice, b: &dyn BlockDevice, what: &str) {
    assert_eq!(a.size(), b.size(), "sizes of ferry and {what}");
    compare_with(a, what, |buf, pos| b.read_at(buf, pos).unwrap());
}

/// Asserts that the device reads exactly `expected` (an in-memory model of a small disk).
pub fn assert_device_eq_bytes(dev: &dyn BlockDevice, expected: &[u8], what: &str) {
    assert_eq!(
        dev.size(),
        expected.len() as u64,
        "size of ferry's device versus {what}"
    );
    compare_with(dev, what, |buf, pos| {
        buf.copy_from_slice(&expected[pos as usize..pos as usize + buf.len()]);
    });
}

/// Asserts that a file holds exactly `expected`; panics naming the first differing byte.
pub fn assert_file_eq_bytes(path: &Path, expected: &[u8], what: &str) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert_eq!(
        got.len(),
        expected.len(),
        "length of {} ({what})",
        path.display()
    );
    if let Some(i) = got.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "{} ({what}) differs first at byte {i:#x}: {:#04x}, expected {:#04x}",
            path.display(),
            got[i],
            expected[i]
        );
    }
}

/// Hex sha256 of a device's whole content, streamed with 1 MiB reads.
pub fn sha256_device(dev: &dyn BlockDevice) -> String {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0;
    while pos < dev.size() {
        let n = (dev.size() - pos).min(CHUNK as u64) as usize;
        dev.read_at(&mut buf[..n], pos)
            .unwrap_or_else(|e| panic!("read at {pos:#x}: {e}"));
        h.update(&buf[..n]);
        pos += n as u64;
    }
    hex(&h.finalize())
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path) -> String {
    let mut f = File::open(path).unwrap();
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).unwrap();
    hex(&h.finalize())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// True when every byte of `[offset, offset+len)` of the device is `byte`.
pub fn device_all(dev: &dyn BlockDevice, offset: u64, len: u64, byte: u8) -> bool {
    let want = vec![byte; CHUNK];
    let mut buf = vec![0u8; CHUNK];
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(CHUNK as u64) as usize;
        dev.read_at(&mut buf[..n], pos)
            .unwrap_or_else(|e| panic!("read at {pos:#x}: {e}"));
        if buf[..n] != want[..n] {
            return false;
        }
        pos += n as u64;
    }
    true
}

/// Reads `len` bytes of a device.
pub fn read_dev(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    dev.read_at(&mut v, offset)
        .unwrap_or_else(|e| panic!("read {len} at {offset:#x}: {e}"));
    v
}

// ---------------------------------------------------------------------------------------------
// Ferry images
// ---------------------------------------------------------------------------------------------

/// Creates a new VHDX file with Ferry.
pub fn create_vhdx(path: &Path, opts: &CreateOptions) {
    let f = File::create_new(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let s: Arc<dyn Storage> = Arc::new(FileStorage::new(f));
    create(&s, opts).unwrap_or_else(|e| panic!("ferry create {}: {e}", path.display()));
}

/// A dynamic VHDX of `size` bytes with `block_size` blocks and 512-byte logical sectors.
pub fn dynamic(size: u64, block_size: u32) -> CreateOptions {
    CreateOptions {
        size,
        block_size,
        ..CreateOptions::default()
    }
}

/// Opens an image (and its chain) read-only.
pub fn open_ro(path: &Path) -> Chain {
    open::open(path, OpenOptions::default())
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Opens an image (and its chain) with a writable top.
pub fn open_rw(path: &Path) -> Chain {
    open::open(
        path,
        OpenOptions {
            writable: true,
            format: None,
        },
    )
    .unwrap_or_else(|e| panic!("open {} writable: {e}", path.display()))
}

/// Runs one write session: open writable, `f`, close cleanly (clean log).
pub fn session(path: &Path, f: impl FnOnce(&dyn BlockDevice)) {
    let chain = open_rw(path);
    f(chain.top().as_ref());
    chain
        .close()
        .unwrap_or_else(|e| panic!("close {}: {e}", path.display()));
}

/// The current VHDX header of a file (opened alone, read-only).
pub fn vhdx_header(path: &Path) -> vhdx::header::Header {
    let layer = open::open_one(path, OpenOptions::default())
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    match &layer.image {
        open::Image::Vhdx(img) => img.header(),
        other => panic!("{} is not vhdx: {other:?}", path.display()),
    }
}

/// The full message of an error, sources included.
pub fn message(e: &Error) -> String {
    contract::ErrorChain(e).to_string()
}

/// Asserts an error's kind and that its full message contains every one of `needles`.
pub fn assert_error(e: &Error, kind: ErrorKind, needles: &[&str]) {
    let msg = message(e);
    assert_eq!(e.kind(), kind, "kind of error {msg:?}");
    for n in needles {
        assert!(
            msg.contains(n),
            "error message {msg:?} does not mention {n:?}"
        );
    }
}

/// Opens a chain read-only, expecting an error.
pub fn open_err(path: &Path) -> Error {
    match open::open(path, OpenOptions::default()) {
        Ok(c) => panic!(
            "{} opened ({} layers) but must be refused",
            path.display(),
            c.layers.len()
        ),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------------------------
// Files and vectors
// ---------------------------------------------------------------------------------------------

/// The shared sample images (see their README; [`testkit::vectors_dir`]).
pub fn vectors_dir() -> PathBuf {
    testkit::vectors_dir()
}

/// A vector's path.
pub fn vector(name: &str) -> PathBuf {
    vectors_dir().join(name)
}

/// Decompresses vector `NAME.bz2` into `dir/NAME` with `bzip2 -dc` (call `require("bzip2")`).
pub fn unpack_bz2(name: &str, dir: &Path) -> PathBuf {
    let out_path = dir.join(name);
    let out = File::create(&out_path).unwrap();
    let status = Command::new("bzip2")
        .arg("-dc")
        .arg(vector(&format!("{name}.bz2")))
        .stdout(out)
        .status()
        .unwrap_or_else(|e| panic!("run bzip2: {e}"));
    assert!(status.success(), "bzip2 -dc {name}.bz2 failed");
    out_path
}

/// Reads `len` bytes of a file at `offset`.
pub fn read_file_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = File::open(path).unwrap();
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, offset).unwrap();
    v
}

/// Overwrites bytes of a file in place.
pub fn patch_file(path: &Path, offset: u64, bytes: &[u8]) {
    let f = File::options().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

/// Truncates a file.
pub fn truncate_file(path: &Path, len: u64) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Writes a file of `len` seeded random bytes.
pub fn write_random_file(path: &Path, len: usize, seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    let mut f = File::create(path).unwrap();
    f.write_all(&v).unwrap();
}

/// A positional store in memory, for opening mutated images without files.
#[derive(Debug)]
pub struct MemStorage(std::sync::Mutex<Vec<u8>>);

impl MemStorage {
    /// A store holding `bytes`.
    pub fn new(bytes: Vec<u8>) -> MemStorage {
        MemStorage(std::sync::Mutex::new(bytes))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Storage for MemStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> disk::Result<()> {
        let v = self.lock();
        buf.fill(0);
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
        let n = (v.len() - start).min(buf.len());
        buf[..n].copy_from_slice(&v[start..start + n]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> disk::Result<()> {
        let mut v = self.lock();
        let end = offset as usize + buf.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> disk::Result<()> {
        Ok(())
    }

    fn len(&self) -> disk::Result<u64> {
        Ok(self.lock().len() as u64)
    }

    fn set_len(&self, len: u64) -> disk::Result<()> {
        self.lock().resize(len as usize, 0);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// libvhdi
// ---------------------------------------------------------------------------------------------

/// `vhdiinfo FILE`, which must succeed; returns its output.
pub fn vhdiinfo(file: &Path) -> String {
    run_ok(Command::new("vhdiinfo").arg(file))
}

/// A `vhdimount` of an image, unmounted (and the tool reaped) on drop.
///
/// vhdimount runs in the foreground (`-v`, output discarded) as our child, so the process we
/// started is the one we wait for: unmounting makes it exit.
#[derive(Debug)]
pub struct VhdiMount {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl VhdiMount {
    /// Mounts `image` and waits until `vhdi1` appears. libvhdi finds a parent by the file name
    /// part of the parent path stored in the child (VHDX `absolute_win32_path`, VHD
    /// ParentUnicodeName), looked up in the child's directory, recursively.
    pub fn new(image: &Path) -> VhdiMount {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        // Verbose output goes to a file: a pipe nobody reads could fill up and block the mount.
        let log = File::create(dir.path().join("vhdimount.log")).unwrap();
        let child = Command::new("vhdimount")
            .arg("-v")
            .arg(image)
            .arg(dir.path().join("mnt"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("run vhdimount: {e}"));
        let mut m = VhdiMount {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if m.dir.path().join("mnt/vhdi1").exists() {
                return m;
            }
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                panic!(
                    "vhdimount {} exited with {status}:\n{}",
                    image.display(),
                    m.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "vhdimount {}: vhdi1 did not appear",
                image.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The mounted disks, `vhdi1` first. vhdimount exposes every layer of a chain: `vhdi1` is
    /// the base and the highest number is the image that was named (the top).
    pub fn layers(&self) -> Vec<PathBuf> {
        let mut v: Vec<(u32, PathBuf)> = std::fs::read_dir(self.dir.path().join("mnt"))
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let n = e.file_name().to_str()?.strip_prefix("vhdi")?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// The mounted top image (the one named at mount).
    pub fn top(&self) -> PathBuf {
        self.layers()
            .pop()
            .expect("vhdimount exposes at least vhdi1")
    }

    /// The last lines vhdimount printed.
    pub fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("vhdimount.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for VhdiMount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let mut unmounted = false;
        for tool in ["fusermount", "fusermount3", "umount"] {
            let mut cmd = Command::new(tool);
            if tool != "umount" {
                cmd.arg("-u");
            }
            let ok = cmd
                .arg(self.dir.path().join("mnt"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                unmounted = true;
                break;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() < deadline && unmounted => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    // Our own child, by its id.
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_skips_off_ci() {
        assert!(!require_in("ferry-no-such-tool", false));
    }

    #[test]
    #[should_panic(expected = "required under CI=true")]
    fn missing_tool_fails_on_ci() {
        require_in("ferry-no-such-tool", true);
    }

    #[test]
    fn present_tool_passes_on_ci() {
        assert!(require_in("sh", true));
    }

    #[test]
    fn patterns_differ_by_seed_and_position() {
        let a = pattern(1024, 1);
        assert_ne!(a, pattern(1024, 2));
        assert_ne!(a[..512], a[512..]);
        assert_eq!(pattern(100, 1), a[..100]);
    }
}
