//! The client's side of the NBD handshake (fixed newstyle): the greeting, then either
//! structured replies and `NBD_OPT_GO` in the clear, or `NBD_OPT_STARTTLS`, the TLS
//! handshake on the connection's runtime, and the same options over TLS. Blocking code
//! on a std socket (with its read timeout) or bridged onto the TLS stream.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use nbd_proto::client::OptionReplyHeader;
use nbd_proto::option::OptionReply;
use nbd_proto::{
    ClientFlags, ClientOption, Info, InfoRequest, NBD_FLAG_NO_ZEROES, NBD_INFO_BLOCK_SIZE,
    NBD_INFO_DESCRIPTION, NBD_OPT_GO, NBD_OPT_STARTTLS, NBD_OPT_STRUCTURED_REPLY, ServerGreeting,
};
use rustls::pki_types::ServerName;
use tokio::runtime::Handle;
use tokio_util::io::SyncIoBridge;

/// What the server said about the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// `NBD_INFO_DESCRIPTION`, or empty.
    pub description: String,
}

/// The most option replies one `NBD_OPT_GO` may produce before the client gives up.
const GO_REPLIES_MAX: usize = 64;

/// The name the server's certificate must carry: the host part of `host:port`, an IP
/// address or a DNS name (`[v6]:port` without its brackets).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} cannot name a TLS server: {e}"))
}

/// The TLS stream a connection's transmission runs over.
pub(crate) type TlsStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// After `NBD_OPT_STARTTLS` was acknowledged on `socket` (non-blocking now): the TLS
/// handshake on `rt`, then the remaining options over TLS. The whole exchange must end
/// within `timeout`, else the socket is shut down (which fails it).
pub(crate) fn tls_negotiate(
    rt: &Handle,
    socket: TcpStream,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    export: &str,
    timeout: Duration,
) -> Result<(ExportInfo, TlsStream), Failed> {
    let raw = socket.try_clone().map_err(io("clone socket"))?;
    let watchdog = rt.spawn(async move {
        tokio::time::sleep(timeout).await;
        tracing::warn!(?timeout, "NBD TLS negotiation timed out");
        let _ = raw.shutdown(Shutdown::Both);
    });
    let r = (|| {
        let stream = {
            let _entered = rt.enter();
            tokio::net::TcpStream::from_std(socket).map_err(io("register socket"))?
        };
        let tls = rt
            .block_on(tokio_rustls::TlsConnector::from(config).connect(name, stream))
            .map_err(io("TLS handshake"))?;
        let mut bridge = SyncIoBridge::new_with_handle(tls, rt.clone());
        let info = go(&mut bridge, export, Vec::new())?;
        Ok((info, bridge.into_inner()))
    })();
    watchdog.abort();
    r
}

/// `host` → `host:10809`; `host:port` and `[v6]:port` unchanged.
pub fn with_default_port(server: &str) -> String {
    let has_port = match server.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>().is_ok() && (!host.contains(':') || host.ends_with(']'))
        }
        None => false,
    };
    if has_port {
        server.to_string()
    } else {
        format!("{server}:10809")
    }
}

/// Why a negotiation failed: the server answered `NBD_OPT_GO` with an error (it is up, and
/// refuses this export: a session it does not know, a certificate it does not accept), or
/// anything else (unreachable, TLS, protocol).
#[derive(Debug)]
pub(crate) enum Failed {
    /// The server refused the export.
    Refused(String),
    /// Anything else.
    Other(String),
}

impl Failed {
    /// True when the server refused the export.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, Failed::Refused(_))
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Refused(m) | Failed::Other(m) => f.write_str(m),
        }
    }
}

impl From<String> for Failed {
    fn from(s: String) -> Failed {
        Failed::Other(s)
    }
}

impl From<&str> for Failed {
    fn from(s: &str) -> Failed {
        Failed::Other(s.to_string())
    }
}

pub(crate) fn io<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

fn read_option_reply(s: &mut impl Read) -> Result<(u32, OptionReply), String> {
    let mut msg = vec![0u8; nbd_proto::option::OPTION_REPLY_HEADER_LEN];
    s.read_exact(&mut msg).map_err(io("read option reply"))?;
    let h = OptionReplyHeader::parse(&msg).map_err(io("option reply"))?;
    msg.resize(h.message_len(), 0);
    s.read_exact(&mut msg[nbd_proto::option::OPTION_REPLY_HEADER_LEN..])
        .map_err(io("read option reply"))?;
    OptionReply::parse(&msg).map_err(io("option reply"))
}

/// Reads the greeting and returns the client flags to answer it with.
fn greet(s: &mut impl Read) -> Result<Vec<u8>, String> {
    let mut greeting = [0u8; nbd_proto::handshake::GREETING_LEN];
    s.read_exact(&mut greeting).map_err(io("read greeting"))?;
    let g = ServerGreeting::parse(&greeting).map_err(io("greeting"))?;
    let mut out = Vec::new();
    ClientFlags {
        fixed_newstyle: true,
        no_zeroes: g.handshake_flags & NBD_FLAG_NO_ZEROES != 0,
    }
    .encode(&mut out);
    Ok(out)
}

/// The whole negotiation in the clear.
pub(crate) fn negotiate(s: &mut TcpStream, export: &str) -> Result<ExportInfo, Failed> {
    let flags = greet(s)?;
    go(s, export, flags)
}

/// The negotiation the Linux kernel's NBD driver needs done before it is handed the socket
/// (`NBD_SET_SOCK`): the greeting and `NBD_OPT_GO` only, without structured replies, which
/// the driver does not read.
pub(crate) fn negotiate_simple<S: Read + Write>(
    s: &mut S,
    export: &str,
) -> Result<ExportInfo, Failed> {
    let flags = greet(s)?;
    go_options(s, export, flags, false)
}

/// The greeting and `NBD_OPT_STARTTLS`, in the clear: what comes next is the TLS
/// handshake.
pub(crate) fn start_tls(s: &mut TcpStream) -> Result<(), String> {
    let mut out = greet(s)?;
    ClientOption::StartTls.encode(&mut out);
    s.write_all(&out).map_err(io("send NBD_OPT_STARTTLS"))?;
    match read_option_reply(s)? {
        (NBD_OPT_STARTTLS, OptionReply::Ack) => Ok(()),
        (NBD_OPT_STARTTLS, OptionReply::Error { code, message }) => Err(format!(
            "the server refused TLS (NBD_OPT_STARTTLS answered {code:#x}: {message}); \
             this client does not fall back to plain NBD"
        )),
        (opt, r) => Err(format!(
            "unexpected reply to NBD_OPT_STARTTLS (option {opt}): {r:?}"
        )),
    }
}

/// Structured replies and `NBD_OPT_GO`, in the clear or over TLS, sent after `out` (what
/// is still to send before them).
fn go<S: Read + Write>(s: &mut S, export: &str, out: Vec<u8>) -> Result<ExportInfo, Failed> {
    go_options(s, export, out, true)
}

/// [`go`], asking for structured replies first when `structured`.
fn go_options<S: Read + Write>(
    s: &mut S,
    export: &str,
    mut out: Vec<u8>,
    structured: bool,
) -> Result<ExportInfo, Failed> {
    if structured {
        ClientOption::StructuredReply.encode(&mut out);
        s.write_all(&out).map_err(io("send options"))?;
        s.flush().map_err(io("send options"))?;
        match read_option_reply(s)? {
            (NBD_OPT_STRUCTURED_REPLY, OptionReply::Ack) => {}
            (_, other) => return Err(format!("structured replies refused: {other:?}").into()),
        }
        out.clear();
    }
    ClientOption::Go(InfoRequest {
        name: export.to_string(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_DESCRIPTION],
    })
    .encode(&mut out);
    s.write_all(&out).map_err(io("send NBD_OPT_GO"))?;
    s.flush().map_err(io("send NBD_OPT_GO"))?;
    let (mut size, mut flags, mut description) = (None, 0u16, String::new());
    for _ in 0..GO_REPLIES_MAX {
        match read_option_reply(s)? {
            (
                NBD_OPT_GO,
                OptionReply::Info(Info::Export {
                    size: sz,
                    transmission_flags,
                }),
            ) => {
                size = Some(sz);
                flags = transmission_flags;
            }
            (NBD_OPT_GO, OptionReply::Info(Info::Description(d))) => description = d,
            (NBD_OPT_GO, OptionReply::Info(_)) => {}
            (NBD_OPT_GO, OptionReply::Ack) => {
                let size = size.ok_or("no NBD_INFO_EXPORT before the ACK")?;
                return Ok(ExportInfo {
                    size,
                    flags,
                    description,
                });
            }
            (NBD_OPT_GO, OptionReply::Error { code, message }) => {
                return Err(Failed::Refused(format!("refused ({code:#x}): {message}")));
            }
            (opt, r) => return Err(format!("unexpected reply to option {opt}: {r:?}").into()),
        }
    }
    Err("too many replies to NBD_OPT_GO".into())
}
