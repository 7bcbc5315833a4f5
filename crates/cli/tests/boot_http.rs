//! The network boot service of the real `ferry server --farm --boot-listen` binary, as a
//! QEMU guest on `-netdev user` would use it (the host's 127.0.0.1 is 10.0.2.2 there):
//! objects made through the CLI over the API's HTTPS (a diskless device, a vDisk boot
//! command line), the device's iPXE script fetched with curl naming the API at
//! `https://10.0.2.2:PORT` (which the server certificate names), the kernel served equal to
//! the one in the version's ext4 filesystem, and nothing of the API on the boot port.
//!
//! Tool rule (STYLE.md §6): a missing mkfs.ext4, curl or openssl skips with a printed reason
//! on a developer's machine and fails under `CI=true`.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::{Proc, ferry, free_port, path_str};
use interop::run_ok;
use serde_json::Value;

const MAC: &str = "52:54:00:12:34:56";
const KERNEL: &str = "boot/vmlinuz-6.1.0-13-amd64";

fn have(tools: &[(&str, &str)]) -> bool {
    for (t, arg) in tools {
        let ok = Command::new(t)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{t} is required under CI"
            );
            eprintln!("{t} not found: skipping");
            return false;
        }
    }
    true
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A whole-disk ext4 root with a kernel and initramfs, captured by `ferry vdisk capture`.
fn root_image(work: &Path, vhdx: &Path) -> Vec<u8> {
    let tree = work.join("tree");
    for d in ["etc", "sbin", "usr", "boot"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    let kernel: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(tree.join(KERNEL), &kernel).unwrap();
    std::fs::write(tree.join("boot/initrd.img-6.1.0-13-amd64"), b"initramfs").unwrap();
    let raw = work.join("root.raw");
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&tree)
            .arg(&raw)
            .arg("16M"),
    );
    run_ok(ferry().args(["vdisk", "capture", path_str(&raw), path_str(vhdx)]));
    kernel
}

fn curl(url: &str) -> (String, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let mut body = out.stdout;
    let at = body.iter().rposition(|&b| b == b'\n').unwrap();
    let code = String::from_utf8_lossy(&body[at + 1..]).to_string();
    body.truncate(at);
    (code, body)
}

#[test]
fn a_diskless_device_s_boot_script_and_kernel_come_from_the_boot_port() {
    if !have(&[
        ("mkfs.ext4", "-V"),
        ("curl", "--version"),
        ("openssl", "version"),
    ]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = run_ok(ferry().args(["farm", "init", "--data", path_str(&data), "--json"]));
    let init: Value = serde_json::from_str(&out).unwrap();
    let token = init["admin_token"].as_str().unwrap().to_string();
    let store = data.join("stores").join("main");
    std::fs::create_dir_all(&store).unwrap();
    let kernel = root_image(dir.path(), &store.join("golden.vhdx"));
    let (api, nbd, boot, metrics) = (free_port(), free_port(), free_port(), free_port());
    let mut cmd = ferry();
    cmd.args(["server", "--farm", path_str(&data)])
        .args(["--store", path_str(&store)])
        .args(["--advertise", "10.0.2.2"])
        .arg(format!("--nbd-listen=127.0.0.1:{nbd}"))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
        .arg(format!("--api-listen=127.0.0.1:{api}"))
        .arg(format!("--boot-listen=127.0.0.1:{boot}"))
        .args(["--server-name", "s1"]);
    let mut proc = Proc::spawn(&mut cmd, dir.path().join("server.log"));
    proc.wait_until("serving boot", || {
        TcpStream::connect(("127.0.0.1", boot)).is_ok()
            && TcpStream::connect(("127.0.0.1", api)).is_ok()
    });
    // The API is HTTPS on loopback (the agent logs in over it), for the advertised host.
    let ca = data.join("secrets").join("ca-cert.pem");
    let api_url = format!("https://127.0.0.1:{api}");
    let cli = |args: &[&str]| -> Value {
        let out = ferry()
            .args(args)
            .args(["--api", &api_url, "--farm-ca", path_str(&ca)])
            .args(["--token", &token, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "ferry {args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    cli(&["store", "add", "main", "--path", "main"]);
    cli(&["farm", "vdisk", "add", "golden", "--store", "1"]);
    cli(&["collection", "add", "lab", "--site", "1"]);
    let d = cli(&[
        "device",
        "add",
        MAC,
        "--name",
        "vm1",
        "--collection",
        "1",
        "--vdisk",
        "golden",
        "--diskless",
    ]);
    assert_eq!(d["diskless"], true, "{d}");
    let v = cli(&[
        "farm",
        "vdisk",
        "set",
        "golden",
        "--boot-cmdline",
        "console=ttyS0,115200",
    ]);
    assert_eq!(v["boot_cmdline"], "console=ttyS0,115200", "{v}");
    let cert = data.join("secrets/servers/s1/server-cert.pem");
    let san = run_ok(
        Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(&cert),
    );
    assert!(san.contains("IP Address:10.0.2.2"), "{san}");

    let base = format!("http://127.0.0.1:{boot}");
    let (code, chain) = curl(&format!("{base}/boot/ipxe"));
    assert_eq!(code, "200");
    assert!(String::from_utf8_lossy(&chain).contains("chain --autofree /boot/ipxe/"));
    let (code, script) = curl(&format!("{base}/boot/ipxe/52-54-00-12-34-56"));
    let script = String::from_utf8(script).unwrap();
    assert_eq!(code, "200", "{script}");
    let want = format!(
        "kernel /boot/files/52-54-00-12-34-56/1/0/kernel initrd=initrd boot=ferry \
         ip=${{netX/ip}}::${{netX/gateway}}:${{netX/netmask}}:::off:${{netX/dns}} \
         BOOTIF=01-${{netX/mac:hexhyp}} ferry.api=https://10.0.2.2:{api} ferry.mac={MAC} ferry.vdisk=golden \
         ferry.version=0 ferry.ticket=ft_"
    );
    // The device is diskless: its boot carries a one-time login ticket (64 hex digits).
    let at = script.find(&want).unwrap_or_else(|| panic!("{script}")) + want.len();
    let (ticket, rest) = script[at..].split_at(64);
    assert!(ticket.bytes().all(|b| b.is_ascii_hexdigit()), "{script}");
    assert!(
        rest.starts_with(" root=/dev/nbd0 panic=30 console=ttyS0,115200 || goto failed"),
        "{script}"
    );
    let files = format!("{base}/boot/files/52-54-00-12-34-56/1/0");
    let (code, got) = curl(&format!("{files}/kernel"));
    assert_eq!(code, "200");
    assert!(got == kernel, "the served kernel differs from /{KERNEL}");
    let (_, initrd) = curl(&format!("{files}/initrd"));
    assert_eq!(initrd, b"initramfs");
    let cached = std::fs::read_dir(data.join("boot-cache")).unwrap().count();
    assert_eq!(cached, 2);
    // An outsider on the boot port: nothing of the API, no other file, no boot file of a
    // MAC that does not boot that version (issue 30: any version was served to anyone).
    for path in [
        "/api/v1/farm",
        "/api/v1/openapi.json",
        "/console/",
        "/boot/files/52-54-00-12-34-56/1/0/../../../../secrets/farm.key",
        "/boot/files/52-54-00-12-34-56/1/0/%2e%2e%2fgolden.vhdx",
        "/boot/files/52-54-00-12-34-56/1/0/golden.vhdx",
        "/boot/files/52-54-00-12-34-56/2/0/kernel",
        "/boot/files/52-54-00-12-34-56/1/1/kernel",
        "/boot/files/52-54-00-00-00-99/1/0/kernel",
        "/boot/files/1/0/kernel",
        "/boot/files/1/0/initrd",
    ] {
        let out = Command::new("curl")
            .args([
                "-s",
                "--path-as-is",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("{base}{path}"))
            .output()
            .unwrap();
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(code == "404" || code == "400", "{path}: {code}");
    }
    let (code, refusal) = curl(&format!("{base}/boot/ipxe/52-54-00-00-00-99"));
    assert_eq!(code, "200");
    let refusal = String::from_utf8(refusal).unwrap();
    assert!(
        refusal.contains("Ferry: this machine cannot boot: MAC 52:54:00:00:00:99 is not a device")
    );
    // What the boot port served is counted on /metrics.
    let (code, page) = curl(&format!("http://127.0.0.1:{metrics}/metrics"));
    assert_eq!(code, "200");
    let page = String::from_utf8(page).unwrap();
    let value = |name: &str| -> u64 {
        page.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{page}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("ferry_boot_scripts_total"), 1);
    assert_eq!(value("ferry_boot_refusals_total"), 1);
    assert_eq!(value("ferry_boot_files_total"), 2);
    assert_eq!(
        value("ferry_boot_file_bytes_total"),
        (kernel.len() + initrd.len()) as u64
    );
    assert_eq!(value("ferry_boot_fills_total"), 2);
    assert!(value("ferry_boot_not_found_total") >= 9);
    proc.stop();
}
