//! One connection's transmission phase.
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
//! ([`BlockDevice::submit_read`]): the request task awaits that future and uses the
//! blocking pool only when the device declines or gives up.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use disk::device::Piece;
use disk::ops::convert::is_zero;
use disk::{BlockDevice, ExtentKind};
use nbd_proto::reply::{Chunk, ChunkPayload, Descriptor, SimpleReply, encode_offset_data_header};
use nbd_proto::{
    Command, NBD_EINVAL, NBD_EIO, NBD_ENOSPC, NBD_EOVERFLOW, NBD_EPERM, NBD_STATE_HOLE,
    NBD_STATE_ZERO, REQUEST_LEN, Request,
};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::listener::{ConnCtx, Shutdown};
use crate::negotiate::{Negotiated, release_blocking};
use crate::{MAX_BLOCK_STATUS_EXTENTS, MAX_BLOCK_STATUS_QUERY, MAX_PAYLOAD, to_nbd_errno};

/// Bytes of the writer's buffer.
const WRITE_BUFFER_BYTES: usize = 256 << 10;
/// Replies the reader encodes into one batch before handing it to the writer.
const BATCH_MAX_BYTES: usize = 256 << 10;
/// Replies the reader encodes into one batch before sending it. A client keeps a queue of
/// requests in flight and refills it as replies arrive: a whole read buffer's worth of
/// replies sent at once leaves the client idle while they are served and the server idle
/// while it reaps them. Sending every few replies overlaps the two. The VDI workload on a
/// RAM write cache, fio at queue depth 16: 177k IOPS with no cap; with a cap of 16, 8, 4
/// and 2: 164-170k, 214-217k, 229-236k and 236-240k; 1 costs a send per request (207k
/// before the fast path resumed after a full batch). Server-side block-cache reads: no
/// change.
const BATCH_MAX_REPLIES: usize = 4;
/// Bytes of the scratch buffer that discards an oversized write's payload.
const DISCARD_BUFFER_BYTES: usize = 64 << 10;
/// The largest read or write served on the connection's own task when the device can do it
/// in memory (a copy of this size takes tens of microseconds; larger ones go to the pool
/// so one client's big reads do not hold up the reactor).
const INLINE_MAX_BYTES: u32 = 1 << 20;
/// Shared reads of at least this many bytes skip the write buffer.
const DIRECT_WRITE_BYTES: usize = 64 << 10;
/// Bytes per step of `NBD_CMD_WRITE_ZEROES` with `NBD_CMD_FLAG_NO_HOLE` and of
/// `NBD_CMD_CACHE`.
const ZERO_STEP_BYTES: usize = 1 << 20;

/// What one connection serves.
#[derive(Debug, Clone)]
struct Export {
    device: Arc<dyn BlockDevice>,
    size: u64,
    writable: bool,
    structured: bool,
    meta_context: Option<u32>,
}

/// The result of one request, before encoding.
#[derive(Debug)]
enum Frame {
    /// Success without data.
    Ok,
    /// Read data.
    Data { offset: u64, data: Vec<u8> },
    /// Read data as pieces of the device's own buffers (a block cache's entries), written
    /// to the socket without a copy into a reply buffer.
    Shared {
        offset: u64,
        len: usize,
        pieces: Vec<Piece>,
    },
    /// A read that returned only zeros (structured replies only).
    Hole { offset: u64, len: u32 },
    /// Failure.
    Error { errno: u32, message: String },
    /// `base:allocation` descriptors.
    BlockStatus {
        context_id: u32,
        descriptors: Vec<Descriptor>,
    },
}

/// A reply on its way to the writer, with the budget it holds until written.
#[derive(Debug)]
struct Outgoing {
    cookie: u64,
    is_read: bool,
    frame: Frame,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Disc,
    Eof,
    Shutdown,
    WriterGone,
    Protocol,
}

/// Serves transmission until the client disconnects, breaks the protocol, or the server
/// shuts down; then finishes in-flight requests, flushes, and releases the export.
pub(crate) async fn serve<R, W>(
    mut reader: BufReader<R>,
    writer: W,
    neg: Negotiated,
    ctx: &Arc<ConnCtx>,
    shutdown: &mut Shutdown,
    peer: &str,
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
    tracing::debug!(%peer, export = %name, size, writable, structured, "transmission");
    let cfg = &ctx.config;
    let slots_n = cfg.max_in_flight.max(1);
    let (tx, rx) = mpsc::channel::<Outgoing>(slots_n);
    let sink: Sink<W> = Arc::new(tokio::sync::Mutex::new(Some(BufWriter::with_capacity(
        WRITE_BUFFER_BYTES,
        writer,
    ))));
    let mut writer_task = tokio::spawn(write_replies(rx, Arc::clone(&sink), structured));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let budget = Budget {
        slots: Arc::new(Semaphore::new(slots_n)),
        bytes: Arc::new(Semaphore::new(
            cfg.max_in_flight_bytes.max(MAX_PAYLOAD as usize),
        )),
    };
    let end = read_requests(
        &mut reader,
        &sink,
        &export,
        ctx,
        &budget,
        &tx,
        &done_tx,
        shutdown,
    )
    .await;
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

/// The per-connection limits.
#[derive(Debug)]
struct Budget {
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
}

/// Reads requests until the connection ends: serves those in the read buffer that the
/// device completes in memory in batches, then the next one the slow way (waiting for a
/// slot, for the socket, or starting a task).
#[allow(clippy::too_many_arguments)]
async fn read_requests<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut BufReader<R>,
    sink: &Sink<W>,
    export: &Export,
    ctx: &Arc<ConnCtx>,
    budget: &Budget,
    tx: &mpsc::Sender<Outgoing>,
    done: &mpsc::Sender<()>,
    shutdown: &mut Shutdown,
) -> End {
    loop {
        let mut batch = Batch::default();
        serve_buffered(reader, export, ctx, budget, &mut batch);
        let full = batch.is_full();
        if batch.count > 0
            && let Err(end) = send_batch(sink, batch, shutdown).await
        {
            return end;
        }
        if full {
            // More may be servable in memory: the fast path again, not the slow one.
            continue;
        }
        if reader.buffer().is_empty() {
            // Wait for the client without taking a slot, then try the fast path again.
            let filled = tokio::select! {
                biased;
                () = shutdown.recv() => return End::Shutdown,
                () = tx.closed() => return End::WriterGone,
                r = reader.fill_buf() => r.map(<[u8]>::len),
            };
            match filled {
                Ok(0) | Err(_) => return End::Eof,
                Ok(_) => continue,
            }
        }
        let slot = tokio::select! {
            biased;
            () = shutdown.recv() => return End::Shutdown,
            () = tx.closed() => return End::WriterGone,
            p = Arc::clone(&budget.slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return End::WriterGone,
            },
        };
        let mut head = [0u8; REQUEST_LEN];
        let read = tokio::select! {
            biased;
            () = shutdown.recv() => return End::Shutdown,
            () = tx.closed() => return End::WriterGone,
            r = reader.read_exact(&mut head) => r,
        };
        if read.is_err() {
            return End::Eof;
        }
        let req = match Request::parse(&head) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "closing connection: bad request");
                ctx.metrics.protocol_error("request magic");
                return End::Protocol;
            }
        };
        match admit(reader, req, export, ctx, budget, slot, tx, done, shutdown).await {
            Ok(()) => {}
            Err(end) => return end,
        }
    }
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

/// The connection's write half, shared by the writer task (replies of requests served on
/// the blocking pool) and the reader (its batches). `None` once a reply was cut short: the
/// stream cannot go on.
type Sink<W> = Arc<tokio::sync::Mutex<Option<BufWriter<W>>>>;

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
/// it).
fn serve_buffered<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    export: &Export,
    ctx: &ConnCtx,
    budget: &Budget,
    batch: &mut Batch,
) {
    let dev = export.device.as_ref();
    while !batch.is_full() {
        let buf = reader.buffer();
        let Some(head) = buf.first_chunk::<REQUEST_LEN>() else {
            break;
        };
        let Ok(req) = Request::parse(head) else {
            break;
        };
        let payload_len = match req.command {
            Command::Read if req.len > 0 && (req.len as usize) < DIRECT_WRITE_BYTES => 0,
            Command::Write if !req.flags.fua() && req.len <= INLINE_MAX_BYTES => req.len as usize,
            _ => break,
        };
        let Some(payload) = buf.get(REQUEST_LEN..REQUEST_LEN + payload_len) else {
            break;
        };
        if validate(&req, export).is_err() {
            break;
        }
        let Ok(slot) = Arc::clone(&budget.slots).try_acquire_owned() else {
            break;
        };
        let start = Instant::now();
        let ok = if req.command == Command::Read {
            let Ok(bytes) = Arc::clone(&budget.bytes).try_acquire_many_owned(req.len) else {
                break;
            };
            let Some(ok) = read_into(dev, &req, export.structured, &mut batch.bytes) else {
                break;
            };
            Batch::hold(&mut batch.payload, bytes);
            ok
        } else {
            let Some(r) = dev.try_write_at(payload, req.offset) else {
                break;
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
}

/// Reads `req`'s range from memory, appending its encoded reply to `out`; `None` (nothing
/// appended) when the device cannot answer without waiting. Returns whether the read
/// succeeded.
fn read_into(
    dev: &dyn BlockDevice,
    req: &Request,
    structured: bool,
    out: &mut Vec<u8>,
) -> Option<bool> {
    let mark = out.len();
    let len = req.len as usize;
    let data_header = |out: &mut Vec<u8>| {
        if structured {
            // At most DIRECT_WRITE_BYTES: the length fits.
            let _ = encode_offset_data_header(req.cookie, req.offset, len, true, out);
        } else {
            SimpleReply {
                error: 0,
                cookie: req.cookie,
            }
            .encode(out);
        }
    };
    if let Some(r) = dev.try_read_shared(req.offset, u64::from(req.len)) {
        let frame = shared_frame(req, r, structured);
        // A shared read's header; the pieces follow.
        encode_frame(req.cookie, true, &frame, structured, out);
        if let Frame::Shared { pieces, .. } = &frame {
            for p in pieces {
                match p.bytes() {
                    Some(b) => out.extend_from_slice(b),
                    None => out.resize(out.len() + p.len(), 0),
                }
            }
        }
        return Some(!matches!(frame, Frame::Error { .. }));
    }
    if dev.shares_reads() {
        return None;
    }
    data_header(out);
    let at = out.len();
    out.resize(at + len, 0);
    match dev.try_read_at(&mut out[at..], req.offset) {
        None => {
            out.truncate(mark);
            None
        }
        Some(Err(err)) => {
            out.truncate(mark);
            encode_frame(req.cookie, true, &disk_error(req, &err), structured, out);
            Some(false)
        }
        Some(Ok(())) => {
            if structured && is_zero(&out[at..]) {
                out.truncate(mark);
                let hole = Frame::Hole {
                    offset: req.offset,
                    len: req.len,
                };
                encode_frame(req.cookie, true, &hole, structured, out);
            }
            Some(true)
        }
    }
}

/// Reads a request's payload, validates it, and starts its task (or queues its error).
#[allow(clippy::too_many_arguments)]
async fn admit<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    req: Request,
    export: &Export,
    ctx: &Arc<ConnCtx>,
    budget: &Budget,
    slot: OwnedSemaphorePermit,
    tx: &mpsc::Sender<Outgoing>,
    done: &mpsc::Sender<()>,
    shutdown: &mut Shutdown,
) -> Result<(), End> {
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
            r = discard(reader, u64::from(req.len)) => r.map_err(|_| End::Eof)?,
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
    let mut payload = Vec::new();
    if req.command == Command::Write {
        payload = vec![0u8; req.len as usize];
        tokio::select! {
            biased;
            () = shutdown.recv() => return Err(End::Shutdown),
            r = reader.read_exact(&mut payload) => r.map_err(|_| End::Eof)?,
        };
    }
    if let Err(f) = validate(&req, export) {
        ctx.metrics
            .request(req.command.name(), 0, std::time::Duration::ZERO, false);
        return tx
            .send(reply_now(f, slot))
            .await
            .map_err(|_| End::WriterGone);
    }
    let mut out = Outgoing {
        cookie: req.cookie,
        is_read,
        frame: Frame::Ok,
        _slot: slot,
        _bytes: bytes,
    };
    let start = Instant::now();
    if let Some(frame) = try_inline(&req, export, &mut payload) {
        // Served from memory on this task: no hand-off to the blocking pool.
        let ok = !matches!(frame, Frame::Error { .. });
        ctx.metrics
            .request(req.command.name(), u64::from(req.len), start.elapsed(), ok);
        out.frame = frame;
        return tx.send(out).await.map_err(|_| End::WriterGone);
    }
    let job = Job {
        req,
        export: export.clone(),
        payload,
        out,
    };
    tokio::spawn(run_job(job, Arc::clone(ctx), tx.clone(), done.clone()));
    Ok(())
}

/// Serves a read or write that the device can complete in memory without blocking (a block
/// cache hit, a RAM write cache with room), or returns `None` to send it to the blocking
/// pool. A read's buffer is left in `payload` for the pool to reuse.
fn try_inline(req: &Request, e: &Export, payload: &mut Vec<u8>) -> Option<Frame> {
    let dev = e.device.as_ref();
    match req.command {
        Command::Read if req.len > 0 => {
            if let Some(r) = dev.try_read_shared(req.offset, u64::from(req.len)) {
                return Some(shared_frame(req, r, e.structured));
            }
            if dev.shares_reads() || req.len > INLINE_MAX_BYTES {
                return None;
            }
            payload.resize(req.len as usize, 0);
            let r = dev.try_read_at(payload, req.offset)?;
            let data = std::mem::take(payload);
            Some(read_frame(req, r, data, e.structured))
        }
        Command::Write if !req.flags.fua() && req.len <= INLINE_MAX_BYTES => {
            match dev.try_write_at(payload, req.offset)? {
                Ok(()) => Some(Frame::Ok),
                Err(err) => Some(disk_error(req, &err)),
            }
        }
        _ => None,
    }
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

fn error(errno: u32, message: impl Into<String>) -> Frame {
    Frame::Error {
        errno,
        message: message.into(),
    }
}

/// Checks a request against the export before any disk call.
fn validate(req: &Request, e: &Export) -> Result<(), Frame> {
    let cmd = req.command;
    if let Command::Unknown(c) = cmd {
        return Err(error(NBD_EINVAL, format!("unknown command {c}")));
    }
    let bad = req.unknown_flags();
    if bad != 0 || (req.flags.df() && !e.structured) || req.flags.fast_zero() {
        return Err(error(
            NBD_EINVAL,
            format!("flags {:#x} not valid for {}", req.flags.0, cmd.name()),
        ));
    }
    let writes = matches!(cmd, Command::Write | Command::Trim | Command::WriteZeroes);
    if writes && !e.writable {
        return Err(error(NBD_EPERM, "export is read-only"));
    }
    match cmd {
        Command::Read | Command::Cache if req.len > MAX_PAYLOAD => {
            return Err(error(
                NBD_EOVERFLOW,
                format!("{} of {} bytes over {MAX_PAYLOAD}", cmd.name(), req.len),
            ));
        }
        Command::BlockStatus if e.meta_context.is_none() => {
            return Err(error(NBD_EINVAL, "no metadata context negotiated"));
        }
        Command::BlockStatus if req.len == 0 => {
            return Err(error(NBD_EINVAL, "zero-length block status"));
        }
        Command::Flush => return Ok(()),
        _ => {}
    }
    match req.end() {
        Some(end) if end <= e.size => Ok(()),
        _ => {
            let errno = if matches!(cmd, Command::Write | Command::WriteZeroes) {
                NBD_ENOSPC
            } else {
                NBD_EINVAL
            };
            Err(error(
                errno,
                format!(
                    "{} at {:#x}+{:#x} past the end ({:#x})",
                    cmd.name(),
                    req.offset,
                    req.len,
                    e.size
                ),
            ))
        }
    }
}

/// A validated request on its way to the blocking pool.
#[derive(Debug)]
struct Job {
    req: Request,
    export: Export,
    payload: Vec<u8>,
    out: Outgoing,
}

async fn run_job(job: Job, ctx: Arc<ConnCtx>, tx: mpsc::Sender<Outgoing>, done: mpsc::Sender<()>) {
    let Job {
        req,
        export,
        payload,
        mut out,
    } = job;
    let start = Instant::now();
    let frame = match submitted(&req, &export, &payload).await {
        Some(frame) => frame,
        None => blocking(req, export, payload, &ctx).await,
    };
    drop(done);
    let ok = !matches!(frame, Frame::Error { .. });
    let bytes = match req.command {
        Command::Read | Command::Write => u64::from(req.len),
        _ => 0,
    };
    ctx.metrics
        .request(req.command.name(), bytes, start.elapsed(), ok);
    out.frame = frame;
    // Never waits: the channel has a place for every slot.
    let _ = tx.send(out).await;
}

/// Serves a read or write the device completes without a thread of ours waiting on it
/// ([`BlockDevice::submit_read`]: the target forwarding to its server); `None` to make the
/// blocking call.
async fn submitted(req: &Request, e: &Export, payload: &[u8]) -> Option<Frame> {
    let dev = e.device.as_ref();
    match req.command {
        Command::Read if req.len > 0 => {
            let r = dev.submit_read(req.offset, req.len as usize)?.await?;
            Some(match r {
                Ok(data) => read_frame(req, Ok(()), data, e.structured),
                Err(err) => disk_error(req, &err),
            })
        }
        Command::Write if !req.flags.fua() => {
            let r = dev.submit_write(payload, req.offset)?.await?;
            Some(match r {
                Ok(()) => Frame::Ok,
                Err(err) => disk_error(req, &err),
            })
        }
        _ => None,
    }
}

/// The disk call on the blocking pool, under the global `max_blocking` limit.
async fn blocking(req: Request, export: Export, payload: Vec<u8>, ctx: &ConnCtx) -> Frame {
    match Arc::clone(&ctx.blocking).acquire_owned().await {
        Ok(permit) => {
            let r = tokio::task::spawn_blocking(move || {
                let f = execute(&req, &export, payload);
                drop(permit);
                f
            })
            .await;
            r.unwrap_or_else(|e| {
                tracing::error!(error = %e, "disk call panicked");
                error(NBD_EIO, "internal error")
            })
        }
        Err(_) => error(NBD_EIO, "server is shutting down"),
    }
}

/// The disk call of one request (on the blocking pool).
fn execute(req: &Request, e: &Export, payload: Vec<u8>) -> Frame {
    let dev = e.device.as_ref();
    let r = match req.command {
        Command::Read => return read(dev, req, e.structured, payload),
        Command::Write => dev.write_at(&payload, req.offset),
        Command::Flush => dev.flush(),
        Command::Trim => dev.trim(req.offset, u64::from(req.len)),
        Command::WriteZeroes if req.flags.no_hole() => write_zeros(dev, req),
        Command::WriteZeroes => dev.write_zeroes(req.offset, u64::from(req.len)),
        Command::Cache => cache(dev, req),
        Command::BlockStatus => return block_status(dev, req, e),
        Command::Disc | Command::Unknown(_) => {
            // validate() refuses unknown commands and admit() never queues DISC.
            unreachable!("command {:?} is never executed", req.command)
        }
    };
    let r = r.and_then(|()| {
        let writes = matches!(
            req.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && req.flags.fua() {
            dev.flush()
        } else {
            Ok(())
        }
    });
    match r {
        Ok(()) => Frame::Ok,
        Err(err) => disk_error(req, &err),
    }
}

fn disk_error(req: &Request, err: &disk::Error) -> Frame {
    tracing::warn!(command = req.command.name(), offset = req.offset, len = req.len,
        error = %disk::error::chain_to_string(err), "disk call failed");
    error(to_nbd_errno(err), err.to_string())
}

fn read(dev: &dyn BlockDevice, req: &Request, structured: bool, mut data: Vec<u8>) -> Frame {
    if req.len == 0 {
        return Frame::Ok;
    }
    // A block cache fills what is missing and answers with its own buffers: the reply is
    // written from them, with no copy into a reply buffer.
    if let Some(r) = dev.read_shared(req.offset, u64::from(req.len)) {
        return shared_frame(req, r, structured);
    }
    data.resize(req.len as usize, 0);
    let r = dev.read_at(&mut data, req.offset);
    read_frame(req, r, data, structured)
}

/// The reply to a read answered with shared pieces.
fn shared_frame(req: &Request, r: disk::Result<Vec<Piece>>, structured: bool) -> Frame {
    match r {
        Err(err) => disk_error(req, &err),
        Ok(pieces) if structured && pieces.iter().all(|p| p.bytes().is_none()) => Frame::Hole {
            offset: req.offset,
            len: req.len,
        },
        Ok(pieces) => Frame::Shared {
            offset: req.offset,
            len: req.len as usize,
            pieces,
        },
    }
}

/// The reply to a read of `data` whose outcome was `r`.
fn read_frame(req: &Request, r: disk::Result<()>, data: Vec<u8>, structured: bool) -> Frame {
    if let Err(err) = r {
        return disk_error(req, &err);
    }
    if structured && is_zero(&data) {
        return Frame::Hole {
            offset: req.offset,
            len: req.len,
        };
    }
    Frame::Data {
        offset: req.offset,
        data,
    }
}

fn write_zeros(dev: &dyn BlockDevice, req: &Request) -> disk::Result<()> {
    let len = u64::from(req.len);
    let zeros = vec![0u8; ZERO_STEP_BYTES.min(req.len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        dev.write_at(&zeros[..n as usize], req.offset + done)?;
        done += n;
    }
    Ok(())
}

/// `NBD_CMD_CACHE`: reads the range (warming any cache below) and drops the bytes.
fn cache(dev: &dyn BlockDevice, req: &Request) -> disk::Result<()> {
    let len = u64::from(req.len);
    let mut buf = vec![0u8; ZERO_STEP_BYTES.min(req.len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64);
        dev.read_at(&mut buf[..n as usize], req.offset + done)?;
        done += n;
    }
    Ok(())
}

/// The `base:allocation` flags of an extent kind.
fn allocation_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Data => 0,
        ExtentKind::Zero => NBD_STATE_ZERO,
        ExtentKind::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
    }
}

fn block_status(dev: &dyn BlockDevice, req: &Request, e: &Export) -> Frame {
    let Some(context_id) = e.meta_context else {
        return error(NBD_EINVAL, "no metadata context negotiated");
    };
    let len = req.len.min(MAX_BLOCK_STATUS_QUERY);
    let extents = match disk::device::extents(dev, req.offset, u64::from(len)) {
        Ok(x) => x,
        Err(err) => return disk_error(req, &err),
    };
    let limit = if req.flags.req_one() {
        1
    } else {
        MAX_BLOCK_STATUS_EXTENTS
    };
    // Each extent lies inside the query, so its length fits the request's 32 bits.
    let descriptors: Vec<Descriptor> = extents
        .iter()
        .filter(|x| x.len > 0)
        .take(limit)
        .map(|x| Descriptor {
            len: u32::try_from(x.len).unwrap_or(u32::MAX),
            flags: allocation_flags(x.kind),
        })
        .collect();
    if descriptors.is_empty() {
        return error(NBD_EIO, "no extents for a nonempty range");
    }
    Frame::BlockStatus {
        context_id,
        descriptors,
    }
}

/// Writes the replies of requests served on the blocking pool, in the order they complete;
/// flushes when none is waiting.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Outgoing>,
    sink: Sink<W>,
    structured: bool,
) -> io::Result<()> {
    let mut head = Vec::with_capacity(64);
    while let Some(mut out) = rx.recv().await {
        let mut guard = sink.lock().await;
        let Some(w) = guard.as_mut() else {
            // The reader cut a batch short: nothing more can be sent.
            return Ok(());
        };
        let r = async {
            loop {
                write_reply(w, &out, structured, &mut head).await?;
                // Releases the request's slot and bytes.
                drop(out);
                match rx.try_recv() {
                    Ok(next) => out = next,
                    Err(_) => break,
                }
            }
            w.flush().await
        }
        .await;
        if r.is_err() {
            *guard = None;
            return r;
        }
    }
    let mut guard = sink.lock().await;
    match guard.as_mut() {
        Some(w) => {
            w.flush().await?;
            w.shutdown().await
        }
        None => Ok(()),
    }
}

/// Writes one reply.
async fn write_reply<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    out: &Outgoing,
    structured: bool,
    head: &mut Vec<u8>,
) -> io::Result<()> {
    head.clear();
    let data = encode_frame(out.cookie, out.is_read, &out.frame, structured, head);
    if let Frame::Shared { len, pieces, .. } = &out.frame
        && *len >= DIRECT_WRITE_BYTES
        && data.is_none()
        && w.buffer().is_empty()
    {
        // The header goes out in the same vectored write as the pieces: sent on its own
        // (a flush), it was a segment and a loopback delivery of its own per reply, a
        // tenth of the server's CPU on a cold nbdcopy of 2 GiB.
        return write_vectored_all(w.get_mut(), Some(head), pieces).await;
    }
    w.write_all(head).await?;
    if let Some(d) = data {
        w.write_all(d).await?;
    }
    if let Frame::Shared { len, pieces, .. } = &out.frame {
        write_pieces(w, *len, pieces).await?;
    }
    Ok(())
}

/// Zeros for the zero pieces of a shared read.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Writes a shared read's pieces: small replies through the buffer (batched with others),
/// large ones straight from the cache's buffers to the socket with vectored writes.
async fn write_pieces<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    len: usize,
    pieces: &[Piece],
) -> io::Result<()> {
    if len < DIRECT_WRITE_BYTES {
        for p in pieces {
            match p.bytes() {
                Some(b) => w.write_all(b).await?,
                None => write_zeros_to(w, p.len()).await?,
            }
        }
        return Ok(());
    }
    w.flush().await?;
    write_vectored_all(w.get_mut(), None, pieces).await
}

/// Writes `head` (if any) and then `pieces` to `sock` with vectored writes.
async fn write_vectored_all<W: AsyncWrite + Unpin>(
    sock: &mut W,
    head: Option<&[u8]>,
    pieces: &[Piece],
) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice<'_>> = Vec::with_capacity(pieces.len() + 1);
    if let Some(h) = head {
        slices.push(io::IoSlice::new(h));
    }
    for p in pieces {
        match p.bytes() {
            Some(b) => slices.push(io::IoSlice::new(b)),
            None => {
                let mut left = p.len();
                while left > 0 {
                    let n = left.min(ZEROS.len());
                    slices.push(io::IoSlice::new(&ZEROS[..n]));
                    left -= n;
                }
            }
        }
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = sock.write_vectored(rest).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

async fn write_zeros_to<W: AsyncWrite + Unpin>(w: &mut W, mut left: usize) -> io::Result<()> {
    while left > 0 {
        let n = left.min(ZEROS.len());
        w.write_all(&ZEROS[..n]).await?;
        left -= n;
    }
    Ok(())
}

/// Encodes a reply's header into `head`; returns the data to write after it, if any.
fn encode_frame<'a>(
    cookie: u64,
    is_read: bool,
    frame: &'a Frame,
    structured: bool,
    head: &mut Vec<u8>,
) -> Option<&'a [u8]> {
    let chunk = |payload| Chunk {
        done: true,
        cookie,
        payload,
    };
    let simple = |error| SimpleReply { error, cookie };
    // Chunk payloads here are bounded (descriptors, 4096-byte messages), so encoding cannot
    // fail; a failure would be a bug, reported as a dropped reply by the client's timeout.
    let put = |c: Chunk, head: &mut Vec<u8>| {
        if let Err(e) = c.encode(head) {
            tracing::error!(error = %e, "reply not encodable");
        }
    };
    match frame {
        Frame::Ok if structured && is_read => put(chunk(ChunkPayload::None), head),
        Frame::Ok => simple(0).encode(head),
        Frame::Data { offset, data } => {
            if structured {
                // At most MAX_PAYLOAD bytes: the length fits.
                let _ = encode_offset_data_header(cookie, *offset, data.len(), true, head);
            } else {
                simple(0).encode(head);
            }
            return Some(data);
        }
        Frame::Shared { offset, len, .. } => {
            if structured {
                let _ = encode_offset_data_header(cookie, *offset, *len, true, head);
            } else {
                simple(0).encode(head);
            }
        }
        Frame::Hole { offset, len } => put(
            chunk(ChunkPayload::OffsetHole {
                offset: *offset,
                len: *len,
            }),
            head,
        ),
        Frame::Error { errno, message } if structured => put(
            chunk(ChunkPayload::Error {
                error: *errno,
                message: message.clone(),
            }),
            head,
        ),
        Frame::Error { errno, .. } => simple(*errno).encode(head),
        Frame::BlockStatus {
            context_id,
            descriptors,
        } => put(
            chunk(ChunkPayload::BlockStatus {
                context_id: *context_id,
                descriptors: descriptors.clone(),
            }),
            head,
        ),
    }
    None
}
