//! End-to-end tests of the `ferry` binary: every command's help, the create → write → version
//! → write → merge → convert round trip checked by Ferry itself, by qemu-img and by libvhdi,
//! `info --json`, `check` on a good and a corrupted image, and the errors people hit first.
//!
//! External tools (qemu-img, vhdiinfo, vhdimount) are optional on a developer's machine (a
//! missing one is skipped with a printed reason) and required under `CI=true`, where
//! `scripts/test.sh` installs them. FUSE may be missing even in CI (containers without
//! /dev/fuse): then the vhdimount comparison is skipped with the reason and vhdiinfo alone
//! checks the differencing file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The virtual size of the round-trip disk: 64 MiB.
const DISK_BYTES: u64 = 64 << 20;
const MIB: u64 = 1 << 20;

fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

/// Runs `ferry ARGS` with `input` on stdin.
fn run(args: &[&str], input: Option<&[u8]>) -> Output {
    let mut cmd = ferry();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().expect("spawn ferry");
    if let Some(bytes) = input {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin.write_all(bytes).expect("write ferry's stdin");
    }
    child.wait_with_output().expect("wait for ferry")
}

/// Runs `ferry ARGS` and fails the test, showing stderr, unless it exits 0.
fn ok(args: &[&str], input: Option<&[u8]>) -> Output {
    let out = run(args, input);
    assert!(
        out.status.success(),
        "ferry {args:?} failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// True when `tool` is on PATH. Under `CI=true` a missing tool fails the test; elsewhere the
/// caller skips that part and the reason is printed.
fn have(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is required when CI=true (scripts/test.sh installs it)"
        );
        eprintln!("skipping the {tool} checks: {tool} is not installed");
    }
    found
}

/// Deterministic bytes (xorshift64), so that a failure is reproducible.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A write of the round trip: where, and what.
struct Put {
    offset: u64,
    data: Vec<u8>,
}

impl Put {
    fn new(offset: u64, len: usize, seed: u64) -> Put {
        Put {
            offset,
            data: pattern(seed, len),
        }
    }

    fn apply(&self, model: &mut [u8]) {
        let at = self.offset as usize;
        model[at..at + self.data.len()].copy_from_slice(&self.data);
    }

    fn write(&self, image: &Path) {
        let offset = self.offset.to_string();
        ok(
            &["vdisk", "write", path_str(image), "--offset", &offset],
            Some(&self.data),
        );
    }
}

/// The writes into the base: a multi-block run ending mid-sector, and a small unaligned one.
fn base_writes() -> Vec<Put> {
    vec![
        Put::new(0, 3 * MIB as usize + 1234, 1),
        Put::new(10 * MIB + 100, 5000, 2),
    ]
}

/// The writes into the version: one overlapping the base's data at an odd offset (partial
/// sectors and partially present blocks), one in an empty block, one in the last block.
fn version_writes() -> Vec<Put> {
    vec![
        Put::new(512 * 1024 + 7, MIB as usize, 3),
        Put::new(40 * MIB, 4096, 4),
        Put::new(63 * MIB + 1536, 512, 5),
    ]
}

#[test]
fn help_of_every_command_exits_zero_with_an_example() {
    let commands: &[&[&str]] = &[
        &[],
        &["vdisk"],
        &["vdisk", "create"],
        &["vdisk", "info"],
        &["vdisk", "check"],
        &["vdisk", "version"],
        &["vdisk", "version", "new"],
        &["vdisk", "merge"],
        &["vdisk", "convert"],
        &["vdisk", "capture"],
        &["vdisk", "read"],
        &["vdisk", "write"],
        &["vdisk", "compact"],
        &["vdisk", "boot-files"],
        &["quickstart"],
        &["server"],
        &["target"],
        &["target", "status"],
        &["target", "mark-booted"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = ok(&args, None);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example"),
            "`ferry {}` help has no example:\n{text}",
            args.join(" ")
        );
    }
}

/// Issue 17: the help said quickstart creates a demo vDisk and prints its info, while it
/// runs a whole farm. Both the short help (`-h`, and the command list of `ferry --help`) and
/// the long one must say so.
#[test]
fn quickstart_help_says_it_runs_a_farm_with_the_console_and_a_target() {
    let short = String::from_utf8_lossy(&ok(&["quickstart", "-h"], None).stdout).to_string();
    for word in ["farm", "console", "target"] {
        assert!(
            short.contains(word),
            "`quickstart -h` lacks {word:?}:\n{short}"
        );
    }
    let long = String::from_utf8_lossy(&ok(&["quickstart", "--help"], None).stdout).to_string();
    for fact in [
        "ferry-data",
        "SQLite",
        "production",
        "ferry server --farm",
        "http://127.0.0.1:8080/",
        "device login",
        "target.sock",
        "Ctrl-C",
        "Examples:",
    ] {
        assert!(
            long.contains(fact),
            "`quickstart --help` lacks {fact:?}:\n{long}"
        );
    }
    assert!(!long.contains("print its info"), "{long}");
    let top = String::from_utf8_lossy(&ok(&["--help"], None).stdout).to_string();
    let listed = top
        .lines()
        .find(|l| l.trim_start().starts_with("quickstart"))
        .unwrap_or_default();
    assert!(listed.contains("farm"), "`ferry --help` lists: {listed}");
}

#[test]
fn round_trip_reads_identically_in_ferry_qemu_and_libvhdi() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.vhdx");
    let version = dir.path().join("base.1.avhdx");
    let mut model = vec![0u8; DISK_BYTES as usize];

    ok(
        &[
            "vdisk",
            "create",
            path_str(&base),
            "--size",
            "64M",
            "--block-size",
            "1M",
        ],
        None,
    );
    for put in base_writes() {
        put.write(&base);
        put.apply(&mut model);
    }
    ok(
        &[
            "vdisk",
            "version",
            "new",
            path_str(&base),
            path_str(&version),
        ],
        None,
    );
    for put in version_writes() {
        put.write(&version);
        put.apply(&mut model);
    }
    let expected_raw = dir.path().join("expected.raw");
    std::fs::write(&expected_raw, &model).expect("write expected.raw");

    let whole = ok(
        &[
            "vdisk",
            "read",
            path_str(&version),
            "--offset",
            "0",
            "--length",
            "64M",
        ],
        None,
    );
    assert!(
        whole.stdout == model,
        "ferry reads the chain differently from the model"
    );
    ok(&["vdisk", "check", path_str(&version)], None);

    let merged = dir.path().join("merged.vhdx");
    let stats = ok(
        &[
            "vdisk",
            "merge",
            path_str(&version),
            "-o",
            path_str(&merged),
            "--json",
        ],
        None,
    );
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("merge --json");
    assert_eq!(stats["virtual_size"], DISK_BYTES);
    ok(&["vdisk", "check", path_str(&merged)], None);

    let raw = dir.path().join("merged.raw");
    ok(
        &["vdisk", "convert", path_str(&merged), path_str(&raw)],
        None,
    );
    assert!(
        std::fs::read(&raw).expect("read merged.raw") == model,
        "converted raw differs"
    );

    let flat = dir.path().join("flat.vhdx");
    ok(
        &[
            "vdisk",
            "convert",
            path_str(&version),
            path_str(&flat),
            "--flatten",
        ],
        None,
    );

    qemu_checks(&[&base, &merged, &flat], &expected_raw);
    libvhdi_checks(&version, &base, &model);
}

/// `qemu-img check` is clean on every VHDX Ferry wrote, and the merged and flattened images
/// equal the expected raw bytes (qemu refuses differencing VHDX, so the chain is left to
/// libvhdi).
fn qemu_checks(images: &[&Path], expected_raw: &Path) {
    if !have("qemu-img") {
        return;
    }
    for image in images {
        let out = Command::new("qemu-img")
            .args(["check", "-f", "vhdx", path_str(image)])
            .output()
            .expect("run qemu-img check");
        assert!(
            out.status.success(),
            "qemu-img check {}: {out:?}",
            image.display()
        );
    }
    for image in &images[1..] {
        let out = Command::new("qemu-img")
            .args([
                "compare",
                "-f",
                "vhdx",
                "-F",
                "raw",
                path_str(image),
                path_str(expected_raw),
            ])
            .output()
            .expect("run qemu-img compare");
        assert!(
            out.status.success(),
            "qemu-img compare {}: {out:?}",
            image.display()
        );
    }
}

/// vhdiinfo opens the differencing file and names its parent (file name and identity);
/// vhdimount, where FUSE works, reads the chain back byte for byte.
fn libvhdi_checks(version: &Path, base: &Path, model: &[u8]) {
    if !have("vhdiinfo") {
        return;
    }
    let out = Command::new("vhdiinfo")
        .arg(version)
        .output()
        .expect("run vhdiinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "vhdiinfo failed: {out:?}");
    assert!(
        text.contains("Differential"),
        "vhdiinfo does not see a differencing disk:\n{text}"
    );
    assert!(
        text.contains("Parent filename") && text.contains("base.vhdx"),
        "no parent:\n{text}"
    );
    let info = ok(&["vdisk", "info", path_str(base), "--json"], None);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("info --json");
    let base_id = info["linkage_id"].as_str().expect("base has a linkage id");
    assert!(
        text.contains(base_id),
        "vhdiinfo's parent identifier is not {base_id}:\n{text}"
    );
    if have("vhdimount") {
        vhdimount_check(version, model);
    }
}

/// Unmounts a FUSE mount when dropped, so that a failed assertion leaves no mount behind.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        for tool in ["fusermount3", "fusermount", "umount"] {
            let done = Command::new(tool).arg("-u").arg(&self.0).output();
            if done.is_ok_and(|o| o.status.success()) {
                return;
            }
        }
    }
}

fn vhdimount_check(version: &Path, model: &[u8]) {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipping the vhdimount comparison: /dev/fuse does not exist (no FUSE here)");
        return;
    }
    let mnt = tempfile::tempdir().expect("mount point");
    let out = Command::new("vhdimount")
        .arg(version)
        .arg(mnt.path())
        .output()
        .expect("vhdimount");
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        eprintln!("skipping the vhdimount comparison: FUSE mount failed: {why}");
        return;
    }
    let _mount = Mount(mnt.path().to_path_buf());
    // vhdimount exposes every layer as vhdi1..vhdiN, base first: the named image is the last.
    let mut layers: Vec<PathBuf> = std::fs::read_dir(mnt.path())
        .expect("list the mount")
        .map(|e| e.expect("mount entry").path())
        .collect();
    layers.sort_by_key(|p| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        name.trim_start_matches("vhdi").parse::<u32>().unwrap_or(0)
    });
    assert_eq!(
        layers.len(),
        2,
        "vhdimount should expose base and version: {layers:?}"
    );
    let top = std::fs::read(&layers[1]).expect("read the chain through vhdimount");
    assert!(
        top == model,
        "libvhdi reads the chain differently from the model"
    );
}

#[test]
fn info_json_reports_size_and_whole_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("b.vhdx");
    let version = dir.path().join("b.1.avhdx");
    ok(&["vdisk", "create", path_str(&base), "--size", "1G"], None);
    ok(
        &[
            "vdisk",
            "version",
            "new",
            path_str(&base),
            path_str(&version),
        ],
        None,
    );

    let out = ok(&["vdisk", "info", path_str(&version), "--json"], None);

    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON only");
    assert_eq!(info["virtual_size"], 1u64 << 30);
    let chain = info["chain"].as_array().expect("chain is an array");
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[0]["parent_linkage"][0], chain[1]["linkage_id"]);
}

#[test]
fn check_passes_a_good_image_and_names_a_bat_entry_over_the_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("c.vhdx");
    ok(
        &[
            "vdisk",
            "create",
            path_str(&image),
            "--size",
            "64M",
            "--block-size",
            "1M",
        ],
        None,
    );
    ok(
        &["vdisk", "write", path_str(&image), "--offset", "0"],
        Some(&pattern(9, 8192)),
    );
    ok(&["vdisk", "check", path_str(&image)], None);

    point_first_block_at_offset_zero(&image);
    let out = run(&["vdisk", "check", path_str(&image)], None);

    assert_eq!(
        out.status.code(),
        Some(2),
        "check of a corrupt image: {out:?}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("bat entry 0") && text.contains("header"),
        "unclear report:\n{text}"
    );
}

/// Rewrites the BAT entry of block 0 (allocated, FULLY_PRESENT) so that its FileOffsetMB
/// (bits 20..63) is 0: the block now lies over the file headers.
fn point_first_block_at_offset_zero(image: &Path) {
    use std::os::unix::fs::FileExt;
    let layer = disk::open::open_one(image, disk::open::OpenOptions::default()).expect("open");
    let disk::open::Image::Vhdx(vhdx) = &layer.image else {
        panic!("not vhdx")
    };
    let bat_offset = vhdx.regions().bat.offset;
    drop(layer);
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(image)
        .expect("open rw");
    let mut entry = [0u8; 8];
    file.read_exact_at(&mut entry, bat_offset)
        .expect("read the entry");
    let value = u64::from_le_bytes(entry);
    assert_eq!(
        value & 7,
        6,
        "block 0 should be PAYLOAD_BLOCK_FULLY_PRESENT"
    );
    assert_ne!(value >> 20, 0, "block 0 should have a file offset");
    file.write_all_at(&(value & 0xF_FFFF).to_le_bytes(), bat_offset)
        .expect("write the entry");
}

#[test]
fn read_past_the_end_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("r.vhdx");
    ok(
        &[
            "vdisk",
            "create",
            path_str(&image),
            "--size",
            "16M",
            "--block-size",
            "1M",
        ],
        None,
    );

    let out = run(
        &[
            "vdisk",
            "read",
            path_str(&image),
            "--offset",
            "16M",
            "--length",
            "1",
        ],
        None,
    );

    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("past the end"),
        "unclear: {err}"
    );
}

#[test]
fn write_past_the_end_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("w.vhdx");
    ok(
        &[
            "vdisk",
            "create",
            path_str(&image),
            "--size",
            "16M",
            "--block-size",
            "1M",
        ],
        None,
    );
    let offset = (16 * MIB - 4).to_string();

    let out = run(
        &["vdisk", "write", path_str(&image), "--offset", &offset],
        Some(b"12345678"),
    );

    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("past the end"));
}

#[test]
fn bad_size_strings_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("s.vhdx");
    for size in ["10X", "1.5G", "", "-1", "G", "0", "99999999999T"] {
        // `--size=VALUE`, so that "-1" reaches the size parser instead of looking like a flag.
        let arg = format!("--size={size}");
        let out = run(&["vdisk", "create", path_str(&image), &arg], None);

        assert_eq!(out.status.code(), Some(1), "size {size:?} was accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid value"),
            "size {size:?}"
        );
        assert!(!image.exists(), "a file was created for size {size:?}");
    }
}

#[test]
fn missing_file_error_shows_the_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.vhdx");

    let out = run(&["vdisk", "info", path_str(&missing)], None);

    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("No such file"),
        "no cause: {err}"
    );
}

use interop::free_port;

/// The README's run command on a fresh directory: a farm, a server with the console, a
/// target attached by device login; `--check` stops once the console and the target
/// answer. A second run keeps the farm (same token, same demo files) and works again.
#[test]
fn quickstart_runs_a_farm_and_a_target_and_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = || {
        let out = ferry()
            .args(["quickstart", "--check", "--json", "--api-listen"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--nbd-listen")
            .arg(format!("127.0.0.1:{}", free_port()))
            .current_dir(dir.path())
            .output()
            .expect("run quickstart");
        assert!(out.status.success(), "quickstart: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v
    };
    let first = run();
    // Issue 19: with QEMU installed, the check also booted the demo machine from the
    // target's disk and saw version 1's sector (the run fails otherwise), and the output
    // names the command that does it.
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if qemu {
        let cmd = first["demo_machine"].as_str().expect("demo_machine named");
        assert!(
            cmd.starts_with("qemu-system-x86_64 -nographic") && cmd.contains("target.sock"),
            "{cmd}"
        );
    } else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true" && v != "1"),
            "CI=true and qemu-system-x86_64 is not installed"
        );
        eprintln!("qemu-system-x86_64 missing: the demo machine's boot was not checked");
        assert!(first["demo_machine"].is_null());
    }
    let data = dir.path().join("ferry-data");
    for f in [
        "farm.db",
        "secrets/farm.key",
        "secrets/ca-cert.pem",
        "admin.token",
        "stores/demo/demo.vhdx",
        "stores/demo/demo.1.avhdx",
    ] {
        assert!(data.join(f).exists(), "{f} missing");
    }
    assert!(
        first["console"]
            .as_str()
            .is_some_and(|c| c.starts_with("http://127.0.0.1:"))
    );
    // Issue 18: the farm's data and the logs are the owner's only. The first run made
    // them so; modes an older version left loose are tightened by the next run.
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
    };
    let private = [
        ("", 0o700),
        ("farm.db", 0o600),
        ("server.log", 0o600),
        ("target.log", 0o600),
    ];
    for (f, want) in private {
        assert_eq!(mode(&data.join(f)), want, "{f:?} after the first run");
    }
    for (f, _) in private {
        use std::os::unix::fs::PermissionsExt as _;
        let loose = std::fs::Permissions::from_mode(if f.is_empty() { 0o755 } else { 0o644 });
        std::fs::set_permissions(data.join(f), loose).expect("chmod");
    }
    let second = run();
    assert_eq!(
        first["admin_token"], second["admin_token"],
        "the farm was made again"
    );
    for (f, want) in private {
        assert_eq!(mode(&data.join(f)), want, "{f:?} after the second run");
    }
    let target_log = std::fs::read_to_string(data.join("target.log")).unwrap_or_default();
    assert!(!target_log.contains("ERROR"), "target log:\n{target_log}");
}
