//! A TCP relay that adds a fixed one-way delay in each direction, for benchmarks of a
//! device and a server with latency between them: `tc netem` is not available here (no
//! sch_netem module, no CAP_NET_ADMIN in a network namespace of our own), so the delay is
//! added in user space.
//!
//! Each accepted connection gets two pumps (client → server, server → client); a pump's
//! reader thread stamps every chunk it reads with `now + delay` and queues it, and its
//! writer thread sleeps until the stamp and writes. So the delay is added once per chunk
//! without limiting bandwidth or serializing requests (pipelined requests stay pipelined).
//! `thread::sleep` overshoots by tens of microseconds; a 0.25 ms delay is ≈ 0.3 ms
//! in practice (the bench measures and prints the relay's real round trip).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes one read of a pump takes at most.
const CHUNK_BYTES: usize = 256 << 10;

/// A running relay; stops accepting when dropped (open connections end with their peers).
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on 127.0.0.1 (a free port) and relays to `target` with `one_way` added in
    /// each direction.
    pub fn start(target: SocketAddr, one_way: Duration) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = conn else { continue };
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                        continue;
                    };
                    pump(client, s2, one_way);
                    pump(server, c2, one_way);
                }
            })?;
        Ok(Relay { addr, stop })
    }

    /// The relay's address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to`, each chunk `delay` late.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    let _ = std::thread::Builder::new()
        .name("relay-write".into())
        .spawn(move || {
            for (due, data) in rx {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&data).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}

/// The relay's measured round trip: the median of `n` one-byte echo exchanges through a
/// relay in front of a local echo server.
pub fn measured_rtt(one_way: Duration, n: usize) -> std::io::Result<Duration> {
    let echo = TcpListener::bind("127.0.0.1:0")?;
    let target = echo.local_addr()?;
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = echo.accept() {
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
        }
    });
    let relay = Relay::start(target, one_way)?;
    let mut s = TcpStream::connect(relay.addr())?;
    s.set_nodelay(true)?;
    let mut times = Vec::with_capacity(n);
    let mut b = [7u8; 1];
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[n / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_the_relay_unchanged_both_ways() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut b = vec![0u8; 100_000];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
        });
        let relay = Relay::start(target, Duration::from_micros(250)).unwrap();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        s.write_all(&sent).unwrap();
        let mut got = vec![0u8; sent.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, sent);
    }
}
