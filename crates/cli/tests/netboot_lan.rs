//! Diskless boots on a network whose DHCP server belongs to someone else (issue 32, parts 1
//! and 2): network namespaces of the test's own joined by a bridge, `dnsmasq` (Debian's) as
//! the site's DHCP server handing out addresses only, `ferry server --farm --proxy-dhcp`
//! beside it with its TFTP root on Debian's iPXE builds (`/usr/lib/ipxe`), and two QEMU
//! machines (TCG) on tap devices of that bridge with no root disk, booting at once:
//!
//! - BIOS: the NIC's iPXE ROM asks DHCP; dnsmasq gives the address and Ferry's ProxyDHCP,
//!   seeing iPXE, the boot script's URL;
//! - UEFI with plain PXE: OVMF with no option ROM on the NIC, so the firmware's own PXE asks
//!   DHCP (architecture 7); Ferry's ProxyDHCP names `snponly.efi`, which the firmware loads
//!   from Ferry's TFTP; that iPXE asks again and gets the script's URL; the kernel starts
//!   as an EFI program.
//!
//! Both reach multi-user (systemd; the test OS's marker unit runs after it) from the farm's
//! version, with the farm's login and session; the site's leases hold both MACs; Ferry's counters show the offers, the two
//! iPXE answers and the TFTP transfer.
//!
//! Needs root (namespaces, taps, ports 67, 69 and 4011), QEMU, OVMF and the static boot
//! agent. Tool rule: a missing one skips with the reason, and fails under `CI=true`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::boot::{capture, golden_image, runnable};
use common::netns::{Lan, site_dhcp};
use common::{Proc, path_str};
use interop::require_all;
use serde_json::Value;

const SERVER_IP: &str = "10.78.0.2";
const SITE_IP: &str = "10.78.0.3";
const BIOS_MAC: &str = "52:54:00:78:00:01";
const UEFI_MAC: &str = "52:54:00:78:00:02";
/// A hang guard for one boot (TCG, two machines on two shared cores), not a measure.
const BOOT_WAIT: Duration = Duration::from_secs(900);
/// The guest's script: nothing to check inside; the marker after it is the point.
const TEST_SCRIPT: &str = "#!/bin/sh\necho LAN-BOOT\n";

/// The farm API as the test's commands reach it: from inside the server's namespace.
struct Api<'a> {
    ns: &'a str,
    url: String,
    token: String,
    ca: String,
}

impl Api<'_> {
    fn json(&self, args: &[&str]) -> Value {
        let out = Lan::exec(self.ns, env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .args(["--api", &self.url, "--token", &self.token, "--json"])
            .args(["--farm-ca", &self.ca])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ferry {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

fn metrics(ns: &str) -> String {
    let out = Lan::exec(ns, "curl")
        .args(["-sf", &format!("http://{SERVER_IP}:9810/metrics")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn series(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

#[test]
fn bios_and_uefi_machines_boot_through_proxydhcp_beside_the_site_s_dhcp() {
    let test = "bios_and_uefi_machines_boot_through_proxydhcp_beside_the_site_s_dhcp";
    if !runnable(test) || !require_all(&["ip", "dnsmasq", "curl"]) {
        return;
    }
    if !Path::new(guest::OVMF).is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no {}",
            guest::OVMF
        );
        eprintln!("{test}: skipped: no {} (Debian's ovmf)", guest::OVMF);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut lan = Lan::new(&format!("fln{}", std::process::id()));
    let srv = lan.join("srv", Some(&format!("{SERVER_IP}/24")));
    let site = lan.join("site", Some(&format!("{SITE_IP}/24")));
    lan.tap("tapb");
    lan.tap("tapu");

    // The site's DHCP server: addresses only.
    let site_dhcp = site_dhcp(&site, "10.78.0.100,10.78.0.150", dir);
    let leases = dir.join("leases");

    // The farm, its image, and the server in its namespace.
    let data = dir.join("farm");
    let init = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["farm", "init", "--data", path_str(&data), "--json"])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let init: Value = serde_json::from_slice(&init.stdout).unwrap();
    let ca = data.join("secrets").join("ca-cert.pem");
    let store = data.join("stores").join("main");
    std::fs::create_dir_all(&store).unwrap();
    let image = golden_image(dir, &ca, TEST_SCRIPT);
    capture(&image.disk, &store.join("debian.vhdx"));
    let mut cmd = Lan::exec(&srv, env!("CARGO_BIN_EXE_ferry"));
    cmd.args([
        "server",
        "--farm",
        path_str(&data),
        "--store",
        path_str(&store),
    ])
    .args(["--server-name", "s1", "--advertise", SERVER_IP])
    .arg(format!("--nbd-listen={SERVER_IP}:10809"))
    .arg(format!("--api-listen={SERVER_IP}:8443"))
    .arg(format!("--metrics-listen={SERVER_IP}:9810"))
    .arg(format!("--boot-listen={SERVER_IP}:8070"))
    .arg(format!("--tftp-listen={SERVER_IP}:69"))
    .args(["--tftp-root", "/usr/lib/ipxe", "--proxy-dhcp", SERVER_IP]);
    let server_log = dir.join("s1.log");
    let mut server = Proc::spawn(&mut cmd, server_log.clone());
    server.wait_until("the server up", || {
        std::fs::read_to_string(&server_log).is_ok_and(|l| l.contains("serving the farm API"))
    });
    let api = Api {
        ns: &srv,
        url: format!("https://{SERVER_IP}:8443"),
        token: init["admin_token"].as_str().unwrap().to_string(),
        ca: path_str(&ca).to_string(),
    };
    api.json(&["farm", "settings", "--boot-ticket-secs", "900"]);
    if api.json(&["site", "list"])["total"] == 0 {
        api.json(&["site", "add", "hq"]);
    }
    api.json(&["store", "add", "main", "--path", "main"]);
    api.json(&[
        "farm",
        "vdisk",
        "add",
        "debian",
        "--store",
        "1",
        "--cache-mode",
        "ram",
    ]);
    // systemd as init: both machines go to multi-user (the marker's unit runs after it).
    api.json(&[
        "farm",
        "vdisk",
        "set",
        "debian",
        "--boot-cmdline",
        "console=ttyS0",
    ]);
    api.json(&[
        "collection",
        "add",
        "lab",
        "--site",
        "1",
        "--vdisk",
        "debian",
    ]);
    for (mac, name) in [(BIOS_MAC, "bios1"), (UEFI_MAC, "uefi1")] {
        api.json(&[
            "device",
            "add",
            mac,
            "--name",
            name,
            "--collection",
            "1",
            "--vdisk",
            "debian",
            "--diskless",
        ]);
    }

    // Two machines with no disk at all, at once.
    let mut bios = guest::Qemu::new(dir.join("console-bios.log"))
        .mac(BIOS_MAC)
        .tap(&lan.net, "tapb")
        .network_boot()
        .spawn()
        .expect("start the BIOS machine");
    let mut uefi = guest::Qemu::new(dir.join("console-uefi.log"))
        .mac(UEFI_MAC)
        .tap(&lan.net, "tapu")
        .uefi()
        .nic_rom("")
        .network_boot()
        .spawn()
        .expect("start the UEFI machine");
    for (vm, what) in [(&mut bios, "BIOS"), (&mut uefi, "UEFI")] {
        let marker = format!("{} version=v1", guest::BOOT_MARKER);
        if let Err(e) = vm.wait_for(&marker, BOOT_WAIT) {
            panic!(
                "{what}: no {marker:?}: {e}\nserver:\n{}\ndnsmasq:\n{}",
                server.log_text(),
                site_dhcp.log_text()
            );
        }
        println!("{what}: booted in {:?}", vm.elapsed());
        assert!(vm.log().contains("LAN-BOOT"), "{what}: {}", vm.log());
    }
    assert!(!bios.log().contains("efi: EFI v"), "{}", bios.log());
    assert!(uefi.log().contains("efi: EFI v"), "{}", uefi.log());
    let leased = std::fs::read_to_string(&leases).unwrap_or_default();
    for mac in [BIOS_MAC, UEFI_MAC] {
        assert!(
            leased.contains(mac),
            "the site leased {mac} no address: {leased}"
        );
    }
    let m = metrics(&srv);
    assert!(
        series(&m, "ferry_proxydhcp_total{what=\"offers\"} ") >= 2,
        "{m}"
    );
    assert!(
        series(&m, "ferry_proxydhcp_total{what=\"ipxe\"} ") >= 2,
        "{m}"
    );
    assert!(
        series(&m, "ferry_tftp_transfers_completed_total ") >= 1,
        "{m}"
    );
    let sessions = api.json(&["farm", "session", "list"]);
    assert_eq!(sessions["total"], 2, "{sessions}");
    drop(bios);
    drop(uefi);
    server.stop();
    drop(site_dhcp);
}
