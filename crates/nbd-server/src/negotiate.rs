//! Option haggling: from the server's greeting to transmission (or to the client's leaving).
//!
//! The codec (`nbd_proto`) decodes and encodes; this module reads and writes the socket and
//! decides policy: which exports exist (the [`ExportSource`]), which transmission flags a
//! device earns, which meta contexts are served. Every read is bounded: the option header is
//! checked against [`nbd_proto::MAX_OPTION_LEN`] before its payload is allocated, and the
//! number of options is capped by [`MAX_OPTIONS_PER_HANDSHAKE`].
//!
//! Refusals: every option refused (unknown, malformed, an export that cannot be opened or
//! listed, anything but STARTTLS while TLS is required) is counted and logged through
//! [`crate::refusals`], a few lines per client per interval and a summary of the rest, so a
//! client repeating bad options cannot flood the log.
//!
//! TLS: `NBD_OPT_STARTTLS` ends this function with [`Outcome::StartTls`]; the listener runs
//! the TLS handshake and calls [`negotiate`] again over the TLS stream with the client's
//! flags (no second greeting), every other piece of state forgotten. In
//! [`TlsMode::Required`] every option but ABORT and STARTTLS is refused before TLS.

use std::sync::Arc;

use nbd_proto::option::OptionReply;
use nbd_proto::{
    ClientFlags, ClientOption, ExportNameReply, Info, InfoRequest, MetaContext, MetaQuery,
    NBD_FLAG_CAN_MULTI_CONN, NBD_FLAG_FIXED_NEWSTYLE, NBD_FLAG_HAS_FLAGS, NBD_FLAG_NO_ZEROES,
    NBD_FLAG_READ_ONLY, NBD_FLAG_SEND_CACHE, NBD_FLAG_SEND_DF, NBD_FLAG_SEND_FLUSH,
    NBD_FLAG_SEND_FUA, NBD_FLAG_SEND_TRIM, NBD_FLAG_SEND_WRITE_ZEROES, NBD_INFO_DESCRIPTION,
    NBD_INFO_NAME, NBD_REP_ERR_INVALID, NBD_REP_ERR_POLICY, NBD_REP_ERR_TLS_REQD,
    NBD_REP_ERR_UNKNOWN, NBD_REP_ERR_UNSUP, OptionError, OptionHeader, ServerGreeting,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::{
    MAX_OPTIONS_PER_HANDSHAKE, MAX_PAYLOAD, MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, TlsMode,
};
use crate::conn::ConnCtx;
use crate::limits::clip;
use crate::refusals;
use crate::source::{ExportHandle, ExportInfo, ExportSource, OpenError, Peer};

/// The context id this server gives `base:allocation` in `NBD_OPT_SET_META_CONTEXT`.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// The handshake flags this server offers.
const HANDSHAKE_FLAGS: u16 = NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES;

/// Why negotiation ended without transmission.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NegotiateError {
    /// The socket failed or the client went away.
    #[error("connection i/o")]
    Io(#[from] std::io::Error),
    /// The TLS handshake after `NBD_OPT_STARTTLS` failed.
    #[error("TLS handshake failed")]
    Tls(#[source] std::io::Error),
    /// The client broke the protocol; `what` is the metrics label.
    #[error("protocol violation ({what}): {detail}")]
    Protocol {
        /// Short static label for metrics.
        what: &'static str,
        /// Details for the log.
        detail: String,
    },
    /// `NBD_OPT_EXPORT_NAME` named an export that cannot be opened: the spec's only answer
    /// is to drop the connection. (The name is the client's: clipped when shown.)
    #[error("export {} cannot be opened: {}", clip(.name), clip(&.source.to_string()))]
    ExportName {
        /// The name asked for.
        name: String,
        /// Why.
        source: OpenError,
    },
}

/// The state transmission starts with.
#[derive(Debug)]
pub(crate) struct Negotiated {
    /// The opened export (released when the connection ends).
    pub handle: ExportHandle,
    /// The export name the client chose.
    pub name: String,
    /// Export size in bytes.
    pub size: u64,
    /// Whether writes are accepted.
    pub writable: bool,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// The context id of `base:allocation` when selected for this export.
    pub meta_context: Option<u32>,
}

/// How negotiation ended, short of an error.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The client aborted.
    Abort,
    /// Enter transmission.
    Transmit(Negotiated),
    /// `NBD_OPT_STARTTLS` was acknowledged: run the TLS handshake, then negotiate again with
    /// these client flags.
    StartTls(ClientFlags),
}

/// Negotiation state carried between options.
#[derive(Debug, Default)]
struct State {
    flags: ClientFlags,
    structured: bool,
    /// The export and contexts of the last `NBD_OPT_SET_META_CONTEXT`.
    meta: Option<(String, Vec<MetaContext>)>,
}

/// The transmission flags a device earns.
pub(crate) fn transmission_flags(writable: bool, structured: bool) -> u16 {
    let mut f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_CACHE;
    if writable {
        f |= NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES;
    } else {
        // Nothing changes a read-only export, so every connection sees the same bytes.
        f |= NBD_FLAG_READ_ONLY | NBD_FLAG_CAN_MULTI_CONN;
    }
    if structured {
        // Every read is answered with a single content chunk.
        f |= NBD_FLAG_SEND_DF;
    }
    f
}

fn protocol(what: &'static str, detail: impl std::fmt::Display) -> NegotiateError {
    NegotiateError::Protocol {
        what,
        detail: detail.to_string(),
    }
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, buf: &mut Vec<u8>) -> std::io::Result<()> {
    w.write_all(buf).await?;
    w.flush().await?;
    buf.clear();
    Ok(())
}

/// Runs option haggling for `peer`: from the greeting, or, with `resumed` (the client's
/// flags), right after a TLS upgrade.
///
/// # Errors
/// [`NegotiateError`]; the caller logs, counts and closes.
pub(crate) async fn negotiate<R, W>(
    r: &mut R,
    w: &mut W,
    ctx: &ConnCtx,
    peer: &Peer,
    resumed: Option<ClientFlags>,
) -> Result<Outcome, NegotiateError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(256);
    let flags = match resumed {
        Some(f) => f,
        None => {
            ServerGreeting {
                handshake_flags: HANDSHAKE_FLAGS,
            }
            .encode(&mut out);
            send(w, &mut out).await?;
            let mut cf = [0u8; 4];
            r.read_exact(&mut cf).await?;
            ClientFlags::parse(&cf, HANDSHAKE_FLAGS).map_err(|e| protocol("client flags", e))?
        }
    };
    let mut st = State {
        flags,
        ..State::default()
    };
    for _ in 0..MAX_OPTIONS_PER_HANDSHAKE {
        let mut head = [0u8; nbd_proto::option::OPTION_HEADER_LEN];
        r.read_exact(&mut head).await?;
        let h = match OptionHeader::parse(&head) {
            Ok(h) => h,
            Err(e @ OptionError::TooLong { option, .. }) => {
                // Answer, then drop the client without reading (or allocating) the payload.
                error_reply(option, e.reply_type(), &e.to_string(), &mut out);
                send(w, &mut out).await?;
                return Err(protocol("option too long", e));
            }
            Err(e) => return Err(protocol("option magic", e)),
        };
        let mut payload = vec![0u8; h.payload_len()];
        r.read_exact(&mut payload).await?;
        let opt = match ClientOption::parse(h, &payload) {
            Ok(o) => o,
            Err(e) => {
                refuse_option(h.option, e.reply_type(), &e.to_string(), peer, &mut out);
                send(w, &mut out).await?;
                continue;
            }
        };
        let step = option(opt, h.option, &mut st, ctx, peer, &mut out).await?;
        send(w, &mut out).await?;
        match step {
            Step::Continue => {}
            Step::Done(o) => return Ok(o),
        }
    }
    Err(protocol(
        "too many options",
        format!("more than {MAX_OPTIONS_PER_HANDSHAKE} options"),
    ))
}

/// Answers a refused option with an error reply of type `code`, and counts the refusal
/// (its debug line rate-limited per client).
fn refuse_option(option: u32, code: u32, message: &str, peer: &Peer, out: &mut Vec<u8>) {
    if refusals::logged(peer) {
        tracing::debug!(%peer, option, reply = code, message = %clip(message), "option refused");
    }
    error_reply(option, code, message, out);
}

fn error_reply(option: u32, code: u32, message: &str, out: &mut Vec<u8>) {
    OptionReply::Error {
        code,
        message: message.to_string(),
    }
    .encode(option, out);
}

/// What follows an option.
#[derive(Debug)]
enum Step {
    /// More options.
    Continue,
    /// Negotiation (or this phase of it) is over.
    Done(Outcome),
}

/// Whether `peer` must upgrade to TLS before this option is served.
fn tls_first(ctx: &ConnCtx, peer: &Peer) -> bool {
    !peer.tls && ctx.config.tls.is_some() && ctx.config.tls_mode == TlsMode::Required
}

/// Handles one option, appending its replies to `out`.
async fn option(
    opt: ClientOption,
    code: u32,
    st: &mut State,
    ctx: &ConnCtx,
    peer: &Peer,
    out: &mut Vec<u8>,
) -> Result<Step, NegotiateError> {
    let registry = &ctx.registry;
    if tls_first(ctx, peer) {
        match opt {
            ClientOption::Abort | ClientOption::StartTls => {}
            ClientOption::ExportName(name) => {
                return Err(NegotiateError::ExportName {
                    name,
                    source: OpenError::TlsRequired("this server requires TLS".into()),
                });
            }
            _ => {
                let msg = "this server requires TLS: send NBD_OPT_STARTTLS first";
                refuse_option(code, NBD_REP_ERR_TLS_REQD, msg, peer, out);
                return Ok(Step::Continue);
            }
        }
    }
    match opt {
        ClientOption::ExportName(name) => {
            let handle =
                open(registry, &name, peer)
                    .await
                    .map_err(|source| NegotiateError::ExportName {
                        name: name.clone(),
                        source,
                    })?;
            let n = negotiated(handle, name, st);
            ExportNameReply {
                size: n.size,
                transmission_flags: transmission_flags(n.writable, n.structured),
            }
            .encode(st.flags.no_zeroes, out);
            return Ok(Step::Done(Outcome::Transmit(n)));
        }
        ClientOption::Abort => {
            OptionReply::Ack.encode(code, out);
            return Ok(Step::Done(Outcome::Abort));
        }
        ClientOption::List => list(code, ctx, peer, out).await,
        ClientOption::StartTls if peer.tls => {
            refuse_option(
                code,
                NBD_REP_ERR_INVALID,
                "TLS is already in use",
                peer,
                out,
            );
        }
        ClientOption::StartTls if ctx.config.tls.is_none() => {
            refuse_option(code, NBD_REP_ERR_UNSUP, "TLS is not configured", peer, out);
        }
        ClientOption::StartTls => {
            OptionReply::Ack.encode(code, out);
            return Ok(Step::Done(Outcome::StartTls(st.flags)));
        }
        ClientOption::Info(req) => {
            if let Some(handle) = info(code, &req, st, ctx, peer, out).await {
                release_blocking(handle).await;
            }
        }
        ClientOption::Go(req) => {
            if let Some(handle) = info(code, &req, st, ctx, peer, out).await {
                let n = negotiated(handle, req.name, st);
                return Ok(Step::Done(Outcome::Transmit(n)));
            }
        }
        ClientOption::StructuredReply => {
            st.structured = true;
            OptionReply::Ack.encode(code, out);
        }
        ClientOption::ListMetaContext(q) => meta_context(code, &q, false, st, out),
        ClientOption::SetMetaContext(q) => meta_context(code, &q, true, st, out),
        ClientOption::Unknown(o) => {
            let msg = format!("unknown option {o}");
            refuse_option(code, NBD_REP_ERR_UNSUP, &msg, peer, out);
        }
    }
    Ok(Step::Continue)
}

fn negotiated(handle: ExportHandle, name: String, st: &State) -> Negotiated {
    let writable = handle.writable && handle.device.can_write();
    let meta_context = match &st.meta {
        Some((export, ctxs)) if *export == name && ctxs.contains(&MetaContext::BaseAllocation) => {
            Some(BASE_ALLOCATION_ID)
        }
        _ => None,
    };
    Negotiated {
        size: handle.device.size(),
        handle,
        name,
        writable,
        structured: st.structured,
        meta_context,
    }
}

/// Opens an export on the blocking pool (opening a chain reads files).
async fn open(
    registry: &Arc<dyn ExportSource>,
    name: &str,
    peer: &Peer,
) -> Result<ExportHandle, OpenError> {
    let reg = Arc::clone(registry);
    let n = name.to_string();
    let p = peer.clone();
    tokio::task::spawn_blocking(move || reg.open(&n, &p))
        .await
        .unwrap_or_else(|e| Err(OpenError::Other(format!("open task failed: {e}"))))
}

/// Drops a handle (running its `release`) on the blocking pool.
pub(crate) async fn release_blocking(mut handle: ExportHandle) {
    if let Some(release) = handle.release.take()
        && let Err(e) = tokio::task::spawn_blocking(release).await
    {
        tracing::error!(error = %e, "export release panicked");
    }
}

/// The option reply code of a refusal.
fn refusal(e: &OpenError) -> u32 {
    match e {
        OpenError::Busy(_) | OpenError::Forbidden(_) => NBD_REP_ERR_POLICY,
        OpenError::TlsRequired(_) => NBD_REP_ERR_TLS_REQD,
        OpenError::NotFound(_) | OpenError::Other(_) => NBD_REP_ERR_UNKNOWN,
    }
}

/// Answers a refused export with `e` and counts it; its line (the name clipped) is
/// rate-limited per client.
fn refuse(code: u32, name: &str, e: &OpenError, peer: &Peer, out: &mut Vec<u8>) {
    if refusals::logged(peer) {
        tracing::info!(%peer, export = %clip(name), error = %clip(&e.to_string()),
            "export refused");
    }
    error_reply(code, refusal(e), &e.to_string(), out);
}

/// Lists the exports `peer` may see, on the blocking pool.
async fn list_blocking(ctx: &ConnCtx, peer: &Peer) -> Result<Vec<ExportInfo>, OpenError> {
    let reg = Arc::clone(&ctx.registry);
    let p = peer.clone();
    tokio::task::spawn_blocking(move || reg.list(&p))
        .await
        .unwrap_or_else(|e| Err(OpenError::Other(format!("listing failed: {e}"))))
}

async fn list(code: u32, ctx: &ConnCtx, peer: &Peer, out: &mut Vec<u8>) {
    match list_blocking(ctx, peer).await {
        Ok(exports) => {
            for e in exports {
                OptionReply::Server {
                    name: e.name,
                    description: e.description,
                }
                .encode(code, out);
            }
            OptionReply::Ack.encode(code, out);
        }
        Err(e) => refuse(code, "", &e, peer, out),
    }
}

/// Answers `NBD_OPT_INFO` / `NBD_OPT_GO`; returns the opened handle on success.
async fn info(
    code: u32,
    req: &InfoRequest,
    st: &State,
    ctx: &ConnCtx,
    peer: &Peer,
    out: &mut Vec<u8>,
) -> Option<ExportHandle> {
    let handle = match open(&ctx.registry, &req.name, peer).await {
        Ok(h) => h,
        Err(e) => {
            refuse(code, &req.name, &e, peer, out);
            return None;
        }
    };
    let writable = handle.writable && handle.device.can_write();
    let infos = [
        Info::Export {
            size: handle.device.size(),
            transmission_flags: transmission_flags(writable, st.structured),
        },
        // Sent whether asked for or not: the constraints are the spec's defaults.
        Info::BlockSize {
            min: MIN_BLOCK_SIZE,
            preferred: PREFERRED_BLOCK_SIZE,
            max: MAX_PAYLOAD,
        },
    ];
    for i in infos {
        OptionReply::Info(i).encode(code, out);
    }
    if req.requests.contains(&NBD_INFO_NAME) {
        OptionReply::Info(Info::Name(req.name.clone())).encode(code, out);
    }
    if req.requests.contains(&NBD_INFO_DESCRIPTION) {
        let desc = list_blocking(ctx, peer)
            .await
            .ok()
            .and_then(|l| l.into_iter().find(|e| e.name == req.name))
            .map(|e| e.description)
            .filter(|d| !d.is_empty());
        if let Some(d) = desc {
            OptionReply::Info(Info::Description(d)).encode(code, out);
        }
    }
    OptionReply::Ack.encode(code, out);
    Some(handle)
}

fn meta_context(code: u32, q: &MetaQuery, set: bool, st: &mut State, out: &mut Vec<u8>) {
    if set {
        // "Issuing this command replaces all previously-set metadata contexts (including
        // when this command fails)".
        st.meta = None;
    }
    if !st.structured {
        let msg = "negotiate NBD_OPT_STRUCTURED_REPLY first";
        error_reply(code, NBD_REP_ERR_INVALID, msg, out);
        return;
    }
    let ctxs = if set { q.selected() } else { q.listed() };
    for c in &ctxs {
        let id = if set { BASE_ALLOCATION_ID } else { 0 };
        OptionReply::MetaContext {
            id,
            name: c.name().to_string(),
        }
        .encode(code, out);
    }
    OptionReply::Ack.encode(code, out);
    if set {
        st.meta = Some((q.export.clone(), ctxs));
    }
}
