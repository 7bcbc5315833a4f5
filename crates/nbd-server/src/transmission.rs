//! One connection's transmission phase: `serve` sets the connection up and tears it down;
//! the reader (this module) reads requests, serves batches of in-memory ones from its read
//! buffer, and admits the rest. Request execution is in `execution`, reply encoding in
//! `frame`, the writer task in `writer`.
//!
//! # Design notes
//!
//! ```text
//!  socket ─► reader (this task) ──spawn──► request task ──► spawn_blocking(disk call)
//!               │  takes a slot            (global Semaphore        │  or the device's
//!               │  (+ payload bytes)        `max_blocking`)          ▼  submitted future
//!               │                                      mpsc (capacity = slots) ─► writer task
//!               ├─ early errors go straight to the mpsc                 │
//!               └─ a batch of in-memory requests (`serve_buffered`) ────┴─► sink ─► socket
//!                  served from the read buffer, replies encoded and      (shared BufWriter)
//!                  written by the reader itself
//! ```
//!
//! Invariants:
//! * Every request holds one *slot* (a permit of a per-connection Semaphore of
//!   `max_in_flight`) from before it is served until its reply has been written to the
//!   sink; reads and writes also hold their payload length in permits of a per-connection
//!   byte Semaphore. So a connection never holds more than `max_in_flight` requests nor
//!   `max_in_flight_bytes` of payload, however fast it sends.
//! * Each request sent to the writer produces exactly one message on the mpsc, whose
//!   capacity is the number of slots, so sending a reply never waits. A client that stops
//!   reading stalls whoever holds the sink (the writer or the reader's batch); the slots stay
//!   held; the reader stops reading new requests. Nothing else waits.
//! * Each request task also holds a clone of a drop-to-complete `mpsc::Sender<()>` until its
//!   disk call has returned, so the end of the connection can wait for every disk call
//!   (and then flush and release) without waiting for a client that will never read.
//! * A reply cut short (shutdown while the reader was writing a batch) empties the sink:
//!   nothing more is written on a stream that is no longer in step.
//! * One pass per request: its header is parsed once, it is checked against the export once
//!   ([`Valid::check`]; the layers below assert the check), and the device's in-memory path
//!   (a block-cache probe) is tried at most once. The batch hands the request it stops at to
//!   the slow path with what it found (`Parsed`), and the slow path consumes its header from
//!   the read buffer instead of reading and parsing it again.
//! * The connection ends like on shutdown when the export's handle is revoked
//!   (`ExportHandle::revoked`), when a request's header and payload take longer than
//!   `request_timeout` to arrive, or, for a connection subject to it (see
//!   `ServerConfig::idle_timeout`), when the reader has waited `idle_timeout` for a request
//!   with none in flight.
//!
//! The simpler design, every disk call inline in the reader, was rejected: it serializes a
//! connection's requests and blocks the reactor on store I/O. Only calls the device can
//! finish in memory (a block-cache hit, a RAM write cache with room) run on the reader.
//! Handing those to the blocking pool cost two thread wake-ups per request, more CPU than
//! the copy itself, and a boot storm is almost all hits. Those whose bytes are all in the
//! read buffer are served in batches without an await: no allocation, no shutdown
//! `select!`, one write per batch of replies and no wake-up of the writer task. With the
//! VDI workload on a RAM write cache (a queue depth of 16 sends about 9 requests per read
//! of the socket) this and writing the batch on the reader took the target from 125,000 to
//! about 150,000 IOPS; sending every 4 replies instead of a whole buffer's worth, so the
//! client refills its queue while the rest are served, took it to about 235,000
//! (docs/target.md). A device that forwards requests over a connection (the target's
//! server modes) completes reads and writes without a thread waiting
//! ([`FastPath::submit_read`](disk::FastPath::submit_read)): the request task awaits
//! that future and uses the blocking pool only when the device declines or gives up.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nbd_proto::{Command, NBD_EOVERFLOW, REQUEST_LEN, Request};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::config::MAX_PAYLOAD;
use crate::conn::{ConnCtx, Export, Shutdown};
use crate::execution::{INLINE_MAX_BYTES, Job, read_into, run_job, try_inline};
use crate::frame::{Frame, Outgoing, disk_error, encode_frame, error};
use crate::limits::LogKind;
use crate::negotiate::{Negotiated, release_blocking};
use crate::source::Peer;
use crate::valid::Valid;
use crate::writer::{DIRECT_WRITE_BYTES, Sink, new_sink, write_replies};

/// Replies the reader encodes into one batch before handing it to the writer.
const BATCH_MAX_BYTES: usize = 256 << 10;
/// Replies the reader encodes into one batch before sending it. A client keeps a queue of
/// requests in flight and refills it as replies arrive: a whole read buffer's worth of
/// replies sent at once leaves the client idle while they are served and the server idle
/// while it reaps them. Sending every few replies overlaps the two; 1 costs a send per
/// request. The caps measured (2026-11-22) are in docs/target.md, "Replies every 4
/// requests".
const BATCH_MAX_REPLIES: usize = 4;
/// Bytes of the scratch buffer that discards an oversized write's payload.
const DISCARD_BUFFER_BYTES: usize = 64 << 10;

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Disc,
    Eof,
    Shutdown,
    WriterGone,
    Protocol,
    Idle,
}

/// Serves transmission until the client disconnects, breaks the protocol, or the server
/// shuts down; then finishes in-flight requests, flushes, and releases the export.
pub(crate) async fn serve<R, W>(
    reader: BufReader<R>,
    writer: W,
    neg: Negotiated,
    ctx: &Arc<ConnCtx>,
    mut shutdown: Shutdown,
    peer: &Peer,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Negotiated {
        handle,
        name,
        size,
        writable,
        structured,
        meta_context,
    } = neg;
    let export = Export {
        device: Arc::clone(&handle.device),
        size,
        writable,
        structured,
        meta_context,
    };
    tracing::debug!(%peer, export = %crate::limits::clip(&name), size, writable, structured,
        "transmission");
    shutdown.or_revoked(handle.revoked.clone());
    let cfg = &ctx.config;
    // Local clients may idle (a kernel or qemu client between guest I/O); an authenticated
    // device is accountable. Only anonymous remote connections are closed when idle.
    let idle = cfg
        .idle_timeout
        .filter(|_| !peer.is_local() && peer.client_cert.is_none());
    let slots_n = cfg.max_in_flight.max(1);
    let (tx, rx) = mpsc::channel::<Outgoing>(slots_n);
    let sink = new_sink(writer);
    let mut writer_task = tokio::spawn(write_replies(rx, Arc::clone(&sink), structured));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let budget = Budget {
        slots_n,
        slots: Arc::new(Semaphore::new(slots_n)),
        bytes: Arc::new(Semaphore::new(
            cfg.max_in_flight_bytes.max(MAX_PAYLOAD as usize),
        )),
    };
    let mut conn = Connection {
        reader,
        sink,
        export,
        ctx: Arc::clone(ctx),
        budget,
        tx,
        done: done_tx,
        shutdown,
        idle,
        peer: peer.clone(),
    };
    let end = read_requests(&mut conn).await;
    // Taken apart to let go of each part when the end of the connection needs it. The rest
    // stays in `conn` until this function returns, the reader (the socket's read half)
    // among it.
    let Connection {
        sink,
        export,
        tx,
        done: done_tx,
        ..
    } = conn;
    drop(sink);
    tracing::debug!(%peer, export = %name, ?end, "transmission ended");
    drop(tx);
    drop(done_tx);
    // Every disk call has returned once every request task dropped its clone.
    let _ = done_rx.recv().await;
    if writable {
        let dev = Arc::clone(&export.device);
        match tokio::task::spawn_blocking(move || dev.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(%peer, export = %name, error = %e, "final flush failed"),
            Err(e) => tracing::error!(%peer, export = %name, error = %e, "final flush panicked"),
        }
    }
    drop(export);
    release_blocking(handle).await;
    // The client has `drain_timeout` to read its last replies.
    if tokio::time::timeout(cfg.drain_timeout, &mut writer_task)
        .await
        .is_err()
    {
        tracing::debug!(%peer, "client did not read its last replies; dropping it");
        writer_task.abort();
    }
}

/// One connection in transmission: what the reader, its batches and the requests it admits
/// work with. [`serve`] owns it and lends it to the reader for the connection's life.
#[derive(Debug)]
struct Connection<R, W> {
    /// The client's requests and write payloads.
    reader: BufReader<R>,
    /// The write half, where the reader writes its batches (the writer task holds a clone).
    sink: Sink<W>,
    /// What the connection serves.
    export: Export,
    /// What every connection shares (metrics, the blocking pool's limit).
    ctx: Arc<ConnCtx>,
    /// The connection's in-flight limits.
    budget: Budget,
    /// Replies to the writer task; its capacity is the number of slots.
    tx: mpsc::Sender<Outgoing>,
    /// Cloned into each request task until its disk call returned: `serve` waits for the
    /// last clone before the final flush.
    done: mpsc::Sender<()>,
    /// The server's shutdown signal (or the export's revocation).
    shutdown: Shutdown,
    /// How long the reader waits for a request with none in flight; `None`: forever.
    idle: Option<Duration>,
    /// Who the client is (for logs).
    peer: Peer,
}

/// The per-connection limits.
#[derive(Debug)]
struct Budget {
    slots_n: usize,
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
}

/// Reads requests until the connection ends: serves those in the read buffer that the
/// device completes in memory in batches, then the next one the slow way (waiting for a
/// slot, for the socket, or starting a task).
async fn read_requests<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    c: &mut Connection<R, W>,
) -> End {
    loop {
        let mut batch = Batch::default();
        let left = serve_buffered(c, &mut batch);
        let full = batch.is_full();
        debug_assert!(
            !full || left.is_none(),
            "a full batch stops before parsing another request"
        );
        if batch.count > 0
            && let Err(end) = send_batch(&c.sink, batch, &mut c.shutdown).await
        {
            return end;
        }
        if full {
            // More may be servable in memory: the fast path again, not the slow one.
            continue;
        }
        if c.reader.buffer().is_empty() {
            // Wait for the client without taking a slot, then try the fast path again.
            let filled = tokio::select! {
                biased;
                () = c.shutdown.recv() => return End::Shutdown,
                () = c.tx.closed() => return End::WriterGone,
                r = c.reader.fill_buf() => r.map(<[u8]>::len),
                () = idle_wait(c.idle) => {
                    if c.budget.slots.available_permits() < c.budget.slots_n {
                        // Requests in flight: not idle, wait again.
                        continue;
                    }
                    tracing::debug!(peer = %c.peer, "closing idle connection");
                    return End::Idle;
                }
            };
            match filled {
                Ok(0) | Err(_) => return End::Eof,
                Ok(_) => continue,
            }
        }
        let slot = tokio::select! {
            biased;
            () = c.shutdown.recv() => return End::Shutdown,
            () = c.tx.closed() => return End::WriterGone,
            p = Arc::clone(&c.budget.slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return End::WriterGone,
            },
        };
        // The request has started arriving: it has `request_timeout` to arrive in full.
        let deadline = tokio::time::Instant::now() + c.ctx.config.request_timeout;
        let parsed = match left {
            Some(left) => {
                // The batch parsed this header at the head of the read buffer, and nothing
                // was read since: consumed here, not parsed again.
                debug_assert_eq!(
                    c.reader
                        .buffer()
                        .first_chunk::<REQUEST_LEN>()
                        .map(Request::parse),
                    Some(Ok(left.req)),
                    "the request the batch left is at the head of the read buffer"
                );
                c.reader.consume(REQUEST_LEN);
                left
            }
            None => match read_request(c, deadline).await {
                Ok(req) => Parsed::new(req),
                Err(end) => return end,
            },
        };
        match admit(c, parsed, slot, deadline).await {
            Ok(()) => {}
            Err(end) => return end,
        }
    }
}

/// Reads and parses the next request's header from the socket (by `deadline`).
async fn read_request<R: AsyncRead + Unpin, W>(
    c: &mut Connection<R, W>,
    deadline: tokio::time::Instant,
) -> Result<Request, End> {
    let mut head = [0u8; REQUEST_LEN];
    let read = tokio::select! {
        biased;
        () = c.shutdown.recv() => return Err(End::Shutdown),
        () = c.tx.closed() => return Err(End::WriterGone),
        r = tokio::time::timeout_at(deadline, c.reader.read_exact(&mut head)) => r,
    };
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return Err(End::Eof),
        Err(_) => return Err(request_timed_out(&c.ctx, &c.peer)),
    }
    Request::parse(&head).map_err(|e| {
        if c.ctx.logs.allow(LogKind::Protocol) {
            tracing::warn!(peer = %c.peer, error = %e, "closing connection: bad request");
        }
        c.ctx.metrics.protocol_error("request magic");
        End::Protocol
    })
}

/// A request the reader parsed, with how far it got: the batch (`serve_buffered`) leaves
/// the request it cannot serve to the slow path in one of these, so that each request's
/// header is parsed once, checked once ([`Valid::check`]), and tried in memory (a
/// block-cache probe) at most once.
#[derive(Debug)]
struct Parsed {
    req: Request,
    /// Its check, when the batch got that far.
    checked: Option<Result<Valid, Frame>>,
    /// The device declined to serve it from memory: the slow path hands it to a request
    /// task without trying again.
    declined: bool,
}

impl Parsed {
    fn new(req: Request) -> Parsed {
        Parsed {
            req,
            checked: None,
            declined: false,
        }
    }
}

/// Waits `idle`, or forever.
async fn idle_wait(idle: Option<Duration>) {
    match idle {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Logs (rate-limited) and counts a request that did not arrive in time.
fn request_timed_out(ctx: &ConnCtx, peer: &Peer) -> End {
    if ctx.logs.allow(LogKind::Protocol) {
        tracing::warn!(%peer, timeout = ?ctx.config.request_timeout,
            "closing connection: request did not arrive in time");
    }
    ctx.metrics.protocol_error("request timeout");
    End::Protocol
}

/// Replies the reader served from its read buffer, encoded, with the slots and bytes of
/// their requests, for one message to the writer.
#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    count: usize,
    slots: Option<OwnedSemaphorePermit>,
    payload: Option<OwnedSemaphorePermit>,
}

impl Batch {
    /// Whether the batch reached a cap (rather than a request it could not serve).
    fn is_full(&self) -> bool {
        self.count >= BATCH_MAX_REPLIES || self.bytes.len() >= BATCH_MAX_BYTES
    }

    fn hold(slot: &mut Option<OwnedSemaphorePermit>, p: OwnedSemaphorePermit) {
        match slot {
            Some(s) => s.merge(p),
            None => *slot = Some(p),
        }
    }
}

/// Writes the reader's batch to the socket itself: no hand-off to the writer task, so no
/// task wake-up between serving requests and sending their replies.
async fn send_batch<W: AsyncWrite + Unpin>(
    sink: &Sink<W>,
    batch: Batch,
    shutdown: &mut Shutdown,
) -> Result<(), End> {
    let mut guard = match sink.try_lock() {
        Ok(g) => g,
        Err(_) => tokio::select! {
            biased;
            () = shutdown.recv() => return Err(End::Shutdown),
            g = sink.lock() => g,
        },
    };
    let Some(w) = guard.as_mut() else {
        return Err(End::WriterGone);
    };
    let written = tokio::select! {
        biased;
        r = async {
            w.write_all(&batch.bytes).await?;
            w.flush().await
        } => Some(r),
        () = shutdown.recv() => None,
    };
    // The batch's slots and bytes are released once its replies are written.
    drop(batch);
    match written {
        Some(Ok(())) => Ok(()),
        Some(Err(_)) => {
            *guard = None;
            Err(End::WriterGone)
        }
        None => {
            *guard = None;
            Err(End::Shutdown)
        }
    }
}

/// Serves, without waiting for anything, the requests already in the read buffer that the
/// device completes in memory (block-cache hits, RAM write-cache writes), encoding their
/// replies into `batch`. Stops after [`BATCH_MAX_REPLIES`] requests (the caller sends them
/// and comes back for the rest), or at the first request that needs more: bytes not yet
/// read, a slot, the blocking pool, or an error reply of the slow path (which then serves
/// it). Returns that request when its header was parsed, with its check and whether the
/// device declined it, for the slow path to go on from.
fn serve_buffered<R: AsyncRead + Unpin, W>(
    c: &mut Connection<R, W>,
    batch: &mut Batch,
) -> Option<Parsed> {
    let Connection {
        reader,
        export,
        ctx,
        budget,
        ..
    } = c;
    let dev = export.device.as_ref();
    while !batch.is_full() {
        let buf = reader.buffer();
        let head = buf.first_chunk::<REQUEST_LEN>()?;
        // A bad header ends the connection; the slow path reports it.
        let req = Request::parse(head).ok()?;
        let mut left = Parsed::new(req);
        let payload_len = match req.command {
            Command::Read if req.len > 0 && (req.len as usize) < DIRECT_WRITE_BYTES => 0,
            Command::Write if !req.flags.fua() && req.len <= INLINE_MAX_BYTES => req.len as usize,
            _ => return Some(left),
        };
        let Some(payload) = buf.get(REQUEST_LEN..REQUEST_LEN + payload_len) else {
            return Some(left);
        };
        let valid = match Valid::check(req, export) {
            Ok(v) => v,
            Err(f) => {
                left.checked = Some(Err(f));
                return Some(left);
            }
        };
        left.checked = Some(Ok(valid));
        let Ok(slot) = Arc::clone(&budget.slots).try_acquire_owned() else {
            return Some(left);
        };
        let start = Instant::now();
        let ok = if req.command == Command::Read {
            let Ok(bytes) = Arc::clone(&budget.bytes).try_acquire_many_owned(req.len) else {
                return Some(left);
            };
            let Some(ok) = read_into(export, &valid, &mut batch.bytes) else {
                left.declined = true;
                return Some(left);
            };
            Batch::hold(&mut batch.payload, bytes);
            ok
        } else {
            valid.assert_on(export);
            let Some(r) = dev.try_write_at(payload, req.offset) else {
                left.declined = true;
                return Some(left);
            };
            let frame = match &r {
                Ok(()) => Frame::Ok,
                Err(err) => disk_error(&req, err),
            };
            encode_frame(
                req.cookie,
                false,
                &frame,
                export.structured,
                &mut batch.bytes,
            );
            r.is_ok()
        };
        ctx.metrics
            .request(req.command.name(), u64::from(req.len), start.elapsed(), ok);
        reader.consume(REQUEST_LEN + payload_len);
        Batch::hold(&mut batch.slots, slot);
        batch.count += 1;
    }
    None
}

/// Reads a request's payload (by `deadline`, plus the time spent waiting for the
/// connection's byte budget), checks it (unless the batch did), tries it in memory (unless
/// the batch did and the device declined), and starts its task (or queues its reply).
async fn admit<R: AsyncRead + Unpin, W>(
    c: &mut Connection<R, W>,
    parsed: Parsed,
    slot: OwnedSemaphorePermit,
    mut deadline: tokio::time::Instant,
) -> Result<(), End> {
    let Connection {
        reader,
        export,
        ctx,
        budget,
        tx,
        done,
        shutdown,
        peer,
        ..
    } = c;
    let Parsed {
        req,
        checked,
        declined,
    } = parsed;
    let is_read = req.command == Command::Read;
    let reply_now = |frame: Frame, slot: OwnedSemaphorePermit| Outgoing {
        cookie: req.cookie,
        is_read,
        frame,
        _slot: slot,
        _bytes: None,
    };
    if req.command == Command::Disc {
        return Err(End::Disc);
    }
    if req.command == Command::Write && req.len > MAX_PAYLOAD {
        // Keep the stream in sync without buffering the payload, then refuse.
        tokio::select! {
            biased;
            () = shutdown.recv() => return Err(End::Shutdown),
            r = tokio::time::timeout_at(deadline, discard(reader, u64::from(req.len))) => match r {
                Ok(r) => r.map_err(|_| End::Eof)?,
                Err(_) => return Err(request_timed_out(ctx, peer)),
            },
        }
        ctx.metrics
            .request("write", 0, std::time::Duration::ZERO, false);
        let f = error(
            NBD_EOVERFLOW,
            format!("write of {} bytes over {MAX_PAYLOAD}", req.len),
        );
        return tx
            .send(reply_now(f, slot))
            .await
            .map_err(|_| End::WriterGone);
    }
    let payload_bytes = match req.command {
        Command::Read | Command::Write if req.len <= MAX_PAYLOAD => req.len,
        _ => 0,
    };
    let waiting = tokio::time::Instant::now();
    let bytes = if payload_bytes > 0 {
        tokio::select! {
            biased;
            () = shutdown.recv() => return Err(End::Shutdown),
            p = Arc::clone(&budget.bytes).acquire_many_owned(payload_bytes) => {
                Some(p.map_err(|_| End::WriterGone)?)
            }
        }
    } else {
        None
    };
    // Waiting for our own budget is not the client's time.
    deadline += waiting.elapsed();
    let mut payload = Vec::new();
    if req.command == Command::Write {
        payload = vec![0u8; req.len as usize];
        tokio::select! {
            biased;
            () = shutdown.recv() => return Err(End::Shutdown),
            r = tokio::time::timeout_at(deadline, reader.read_exact(&mut payload)) => match r {
                Ok(r) => r.map_err(|_| End::Eof)?,
                Err(_) => return Err(request_timed_out(ctx, peer)),
            },
        };
    }
    let valid = match checked.unwrap_or_else(|| Valid::check(req, export)) {
        Ok(v) => v,
        Err(f) => {
            ctx.metrics
                .request(req.command.name(), 0, std::time::Duration::ZERO, false);
            return tx
                .send(reply_now(f, slot))
                .await
                .map_err(|_| End::WriterGone);
        }
    };
    let mut out = Outgoing {
        cookie: req.cookie,
        is_read,
        frame: Frame::Ok,
        _slot: slot,
        _bytes: bytes,
    };
    let start = Instant::now();
    // A request the batch tried in memory is not tried again: the device declined it.
    if !declined && let Some(frame) = try_inline(&valid, export, &mut payload) {
        // Served from memory on this task: no hand-off to the blocking pool.
        let ok = !matches!(frame, Frame::Error { .. });
        ctx.metrics
            .request(req.command.name(), u64::from(req.len), start.elapsed(), ok);
        out.frame = frame;
        return tx.send(out).await.map_err(|_| End::WriterGone);
    }
    let job = Job {
        req: valid,
        export: export.clone(),
        payload,
        out,
    };
    tokio::spawn(run_job(job, Arc::clone(ctx), tx.clone(), done.clone()));
    Ok(())
}

async fn discard<R: AsyncRead + Unpin>(reader: &mut R, mut left: u64) -> io::Result<()> {
    let mut scratch = vec![0u8; DISCARD_BUFFER_BYTES];
    while left > 0 {
        let n = scratch
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        reader.read_exact(&mut scratch[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}
