//! The ProxyDHCP listeners: UDP 67 (broadcast DISCOVERs) and 4011 (ProxyDHCP REQUESTs),
//! each datagram parsed ([`crate::packet`]), answered ([`crate::answer`]) within the reply
//! budget ([`crate::budget`]) and sent; nothing else.
//!
//! Both ports are served by one task (a proxy's traffic is a few packets a boot). What is
//! refused is counted; malformed packets and architectures with no boot program are also
//! logged, at most [`contract::refusal_log`]'s lines per client a window. A plain DHCP
//! client's traffic (no `PXEClient` class) is only counted: it is most of what port 67 hears.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use contract::refusal_log::{Limits as LogLimits, RefusalLog};
use tokio::net::UdpSocket;

use crate::answer::{BootInfo, Destination, Ignored, Port, answer};
use crate::budget::{Budget, Limits};
use crate::packet::{PACKET_BYTES_MAX, parse};

/// The DHCP client port replies are broadcast to.
pub const CLIENT_PORT: u16 = 68;
/// The DHCP server port (a relay's too).
pub const SERVER_PORT: u16 = 67;
/// The PXE boot server port.
pub const PXE_PORT: u16 = 4011;

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// What it offers.
    pub info: BootInfo,
    /// Where it hears DISCOVERs (0.0.0.0:67).
    pub dhcp: SocketAddr,
    /// Where it hears ProxyDHCP REQUESTs (0.0.0.0:4011).
    pub pxe: SocketAddr,
    /// The reply budget.
    pub limits: Limits,
}

impl Config {
    /// Both ports on every address, the default budget.
    pub fn new(info: BootInfo) -> Config {
        let any = |p| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, p));
        Config {
            info,
            dhcp: any(SERVER_PORT),
            pxe: any(PXE_PORT),
            limits: Limits::default(),
        }
    }
}

/// What the proxy did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// DHCPOFFERs sent.
    pub offers: AtomicU64,
    /// DHCPACKs sent (port 4011).
    pub acks: AtomicU64,
    /// Of those, answers naming the boot script (the request came from iPXE).
    pub ipxe: AtomicU64,
    /// Datagrams that are not DHCP packets.
    pub malformed: AtomicU64,
    /// Requests of plain DHCP clients (no `PXEClient` class), left to the site's server.
    pub not_pxe: AtomicU64,
    /// Requests not answered here (a REQUEST on 67, a reply, …).
    pub not_for_us: AtomicU64,
    /// PXE requests of an architecture with no boot program here.
    pub arch: AtomicU64,
    /// Answers left out by the reply budget.
    pub limited: AtomicU64,
    /// Answers whose send failed.
    pub send_errors: AtomicU64,
}

impl Counters {
    /// Every counter with its name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("offers", g(&self.offers)),
            ("acks", g(&self.acks)),
            ("ipxe", g(&self.ipxe)),
            ("malformed", g(&self.malformed)),
            ("not_pxe", g(&self.not_pxe)),
            ("not_for_us", g(&self.not_for_us)),
            ("arch", g(&self.arch)),
            ("limited", g(&self.limited)),
            ("send_errors", g(&self.send_errors)),
        ]
    }
}

/// The bound proxy.
#[derive(Debug)]
pub struct Server {
    dhcp: UdpSocket,
    pxe: UdpSocket,
    config: Config,
    counters: Arc<Counters>,
}

fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = std::net::UdpSocket::bind(addr)?;
    s.set_broadcast(true)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

impl Server {
    /// Binds both ports.
    ///
    /// # Errors
    /// A bind fails (67 and 4011 need `CAP_NET_BIND_SERVICE`; 67 is taken where a DHCP
    /// server runs on this host).
    pub fn bind(config: Config) -> std::io::Result<Server> {
        let dhcp = bind(config.dhcp).map_err(|e| with_addr(e, config.dhcp))?;
        let pxe = bind(config.pxe).map_err(|e| with_addr(e, config.pxe))?;
        Ok(Server {
            dhcp,
            pxe,
            config,
            counters: Arc::new(Counters::default()),
        })
    }

    /// Its counters.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// The addresses it listens on (port 67's, port 4011's).
    ///
    /// # Errors
    /// The sockets' own.
    pub fn local_addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.dhcp.local_addr()?, self.pxe.local_addr()?))
    }

    /// Serves until `stop` completes.
    pub async fn run(self, stop: impl Future) {
        tokio::pin!(stop);
        let mut budget = Budget::new(self.config.limits);
        let mut log: RefusalLog<String> = RefusalLog::new(LogLimits::default());
        let mut a = vec![0u8; PACKET_BYTES_MAX + 1];
        let mut b = vec![0u8; PACKET_BYTES_MAX + 1];
        loop {
            let (port, n, from) = tokio::select! {
                _ = &mut stop => return,
                r = self.dhcp.recv_from(&mut a) => match r {
                    Ok((n, from)) => (Port::Dhcp, n, from),
                    Err(e) => { tracing::debug!(error = %e, "proxydhcp receive failed"); continue }
                },
                r = self.pxe.recv_from(&mut b) => match r {
                    Ok((n, from)) => (Port::Pxe, n, from),
                    Err(e) => { tracing::debug!(error = %e, "proxydhcp receive failed"); continue }
                },
            };
            let bytes = match port {
                Port::Dhcp => &a[..n],
                Port::Pxe => &b[..n],
            };
            self.one(port, bytes, from, &mut budget, &mut log).await;
        }
    }

    async fn one(
        &self,
        port: Port,
        bytes: &[u8],
        from: SocketAddr,
        budget: &mut Budget,
        log: &mut RefusalLog<String>,
    ) {
        let c = &self.counters;
        let req = match parse(bytes) {
            Ok(p) => p,
            Err(e) => {
                c.malformed.fetch_add(1, Ordering::Relaxed);
                if log.record(from.ip().to_string(), Instant::now()).log {
                    tracing::info!(%from, error = %e, "proxydhcp: not a DHCP packet");
                }
                return;
            }
        };
        let mac = contract::Mac::new(req.mac);
        let reply = match answer(&req, port, &self.config.info) {
            Ok(r) => r,
            Err(why) => {
                let counter = match why {
                    Ignored::NotPxe => &c.not_pxe,
                    Ignored::NotForUs | Ignored::NotRequest => &c.not_for_us,
                    Ignored::Arch(_) => &c.arch,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Ignored::Arch(arch) = why
                    && log.record(mac.to_string(), Instant::now()).log
                {
                    tracing::info!(%mac, arch, "proxydhcp: no boot program for this client architecture");
                }
                return;
            }
        };
        if !budget.take(req.mac, Instant::now()) {
            c.limited.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let to = match reply.to {
            Destination::Broadcast => {
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT))
            }
            Destination::Relay(g) => SocketAddr::V4(SocketAddrV4::new(g, SERVER_PORT)),
            Destination::Source => from,
        };
        let socket = match port {
            Port::Dhcp => &self.dhcp,
            Port::Pxe => &self.pxe,
        };
        match socket.send_to(&reply.packet.encode(), to).await {
            Ok(_) => {
                let kind = match port {
                    Port::Dhcp => &c.offers,
                    Port::Pxe => &c.acks,
                };
                kind.fetch_add(1, Ordering::Relaxed);
                if reply.ipxe {
                    c.ipxe.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(%mac, arch = ?reply.arch, ipxe = reply.ipxe, %to,
                    file = %String::from_utf8_lossy(&reply.packet.file), "proxydhcp: answered");
            }
            Err(e) => {
                c.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%to, error = %e, "proxydhcp: send failed");
            }
        }
    }
}

fn with_addr(e: std::io::Error, addr: SocketAddr) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("bind {addr}: {e}"))
}
