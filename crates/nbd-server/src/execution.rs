//! Requests on the device: the fast paths that complete in memory on the reader
//! (`try_read_shared`, `try_read_at`, `try_write_at`), the request tasks that await a
//! device's submitted future (`submit_read`, `submit_write`) or make the disk call on the
//! blocking pool under the global `max_blocking` limit, and the disk calls themselves.
//!
//! Every request here is a [`Valid`] one: checked once by the reader against its export.
//! Each entry point (`read_into`, `try_inline`, `execute`) asserts that check
//! ([`Valid::assert_on`]) instead of checking again, and the replies it encodes are within
//! the limits the check established.

use std::sync::Arc;
use std::time::Instant;

use disk::BlockDevice;
use disk::bytes::is_zero;
use disk::device::Piece;
use nbd_proto::reply::{SimpleReply, encode_offset_data_header};
use nbd_proto::{Command, NBD_EIO, Request};
use tokio::sync::mpsc;

use crate::block_status::block_status;
use crate::conn::{ConnCtx, Export};
use crate::frame::{Frame, Outgoing, disk_error, encode_frame, error};
use crate::valid::Valid;

/// The largest read or write served on the connection's own task when the device can do it
/// in memory (a copy of this size takes tens of microseconds; larger ones go to the pool
/// so one client's big reads do not hold up the reactor).
pub(crate) const INLINE_MAX_BYTES: u32 = 1 << 20;
/// Bytes per step of `NBD_CMD_WRITE_ZEROES` with `NBD_CMD_FLAG_NO_HOLE` and of
/// `NBD_CMD_CACHE`.
const ZERO_STEP_BYTES: usize = 1 << 20;

/// Reads `req`'s range from memory, appending its encoded reply to `out`; `None` (nothing
/// appended) when the device cannot answer without waiting. Returns whether the read
/// succeeded. The device is probed once: a declined read is not tried again by the caller.
pub(crate) fn read_into(e: &Export, req: &Valid, out: &mut Vec<u8>) -> Option<bool> {
    req.assert_on(e);
    let (dev, structured) = (e.device.as_ref(), e.structured);
    let mark = out.len();
    let len = req.len as usize;
    let data_header = |out: &mut Vec<u8>| {
        if structured {
            // At most MAX_PAYLOAD bytes (the check): the length fits.
            let r = encode_offset_data_header(req.cookie, req.offset, len, true, out);
            debug_assert!(r.is_ok(), "a read of {len} bytes has an encodable header");
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

/// Serves a read or write that the device can complete in memory without blocking (a block
/// cache hit, a RAM write cache with room), or returns `None` to send it to the blocking
/// pool. A read's buffer is left in `payload` for the pool to reuse.
pub(crate) fn try_inline(req: &Valid, e: &Export, payload: &mut Vec<u8>) -> Option<Frame> {
    req.assert_on(e);
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

/// A checked request on its way to the blocking pool.
#[derive(Debug)]
pub(crate) struct Job {
    /// The request.
    pub req: Valid,
    /// What it runs on.
    pub export: Export,
    /// A write's data (empty for other commands).
    pub payload: Vec<u8>,
    /// Its reply, holding the request's slot and bytes; the frame is filled in.
    pub out: Outgoing,
}

/// Runs a job on its own task: the device's submitted future if it has one, else the
/// blocking pool; then counts it and hands its reply to the writer.
pub(crate) async fn run_job(
    job: Job,
    ctx: Arc<ConnCtx>,
    tx: mpsc::Sender<Outgoing>,
    done: mpsc::Sender<()>,
) {
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
/// ([`disk::FastPath::submit_read`]: the target forwarding to its server); `None` to make the
/// blocking call.
async fn submitted(req: &Valid, e: &Export, payload: &[u8]) -> Option<Frame> {
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
async fn blocking(req: Valid, export: Export, payload: Vec<u8>, ctx: &ConnCtx) -> Frame {
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
fn execute(req: &Valid, e: &Export, payload: Vec<u8>) -> Frame {
    req.assert_on(e);
    debug_assert!(
        req.command != Command::Write || payload.len() == req.len as usize,
        "a write's payload is its length"
    );
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
            // Valid::check refuses unknown commands and admit() never queues DISC.
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
