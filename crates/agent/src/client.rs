//! One NBD connection to a server, client side: the fixed newstyle handshake with
//! structured replies, then pipelined requests over the one socket with replies matched by
//! cookie.
//!
//! # Design notes
//!
//! ```text
//!  futures (`submit`) ─┬─(register cookie in `pending`)─► writer (async Mutex) ─► socket
//!  blocking callers ───┘  (`Handle::block_on` of the same send)
//!        ◄── per-request oneshot / channel ◄── reader task ◄──────────────────── socket
//! ```
//!
//! The transmission phase runs on a tokio runtime's reactor: the agent's own when the
//! connection is made inside it (the reader is then a task), else a one-thread runtime on a
//! thread of the connection's own (tests, tools). Requests come two ways.
//! [`Connection::submit`] is a future that sends a read or a write and awaits the reply:
//! the local export's request task awaits it, and no thread waits while the request
//! travels. Blocking callers (the `Remote`'s failover path, flush, trim; every call of the
//! local cache modes that is not a plain miss, made on a blocking pool) run the same send
//! with `Handle::block_on` and wait on their own channel. The reader reads replies in the
//! order the server sends them and completes the matching request either way: simple
//! replies, or structured chunks assembled into the request's buffer (data and holes at
//! their offsets, errors kept) until the chunk flagged DONE. When the socket fails (or the
//! runtime drops the reader), the reader marks the connection dead under the `pending`
//! lock and fails every waiting request with [`ClientError::Disconnected`]; a request
//! registered afterwards sees the flag under the same lock, so none waits forever. Every
//! request, its send included, has a timeout, after which the connection is shut down (a
//! server that stops answering counts as lost); so does a send cut short.
//!
//! The blocking calls ([`Connection::read`] and the rest) must not be made on a reactor
//! thread (tokio refuses to block one); the agent makes them on its blocking pool.
//!
//! No reactor thread ever blocks: sends wait for the socket's write readiness and for the
//! writer lock asynchronously. That is what makes a reader task safe. Were a worker to
//! block in a send to a server that waits for its own replies to be read, and every
//! worker did, nothing would read them.
//!
//! Measured on 2026-11-22 (docs/target.md): forwarding through the blocking pool cost about four thread
//! switches per request (caller to pool, pool to socket, reader to pool, pool to caller);
//! a submitted request with a reader *thread* costs two wake-ups (the reader's, then the
//! awaiting task's), with the reader task one. The VDI workload in `server` mode: 33,000
//! IOPS through the pool, 47,000 submitted with a reader thread, 51,000 with the task;
//! random 4 KiB reads through a `ram` target at queue depth 1: 121, 107 and 48–82 µs.
//!
//! With TLS (the farm's data path), the client asks for `NBD_OPT_STARTTLS` right after the
//! greeting, before any other option, and refuses to go on in the clear if the server
//! declines. The TLS handshake runs on the connection's runtime (`tokio_rustls`), the rest
//! of the negotiation is the same blocking code as without TLS, bridged onto the TLS
//! stream, and transmission reads and writes the two halves of the TLS stream
//! (`tokio::io::split`). `kill` still shuts the TCP socket itself down, so it cuts a TLS
//! connection at once too.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::oneshot;

use nbd_proto::client::{
    MAX_CHUNK_META_LEN, OFFSET_DATA_PREFIX_LEN, REPLY_PREFIX_LEN, ReplyHeader, parse_chunk_payload,
};
use nbd_proto::reply::ChunkPayload;
use nbd_proto::{Command, CommandFlags, NBD_REPLY_TYPE_OFFSET_DATA, Request};

pub use crate::handshake::{ExportInfo, server_name, with_default_port};
use crate::handshake::{io, negotiate, start_tls, tls_negotiate};
use parking_lot::Mutex;

/// Bytes of the socket's read buffer.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// The largest request (header and payload) sent with one write; a larger payload goes
/// out in a second.
const WRITE_BUFFER_BYTES: usize = 256 << 10;

/// Why a request or a connection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The connection is gone (reset, closed, timed out): try another server.
    #[error("connection to {0} lost")]
    Disconnected(String),
    /// Connecting or the handshake failed.
    #[error("cannot attach {export:?} from {server}: {reason}")]
    Handshake {
        /// The server.
        server: String,
        /// The export.
        export: String,
        /// What went wrong.
        reason: String,
        /// The server answered and refused the export (`NBD_OPT_GO` failed), as opposed to
        /// being unreachable or failing the handshake.
        refused: bool,
    },
    /// The server broke the protocol; the connection is closed.
    #[error("protocol error from {server}: {what}")]
    Protocol {
        /// The server.
        server: String,
        /// What.
        what: String,
    },
    /// The server answered the request with an error.
    #[error("server error {errno}: {message}")]
    Server {
        /// `NBD_E*`.
        errno: u32,
        /// The server's message, if it sent one.
        message: String,
    },
}

impl ClientError {
    /// True when the request may succeed on another connection.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Disconnected(_)
                | ClientError::Handshake { .. }
                | ClientError::Protocol { .. }
        )
    }
}

type Completion = Result<Vec<u8>, ClientError>;

/// Where a request's completion goes: a thread blocked on it, or a future.
#[derive(Debug)]
enum Done {
    Blocking(SyncSender<Completion>),
    Future(oneshot::Sender<Completion>),
}

impl Done {
    fn send(self, r: Completion) {
        // The waiter may have given up (timeout, dropped future): nothing to do.
        let _ = match self {
            Done::Blocking(tx) => tx.send(r).map_err(drop),
            Done::Future(tx) => tx.send(r).map_err(drop),
        };
    }
}

/// A request waiting for its reply.
#[derive(Debug)]
struct Pending {
    tx: Done,
    offset: u64,
    /// The read's data (zeros until chunks fill it), empty for other commands.
    buf: Vec<u8>,
    error: Option<(u32, String)>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Requests in flight by cookie; `dead` is set under this lock.
    pending: Mutex<HashMap<u64, Pending>>,
    dead: AtomicBool,
}

/// The write half of the transmission stream: the TCP socket's, or the TLS stream's.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The sending side: the stream's write half and the buffer a request is assembled in.
struct Writer {
    half: WriteHalf,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// A connected, negotiated NBD client connection.
#[derive(Debug)]
pub struct Connection {
    server: String,
    /// A handle on the TCP socket for `kill` (shutdown wakes the reader and any sender,
    /// with or without TLS over it).
    socket: TcpStream,
    /// The runtime whose reactor drives the socket (see the module docs).
    rt: Handle,
    writer: tokio::sync::Mutex<Writer>,
    shared: Arc<Shared>,
    next_cookie: AtomicU64,
    timeout: Duration,
    /// The export as negotiated.
    pub info: ExportInfo,
}

fn hs(server: &str, export: &str, reason: impl std::fmt::Display) -> ClientError {
    ClientError::Handshake {
        server: server.to_string(),
        export: export.to_string(),
        reason: reason.to_string(),
        refused: false,
    }
}

/// A failed negotiation as a [`ClientError::Handshake`] that says whether it was a refusal.
fn negotiation(server: &str, export: &str, f: &crate::handshake::Failed) -> ClientError {
    ClientError::Handshake {
        server: server.to_string(),
        export: export.to_string(),
        reason: f.to_string(),
        refused: f.is_refusal(),
    }
}

impl Connection {
    /// Connects to `server` (`host[:port]`, port 10809 by default), negotiates structured
    /// replies and opens `export` with `NBD_OPT_GO`.
    ///
    /// With `tls`, the connection is TLS from the first option on (`NBD_OPT_STARTTLS`),
    /// the server's certificate verified for the host part of `server` (an IP address or
    /// a DNS name); a server that declines TLS is refused. Like the blocking calls, this
    /// must not be called on a reactor thread when `tls` is given (see the module docs).
    ///
    /// # Errors
    /// [`ClientError::Handshake`].
    pub fn connect(
        server: &str,
        export: &str,
        connect_timeout: Duration,
        request_timeout: Duration,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Connection, ClientError> {
        let err = |r: &dyn std::fmt::Display| hs(server, export, r);
        let addr = with_default_port(server);
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| err(&e))?
            .next()
            .ok_or_else(|| err(&"no address"))?;
        let socket = TcpStream::connect_timeout(&sa, connect_timeout).map_err(|e| err(&e))?;
        socket.set_nodelay(true).map_err(|e| err(&e))?;
        socket
            .set_read_timeout(Some(request_timeout))
            .map_err(|e| err(&e))?;
        let mut s = socket.try_clone().map_err(|e| err(&e))?;
        let shared = Arc::new(Shared::default());
        let (info, rt, half) = match tls {
            None => {
                let info =
                    negotiate(&mut s, export).map_err(|f| negotiation(server, export, &f))?;
                // Transmission: the runtime's reactor drives the socket; requests time out.
                socket.set_read_timeout(None).map_err(|e| err(&e))?;
                socket.set_nonblocking(true).map_err(|e| err(&e))?;
                let (rt, start) = io_runtime().map_err(|e| err(&e))?;
                let stream = {
                    let _entered = rt.enter();
                    tokio::net::TcpStream::from_std(s).map_err(|e| err(&e))?
                };
                let (r, w) = stream.into_split();
                start_reader(&rt, start, r, Arc::clone(&shared), server);
                (info, rt, Box::new(w) as WriteHalf)
            }
            Some(config) => {
                let name = server_name(&addr).map_err(|e| err(&e))?;
                start_tls(&mut s).map_err(|e| err(&e))?;
                socket.set_read_timeout(None).map_err(|e| err(&e))?;
                socket.set_nonblocking(true).map_err(|e| err(&e))?;
                let (rt, start) = io_runtime().map_err(|e| err(&e))?;
                let (info, stream) = tls_negotiate(
                    &rt,
                    s,
                    Arc::clone(config),
                    name,
                    export,
                    connect_timeout.max(request_timeout),
                )
                .map_err(|f| negotiation(server, export, &f))?;
                let (r, w) = tokio::io::split(stream);
                start_reader(&rt, start, r, Arc::clone(&shared), server);
                (info, rt, Box::new(w) as WriteHalf)
            }
        };
        Ok(Connection {
            server: server.to_string(),
            socket,
            rt,
            writer: tokio::sync::Mutex::new(Writer {
                half,
                buf: Vec::with_capacity(WRITE_BUFFER_BYTES),
            }),
            shared,
            next_cookie: AtomicU64::new(1),
            timeout: request_timeout,
            info,
        })
    }

    /// The server this connection goes to.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// True once the connection failed.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    /// Closes the socket; waiting requests fail with `Disconnected`. The connection is
    /// dead from here on, before its reader notices.
    pub fn kill(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        self.shared.dead.store(true, Ordering::Release);
    }

    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), ClientError> {
        let len = u32::try_from(buf.len()).map_err(|_| ClientError::Protocol {
            server: self.server.clone(),
            what: "read over 4 GiB".into(),
        })?;
        let data = self.request(Command::Read, offset, len, None)?;
        buf.copy_from_slice(&data);
        Ok(())
    }

    /// Writes `buf` at `offset`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<(), ClientError> {
        let len = u32::try_from(buf.len()).map_err(|_| ClientError::Protocol {
            server: self.server.clone(),
            what: "write over 4 GiB".into(),
        })?;
        self.request(Command::Write, offset, len, Some(buf))
            .map(drop)
    }

    /// `NBD_CMD_FLUSH`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn flush(&self) -> Result<(), ClientError> {
        self.request(Command::Flush, 0, 0, None).map(drop)
    }

    /// `NBD_CMD_TRIM`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn trim(&self, offset: u64, len: u32) -> Result<(), ClientError> {
        self.request(Command::Trim, offset, len, None).map(drop)
    }

    /// `NBD_CMD_WRITE_ZEROES`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn write_zeroes(&self, offset: u64, len: u32) -> Result<(), ClientError> {
        self.request(Command::WriteZeroes, offset, len, None)
            .map(drop)
    }

    /// A read (`payload` `None`) or a write as a future: it sends the request and waits
    /// for the reply, which the reader delivers; no thread waits while the request
    /// travels. Past the request timeout the connection is shut down, as in the blocking
    /// calls. Returns the read's data (empty for a write).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn submit(&self, offset: u64, len: u32, payload: Option<&[u8]>) -> Completion {
        let command = if payload.is_some() {
            Command::Write
        } else {
            Command::Read
        };
        let (tx, rx) = oneshot::channel();
        let call = async {
            self.send(command, offset, len, payload, Done::Future(tx))
                .await?;
            rx.await.map_err(|_| self.lost())?
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out()),
        }
    }

    fn lost(&self) -> ClientError {
        ClientError::Disconnected(self.server.clone())
    }

    fn timed_out(&self) -> ClientError {
        tracing::warn!(server = %self.server, timeout = ?self.timeout,
            "request timed out; dropping the connection");
        self.kill();
        self.lost()
    }

    fn request(
        &self,
        command: Command,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> Result<Vec<u8>, ClientError> {
        let (tx, rx) = sync_channel(1);
        let send = self.send(command, offset, len, payload, Done::Blocking(tx));
        match self
            .rt
            .block_on(async { tokio::time::timeout(self.timeout, send).await })
        {
            Ok(r) => r?,
            Err(_) => return Err(self.timed_out()),
        }
        match rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(self.timed_out()),
            Err(RecvTimeoutError::Disconnected) => Err(self.lost()),
        }
    }

    /// Registers the request's completion under a new cookie and sends the request.
    /// Dropped halfway through the send, it shuts the connection down: the stream is out of
    /// step.
    async fn send(
        &self,
        command: Command,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
        tx: Done,
    ) -> Result<(), ClientError> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        // Registered under the writer lock: a call dropped while it waits for the lock
        // leaves nothing behind.
        let mut w = self.writer.lock().await;
        {
            let mut pending = self.shared.pending.lock();
            if self.is_dead() {
                return Err(self.lost());
            }
            let buf = if command == Command::Read {
                vec![0u8; len as usize]
            } else {
                Vec::new()
            };
            pending.insert(
                cookie,
                Pending {
                    tx,
                    offset,
                    buf,
                    error: None,
                },
            );
        }
        let Writer { half, buf } = &mut *w;
        buf.clear();
        Request {
            flags: CommandFlags(0),
            command,
            cookie,
            offset,
            len,
        }
        .encode(buf);
        let payload = payload.unwrap_or_default();
        // Small payloads go out with their header in one send.
        let together = buf.len() + payload.len() <= WRITE_BUFFER_BYTES;
        if together {
            buf.extend_from_slice(payload);
        }
        let mut step = OutOfStep(Some(self));
        let mut sent = half.write_all(buf).await;
        if sent.is_ok() && !together {
            sent = half.write_all(payload).await;
        }
        if sent.is_ok() {
            // TLS may hold the end of a request back in its record buffer until flushed
            // (a TCP socket's flush does nothing).
            sent = half.flush().await;
        }
        step.0 = None;
        if sent.is_err() {
            self.shared.pending.lock().remove(&cookie);
            self.kill();
            return Err(self.lost());
        }
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Shuts the connection down if dropped while armed: a send cut short leaves the stream
/// out of step.
struct OutOfStep<'a>(Option<&'a Connection>);

impl Drop for OutOfStep<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.kill();
        }
    }
}

/// Hands a connection's reader to the runtime that runs it (see [`io_runtime`]).
type ReaderStart = oneshot::Sender<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>;

/// The runtime whose reactor drives a new connection's socket. Inside a multi-threaded
/// runtime (the agent) it is that runtime, and the reader will be a task on it; otherwise it
/// is a one-thread runtime on a thread of the connection's own, already driving its reactor
/// (so the TLS handshake can run on it), which runs the reader once it is handed over
/// through the returned sender. The blocking calls use the runtime through its handle.
fn io_runtime() -> std::io::Result<(Handle, Option<ReaderStart>)> {
    if let Ok(h) = Handle::try_current()
        && h.runtime_flavor() == RuntimeFlavor::MultiThread
    {
        return Ok((h, None));
    }
    let (tx, rx) = sync_channel(1);
    let (start_tx, start_rx): (ReaderStart, _) = oneshot::channel();
    std::thread::Builder::new()
        .name("nbd-client-reader".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    if tx.send(Ok(rt.handle().clone())).is_ok() {
                        rt.block_on(async {
                            // A connection that failed before its reader started drops
                            // the sender, and the thread ends.
                            if let Ok(reader) = start_rx.await {
                                reader.await;
                            }
                        });
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
    let h = rx
        .recv()
        .map_err(|_| std::io::Error::other("the reader thread ended"))??;
    Ok((h, Some(start_tx)))
}

/// Starts the reader of the transmission stream's read half on `rt`.
fn start_reader<R: AsyncRead + Send + Unpin + 'static>(
    rt: &Handle,
    start: Option<ReaderStart>,
    half: R,
    shared: Arc<Shared>,
    server: &str,
) {
    let reader = read_replies(half, shared, server.to_string());
    match start {
        None => drop(rt.spawn(reader)),
        // The thread only ends early if its runtime failed; the reader's `FailRest` then
        // marks the connection dead as it is dropped.
        Some(tx) => drop(tx.send(Box::pin(reader))),
    }
}

/// The reader: completes requests until the socket fails, then fails the rest (also when
/// its runtime drops it).
async fn read_replies<R: AsyncRead + Unpin>(half: R, shared: Arc<Shared>, server: String) {
    let mut end = FailRest {
        shared: &shared,
        server: &server,
        why: "the runtime stopped".into(),
    };
    let mut r = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, half);
    end.why = match read_loop(&mut r, &shared).await {
        Ok(()) => "closed by the server".to_string(),
        Err(e) => e,
    };
}

/// Marks the connection dead and fails every waiting request when dropped.
struct FailRest<'a> {
    shared: &'a Shared,
    server: &'a str,
    why: String,
}

impl Drop for FailRest<'_> {
    fn drop(&mut self) {
        let (shared, server, why) = (self.shared, self.server, &self.why);
        let mut pending = shared.pending.lock();
        shared.dead.store(true, Ordering::Release);
        if !pending.is_empty() {
            tracing::warn!(%server, in_flight = pending.len(), reason = %why, "NBD connection lost");
        } else {
            tracing::info!(%server, reason = %why, "NBD connection closed");
        }
        for (_, p) in pending.drain() {
            p.tx.send(Err(ClientError::Disconnected(server.to_string())));
        }
    }
}

fn take(shared: &Shared, cookie: u64) -> Result<Pending, String> {
    shared
        .pending
        .lock()
        .remove(&cookie)
        .ok_or_else(|| format!("reply for unknown cookie {cookie}"))
}

fn complete(p: Pending) {
    let r = match p.error {
        Some((errno, message)) => Err(ClientError::Server { errno, message }),
        None => Ok(p.buf),
    };
    p.tx.send(r);
}

async fn read_loop<R: AsyncRead + Unpin>(r: &mut R, shared: &Shared) -> Result<(), String> {
    let mut head = [0u8; 20];
    let mut meta = Vec::new();
    loop {
        match r.read_exact(&mut head[..REPLY_PREFIX_LEN]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
        let header = match ReplyHeader::parse(&head[..REPLY_PREFIX_LEN]) {
            Ok((h, _)) => h,
            Err(nbd_proto::ReplyError::Truncated { need }) => {
                r.read_exact(&mut head[REPLY_PREFIX_LEN..REPLY_PREFIX_LEN + need])
                    .await
                    .map_err(io("read reply"))?;
                ReplyHeader::parse(&head[..REPLY_PREFIX_LEN + need])
                    .map_err(io("reply"))?
                    .0
            }
            Err(e) => return Err(e.to_string()),
        };
        match header {
            ReplyHeader::Simple { error, cookie } => {
                let mut p = take(shared, cookie)?;
                if error == 0 {
                    r.read_exact(&mut p.buf).await.map_err(io("read data"))?;
                } else {
                    p.buf.clear();
                    p.error = Some((error, String::new()));
                }
                complete(p);
            }
            ReplyHeader::Chunk {
                done,
                kind,
                cookie,
                len,
            } => {
                let mut p = take(shared, cookie)?;
                if kind == NBD_REPLY_TYPE_OFFSET_DATA {
                    let mut off = [0u8; OFFSET_DATA_PREFIX_LEN];
                    r.read_exact(&mut off).await.map_err(io("read chunk"))?;
                    let at = u64::from_be_bytes(off);
                    let n = len as usize - OFFSET_DATA_PREFIX_LEN;
                    let dst = range(&p, at, n as u64)?;
                    r.read_exact(&mut p.buf[dst])
                        .await
                        .map_err(io("read data"))?;
                } else {
                    debug_assert!(len <= MAX_CHUNK_META_LEN, "checked by the codec");
                    meta.resize(len as usize, 0);
                    r.read_exact(&mut meta).await.map_err(io("read chunk"))?;
                    match parse_chunk_payload(kind, &meta).map_err(io("chunk"))? {
                        ChunkPayload::OffsetHole { offset, len } => {
                            let dst = range(&p, offset, u64::from(len))?;
                            p.buf[dst].fill(0);
                        }
                        ChunkPayload::Error { error, message }
                        | ChunkPayload::ErrorOffset { error, message, .. } => {
                            p.error = Some((error, message));
                        }
                        _ => {}
                    }
                }
                if done {
                    complete(p);
                } else {
                    shared.pending.lock().insert(cookie, p);
                }
            }
        }
    }
}

/// The part of a read's buffer a chunk covers, checked against the request.
fn range(p: &Pending, at: u64, len: u64) -> Result<std::ops::Range<usize>, String> {
    let rel = at
        .checked_sub(p.offset)
        .filter(|rel| {
            rel.checked_add(len)
                .is_some_and(|e| e <= p.buf.len() as u64)
        })
        .ok_or_else(|| format!("chunk {at:#x}+{len:#x} outside its request"))?;
    // Inside the buffer, so it fits usize.
    Ok(rel as usize..(rel + len) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_gets_the_default_port() {
        assert_eq!(with_default_port("10.0.0.1"), "10.0.0.1:10809");
    }

    #[test]
    fn host_with_port_is_kept() {
        assert_eq!(with_default_port("srv:1234"), "srv:1234");
    }

    #[test]
    fn bracketed_v6_with_port_is_kept() {
        assert_eq!(with_default_port("[::1]:99"), "[::1]:99");
    }
}
