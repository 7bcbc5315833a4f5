//! Fuzzes the ProxyDHCP codec (`proxydhcp::packet`) and the proxy's answer
//! (`proxydhcp::answer`): one datagram as it reaches port 67 or 4011.
//!
//! Input: a DHCP packet (236 fixed bytes, the magic cookie, options).
//!
//! Must hold: no panic; a parsed packet whose `sname` and `file` fit re-encodes to bytes that
//! parse to the same packet; an answer (on either port) encodes within `PACKET_BYTES_MAX`,
//! offers no address and names one of the configured files.
//!
//! Seed corpus: DHCPDISCOVERs laid out as PXE 2.1 BIOS and UEFI clients and iPXE send them
//! (option 55, 57, 60, 93, 94, 97; iPXE's 77 and 175), a ProxyDHCP REQUEST to 4011 and a
//! plain DHCP client's DISCOVER.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use proxydhcp::packet::PACKET_BYTES_MAX;
use proxydhcp::{BootInfo, Port, answer, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = parse(data) else {
        return;
    };
    if p.sname.len() <= 63 && p.file.len() <= 127 {
        assert_eq!(parse(&p.encode()).as_ref(), Ok(&p));
    }
    let info = BootInfo {
        server: Ipv4Addr::new(10, 9, 0, 2),
        bios_file: "undionly.kpxe".into(),
        efi_x64_file: "snponly.efi".into(),
        script_url: "http://10.9.0.2:8070/boot/ipxe".into(),
    };
    for port in [Port::Dhcp, Port::Pxe] {
        if let Ok(r) = answer(&p, port, &info) {
            let bytes = r.packet.encode();
            assert!(bytes.len() <= PACKET_BYTES_MAX);
            assert_eq!(r.packet.yiaddr, Ipv4Addr::UNSPECIFIED);
            let file = String::from_utf8(r.packet.file.clone()).unwrap();
            assert!([&info.bios_file, &info.efi_x64_file, &info.script_url].contains(&&file));
        }
    }
});
