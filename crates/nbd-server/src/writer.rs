//! The writer task: writes the replies of requests served off the reader (on the blocking
//! pool or by a submitted future) to the connection's shared write half, the `Sink`, in the
//! order they complete. Large shared reads go from the device's buffers to the socket with
//! vectored writes.

use std::io;
use std::sync::Arc;

use disk::device::Piece;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::frame::{Frame, Outgoing, encode_frame};

/// Bytes of the writer's buffer.
const WRITE_BUFFER_BYTES: usize = 256 << 10;
/// Shared reads of at least this many bytes skip the write buffer.
pub(crate) const DIRECT_WRITE_BYTES: usize = 64 << 10;

/// The connection's write half, shared by the writer task (replies of requests served on
/// the blocking pool) and the reader (its batches). `None` once a reply was cut short: the
/// stream cannot go on.
pub(crate) type Sink<W> = Arc<tokio::sync::Mutex<Option<BufWriter<W>>>>;

/// A connection's sink over its write half.
pub(crate) fn new_sink<W: AsyncWrite>(writer: W) -> Sink<W> {
    Arc::new(tokio::sync::Mutex::new(Some(BufWriter::with_capacity(
        WRITE_BUFFER_BYTES,
        writer,
    ))))
}

/// Writes the replies of requests served on the blocking pool, in the order they complete;
/// flushes when none is waiting.
pub(crate) async fn write_replies<W: AsyncWrite + Unpin>(
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
