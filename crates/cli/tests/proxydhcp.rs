//! ProxyDHCP as it runs in the field (issue 32, part 2): on a network whose DHCP server is
//! someone else's. Network namespaces of the test's own, joined by a bridge: `dnsmasq`
//! (Debian's) as the site's DHCP server handing out addresses only, `ferry server
//! --proxy-dhcp` beside it, and a client namespace whose DHCP client
//! (`netns_tools/dhcp_probe.py`) broadcasts what PXE firmware, iPXE and a plain client send:
//!
//! - a BIOS PXE DISCOVER gets two offers: dnsmasq's with an address, Ferry's with none, the
//!   PXEClient class, Ferry as next server and `undionly.kpxe`;
//! - a UEFI x86-64 one (option 93 = 7) gets `snponly.efi`; iPXE's (user class `iPXE`) the
//!   boot script's URL, so it does not load iPXE again;
//! - a plain DHCP client gets dnsmasq's offer and nothing from Ferry;
//! - a ProxyDHCP REQUEST to port 4011 gets Ferry's ACK back at its source;
//! - one MAC flooding 40 DISCOVERs gets at most the per-MAC budget of offers, and a second
//!   client right after still gets its own; the counters say so.
//!
//! Needs root (namespaces, ports 67 and 4011). Tool rule: ip, dnsmasq and python3 skip with
//! a printed reason, and fail under `CI=true`.

use std::path::Path;

mod common;

use common::farm::Farm;
use common::netns::{Lan, site_dhcp};
use common::{Proc, path_str};
use interop::require_all;
use serde_json::{Value, json};

const SERVER_IP: &str = "10.77.0.2";
const SITE_IP: &str = "10.77.0.3";
const BIOS: &str = "PXEClient:Arch:00000:UNDI:002001";
const EFI: &str = "PXEClient:Arch:00007:UNDI:003016";

/// Runs the probe in `ns` with `requests`; the replies it heard.
fn probe(ns: &str, requests: &Value) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/netns_tools/dhcp_probe.py");
    let out = Lan::exec(ns, "python3")
        .arg(&script)
        .arg(requests.to_string())
        .arg("2")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn discover(
    xid: u32,
    mac: &str,
    class: Option<&str>,
    arch: Option<u16>,
    user: Option<&str>,
) -> Value {
    json!({ "xid": xid, "mac": mac, "type": 1, "class": class, "arch": arch,
            "user_class": user, "to": "255.255.255.255:67" })
}

fn from<'a>(replies: &'a [Value], xid: u32, ip: &str) -> Vec<&'a Value> {
    replies
        .iter()
        .filter(|r| r["xid"] == xid && r["from"] == ip)
        .collect()
}

fn counter(ns: &str, metrics: &str, what: &str) -> u64 {
    let out = Lan::exec(ns, "curl")
        .args(["-sf", metrics])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let key = format!("ferry_proxydhcp_total{{what=\"{what}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key}in:\n{text}"))
}

#[test]
fn pxe_clients_get_boot_information_from_ferry_and_addresses_from_the_site_s_dhcp() {
    if !require_all(&["ip", "dnsmasq", "python3", "curl"]) {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "root is required under CI"
        );
        eprintln!("SKIPPED: network namespaces need root");
        return;
    }
    let f = Farm::init();
    let tag = format!("fpx{}", std::process::id());
    let mut lan = Lan::new(&tag);
    let _ = &lan.net;
    let srv = lan.join("srv", Some(&format!("{SERVER_IP}/24")));
    let site = lan.join("site", Some(&format!("{SITE_IP}/24")));
    let cli = lan.join("cli", Some("10.77.0.50/24"));

    // The site's DHCP server: addresses only, nothing about booting.
    let site_dhcp = site_dhcp(&site, "10.77.0.100,10.77.0.150", f.dir.path());

    // Ferry beside it, with the boot programs on its TFTP root.
    let tftp = f.dir.path().join("tftp");
    std::fs::create_dir_all(&tftp).unwrap();
    std::fs::write(tftp.join("undionly.kpxe"), b"bios program").unwrap();
    std::fs::write(tftp.join("snponly.efi"), b"efi program").unwrap();
    let mut cmd = Lan::exec(&srv, env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["server", "--farm", path_str(&f.data())])
        .args(["--store", path_str(&f.store())])
        .args(["--server-name", "s1"])
        .arg(format!("--nbd-listen={SERVER_IP}:10809"))
        .arg(format!("--api-listen={SERVER_IP}:8443"))
        .arg(format!("--metrics-listen={SERVER_IP}:9810"))
        .arg(format!("--boot-listen={SERVER_IP}:8070"))
        .arg(format!("--tftp-listen={SERVER_IP}:69"))
        .args(["--tftp-root", path_str(&tftp)])
        .args(["--proxy-dhcp", SERVER_IP]);
    let log = f.dir.path().join("s1.log");
    let mut server = Proc::spawn(&mut cmd, log.clone());
    server.wait_until("ProxyDHCP up", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ProxyDHCP answering"))
    });
    let metrics = format!("http://{SERVER_IP}:9810/metrics");

    let replies = probe(
        &cli,
        &json!([
            discover(1, "52:54:00:77:00:01", Some(BIOS), Some(0), None),
            discover(2, "52:54:00:77:00:02", Some(EFI), Some(7), None),
            discover(3, "52:54:00:77:00:03", Some(BIOS), Some(0), Some("iPXE")),
            discover(4, "52:54:00:77:00:04", Some("android-dhcp-13"), None, None),
            json!({ "xid": 5, "mac": "52:54:00:77:00:05", "type": 3, "class": BIOS, "arch": 0,
                    "to": format!("{SERVER_IP}:4011") }),
        ]),
    );
    let said = format!("{replies:#?}\ndnsmasq:\n{}", site_dhcp.log_text());
    // BIOS PXE: an address from the site, boot information from Ferry.
    let site1 = from(&replies, 1, SITE_IP);
    assert!(
        site1
            .iter()
            .any(|r| r["type"] == 2 && r["yiaddr"] != "0.0.0.0"),
        "no address offered by the site: {said}"
    );
    let ferry1 = from(&replies, 1, SERVER_IP);
    assert_eq!(ferry1.len(), 1, "{said}");
    let o = ferry1[0];
    assert_eq!(o["type"], 2, "an OFFER: {said}");
    assert_eq!(o["yiaddr"], "0.0.0.0");
    assert_eq!(o["siaddr"], SERVER_IP);
    assert_eq!(o["server_id"], SERVER_IP);
    assert_eq!(o["class"], "PXEClient");
    assert_eq!(o["file"], "undionly.kpxe");
    // UEFI and iPXE.
    assert_eq!(
        from(&replies, 2, SERVER_IP)[0]["file"],
        "snponly.efi",
        "{said}"
    );
    assert_eq!(
        from(&replies, 3, SERVER_IP)[0]["file"],
        format!("http://{SERVER_IP}:8070/boot/ipxe"),
        "{said}"
    );
    // A plain client: the site answers, Ferry does not.
    assert!(!from(&replies, 4, SITE_IP).is_empty(), "{said}");
    assert!(from(&replies, 4, SERVER_IP).is_empty(), "{said}");
    // Port 4011.
    let ack = from(&replies, 5, SERVER_IP);
    assert_eq!(ack.len(), 1, "{said}");
    assert_eq!(
        (ack[0]["type"].as_u64(), ack[0]["file"].as_str()),
        (Some(5), Some("undionly.kpxe"))
    );
    assert!(counter(&cli, &metrics, "not_pxe") >= 1);

    // One MAC floods; the next client is still answered.
    let mut flood = discover(6, "52:54:00:77:00:06", Some(BIOS), Some(0), None);
    flood["count"] = json!(40);
    let replies = probe(
        &cli,
        &json!([
            flood,
            discover(7, "52:54:00:77:00:07", Some(BIOS), Some(0), None)
        ]),
    );
    let flooded = from(&replies, 6, SERVER_IP).len();
    assert!(
        (1..=proxydhcp::budget::PER_MAC_DEFAULT as usize).contains(&flooded),
        "{flooded} offers to one MAC"
    );
    assert_eq!(from(&replies, 7, SERVER_IP).len(), 1, "{replies:#?}");
    assert!(counter(&cli, &metrics, "limited") >= 30);
    assert!(counter(&cli, &metrics, "offers") >= 4);
    server.stop();
    drop(site_dhcp);
}
