//! The slot protocol: lookups, fills and their waits over the mapped words.
//!
//! # Design notes
//!
//! A slot is a seqlock. `seq` even: the slot is stable, and its key, block, length and
//! data agree; odd: one process is filling it. A reader loads `seq` (acquire), the header
//! words, the pages it needs and their CRCs, then `seq` again after an acquire fence: the
//! copy is good only if `seq` did not move and was even, the key and block are the ones it
//! asked for, and every page matches its CRC-32C. So a reader returns neither torn bytes
//! (a fill racing the copy moves `seq`) nor foreign ones (another version's or block's: the
//! key and block are read under the same seqlock).
//!
//! A filler claims a slot with a compare-and-swap of `seq` from even to odd, writes the key,
//! block, its pid and the time, and then (after fetching from the server, outside any
//! lock) the data, the page CRCs and the length, and ends with a compare-and-swap from its
//! odd value to the next even one. A process killed mid-fill leaves the slot odd: a later
//! process that needs the slot takes it over when the filler's pid is gone or the fill is
//! older than [`FILL_STALE`], with a compare-and-swap from that odd value to the next odd
//! one, so the dead filler's commit (if it was only slow) fails. A slow filler's data
//! stores may still land over the new filler's; the page CRCs catch that, and the reader
//! counts the slot torn, clears it and fetches again. No step ever waits for a lock that
//! a dead process holds.
//!
//! Two agents missing the same block at once would both fetch it; the second waits
//! instead: a lookup that finds the block's slot odd waits (polling, at most
//! [`FILL_WAIT_MAX`]) for the fill, then reads it. Two claims of the same block in one set
//! at once: each claimer scans its set after writing its key, and the one with the higher
//! slot index gives way. So N agents booting one version fetch each block once per host
//! (a few blocks twice when claims cross exactly).
//!
//! Rejected: a lock file or a futex-based mutex per set (a holder killed by SIGKILL leaves
//! it held: robust futexes exist, but not in safe Rust across processes), and a host daemon
//! (one more service to run, and a socket hop per read).

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::Duration;

use crate::layout::{Geometry, PAGE_BYTES, WAYS, header, slot};
use crate::map::Region;
use crate::{Counters, VersionKey};

/// A fill older than this may be taken over even when its process still lives (a filler
/// stuck that long has a server that does not answer; its own request times out).
pub const FILL_STALE: Duration = Duration::from_secs(120);
/// The longest a read waits for another process's fill before it fetches itself.
pub const FILL_WAIT_MAX: Duration = Duration::from_secs(10);
/// Reads of one slot retried when a fill moved `seq` under the copy.
const READ_RETRIES: u32 = 4;

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The bytes were copied.
    Hit,
    /// Another process is filling the block: wait ([`HostCache::wait_fill`]) or fetch.
    Filling,
    /// Not cached.
    Miss,
}

/// The cache over a mapping (see the crate docs); shared by the threads of one agent.
#[derive(Debug)]
pub struct HostCache {
    pub(crate) region: Region,
    pub(crate) geo: Geometry,
    pub(crate) path: Option<std::path::PathBuf>,
    pub(crate) local: LocalCounters,
    pub(crate) pid: u32,
}

/// This process's counters.
#[derive(Debug, Default)]
pub(crate) struct LocalCounters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    waits: AtomicU64,
    fills: AtomicU64,
    fill_bytes: AtomicU64,
    torn: AtomicU64,
    stolen: AtomicU64,
}

/// A claimed slot being filled; dropping it without [`Fill::commit`] empties the slot.
#[derive(Debug)]
pub struct Fill<'a> {
    cache: &'a HostCache,
    slot: u64,
    /// The odd `seq` this fill set.
    seq: u64,
    done: bool,
}

/// What [`HostCache::claim`] got.
#[derive(Debug)]
pub enum Claim<'a> {
    /// The block is cached now.
    Present,
    /// Another process fills it.
    Filling,
    /// This process fills it.
    Mine(Fill<'a>),
}

/// CLOCK_MONOTONIC in ms: the same clock in every process of the host.
fn now_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1000) + (t.tv_nsec as u64) / 1_000_000
}

fn pid_alive(pid: u32) -> bool {
    match i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        // EPERM: it lives, as another user's process (pids are shared across users).
        Some(p) => !matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        ),
        None => false,
    }
}

impl HostCache {
    fn w(&self, i: usize) -> &AtomicU64 {
        &self.region.words()[i]
    }

    fn sw(&self, s: u64, field: usize) -> &AtomicU64 {
        self.w(self.geo.slot_word(s, field))
    }

    fn host_add(&self, field: usize, n: u64) {
        self.w(field).fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> u64 {
        self.geo.block_bytes
    }

    /// The geometry in use (the file's, which its creator chose).
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The file, or `None` for a private cache.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// The first slot of the set of `(key, block)`.
    fn set_of(&self, key: VersionKey, block: u64) -> u64 {
        let h = key
            .lo
            .rotate_left(17)
            .wrapping_add(key.hi)
            .wrapping_add(block.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let h = h ^ (h >> 29);
        (h % self.geo.sets()) * WAYS
    }

    pub(crate) fn holds(&self, s: u64, key: VersionKey, block: u64) -> bool {
        self.sw(s, slot::KEY_LO).load(Ordering::Relaxed) == key.lo
            && self.sw(s, slot::KEY_HI).load(Ordering::Relaxed) == key.hi
            && self.sw(s, slot::BLOCK).load(Ordering::Relaxed) == block
    }

    /// Copies bytes `[offset, offset + dst.len())` of block `block` of version `key` into
    /// `dst` when the cache holds them.
    pub fn read(&self, key: VersionKey, block: u64, offset: usize, dst: &mut [u8]) -> Lookup {
        debug_assert!(offset as u64 + dst.len() as u64 <= self.geo.block_bytes);
        let set = self.set_of(key, block);
        let mut filling = false;
        for s in set..set + WAYS {
            match self.read_slot(s, key, block, offset, dst) {
                Lookup::Hit => {
                    self.local.hits.fetch_add(1, Ordering::Relaxed);
                    self.local
                        .hit_bytes
                        .fetch_add(dst.len() as u64, Ordering::Relaxed);
                    self.host_add(header::HITS, 1);
                    return Lookup::Hit;
                }
                Lookup::Filling => filling = true,
                Lookup::Miss => {}
            }
        }
        if filling {
            Lookup::Filling
        } else {
            self.local.misses.fetch_add(1, Ordering::Relaxed);
            Lookup::Miss
        }
    }

    fn read_slot(&self, s: u64, key: VersionKey, block: u64, o: usize, dst: &mut [u8]) -> Lookup {
        for _ in 0..READ_RETRIES {
            let s1 = self.sw(s, slot::SEQ).load(Ordering::Acquire);
            if !self.holds(s, key, block) {
                return Lookup::Miss;
            }
            if odd(s1) {
                return Lookup::Filling;
            }
            // Clamped: the file is shared, and a bad length must not index past the slot.
            let valid =
                (self.sw(s, slot::LEN_PID).load(Ordering::Relaxed) >> 32).min(self.geo.block_bytes);
            if (o + dst.len()) as u64 > valid {
                return Lookup::Miss;
            }
            let good = self.copy_out(s, valid as usize, o, dst);
            fence(Ordering::Acquire);
            if self.sw(s, slot::SEQ).load(Ordering::Relaxed) != s1 {
                continue;
            }
            if !good {
                self.clear_torn(s, s1);
                return Lookup::Miss;
            }
            let now = now_ms();
            let used = self.sw(s, slot::USED);
            if used.load(Ordering::Relaxed) != now {
                used.store(now, Ordering::Relaxed);
            }
            return Lookup::Hit;
        }
        Lookup::Miss
    }

    /// Copies the pages `[o, o + dst.len())` touches through a page buffer, checking each
    /// page's CRC; false when one does not match.
    fn copy_out(&self, s: u64, valid: usize, o: usize, dst: &mut [u8]) -> bool {
        let words = self.region.words();
        let base = self.geo.data_word(s);
        let mut page = [0u8; PAGE_BYTES as usize];
        let (first, end) = (o / PAGE_BYTES as usize, (o + dst.len()).div_ceil(4096));
        for p in first..end {
            let start = p * PAGE_BYTES as usize;
            let n = valid.saturating_sub(start).min(PAGE_BYTES as usize);
            if n < (o + dst.len()).min(start + PAGE_BYTES as usize) - start {
                return false;
            }
            for (i, chunk) in page[..n].chunks_mut(8).enumerate() {
                let v = words[base + start / 8 + i]
                    .load(Ordering::Relaxed)
                    .to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            let want = self
                .w(self.geo.crc_word(s, p as u64))
                .load(Ordering::Relaxed);
            if u64::from(crc32c::crc32c(&page[..n])) != want {
                return false;
            }
            // The part of this page inside the request.
            let from = o.max(start);
            let to = (o + dst.len()).min(start + n);
            dst[from - o..to - o].copy_from_slice(&page[from - start..to - start]);
        }
        true
    }

    /// Empties a slot whose bytes failed their CRC while `seq` was `seen`.
    fn clear_torn(&self, s: u64, seen: u64) {
        self.local.torn.fetch_add(1, Ordering::Relaxed);
        self.host_add(header::TORN, 1);
        tracing::warn!(slot = s, "host cache slot failed its checksum; refetching");
        let q = self.sw(s, slot::SEQ);
        if q.compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.sw(s, slot::KEY_LO).store(0, Ordering::Relaxed);
            self.sw(s, slot::KEY_HI).store(0, Ordering::Relaxed);
            q.store(seen + 2, Ordering::Release);
        }
    }

    /// Claims a slot to fill block `block` of `key`, unless the block is cached or being
    /// filled by a live process.
    pub fn claim(&self, key: VersionKey, block: u64) -> Claim<'_> {
        let set = self.set_of(key, block);
        let now = now_ms();
        let mut victim: Option<(u64, u64, u64)> = None; // (slot, seq, used)
        for s in set..set + WAYS {
            let seq = self.sw(s, slot::SEQ).load(Ordering::Acquire);
            if self.holds(s, key, block) {
                if !odd(seq) {
                    return Claim::Present;
                }
                return match self.steal(s, seq, now) {
                    Some(f) => Claim::Mine(f),
                    None => Claim::Filling,
                };
            }
            if odd(seq) {
                if let Some(f) = self.steal(s, seq, now) {
                    return self.claimed(f, key, block, now);
                }
                continue;
            }
            let empty = self.sw(s, slot::KEY_LO).load(Ordering::Relaxed) == 0
                && self.sw(s, slot::KEY_HI).load(Ordering::Relaxed) == 0;
            let used = if empty {
                0
            } else {
                self.sw(s, slot::USED).load(Ordering::Relaxed).max(1)
            };
            if victim.is_none_or(|(_, _, u)| used < u) {
                victim = Some((s, seq, used));
            }
        }
        // Every slot of the set is being filled: the caller reads past the cache.
        let Some((s, seq, _)) = victim else {
            return Claim::Filling;
        };
        let q = self.sw(s, slot::SEQ);
        if q.compare_exchange(seq, seq + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Claim::Filling;
        }
        fence(Ordering::Release);
        let fill = Fill {
            cache: self,
            slot: s,
            seq: seq + 1,
            done: false,
        };
        self.claimed(fill, key, block, now)
    }

    /// Writes the claim's key, then gives way to a claim of the same block at a lower slot.
    fn claimed<'a>(&'a self, fill: Fill<'a>, key: VersionKey, block: u64, now: u64) -> Claim<'a> {
        let s = fill.slot;
        self.sw(s, slot::LEN_PID)
            .store(u64::from(self.pid), Ordering::SeqCst);
        self.sw(s, slot::FILL_MS).store(now, Ordering::SeqCst);
        self.sw(s, slot::KEY_LO).store(key.lo, Ordering::SeqCst);
        self.sw(s, slot::KEY_HI).store(key.hi, Ordering::SeqCst);
        self.sw(s, slot::BLOCK).store(block, Ordering::SeqCst);
        let set = self.set_of(key, block);
        for other in set..s {
            if self.holds(other, key, block) {
                // `fill` drops: the slot is emptied.
                let odd = self.sw(other, slot::SEQ).load(Ordering::SeqCst) & 1 == 1;
                return if odd { Claim::Filling } else { Claim::Present };
            }
        }
        Claim::Mine(fill)
    }

    /// Takes over slot `s`, odd at `seq`, if its filler died or stalled.
    fn steal(&self, s: u64, seq: u64, now: u64) -> Option<Fill<'_>> {
        let pid = (self.sw(s, slot::LEN_PID).load(Ordering::Relaxed) & 0xFFFF_FFFF) as u32;
        let started = self.sw(s, slot::FILL_MS).load(Ordering::Relaxed);
        let stale = now.saturating_sub(started) > FILL_STALE.as_millis() as u64;
        if !stale && pid_alive(pid) {
            return None;
        }
        let q = self.sw(s, slot::SEQ);
        q.compare_exchange(seq, seq + 2, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        fence(Ordering::Release);
        self.local.stolen.fetch_add(1, Ordering::Relaxed);
        self.host_add(header::STOLEN, 1);
        tracing::info!(
            slot = s,
            pid,
            "took over a host cache fill of a gone process"
        );
        self.sw(s, slot::LEN_PID)
            .store(u64::from(self.pid), Ordering::SeqCst);
        self.sw(s, slot::FILL_MS).store(now, Ordering::SeqCst);
        Some(Fill {
            cache: self,
            slot: s,
            seq: seq + 2,
            done: false,
        })
    }

    /// Waits until no live process fills block `block` of `key` (at most
    /// [`FILL_WAIT_MAX`]); true when the wait ended that way.
    pub fn wait_fill(&self, key: VersionKey, block: u64) -> bool {
        self.local.waits.fetch_add(1, Ordering::Relaxed);
        self.host_add(header::WAITS, 1);
        let start = std::time::Instant::now();
        let mut pause = Duration::from_micros(20);
        let set = self.set_of(key, block);
        loop {
            let busy = (set..set + WAYS).any(|s| {
                let seq = self.sw(s, slot::SEQ).load(Ordering::Acquire);
                if !odd(seq) || !self.holds(s, key, block) {
                    return false;
                }
                let pid = (self.sw(s, slot::LEN_PID).load(Ordering::Relaxed) & 0xFFFF_FFFF) as u32;
                pid_alive(pid)
            });
            if !busy {
                return true;
            }
            if start.elapsed() >= FILL_WAIT_MAX {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// This process's counters and the host's.
    pub fn counters(&self) -> Counters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let h = |i: usize| self.w(i).load(Ordering::Relaxed);
        Counters {
            hits: l(&self.local.hits),
            hit_bytes: l(&self.local.hit_bytes),
            misses: l(&self.local.misses),
            waits: l(&self.local.waits),
            fills: l(&self.local.fills),
            fill_bytes: l(&self.local.fill_bytes),
            torn: l(&self.local.torn),
            stolen: l(&self.local.stolen),
            host_hits: h(header::HITS),
            host_fills: h(header::FILLS),
            host_fill_bytes: h(header::FILL_BYTES),
            host_waits: h(header::WAITS),
        }
    }
}

impl Fill<'_> {
    /// The slot claimed (for tests).
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// Stores the block's bytes (the whole block, or less at the end of the disk; at most
    /// one block, a multiple of 8 bytes) and makes them visible. False when another
    /// process took the fill over meanwhile (nothing is visible then).
    pub fn commit(mut self, data: &[u8]) -> bool {
        let c = self.cache;
        let geo = c.geo;
        assert!(
            data.len() as u64 <= geo.block_bytes && data.len().is_multiple_of(8),
            "a fill is at most one block, whole words ({} bytes)",
            data.len()
        );
        let words = c.region.words();
        let base = geo.data_word(self.slot);
        for (i, chunk) in data.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            words[base + i].store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        for (p, page) in data.chunks(PAGE_BYTES as usize).enumerate() {
            let crc = u64::from(crc32c::crc32c(page));
            c.w(geo.crc_word(self.slot, p as u64))
                .store(crc, Ordering::Relaxed);
        }
        let len_pid = ((data.len() as u64) << 32) | u64::from(c.pid);
        c.sw(self.slot, slot::LEN_PID)
            .store(len_pid, Ordering::Relaxed);
        c.sw(self.slot, slot::USED)
            .store(now_ms(), Ordering::Relaxed);
        self.done = true;
        let ok = c
            .sw(self.slot, slot::SEQ)
            .compare_exchange(self.seq, self.seq + 1, Ordering::Release, Ordering::Relaxed)
            .is_ok();
        if ok {
            let n = data.len() as u64;
            c.local.fills.fetch_add(1, Ordering::Relaxed);
            c.local.fill_bytes.fetch_add(n, Ordering::Relaxed);
            c.host_add(header::FILLS, 1);
            c.host_add(header::FILL_BYTES, n);
        }
        ok
    }
}

impl Drop for Fill<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let c = self.cache;
        let q = c.sw(self.slot, slot::SEQ);
        if q.load(Ordering::Acquire) == self.seq {
            c.sw(self.slot, slot::KEY_LO).store(0, Ordering::Relaxed);
            c.sw(self.slot, slot::KEY_HI).store(0, Ordering::Relaxed);
            let _ =
                q.compare_exchange(self.seq, self.seq + 1, Ordering::Release, Ordering::Relaxed);
        }
    }
}

/// A `seq` of a slot being filled.
fn odd(seq: u64) -> bool {
    seq & 1 == 1
}
