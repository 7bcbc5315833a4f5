//! What a ProxyDHCP server answers (PXE 2.1 §2.2, RFC 4578): boot information, never an
//! address. Pure: a request in, a reply (or why none) out.
//!
//! ```text
//!   port 67   DHCPDISCOVER from a PXE client ──► DHCPOFFER  yiaddr 0.0.0.0, siaddr and file,
//!                                                            option 60 "PXEClient", 54, 97,
//!                                                            43 {6: 0x08}: boot the file named
//!                                                            here, no boot server discovery
//!   port 4011 DHCPREQUEST (or INFORM) ─────────► DHCPACK    the same boot information
//!   anything else, a client without "PXEClient" ► nothing (the site's DHCP server answers it)
//! ```
//!
//! The file follows the client: option 93 (client architecture, RFC 4578 §2.1) picks the BIOS
//! or the x86-64 UEFI boot program; a request from iPXE itself (user class `iPXE`, or iPXE's
//! option 175) gets the boot script's URL instead, so that iPXE does not load iPXE again.

use std::net::Ipv4Addr;

use crate::packet::{BOOTREPLY, BOOTREQUEST, MessageType, Packet, code};

/// The prefix of a PXE client's vendor class (option 60).
pub const PXE_CLASS: &[u8] = b"PXEClient";
/// PXE_DISCOVERY_CONTROL (vendor sub-option 6) bit 3: boot the file of this offer, with no
/// boot server discovery or menu.
pub const DISCOVERY_USE_FILE: u8 = 0x08;

/// What the proxy offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    /// This server's address on the boot network: server identifier and TFTP server.
    pub server: Ipv4Addr,
    /// The boot program of BIOS clients (arch 0), on the TFTP server: `undionly.kpxe`.
    pub bios_file: String,
    /// The boot program of x86-64 UEFI clients (arch 7, 9): `snponly.efi` or `ipxe.efi`.
    pub efi_x64_file: String,
    /// What iPXE loads: the boot script's URL.
    pub script_url: String,
}

/// The port a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// 67, the DHCP server port (broadcast DISCOVERs).
    Dhcp,
    /// 4011, the PXE boot server port (a client's ProxyDHCP REQUEST).
    Pxe,
}

/// The client architectures of RFC 4578 §2.1 (IANA's registry) a boot program exists for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// 0: x86 BIOS.
    Bios,
    /// 7 (EFI BC, x86-64 in practice) and 9 (EFI x86-64).
    EfiX64,
}

/// Where a reply goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// 255.255.255.255:68 (the client has no address yet).
    Broadcast,
    /// The relay agent `giaddr`, port 67.
    Relay(Ipv4Addr),
    /// Back to the request's source address and port (a 4011 request).
    Source,
}

/// A reply and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The packet.
    pub packet: Packet,
    /// Where.
    pub to: Destination,
    /// The architecture it was answered for.
    pub arch: Arch,
    /// True when the file is the script URL (the request came from iPXE).
    pub ipxe: bool,
}

/// Why a request gets no answer (counted and, rate-limited, logged by the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// A reply, not a request.
    NotRequest,
    /// No `PXEClient` vendor class: a plain DHCP client, the site server's business.
    NotPxe,
    /// A message type this port does not answer (a REQUEST on 67 is for the site server).
    NotForUs,
    /// An architecture with no boot program here (option 93's value).
    Arch(u16),
}

impl Ignored {
    /// A short name for counters and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Ignored::NotRequest => "not_request",
            Ignored::NotPxe => "not_pxe",
            Ignored::NotForUs => "not_for_us",
            Ignored::Arch(_) => "arch",
        }
    }
}

/// The client's architecture: option 93's first value; without it, from the vendor class
/// (`PXEClient:Arch:NNNNN:…`); without either, BIOS (PXE 2.1 clients before RFC 4578).
pub fn client_arch(p: &Packet) -> Result<Arch, Ignored> {
    let n = match p.option(code::CLIENT_ARCH) {
        Some([a, b, ..]) => u16::from_be_bytes([*a, *b]),
        _ => p
            .option(code::VENDOR_CLASS)
            .and_then(|v| v.strip_prefix(b"PXEClient:Arch:"))
            .and_then(|v| std::str::from_utf8(v.get(..5)?).ok()?.parse().ok())
            .unwrap_or(0),
    };
    match n {
        0 => Ok(Arch::Bios),
        7 | 9 => Ok(Arch::EfiX64),
        other => Err(Ignored::Arch(other)),
    }
}

/// True when the request comes from iPXE (user class `iPXE`, RFC 3004's length-prefixed
/// form or iPXE's plain one, or iPXE's option 175).
pub fn from_ipxe(p: &Packet) -> bool {
    if p.option(code::IPXE).is_some() {
        return true;
    }
    p.option(code::USER_CLASS)
        .is_some_and(|v| v == b"iPXE" || v.strip_prefix(&[4u8]) == Some(b"iPXE".as_slice()))
}

/// The answer to `req`, which came to `port` (see the module documentation).
///
/// # Errors
/// [`Ignored`] when the proxy stays silent.
pub fn answer(req: &Packet, port: Port, info: &BootInfo) -> Result<Reply, Ignored> {
    if req.op != BOOTREQUEST {
        return Err(Ignored::NotRequest);
    }
    if !req
        .option(code::VENDOR_CLASS)
        .is_some_and(|v| v.starts_with(PXE_CLASS))
    {
        return Err(Ignored::NotPxe);
    }
    let kind = match (port, req.message_type()) {
        (Port::Dhcp, Some(MessageType::Discover)) => MessageType::Offer,
        (Port::Pxe, Some(MessageType::Request | MessageType::Inform)) => MessageType::Ack,
        _ => return Err(Ignored::NotForUs),
    };
    let arch = client_arch(req)?;
    let ipxe = from_ipxe(req);
    let file = if ipxe {
        &info.script_url
    } else {
        match arch {
            Arch::Bios => &info.bios_file,
            Arch::EfiX64 => &info.efi_x64_file,
        }
    };
    let mut options = vec![
        (code::MESSAGE_TYPE, vec![kind.to_u8()]),
        (code::SERVER_ID, info.server.octets().to_vec()),
        (code::VENDOR_CLASS, PXE_CLASS.to_vec()),
    ];
    // RFC 4578 §2.3: a type octet and 16 octets; anything else is not echoed.
    if let Some(uuid) = req.option(code::CLIENT_UUID).filter(|u| u.len() == 17) {
        options.push((code::CLIENT_UUID, uuid.to_vec()));
    }
    // PXE_DISCOVERY_CONTROL: boot the file named here; then the sub-options' end.
    options.push((code::VENDOR, vec![6, 1, DISCOVERY_USE_FILE, 255]));
    options.push((code::TFTP_SERVER, info.server.to_string().into_bytes()));
    options.push((code::BOOTFILE, file.as_bytes().to_vec()));
    let packet = Packet {
        op: BOOTREPLY,
        hops: 0,
        xid: req.xid,
        secs: 0,
        flags: req.flags,
        ciaddr: req.ciaddr,
        yiaddr: Ipv4Addr::UNSPECIFIED,
        siaddr: info.server,
        giaddr: req.giaddr,
        mac: req.mac,
        sname: Vec::new(),
        file: file.as_bytes().to_vec(),
        options,
    };
    let to = match port {
        Port::Pxe => Destination::Source,
        Port::Dhcp if !req.giaddr.is_unspecified() => Destination::Relay(req.giaddr),
        Port::Dhcp => Destination::Broadcast,
    };
    Ok(Reply {
        packet,
        to,
        arch,
        ipxe,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{FLAG_BROADCAST, parse};

    fn info() -> BootInfo {
        BootInfo {
            server: Ipv4Addr::new(10, 9, 0, 2),
            bios_file: "undionly.kpxe".into(),
            efi_x64_file: "snponly.efi".into(),
            script_url: "http://10.9.0.2:8070/boot/ipxe".into(),
        }
    }

    fn request(kind: u8, extra: &[(u8, &[u8])]) -> Packet {
        let mut options = vec![(code::MESSAGE_TYPE, vec![kind])];
        for (c, v) in extra {
            options.push((*c, v.to_vec()));
        }
        Packet {
            op: BOOTREQUEST,
            hops: 0,
            xid: 7,
            secs: 0,
            flags: FLAG_BROADCAST,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            mac: [2, 0, 0, 0, 0, 9],
            sname: Vec::new(),
            file: Vec::new(),
            options,
        }
    }

    const BIOS: &[u8] = b"PXEClient:Arch:00000:UNDI:002001";
    const EFI: &[u8] = b"PXEClient:Arch:00007:UNDI:003016";

    #[test]
    fn a_bios_discover_gets_an_offer_of_the_bios_program_and_no_address() {
        let uuid = [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
        let req = request(1, &[(60, BIOS), (93, &[0, 0]), (97, &uuid)]);
        let r = answer(&req, Port::Dhcp, &info()).unwrap();
        assert_eq!(r.to, Destination::Broadcast);
        assert_eq!(r.arch, Arch::Bios);
        let p = parse(&r.packet.encode()).unwrap();
        assert_eq!(p.op, BOOTREPLY);
        assert_eq!(p.message_type(), Some(MessageType::Offer));
        assert_eq!(p.yiaddr, Ipv4Addr::UNSPECIFIED);
        assert_eq!(p.siaddr, info().server);
        assert_eq!(p.file, b"undionly.kpxe");
        assert_eq!(p.option(code::BOOTFILE), Some(b"undionly.kpxe".as_slice()));
        assert_eq!(p.option(code::VENDOR_CLASS), Some(PXE_CLASS));
        assert_eq!(p.option(code::SERVER_ID), Some([10u8, 9, 0, 2].as_slice()));
        assert_eq!(p.option(code::CLIENT_UUID), Some(uuid.as_slice()));
        assert_eq!(p.option(code::VENDOR), Some([6u8, 1, 8, 255].as_slice()));
        assert_eq!((p.xid, p.mac), (7, [2, 0, 0, 0, 0, 9]));
    }

    #[test]
    fn uefi_gets_the_efi_program_and_ipxe_gets_the_script() {
        let efi = request(1, &[(60, EFI), (93, &[0, 7])]);
        let r = answer(&efi, Port::Dhcp, &info()).unwrap();
        assert_eq!(
            (r.arch, r.packet.file.as_slice()),
            (Arch::EfiX64, b"snponly.efi".as_slice())
        );
        let nine = request(1, &[(60, EFI), (93, &[0, 9])]);
        assert_eq!(
            answer(&nine, Port::Dhcp, &info()).unwrap().arch,
            Arch::EfiX64
        );
        // iPXE names itself in its user class (RFC 3004 form or plain) or by option 175.
        for extra in [
            (77u8, b"\x04iPXE".as_slice()),
            (77, b"iPXE"),
            (175, b"\x01\x01\x01"),
        ] {
            let ipxe = request(1, &[(60, BIOS), (93, &[0, 0]), extra]);
            let r = answer(&ipxe, Port::Dhcp, &info()).unwrap();
            assert!(r.ipxe);
            assert_eq!(r.packet.file, info().script_url.as_bytes());
        }
    }

    #[test]
    fn a_request_on_4011_gets_an_ack_back_to_its_source() {
        let mut req = request(3, &[(60, BIOS), (93, &[0, 0])]);
        req.ciaddr = Ipv4Addr::new(10, 9, 0, 50);
        let r = answer(&req, Port::Pxe, &info()).unwrap();
        assert_eq!(r.to, Destination::Source);
        assert_eq!(r.packet.message_type(), Some(MessageType::Ack));
        assert_eq!(r.packet.ciaddr, req.ciaddr);
    }

    #[test]
    fn plain_dhcp_clients_replies_requests_on_67_and_other_archs_get_nothing() {
        let plain = request(1, &[(60, b"android-dhcp-13")]);
        assert_eq!(answer(&plain, Port::Dhcp, &info()), Err(Ignored::NotPxe));
        let none = request(1, &[]);
        assert_eq!(answer(&none, Port::Dhcp, &info()), Err(Ignored::NotPxe));
        let req67 = request(3, &[(60, BIOS)]);
        assert_eq!(answer(&req67, Port::Dhcp, &info()), Err(Ignored::NotForUs));
        let disc4011 = request(1, &[(60, BIOS)]);
        assert_eq!(
            answer(&disc4011, Port::Pxe, &info()),
            Err(Ignored::NotForUs)
        );
        let arm = request(
            1,
            &[(60, b"PXEClient:Arch:00011:UNDI:003016"), (93, &[0, 11])],
        );
        assert_eq!(answer(&arm, Port::Dhcp, &info()), Err(Ignored::Arch(11)));
        let mut reply = request(1, &[(60, BIOS)]);
        reply.op = BOOTREPLY;
        assert_eq!(
            answer(&reply, Port::Dhcp, &info()),
            Err(Ignored::NotRequest)
        );
    }

    #[test]
    fn without_option_93_the_vendor_class_names_the_arch_and_relays_get_the_reply() {
        let mut req = request(1, &[(60, EFI)]);
        req.giaddr = Ipv4Addr::new(10, 1, 0, 1);
        let r = answer(&req, Port::Dhcp, &info()).unwrap();
        assert_eq!(r.arch, Arch::EfiX64);
        assert_eq!(r.to, Destination::Relay(Ipv4Addr::new(10, 1, 0, 1)));
        let old = request(1, &[(60, b"PXEClient")]);
        assert_eq!(answer(&old, Port::Dhcp, &info()).unwrap().arch, Arch::Bios);
    }
}
