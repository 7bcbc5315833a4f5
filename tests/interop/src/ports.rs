//! Loopback ports for a child process to bind, reserved across the test processes of a run.
//!
//! Binding `127.0.0.1:0` and letting the port go races twice: with another test process that
//! got the same port the same way, and with every outgoing connection on the machine, which
//! takes its local port from the same ephemeral range. cargo-nextest runs each test in its
//! own process, so a process-local set cannot help. Here a port comes from below the
//! ephemeral range (no `connect` ever takes it) and is held by an exclusive lock on a file
//! named after it, for as long as the test process lives: the kernel drops the lock when the
//! process exits, however it exits, so a crashed test leaks nothing.

use std::fs::{File, OpenOptions};
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::Mutex;

/// The first port handed out.
const FIRST: u16 = 20_000;
/// One past the last port, when the ephemeral range cannot be read.
const END_DEFAULT: u16 = 32_768;

/// Locks held until the process exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// One past the last port to hand out: the start of the kernel's ephemeral range.
fn end() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&start| start > FIRST + 1_000)
        .unwrap_or(END_DEFAULT)
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("ferry-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock directory");
    dir
}

/// An exclusive lock on `file`'s open file description, if no one holds one (flock(2);
/// `File::try_lock` is newer than the project's MSRV).
fn try_lock(file: &File) -> bool {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// A loopback port free for both TCP and UDP now, that no other test process of this
/// machine gets until this one exits.
pub fn free_port() -> u16 {
    let (first, end) = (FIRST, end());
    let span = u32::from(end - first);
    let dir = lock_dir();
    // Start at a point that differs between processes, so they rarely contend.
    let start = (std::process::id().wrapping_mul(7_919) ^ rand::random::<u32>()) % span;
    for i in 0..span {
        let port = first + ((start + i) % span) as u16;
        let path = dir.join(port.to_string());
        let Ok(file) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        if !try_lock(&file) {
            continue;
        }
        let free = TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if !free {
            continue; // The lock drops with `file`.
        }
        HELD.lock().expect("port locks").push(file);
        return port;
    }
    panic!("no free loopback port in {first}..{end}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_bindable() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        for p in ports {
            assert!(
                (FIRST..end()).contains(&p),
                "{p} outside {FIRST}..{}",
                end()
            );
            TcpListener::bind(("127.0.0.1", p)).expect("bindable");
        }
    }

    #[test]
    fn a_port_held_by_another_process_is_not_handed_out() {
        let p = free_port();
        // Another open file description of the same lock file: as another process would.
        let other = File::options()
            .write(true)
            .open(lock_dir().join(p.to_string()))
            .unwrap();
        assert!(!try_lock(&other), "port {p} was not locked");
    }
}
