//! [`Stalled`]: a stream whose reads and writes fail with `TimedOut` once one has waited
//! longer than a timeout without moving a byte.
//!
//! hyper bounds the time to read a request head (`header_read_timeout`, which also bounds
//! the wait for the next request on a kept-alive connection), but not a body sent one byte
//! a minute, nor a response its client never reads. This wrapper bounds both: a read (or
//! a write) that stays pending for the timeout ends the connection; any byte moved starts
//! the wait again. A handler that works without touching the socket is not timed: hyper
//! reads only for a head or a body when half-close is allowed (see `http.rs`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream with a stall timeout on each direction. See the module docs.
#[derive(Debug)]
pub struct Stalled<S> {
    inner: S,
    timeout: Duration,
    read: Timer,
    write: Timer,
}

/// The wait of one direction: armed when an operation goes pending, disarmed when it
/// moves bytes.
#[derive(Debug)]
struct Timer {
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Timer {
    fn new() -> Timer {
        Timer {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Arms the timer (if it was not) and says whether it has run out.
    fn expired(&mut self, timeout: Duration, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            self.armed = true;
            self.sleep.as_mut().reset(Instant::now() + timeout);
        }
        self.sleep.as_mut().poll(cx).is_ready()
    }

    /// `poll`, the inner stream's answer, with this direction's stall rule: a ready answer
    /// disarms the timer; a pending one arms it and fails as `what stalled` once it ran out.
    fn watch<T>(
        &mut self,
        poll: Poll<io::Result<T>>,
        timeout: Duration,
        cx: &mut Context<'_>,
        what: &str,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(timeout, cx) => Poll::Ready(Err(stalled(what))),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn stalled(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} stalled"))
}

impl<S> Stalled<S> {
    /// Wraps `inner`; a read or write pending for `timeout` fails.
    pub fn new(inner: S, timeout: Duration) -> Stalled<S> {
        Stalled {
            inner,
            timeout,
            read: Timer::new(),
            write: Timer::new(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Stalled<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read.watch(poll, this.timeout, cx, "read")
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stalled<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.write.watch(poll, this.timeout, cx, "write")
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.write.watch(poll, this.timeout, cx, "flush")
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.write.watch(poll, this.timeout, cx, "write")
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Paused time: the 30 s pass at once.
    #[tokio::test(start_paused = true)]
    async fn a_read_that_waits_past_the_timeout_fails() {
        let (a, _b) = tokio::io::duplex(64);
        let mut s = Stalled::new(a, Duration::from_secs(30));
        let e = s.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_arriving_in_time_start_the_wait_again() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut s = Stalled::new(a, Duration::from_secs(30));
        let feeder = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                b.write_all(b"x").await.unwrap();
            }
            b
        });
        let mut got = [0u8; 3];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"xxx");
        drop(feeder.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_its_reader_never_takes_fails() {
        let (a, _b) = tokio::io::duplex(16);
        let mut s = Stalled::new(a, Duration::from_secs(30));
        let e = s.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
