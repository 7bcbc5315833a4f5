//! Where exports come from: the [`ExportSource`] the server's store implements, and what it
//! hands out (an [`ExportHandle`] per connection, an [`ExportInfo`] per listed export), and
//! who asks (the [`Peer`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// Who is on the other end of a connection, as the export source sees it.
#[derive(Clone, PartialEq, Eq)]
pub struct Peer {
    /// The client's address; `None` on the unix socket.
    pub addr: Option<SocketAddr>,
    /// Whether the connection upgraded to TLS (`NBD_OPT_STARTTLS`).
    pub tls: bool,
    /// DER of the client's end-entity certificate, verified by the TLS configuration's
    /// client verifier; `None` without TLS or when the client presented none.
    pub client_cert: Option<Vec<u8>>,
    /// Whether a loopback address counts as local ([`ServerConfig::trust_loopback`]).
    ///
    /// [`ServerConfig::trust_loopback`]: crate::ServerConfig::trust_loopback
    pub trust_loopback: bool,
}

impl Peer {
    /// A peer at `addr` (`None`: the unix socket), before TLS.
    pub fn new(addr: Option<SocketAddr>, trust_loopback: bool) -> Peer {
        Peer {
            addr,
            tls: false,
            client_cert: None,
            trust_loopback,
        }
    }

    /// Whether the client is on this machine: the unix socket, or a loopback address when
    /// loopback is trusted (an IPv4-mapped IPv6 loopback address counts too).
    pub fn is_local(&self) -> bool {
        match self.addr {
            None => true,
            Some(a) => self.trust_loopback && a.ip().to_canonical().is_loopback(),
        }
    }
}

/// Shows the certificate's length, not its bytes.
impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .field("client_cert_len", &self.client_cert.as_ref().map(Vec::len))
            .field("trust_loopback", &self.trust_loopback)
            .finish()
    }
}

/// Shows the address ("unix" for the unix socket) and "+tls" after an upgrade.
impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            Some(a) => write!(f, "{a}")?,
            None => f.write_str("unix")?,
        }
        if self.tls {
            f.write_str("+tls")?;
        }
        Ok(())
    }
}

/// One export, as listed by `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export name a client asks for.
    pub name: String,
    /// A human-readable description (`NBD_INFO_DESCRIPTION`); may be empty.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
}

/// An opened export, owned by one connection.
pub struct ExportHandle {
    /// The device to serve.
    pub device: Arc<dyn disk::BlockDevice>,
    /// Whether the client may write (the device must then also `can_write`).
    pub writable: bool,
    /// Runs once when the connection ends, after in-flight requests finished and a writable
    /// device was flushed (discard a non-persistent write cache, unlock a private image).
    pub release: Option<Box<dyn FnOnce() + Send>>,
    /// Cancelled to end the connection (its session ended): the server stops reading
    /// requests, finishes those in flight, flushes and runs `release`, as on shutdown.
    pub revoked: Option<CancellationToken>,
}

impl fmt::Debug for ExportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportHandle")
            .field("device", &self.device)
            .field("writable", &self.writable)
            .field("release", &self.release.is_some())
            .field("revoked", &self.revoked)
            .finish()
    }
}

/// Dropping a handle runs its `release` if the server has not already run it (the server
/// runs it explicitly, on the blocking pool, after the final flush).
impl Drop for ExportHandle {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Why an export could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No export of that name (`NBD_REP_ERR_UNKNOWN`).
    #[error("no export named {0:?}")]
    NotFound(String),
    /// The export exists but cannot be opened now, e.g. a private image already has its one
    /// writer (`NBD_REP_ERR_POLICY`).
    #[error("export busy: {0}")]
    Busy(String),
    /// The export is served only over TLS and the client has not upgraded
    /// (`NBD_REP_ERR_TLS_REQD`).
    #[error("TLS required: {0}")]
    TlsRequired(String),
    /// The client may not see or open it (`NBD_REP_ERR_POLICY`).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Anything else (`NBD_REP_ERR_UNKNOWN` with a message... logged on the server).
    #[error("cannot open export: {0}")]
    Other(String),
}

/// Where the NBD server finds its exports. Implemented by the server's store/registry.
///
/// Both methods are called on tokio's blocking pool, so they may do file I/O (open a chain,
/// scan a store directory). `open` is called once per `NBD_OPT_INFO`, `NBD_OPT_GO` and
/// `NBD_OPT_EXPORT_NAME`; the handle of an `NBD_OPT_INFO` is released right after its reply.
/// Both are told who asks ([`Peer`]), so they can refuse (`Forbidden`) or ask for TLS
/// (`TlsRequired`).
pub trait ExportSource: Send + Sync {
    /// Every export `peer` may list.
    ///
    /// # Errors
    /// [`OpenError`]: the reply to `NBD_OPT_LIST` is then that error.
    fn list(&self, peer: &Peer) -> Result<Vec<ExportInfo>, OpenError>;

    /// Opens `name` ("" is the default export) for one connection of `peer`.
    ///
    /// # Errors
    /// [`OpenError`].
    fn open(&self, name: &str, peer: &Peer) -> Result<ExportHandle, OpenError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_is_the_unix_socket_or_trusted_loopback() {
        let lo: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        let remote: SocketAddr = "192.0.2.7:5".parse().unwrap();
        assert!(Peer::new(None, false).is_local());
        assert!(Peer::new(Some(lo), true).is_local());
        assert!(Peer::new(Some(mapped), true).is_local());
        assert!(!Peer::new(Some(lo), false).is_local());
        assert!(!Peer::new(Some(remote), true).is_local());
    }
}
