//! Network namespaces a test makes and removes: one holding a bridge (the boot network) and
//! others joined to it by veth pairs, each with its own address, so that DHCP broadcasts,
//! a site's DHCP server and Ferry meet on a real L2 network and nothing leaves the test's
//! namespaces.

use std::path::Path;
use std::process::{Command, Output};

/// A bridge in a namespace of its own, and the namespaces joined to it.
pub struct Lan {
    /// The bridge's namespace.
    pub net: String,
    /// The joined namespaces.
    members: Vec<String>,
}

fn ip(args: &[&str]) -> Output {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Lan {
    /// A bridge `br0` in namespace `{tag}-net` (up, no address).
    pub fn new(tag: &str) -> Lan {
        let net = format!("{tag}-net");
        let _ = Command::new("ip").args(["netns", "del", &net]).output();
        ip(&["netns", "add", &net]);
        ip(&["-n", &net, "link", "set", "lo", "up"]);
        ip(&["-n", &net, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &net, "link", "set", "br0", "up"]);
        Lan {
            net,
            members: Vec::new(),
        }
    }

    /// A namespace `{net}-{name}` joined to the bridge by a veth (`eth0` inside), with
    /// `cidr` on it when given; returns its name.
    pub fn join(&mut self, name: &str, cidr: Option<&str>) -> String {
        let ns = format!("{}-{name}", self.net);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        ip(&["netns", "add", &ns]);
        self.members.push(ns.clone());
        let port = format!("p-{name}");
        ip(&[
            "-n", &self.net, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
            &ns,
        ]);
        ip(&["-n", &self.net, "link", "set", &port, "master", "br0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        if let Some(c) = cidr {
            ip(&["-n", &ns, "addr", "add", c, "dev", "eth0"]);
        }
        // The limited broadcast (255.255.255.255) of DHCP goes out on the LAN.
        ip(&["-n", &ns, "route", "add", "default", "dev", "eth0"]);
        ns
    }

    /// A tap device `name` on the bridge, for a QEMU machine run in [`Lan::net`].
    pub fn tap(&self, name: &str) {
        ip(&["-n", &self.net, "tuntap", "add", "dev", name, "mode", "tap"]);
        ip(&["-n", &self.net, "link", "set", name, "master", "br0", "up"]);
    }

    /// `cmd` to run inside namespace `ns`.
    pub fn exec(ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }
}

/// A site's DHCP server in namespace `ns`: Debian's dnsmasq handing out addresses of
/// `range` (`FIRST,LAST`) only, nothing about booting, with its log in `dir/dnsmasq.log` and
/// its leases in `dir/leases`; returned once it serves.
pub fn site_dhcp(ns: &str, range: &str, dir: &Path) -> super::Proc {
    let log = dir.join("dnsmasq.log");
    let mut dnsmasq = Lan::exec(ns, "dnsmasq");
    dnsmasq
        .args([
            "--no-daemon",
            "--port=0",
            "--interface=eth0",
            "--bind-interfaces",
        ])
        .arg(format!("--dhcp-range={range},255.255.255.0,1h"))
        .args([
            "--no-resolv",
            "--no-hosts",
            "--log-dhcp",
            "--dhcp-authoritative",
        ])
        .arg("--no-ping")
        .arg(format!(
            "--dhcp-leasefile={}",
            super::path_str(&dir.join("leases"))
        ))
        .arg(format!(
            "--pid-file={}",
            super::path_str(&dir.join("dnsmasq.pid"))
        ));
    let mut p = super::Proc::spawn(&mut dnsmasq, log.clone());
    p.wait_until("dnsmasq up", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("DHCP, IP range"))
    });
    p
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in self.members.iter().chain(std::iter::once(&self.net)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
