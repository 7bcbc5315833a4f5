//! ProxyDHCP for PXE: on a network whose DHCP server belongs to someone else, `ferry server`
//! answers PXE clients with boot information only (no address), as the PXE 2.1
//! specification's ProxyDHCP and RFC 4578 describe; the site's server gives the addresses.
//!
//! # Layout
//!
//! ```text
//! packet   PURE. The DHCP packet and its options (RFC 2131, 2132): parse, encode, limits.
//! answer   PURE. A proxy's answer to one request: which port, which client (option 60
//!          PXEClient, option 93's architecture, iPXE's user class), which boot file.
//! budget   PURE. Replies per MAC and in all per window (takes now).
//! server   The UDP listeners on 67 and 4011 and their counters.
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, clippy::cast_possible_truncation)]

pub mod answer;
pub mod budget;
pub mod packet;
pub mod server;

pub use answer::{Arch, BootInfo, Destination, Ignored, Port, Reply, answer};
pub use budget::{Budget, Limits};
pub use packet::{MessageType, Packet, PacketError, parse};
pub use server::{Config, Counters, Server};
