//! The vDisk as the servers serve it: a [`BlockDevice`] over one NBD [`Connection`] at a
//! time, which moves to the next server of the list when the current one is lost.
//!
//! # Design notes
//!
//! A request that fails with a transient error (connection reset or closed, timeout,
//! protocol error) is retried, after a *failover*: the first caller to notice takes the
//! `active` write lock, closes the dead connection and tries the servers in order after the
//! failed one, for at most `failover_timeout`. Other callers wait on the same lock and then
//! retry on the new connection; at most [`RETRIES_MAX`] times per request.
//!
//! The list is the login's, and the farm may hand a newer one (servers that joined or
//! returned, in its load order) through a [`ServerRefresh`]: the next failover takes it, in
//! its order, with the server it leaves last. So a device that a server moves away (a
//! drain, or a rebalance when a server joins) goes to the least loaded server the farm
//! knows, without a new login.
//!
//! Writes survive a failover through a *replay log*: every acknowledged write, trim and
//! zeroing is kept (a copy of the data) until it is known to be on stable storage, and on
//! a new connection the log is replayed, in acknowledgement order, before any other
//! request runs. How long entries stay depends on where the server keeps the writes:
//!
//! ```text
//!  Replay::UntilFlush  server-persistent, private: the server's file is shared storage
//!                      and a flush makes writes durable there; entries acknowledged
//!                      before a successful flush was sent are dropped when it completes.
//!                      Past `replay_bytes_max` the log flushes on its own.
//!  Replay::All         server: the server discards the cache when the connection goes, so
//!                      every write since attach is kept, up to `replay_bytes_max`; past
//!                      that the log is dropped, and a later failover fails (EIO) rather
//!                      than silently lose writes (fail-stop).
//!  Replay::None        read-only exports (the local cache modes)
//! ```
//!
//! Reads and writes of the server modes take a faster road first:
//! [`FastPath::submit_read`](disk::FastPath::submit_read) and
//! [`FastPath::submit_write`](disk::FastPath::submit_write) send the request on the
//! active connection and return a future that the connection's reader completes, with no
//! thread waiting (see `client`). An acknowledged write is logged as above; a log over its
//! budget is flushed on the blocking pool. Any transient failure resolves the future to
//! `None` and the caller makes the blocking call, which fails over and retries: the
//! failover machinery has one implementation, on the blocking side.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use disk::device::{Geometry, Submitted, check_bounds};
use disk::{BlockDevice, Error, ErrorKind, Result};
use nbd_proto::{
    NBD_EINVAL, NBD_ENOSPC, NBD_EPERM, NBD_FLAG_READ_ONLY, NBD_FLAG_SEND_TRIM,
    NBD_FLAG_SEND_WRITE_ZEROES,
};
use parking_lot::{Mutex, RwLock};

use crate::client::{ClientError, Connection};
pub use crate::server_list::{ServerRefresh, refreshed_order};

/// Attempts of one request (each after a failover) before it fails with EIO.
pub const RETRIES_MAX: u32 = 8;
/// The longest single NBD request the device sends; longer calls are split.
const REQUEST_BYTES_MAX: usize = 8 << 20;
/// Pause between two rounds over the server list.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// How long acknowledged writes are kept for replay after a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Nothing is written (read-only export).
    None,
    /// Until a flush acknowledged by the server covers them.
    UntilFlush,
    /// Since attach (the server discards its cache when the connection goes).
    All,
}

/// Settings of a [`Remote`].
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Servers, `host[:port]`, in failover order.
    pub servers: Vec<String>,
    /// The export name to attach.
    pub export: String,
    /// Timeout of one TCP connect and handshake.
    pub connect_timeout: Duration,
    /// Timeout of one request; past it the server counts as lost.
    pub request_timeout: Duration,
    /// How long one failover may try servers before the request fails.
    pub failover_timeout: Duration,
    /// Replay policy.
    pub replay: Replay,
    /// Most bytes of write data the replay log holds.
    pub replay_bytes_max: u64,
    /// TLS for every connection (the farm's CA and the device's certificate), or `None`
    /// for plain NBD.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// How to get a new session when every server refuses this one (a farm that forgot it,
    /// or ended it): device login again. `None`: the export is fixed.
    pub relogin: Option<Relogin>,
    /// Newer server lists from the farm (status reports), taken at the next failover.
    /// `None`: the list is fixed.
    pub refresh: Option<Arc<ServerRefresh>>,
}

/// A new session from the farm: the export to attach now and the TLS to attach it with.
#[derive(Debug, Clone)]
pub struct Session {
    /// The new session export.
    pub export: String,
    /// TLS with the new grant's client certificate.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Logs the device in again (blocking; called from a failover). It must refuse (`Err`
/// with why) a grant of another vDisk, version or cache mode than the one attached: the
/// device keeps reading the version it booted until it restarts.
#[derive(Clone)]
pub struct Relogin(pub Arc<dyn Fn() -> std::result::Result<Session, String> + Send + Sync>);

impl std::fmt::Debug for Relogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Relogin")
    }
}

/// How often an idle device looks whether its server closed the connection, so that a
/// device a server moves away (drain, rebalance) or loses moves at once, not at its next
/// request.
pub const IDLE_CHECK_EVERY: Duration = Duration::from_millis(100);
/// The longest pause between two failovers the idle watch starts when none succeeds.
const IDLE_RETRY_MAX: Duration = Duration::from_secs(10);

/// Watches `remote`'s connection while nothing else uses it: once its reader saw the
/// server close it, fails over without waiting for a request (a thread that ends with the
/// remote).
fn watch(remote: Weak<Remote>) {
    let spawned = std::thread::Builder::new()
        .name("ferry-remote-watch".into())
        .spawn(move || {
            let mut pause = IDLE_CHECK_EVERY;
            loop {
                std::thread::sleep(pause);
                let Some(r) = remote.upgrade() else { return };
                let Some(conn) = r.active_now() else { continue };
                if !conn.is_dead() {
                    pause = IDLE_CHECK_EVERY;
                    continue;
                }
                match r.failover(&conn) {
                    Ok(()) => pause = IDLE_CHECK_EVERY,
                    Err(e) => {
                        tracing::warn!(error = %e, "no server took the idle device over; trying again");
                        pause = (pause * 2).clamp(IDLE_CHECK_EVERY, IDLE_RETRY_MAX);
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no idle watch: a closed connection is replaced at the next request");
    }
}

/// The least time between two logins of one failover.
const RELOGIN_EVERY: Duration = Duration::from_secs(2);

/// Failover counters.
#[derive(Debug, Default)]
pub struct RemoteCounters {
    /// Requests retried after a transient failure.
    pub retries: AtomicU64,
    /// Moves to another connection.
    pub failovers: AtomicU64,
    /// Log entries replayed on new connections.
    pub replayed: AtomicU64,
}

#[derive(Debug)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    Trim { offset: u64, len: u32 },
    Zero { offset: u64, len: u32 },
}

#[derive(Debug, Default)]
struct Log {
    entries: VecDeque<(u64, Op)>,
    next_seq: u64,
    bytes: u64,
    /// The log overflowed in `Replay::All`: a failover can no longer restore every write.
    incomplete: bool,
}

#[derive(Debug)]
struct Active {
    conn: Arc<Connection>,
    /// The failover list, and the position of `conn`'s server in it.
    servers: Vec<String>,
    index: usize,
}

/// The remote vDisk with failover (see the module docs).
#[derive(Debug)]
pub struct Remote {
    cfg: RemoteConfig,
    /// The session attached now (the configured export, or the last re-login's).
    session: Mutex<Session>,
    /// Re-logins done.
    relogins: AtomicU64,
    active: RwLock<Active>,
    size: u64,
    flags: u16,
    description: String,
    log: Mutex<Log>,
    counters: Arc<RemoteCounters>,
    /// This device, for the futures of [`disk::FastPath::submit_write`].
    me: Weak<Remote>,
}

/// What [`Remote::push`] did with an acknowledged change.
enum Pushed {
    /// Logged (or nothing to log).
    Done,
    /// Logged, and the log is now over `replay_bytes_max`: see [`Remote::overflowed`].
    Over,
    /// The connection that acknowledged it was replaced first: run it again.
    Again(Op),
}

impl Remote {
    /// Attaches the export from the first server that serves it.
    ///
    /// # Errors
    /// Every server refused or failed (the last error).
    pub fn connect(cfg: RemoteConfig) -> std::result::Result<Arc<Remote>, ClientError> {
        let mut last = None;
        for (index, server) in cfg.servers.iter().enumerate() {
            match Connection::connect(
                server,
                &cfg.export,
                cfg.connect_timeout,
                cfg.request_timeout,
                cfg.tls.as_ref(),
            ) {
                Ok(conn) => {
                    let info = conn.info.clone();
                    tracing::info!(%server, export = %cfg.export, size = info.size,
                        description = %info.description, "attached");
                    let remote = Arc::new_cyclic(|me| Remote {
                        active: RwLock::new(Active {
                            conn: Arc::new(conn),
                            servers: cfg.servers.clone(),
                            index,
                        }),
                        size: info.size,
                        flags: info.flags,
                        description: info.description,
                        log: Mutex::new(Log::default()),
                        counters: Arc::default(),
                        me: me.clone(),
                        session: Mutex::new(Session {
                            export: cfg.export.clone(),
                            tls: cfg.tls.clone(),
                        }),
                        relogins: AtomicU64::new(0),
                        cfg,
                    });
                    watch(Arc::downgrade(&remote));
                    return Ok(remote);
                }
                Err(e) => {
                    tracing::warn!(%server, error = %e, "server unavailable");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Disconnected("no server given".into())))
    }

    /// The server in use, or "failing over" while a failover holds the connection (status
    /// is answered on the runtime, which must not wait for it: see `active_now`).
    pub fn server(&self) -> String {
        match self.active.try_read() {
            Some(active) => active.conn.server().to_string(),
            None => "failing over".to_string(),
        }
    }

    /// The failover list in use (the login's, or the farm's latest after a failover took
    /// it); `None` while a failover holds it.
    pub fn servers(&self) -> Option<Vec<String>> {
        self.active.try_read().map(|a| a.servers.clone())
    }

    /// The active connection, without waiting: `None` while a failover holds it. Submitted
    /// calls run on the runtime's worker threads, and a failover holds the connection
    /// while it connects and replays over the runtime's own reader tasks: a worker that
    /// waited for it could leave no thread to run them (both workers did, and the agent
    /// hung). The caller then takes the blocking path, which waits for the failover.
    fn active_now(&self) -> Option<Arc<Connection>> {
        self.active.try_read().map(|a| Arc::clone(&a.conn))
    }

    /// The export's description as the server gave it (vDisk and version).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The failover counters.
    pub fn counters(&self) -> Arc<RemoteCounters> {
        Arc::clone(&self.counters)
    }

    /// Runs `op` on the current connection, failing over and retrying on transient errors.
    /// Returns the result and the connection that produced it.
    fn call<T>(
        &self,
        what: &str,
        mut op: impl FnMut(&Connection) -> std::result::Result<T, ClientError>,
    ) -> Result<(T, Arc<Connection>)> {
        let mut attempt = 0;
        loop {
            let conn = Arc::clone(&self.active.read().conn);
            let e = match op(&conn) {
                Ok(v) => return Ok((v, conn)),
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(server_error(what, &e)),
            };
            attempt += 1;
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            if attempt > RETRIES_MAX {
                return Err(Error::with_source(
                    ErrorKind::Io,
                    format!("{what}: out of retries"),
                    e,
                ));
            }
            self.failover(&conn)?;
        }
    }

    /// Runs a change and records it for replay. A change acknowledged by a connection that
    /// was replaced before it was recorded was not replayed, so it runs again.
    fn apply(&self, what: &str, mut op: Op) -> Result<()> {
        loop {
            let ((), conn) = self.call(what, |c| run(c, &op))?;
            match self.record(op, &conn)? {
                None => return Ok(()),
                Some(again) => op = again,
            }
        }
    }

    /// Replaces `failed` by a connection to another server (unless another caller already
    /// did), replaying the log.
    fn failover(&self, failed: &Arc<Connection>) -> Result<()> {
        let mut active = self.active.write();
        if !Arc::ptr_eq(&active.conn, failed) && !active.conn.is_dead() {
            return Ok(());
        }
        active.conn.kill();
        if self.log.lock().incomplete {
            tracing::error!("server lost and the replay log overflowed: writes cannot be restored");
            return Err(Error::new(
                ErrorKind::Io,
                "server lost; the server cache had more writes than the replay log holds",
            ));
        }
        if let Some(offered) = self.cfg.refresh.as_ref().and_then(|r| r.take()) {
            let current = active.conn.server().to_string();
            active.servers = refreshed_order(offered, &current);
            active.index = active.servers.len() - 1;
            tracing::info!(servers = ?active.servers, "failover list refreshed by the farm");
        }
        let servers = active.servers.clone();
        let n = servers.len();
        let deadline = Instant::now() + self.cfg.failover_timeout;
        let mut k = 1;
        let mut refused = false;
        let mut last_login: Option<Instant> = None;
        while Instant::now() < deadline {
            let index = (active.index + k) % n;
            let server = &servers[index];
            k += 1;
            // A new round over the list (with one server, every try is one).
            if n == 1 || k % n == 1 {
                if refused {
                    self.relogin(&mut last_login);
                }
                refused = false;
                std::thread::sleep(ROUND_PAUSE);
            }
            let session = self.session.lock().clone();
            let conn = match Connection::connect(
                server,
                &session.export,
                self.cfg.connect_timeout,
                self.cfg.request_timeout,
                session.tls.as_ref(),
            ) {
                Ok(c) if c.info.size == self.size => c,
                Ok(c) => {
                    tracing::warn!(%server, size = c.info.size, expected = self.size,
                        "server serves a different size; skipped");
                    continue;
                }
                Err(e) => {
                    // A server that answered and refused the export (not one that is down):
                    // the session may be gone from the farm.
                    refused |= matches!(&e, ClientError::Handshake { refused: true, .. });
                    tracing::debug!(%server, error = %e, "failover candidate unavailable");
                    continue;
                }
            };
            match self.replay(&conn) {
                Ok(n) => {
                    tracing::warn!(from = %active.conn.server(), to = %server, replayed = n,
                        "failed over");
                    *active = Active {
                        conn: Arc::new(conn),
                        servers,
                        index,
                    };
                    self.counters.failovers.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.is_transient() => continue,
                Err(e) => return Err(server_error("replay", &e)),
            }
        }
        Err(Error::new(
            ErrorKind::Io,
            format!("no server answered within {:?}", self.cfg.failover_timeout),
        ))
    }

    /// Logs in again (at most every [`RELOGIN_EVERY`]) and attaches the new session from
    /// then on.
    fn relogin(&self, last: &mut Option<Instant>) {
        let Some(relogin) = &self.cfg.relogin else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < RELOGIN_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        match (relogin.0)() {
            Ok(s) => {
                tracing::warn!(export = %s.export, "the servers refused the session: logged in again");
                *self.session.lock() = s;
                self.relogins.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => tracing::warn!(
                why,
                "the servers refused the session and login again failed"
            ),
        }
    }

    /// The export attached now: the session's, a new one after a login again.
    pub fn export(&self) -> String {
        self.session.lock().export.clone()
    }

    /// Times the device logged in again after its session was refused.
    pub fn relogins(&self) -> u64 {
        self.relogins.load(Ordering::Relaxed)
    }

    fn replay(&self, conn: &Connection) -> std::result::Result<u64, ClientError> {
        let log = self.log.lock();
        for (_, op) in &log.entries {
            run(conn, op)?;
        }
        let n = log.entries.len() as u64;
        self.counters.replayed.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// Records a change `conn` acknowledged. Gives it back when `conn` is no longer the
    /// active connection (a failover replayed the log without it).
    fn record(&self, op: Op, conn: &Arc<Connection>) -> Result<Option<Op>> {
        match self.push(op, conn) {
            Pushed::Done => Ok(None),
            Pushed::Over => self.overflowed().map(|()| None),
            Pushed::Again(op) => Ok(Some(op)),
        }
    }

    /// The non-blocking part of [`Remote::record`]: logs the change.
    fn push(&self, op: Op, conn: &Arc<Connection>) -> Pushed {
        if self.cfg.replay == Replay::None {
            return Pushed::Done;
        }
        let bytes = match &op {
            Op::Write { data, .. } => data.len() as u64,
            _ => 0,
        };
        // A failover holds `active` for writing while it replays: the check and the push
        // are atomic with respect to it.
        let active = self.active.read();
        if !Arc::ptr_eq(&active.conn, conn) {
            return Pushed::Again(op);
        }
        let mut log = self.log.lock();
        if log.incomplete {
            return Pushed::Done;
        }
        let seq = log.next_seq;
        log.next_seq += 1;
        log.entries.push_back((seq, op));
        log.bytes += bytes;
        if log.bytes > self.cfg.replay_bytes_max {
            Pushed::Over
        } else {
            Pushed::Done
        }
    }

    /// The log went over `replay_bytes_max`: flushes it (`UntilFlush`, may block) or drops
    /// it (`All`).
    fn overflowed(&self) -> Result<()> {
        if self.cfg.replay == Replay::UntilFlush {
            return self.flush();
        }
        let mut log = self.log.lock();
        tracing::warn!(
            bytes = log.bytes,
            "replay log full: a server loss will now fail I/O"
        );
        log.entries.clear();
        log.bytes = 0;
        log.incomplete = true;
        Ok(())
    }
}

fn run(c: &Connection, op: &Op) -> std::result::Result<(), ClientError> {
    match op {
        Op::Write { offset, data } => c.write(data, *offset),
        Op::Trim { offset, len } => c.trim(*offset, *len),
        Op::Zero { offset, len } => c.write_zeroes(*offset, *len),
    }
}

fn server_error(what: &str, e: &ClientError) -> Error {
    let kind = match e {
        ClientError::Server { errno, .. } => match *errno {
            NBD_ENOSPC => ErrorKind::LimitExceeded,
            NBD_EPERM => ErrorKind::ReadOnly,
            NBD_EINVAL => ErrorKind::InvalidArgument,
            _ => ErrorKind::Io,
        },
        _ => ErrorKind::Io,
    };
    Error::with_source(kind, what.to_string(), e.clone())
}

impl BlockDevice for Remote {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.size,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }

    fn format(&self) -> &'static str {
        "nbd"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.size, offset, buf.len() as u64)?;
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(REQUEST_BYTES_MAX);
            let at = offset + done as u64;
            let part = &mut buf[done..done + n];
            self.call("read", |c| c.read(part, at))?;
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_bounds(self.size, offset, buf.len() as u64)?;
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(REQUEST_BYTES_MAX);
            let at = offset + done as u64;
            let data = buf[done..done + n].to_vec();
            self.apply("write", Op::Write { offset: at, data })?;
            done += n;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let watermark = self.log.lock().next_seq;
        self.call("flush", Connection::flush)?;
        if self.cfg.replay == Replay::UntilFlush {
            let mut log = self.log.lock();
            while log.entries.front().is_some_and(|(seq, _)| *seq < watermark) {
                if let Some((_, Op::Write { data, .. })) = log.entries.pop_front() {
                    log.bytes -= data.len() as u64;
                }
            }
        }
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        check_bounds(self.size, offset, len)?;
        if self.flags & NBD_FLAG_SEND_TRIM == 0 {
            return Ok(());
        }
        for (at, n) in split(offset, len) {
            self.apply("trim", Op::Trim { offset: at, len: n })?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        check_bounds(self.size, offset, len)?;
        if self.flags & NBD_FLAG_SEND_WRITE_ZEROES == 0 {
            let zeros = vec![0u8; (len as usize).min(REQUEST_BYTES_MAX)];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len() as u64) as usize;
                self.write_at(&zeros[..n], offset + done)?;
                done += n as u64;
            }
            return Ok(());
        }
        for (at, n) in split(offset, len) {
            self.apply("write zeroes", Op::Zero { offset: at, len: n })?;
        }
        Ok(())
    }

    fn can_write(&self) -> bool {
        self.flags & NBD_FLAG_READ_ONLY == 0
    }

    fn fast_path(&self) -> Option<&dyn disk::FastPath> {
        Some(self)
    }
}

/// Reads and writes of one request each are submitted on the active connection; the rest takes the blocking path, where failover lives.
impl disk::FastPath for Remote {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    /// One request on the active connection, its reply delivered by the connection's
    /// reader: no thread of the caller's waits. A lost connection resolves to
    /// `None` and the blocking call fails over.
    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        let n = u32::try_from(len).ok()?;
        if len > REQUEST_BYTES_MAX || check_bounds(self.size, offset, len as u64).is_err() {
            return None;
        }
        let conn = self.active_now()?;
        Some(Box::pin(async move {
            match conn.submit(offset, n, None).await {
                Ok(data) => Some(Ok(data)),
                Err(e) if e.is_transient() => None,
                Err(e) => Some(Err(server_error("read", &e))),
            }
        }))
    }

    /// Like [`Remote::submit_read`]; the acknowledged write goes into the replay log as in
    /// [`BlockDevice::write_at`]. A log that must flush first hands the flush to the
    /// blocking pool.
    fn submit_write(&self, buf: &[u8], offset: u64) -> Option<Submitted<()>> {
        let n = u32::try_from(buf.len()).ok()?;
        if buf.len() > REQUEST_BYTES_MAX
            || check_bounds(self.size, offset, buf.len() as u64).is_err()
            || !self.can_write()
        {
            return None;
        }
        let me = self.me.upgrade()?;
        let conn = self.active_now()?;
        let data = buf.to_vec();
        Some(Box::pin(async move {
            match conn.submit(offset, n, Some(&data)).await {
                Ok(_) => {}
                Err(e) if e.is_transient() => return None,
                Err(e) => return Some(Err(server_error("write", &e))),
            }
            match me.push(Op::Write { offset, data }, &conn) {
                Pushed::Done => Some(Ok(())),
                Pushed::Again(_) => None,
                Pushed::Over => Some(
                    tokio::task::spawn_blocking(move || me.overflowed())
                        .await
                        .unwrap_or_else(|e| Err(Error::new(ErrorKind::Io, e.to_string()))),
                ),
            }
        }))
    }
}

/// `[offset, offset+len)` in pieces of at most 1 GiB (NBD lengths are 32-bit).
fn split(offset: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
    const STEP: u64 = 1 << 30;
    (0..len.div_ceil(STEP)).map(move |i| {
        let at = i * STEP;
        // At most STEP = 2^30.
        (offset + at, (len - at).min(STEP) as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_at_one_gib() {
        let v: Vec<_> = split(10, (1 << 30) + 5).collect();
        assert_eq!(v, vec![(10, 1 << 30), (10 + (1 << 30), 5)]);
    }

    #[test]
    fn server_enospc_is_limit_exceeded() {
        let e = ClientError::Server {
            errno: NBD_ENOSPC,
            message: String::new(),
        };
        assert_eq!(server_error("write", &e).kind(), ErrorKind::LimitExceeded);
    }
}
