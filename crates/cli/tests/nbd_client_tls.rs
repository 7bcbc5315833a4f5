//! NBD over TLS with the Linux kernel's own client: Debian 12's `nbd-client` (GnuTLS) in a
//! QEMU machine attaches an export of `ferry server --tls-required` to `/dev/nbd0` with an
//! administrator's certificate from `ferry farm cert admin`, and reads every byte of it
//! back; the same client without TLS, over TLS without a certificate, and with a certificate
//! of another farm's CA, is refused. This host has no nbd module, hence the machine (the
//! test OS of `crates/guest`, booted from its own disk with its small init,
//! `guest::QUICK_INIT`: what is tested is the kernel's client, not systemd).
//!
//! QEMU's user network makes the machine's connections come from the host's loopback, which
//! `[access]`'s defaults trust for plain reads; the server is told `plain_reads = "none"` so
//! that the machine is the outsider it would be on a real network.
//!
//! nbd-client 3.24 takes the long TLS options only (`-certfile`, not `-F`).
//!
//! Needs root, qemu-system-x86_64 and the guest root (scripts/guest-root.sh); under CI=true
//! a missing one fails the test.

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{Proc, ferry, free_port, path_str};

/// A hang guard for the machine's boot and script (TCG, 2 shared cores), not a measure.
const BOOT_WAIT: Duration = Duration::from_secs(600);
/// The export's size: a few MiB of random bytes, read whole by the machine.
const EXPORT_BYTES: usize = 8 << 20;

/// `ferry ARGS`, which must succeed.
fn ok(args: &[&str]) {
    let out = ferry().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ferry {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The guest's script: brings up the NIC by hand (QEMU's user network: 10.0.2.15, the host
/// at 10.0.2.2), then tries `nbd-client` three ways and prints what each got.
fn script(port: u16) -> String {
    format!(
        r#"#!/bin/sh
nic=$(ls /sys/class/net | grep -v '^lo$' | head -n1)
ip link set "$nic" up && ip addr add 10.0.2.15/24 dev "$nic" || echo NIC-FAILED
modprobe nbd || echo MODPROBE-FAILED
try() {{
    name=$1; shift
    if timeout 120 nbd-client 10.0.2.2 {port} /dev/nbd0 -N data "$@" >/tmp/$name.log 2>&1; then
        echo "$name=attached"
        echo "$name-SHA=$(sha256sum </dev/nbd0 | cut -d' ' -f1)"
        nbd-client -d /dev/nbd0 >/dev/null 2>&1
    else
        echo "$name=refused"
        sed "s/^/$name-LOG: /" /tmp/$name.log
    fi
}}
T="-cacertfile /etc/ferry-tls/ca-cert.pem -tlshostname 10.0.2.2"
try ADMIN $T -certfile /etc/ferry-tls/client-cert.pem -keyfile /etc/ferry-tls/client-key.pem
try PLAIN
try ANON $T
try OTHER $T -certfile /etc/other-tls/client-cert.pem -keyfile /etc/other-tls/client-key.pem
"#
    )
}

/// `sha256sum FILE`'s digest (what the machine's `sha256sum` prints for the device).
fn sha256_hex(file: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_kernel_s_nbd_client_reads_over_tls_with_a_farm_certificate_only() {
    if !guest::can_run_or_skip(
        "the_kernel_s_nbd_client_reads_over_tls_with_a_farm_certificate_only",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The farm's CA: the server's certificate (for the address the machine dials) and an
    // administrator's; another farm's CA for the outsider.
    let data = dir.join("farm");
    ok(&["farm", "init", "--data", path_str(&data)]);
    let tls = dir.join("server-tls");
    ok(&[
        "farm",
        "cert",
        "server",
        "s1",
        "--data",
        path_str(&data),
        "--host",
        "10.0.2.2",
        "--host",
        "127.0.0.1",
        "--out",
        path_str(&tls),
    ]);
    let admin = dir.join("admin-tls");
    ok(&[
        "farm",
        "cert",
        "admin",
        "alice",
        "--data",
        path_str(&data),
        "--out",
        path_str(&admin),
    ]);
    let other_data = dir.join("other-farm");
    ok(&["farm", "init", "--data", path_str(&other_data)]);
    let other = dir.join("other-tls");
    ok(&[
        "farm",
        "cert",
        "admin",
        "mallory",
        "--data",
        path_str(&other_data),
        "--out",
        path_str(&other),
    ]);

    // The export: random bytes, captured into the store.
    let mut bytes = vec![0u8; EXPORT_BYTES];
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for b in &mut bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let raw = dir.join("data.raw");
    std::fs::write(&raw, &bytes).unwrap();
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    ok(&[
        "vdisk",
        "capture",
        path_str(&raw),
        path_str(&store.join("data.vhdx")),
    ]);

    let port = free_port();
    let read = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
    let image = guest::ImageBuilder::new(guest::guest_root())
        .file(
            "/etc/ferry-tls/ca-cert.pem",
            read(&admin, "ca-cert.pem"),
            0o644,
        )
        .file(
            "/etc/ferry-tls/client-cert.pem",
            read(&admin, "client-cert.pem"),
            0o644,
        )
        .file(
            "/etc/ferry-tls/client-key.pem",
            read(&admin, "client-key.pem"),
            0o600,
        )
        .file(
            "/etc/other-tls/client-cert.pem",
            read(&other, "client-cert.pem"),
            0o644,
        )
        .file(
            "/etc/other-tls/client-key.pem",
            read(&other, "client-key.pem"),
            0o600,
        )
        .version("tls")
        .test_script(&script(port))
        .quick_init()
        .build(&dir.join("image"))
        .expect("build the image");

    let config = dir.join("ferry.toml");
    std::fs::write(
        &config,
        "[access]\nplain_reads = \"none\"\nplain_writes = \"none\"\n",
    )
    .unwrap();
    let mut cmd = ferry();
    cmd.args(["server", "--config", path_str(&config)])
        .args(["--store", path_str(&store)])
        .arg(format!("--nbd-listen=127.0.0.1:{port}"))
        .arg("--metrics-listen=")
        .args(["--tls-dir", path_str(&tls), "--tls-required"]);
    let mut server = Proc::spawn(&mut cmd, dir.join("server.log"));
    server.wait_until("serving NBD", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    // The test OS's small init: the script needs the kernel, modules and a shell, not
    // systemd (it brings the NIC up by hand).
    let append = format!(
        "root=/dev/vda1 {} init={}",
        guest::DIRECT_BOOT_ARGS,
        guest::QUICK_INIT_PATH
    );
    let mut vm = guest::Qemu::new(dir.join("console.log"))
        .disk(&image.disk)
        .direct_boot(&image.kernel, &image.initrd, &append)
        .spawn()
        .expect("start the machine");
    if let Err(e) = vm.wait_for("FERRY-BOOT-OK version=tls", BOOT_WAIT) {
        panic!("the machine did not finish: {e}\n{}", vm.log());
    }
    let out = vm
        .test_output()
        .expect("the script's output on the console");
    vm.kill();
    let text = out.text;
    eprintln!("{text}");
    assert!(!text.contains("-FAILED"), "{text}");
    assert!(
        text.contains("ADMIN=attached"),
        "the administrator's certificate opens the export: {text}"
    );
    assert!(
        text.contains(&format!("ADMIN-SHA={}", sha256_hex(&raw))),
        "every byte read over TLS is the export's: {text}"
    );
    assert!(
        text.contains("PLAIN=refused"),
        "a TLS-required server refuses a client without TLS: {text}"
    );
    assert!(
        text.contains("ANON=refused"),
        "TLS without a certificate does not read when plain reads are off: {text}"
    );
    assert!(
        text.contains("OTHER=refused"),
        "a certificate of another CA is refused: {text}"
    );
    server.stop();
}
