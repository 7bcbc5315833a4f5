//! The two baselines of the boot benchmark, each a real boot of the test OS (Debian 12,
//! systemd) in QEMU (TCG) to the `FERRY-BOOT-OK` marker after multi-user.target:
//!
//! * `local_virtio_disk_boots_and_keeps_a_file_over_a_reboot`: the root on a local virtio
//!   disk (the ceiling), booted twice: first with QEMU's `-kernel`/`-initrd`, then from the
//!   network (`-boot n`: the NIC's iPXE ROM loads an iPXE script, the kernel and initramfs
//!   over HTTP from a file server on loopback). A file written by `/etc/ferry-test.sh` on the
//!   first boot is read on the second, which proves the harness's in-guest test hook;
//! * `nbdkit_root_boots_through_debians_nbd_client`: the same root served by `nbdkit` (file
//!   plugin, cow filter) on loopback and mounted by Debian's nbd-client initramfs support
//!   (`nbdroot=` on the kernel command line) over QEMU's user network.
//!
//! Times from QEMU's start to the marker are printed (`--nocapture` shows them); they are no
//! pass/fail criterion. The boots are serialized so that one does not slow the other.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use guest::{BOOT_MARKER, DIRECT_BOOT_ARGS, ImageBuilder, Qemu, guest_root};

/// Guard against a hung boot; a TCG boot takes about half a minute.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// One test at a time, so that the printed times are not those of two machines (or a machine
/// and an image build) on 2 cores.
static ONE_BOOT: Mutex<()> = Mutex::new(());

/// The script both boots of the local-disk test run: it leaves a file on the first boot and
/// finds it on the second.
const REBOOT_SCRIPT: &str = "\
if [ -f /var/lib/ferry-mark ]; then
    echo \"found $(cat /var/lib/ferry-mark)\"
else
    echo boot-one >/var/lib/ferry-mark && sync && echo written
fi
echo \"kernel $(uname -r) root $(findmnt -n -o SOURCE /)\"
";

#[test]
fn local_virtio_disk_boots_and_keeps_a_file_over_a_reboot() {
    if !guest::can_run_or_skip("local_virtio_disk") {
        return;
    }
    let _one = ONE_BOOT.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let image = ImageBuilder::new(guest_root())
        .version("local-1")
        .test_script(REBOOT_SCRIPT)
        .build(dir.path())
        .unwrap();
    let append = format!("root=/dev/vda1 {DIRECT_BOOT_ARGS}");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::copy(&image.kernel, www.join("vmlinuz")).unwrap();
    std::fs::copy(&image.initrd, www.join("initrd.img")).unwrap();
    let port = serve_dir(&www);
    let script = format!(
        "#!ipxe\necho ferry-test-ipxe-script\n\
         kernel http://10.0.2.2:{port}/vmlinuz initrd=initrd.img {append}\n\
         initrd http://10.0.2.2:{port}/initrd.img\nboot\n"
    );
    std::fs::write(www.join("boot.ipxe"), script).unwrap();

    let mut outputs = Vec::new();
    for boot in ["direct", "ipxe-http"] {
        let vm = Qemu::new(dir.path().join(format!("serial-{boot}.log"))).disk(&image.disk);
        let vm = match boot {
            "direct" => vm.direct_boot(&image.kernel, &image.initrd, &append),
            _ => vm
                .bootfile(&format!("http://10.0.2.2:{port}/boot.ipxe"))
                .network_boot(),
        };
        let mut vm = vm.spawn().unwrap();
        let took = vm
            .wait_for(&format!("{BOOT_MARKER} version=local-1"), BOOT_TIMEOUT)
            .unwrap_or_else(|e| panic!("boot {boot}: {e}"));
        println!(
            "baseline local virtio disk, {boot} kernel: {:.1} s from QEMU start to the marker",
            took.as_secs_f64()
        );
        outputs.push(
            vm.test_output()
                .expect("ferry-test.sh's output is on the console"),
        );
        if boot == "ipxe-http" {
            assert!(
                vm.log().contains("ferry-test-ipxe-script"),
                "iPXE ran the script"
            );
        }
        vm.kill();
    }

    assert_eq!((outputs[0].rc, outputs[1].rc), (0, 0), "{outputs:?}");
    assert!(outputs[0].text.contains("written"), "{outputs:?}");
    assert!(outputs[1].text.contains("found boot-one"), "{outputs:?}");
    assert!(outputs[1].text.contains("root /dev/vda1"), "{outputs:?}");
}

#[test]
fn nbdkit_root_boots_through_debians_nbd_client() {
    if !guest::can_run_or_skip("nbdkit_root") || !nbdkit_or_skip() {
        return;
    }
    let _one = ONE_BOOT.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let image = ImageBuilder::new(guest_root())
        .version("nbdkit-1")
        .test_script(
            "echo \"root $(findmnt -n -o SOURCE /)\"; touch /var/lib/cow-write && echo wrote",
        )
        .build(dir.path())
        .unwrap();
    let (_nbdkit, port) = start_nbdkit(&image.disk);

    let append =
        format!("ip=dhcp nbdroot=10.0.2.2:{port}/root root=/dev/nbd0p1 {DIRECT_BOOT_ARGS}");
    let mut vm = Qemu::new(dir.path().join("serial.log"))
        .direct_boot(&image.kernel, &image.initrd, &append)
        .spawn()
        .unwrap();
    let took = vm
        .wait_for(&format!("{BOOT_MARKER} version=nbdkit-1"), BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "baseline nbdkit (file plugin, cow filter): {:.1} s from QEMU start to the marker",
        took.as_secs_f64()
    );
    println!("kernel command line: {append}");

    let out = vm
        .test_output()
        .expect("ferry-test.sh's output is on the console");
    assert_eq!(out.rc, 0, "{out:?}");
    assert!(out.text.contains("root /dev/nbd0p1"), "{out:?}");
    assert!(out.text.contains("wrote"), "{out:?}");
}

/// The tool rule for nbdkit (docs/testing.md).
fn nbdkit_or_skip() -> bool {
    let found = Command::new("nbdkit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("nbdkit is missing under CI");
    }
    eprintln!("nbdkit_root: skipped, nbdkit is missing");
    false
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nbdkit --filter=cow file` serving `disk` on 127.0.0.1 (the guest's 10.0.2.2), and its port.
fn start_nbdkit(disk: &Path) -> (Killed, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("nbdkit")
        .args([
            "--exit-with-parent",
            "-f",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--filter=cow",
            "file",
        ])
        .arg(disk)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let nbdkit = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nbdkit does not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (nbdkit, port)
}

/// The most bytes of one request the file server reads.
const REQUEST_BYTES_MAX: u64 = 64 << 10;

/// Serves the files of `dir` (by name, no subdirectories) over HTTP/1.0 on 127.0.0.1 from a
/// thread, one connection at a time, for iPXE; the port.
fn serve_dir(dir: &Path) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = answer(conn, &dir);
        }
    });
    port
}

/// Answers one request: the named file with 200, or 404.
fn answer(mut conn: TcpStream, dir: &Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(std::io::Read::take(conn.try_clone()?, REQUEST_BYTES_MAX));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let name = line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .trim_start_matches('/');
    let plain = !name.is_empty() && !name.contains('/') && !name.starts_with('.');
    match plain.then(|| std::fs::read(dir.join(name)).ok()).flatten() {
        Some(body) => {
            let head = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            conn.write_all(head.as_bytes())?;
            conn.write_all(&body)
        }
        None => conn.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
    }
}
