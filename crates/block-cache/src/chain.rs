//! Per-chain state shared by a chain's wrappers: the [`ChainKey`] that names a vDisk
//! version, the table that interns keys into ids, and the chain's read-ahead score (is
//! read-ahead paying off, are misses scattered within blocks).
//!
//! Pure: no I/O and no threads (the score's counters are atomics so that every wrapper of a
//! chain updates them under no lock). The stream detector is per connection and lives in
//! `stream.rs`; a chain's scan state (`scanned`, `scan_end`) is in its `ChainHandle`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vhdx::Guid;

use crate::config::{
    COMPLETE_SCATTERED_PERCENT, COMPLETE_WINDOW_MISSES, IDLE_CHAINS_MAX,
    READ_AHEAD_ACCURACY_PERCENT, READ_AHEAD_WARMUP_BLOCKS,
};

/// Identifies one read-only vDisk version: the top file of its chain and that file's
/// linkage identity. Wrappers with equal keys share cache entries, so the key must change
/// whenever the chain's bytes can: the VHDX DataWriteGuid does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainKey {
    path: PathBuf,
    linkage: Option<Guid>,
}

impl ChainKey {
    /// A key from a top file's path and its linkage identity.
    pub fn new(path: impl Into<PathBuf>, linkage: Option<Guid>) -> ChainKey {
        ChainKey {
            path: path.into(),
            linkage,
        }
    }

    /// The key of an opened chain: `path` and the top device's `linkage_id()`.
    pub fn of_device(path: impl Into<PathBuf>, top: &dyn disk::BlockDevice) -> ChainKey {
        ChainKey::new(path, top.linkage_id())
    }

    /// The top file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The top file's linkage identity.
    pub fn linkage(&self) -> Option<Guid> {
        self.linkage
    }
}

/// Read-ahead accounting of one chain, shared by its wrappers: blocks prefetched and blocks
/// of those a demand read later used. Read-ahead stays on only while it pays off.
#[derive(Debug, Default)]
pub(crate) struct ReadAheadScore {
    /// Blocks prefetched for the chain.
    pub(crate) issued: AtomicU64,
    /// Prefetched blocks that a demand read then used.
    pub(crate) used: AtomicU64,
    /// Recent demand misses of the chain, and of those the scattered ones (decaying).
    misses: AtomicU64,
    scattered: AtomicU64,
}

impl ReadAheadScore {
    /// True while the chain's read-ahead is accurate enough to go on: always during the
    /// first [`READ_AHEAD_WARMUP_BLOCKS`], then while at least
    /// [`READ_AHEAD_ACCURACY_PERCENT`] of the prefetched blocks were used.
    #[inline]
    pub(crate) fn allows(&self) -> bool {
        let issued = self.issued.load(Ordering::Relaxed);
        let used = self.used.load(Ordering::Relaxed);
        issued < READ_AHEAD_WARMUP_BLOCKS || used * 100 >= issued * READ_AHEAD_ACCURACY_PERCENT
    }
}

impl ReadAheadScore {
    /// Counts a demand miss (`spread`: a [`scattered`] one) and says whether it should read
    /// the rest of its block: only when it is scattered and, over the chain's recent
    /// misses (a window of about [`COMPLETE_WINDOW_MISSES`], after as many for warm-up),
    /// at least [`COMPLETE_SCATTERED_PERCENT`] were scattered too. Random reads over a
    /// large disk soon pass that (half their misses are second misses in a block once
    /// completion is on); a boot, whose scattered misses are about 1% of its misses, never
    /// does, so its store bytes stay near its unique bytes.
    #[inline]
    pub(crate) fn completes(&self, spread: bool) -> bool {
        let misses = self.misses.fetch_add(1, Ordering::Relaxed) + 1;
        let scattered = if spread {
            self.scattered.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.scattered.load(Ordering::Relaxed)
        };
        if misses >= 2 * COMPLETE_WINDOW_MISSES {
            // Decay: halve both (racing updates may be lost; this is a heuristic).
            self.misses.store(misses / 2, Ordering::Relaxed);
            self.scattered.store(scattered / 2, Ordering::Relaxed);
        }
        spread
            && misses >= COMPLETE_WINDOW_MISSES
            && scattered * 100 >= misses * COMPLETE_SCATTERED_PERCENT
    }
}

/// Interned chain keys. Ids are never reused, so an entry can never be read under another
/// chain's id. `token`'s strong count minus one is the number of live wrappers; it also
/// carries the chain's read-ahead score.
#[derive(Debug, Default)]
pub(crate) struct ChainTable {
    next_id: u64,
    tick: u64,
    by_key: HashMap<ChainKey, ChainEntry>,
}

#[derive(Debug)]
struct ChainEntry {
    id: u64,
    token: Arc<ReadAheadScore>,
    used_tick: u64,
}

impl ChainTable {
    /// The id of `key` (a new one if unknown), a token to hold while wrapped, and the ids of
    /// idle chains forgotten to stay under [`IDLE_CHAINS_MAX`] (their entries must be purged).
    pub(crate) fn intern(&mut self, key: ChainKey) -> (u64, Arc<ReadAheadScore>, Vec<u64>) {
        self.tick += 1;
        if let Some(e) = self.by_key.get_mut(&key) {
            e.used_tick = self.tick;
            return (e.id, e.token.clone(), Vec::new());
        }
        let mut forgotten = Vec::new();
        while self.by_key.len() >= IDLE_CHAINS_MAX {
            let oldest_idle = self
                .by_key
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.token) == 1)
                .min_by_key(|(_, e)| e.used_tick)
                .map(|(k, _)| k.clone());
            let Some(k) = oldest_idle else { break };
            if let Some(e) = self.by_key.remove(&k) {
                forgotten.push(e.id);
            }
        }
        self.next_id += 1;
        let e = ChainEntry {
            id: self.next_id,
            token: Arc::default(),
            used_tick: self.tick,
        };
        let out = (e.id, e.token.clone(), forgotten);
        self.by_key.insert(key, e);
        out
    }

    /// Forgets `key`; returns its id if it was known (the caller purges its entries).
    pub(crate) fn remove(&mut self, key: &ChainKey) -> Option<u64> {
        self.by_key.remove(key).map(|e| e.id)
    }

    /// The number of chains known, live or idle.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// True when a block holding pages `have` is asked for pages `need` of which some are
/// missing and none of the missing ones borders a held page: a read elsewhere in a block
/// already partly read (random access), not the next read of a stream through it.
#[inline]
pub(crate) fn scattered(have: u64, need: u64) -> bool {
    let missing = need & !have;
    have != 0 && missing != 0 && missing & (have << 1 | have >> 1) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ChainKey {
        ChainKey::new(name, None)
    }

    #[test]
    fn interning_the_same_key_gives_the_same_id() {
        let mut t = ChainTable::default();
        let (a, _ta, _) = t.intern(key("a"));
        let (b, _tb, _) = t.intern(key("a"));
        assert_eq!(a, b);
    }

    #[test]
    fn idle_chains_past_the_limit_are_forgotten_oldest_first() {
        let mut t = ChainTable::default();
        let (first, token, _) = t.intern(key("0"));
        drop(token);
        for i in 1..IDLE_CHAINS_MAX {
            t.intern(key(&i.to_string()));
        }
        let (_, _, forgotten) = t.intern(key("new"));
        assert_eq!(forgotten, vec![first]);
    }

    #[test]
    fn live_chains_are_not_forgotten() {
        let mut t = ChainTable::default();
        let tokens: Vec<_> = (0..IDLE_CHAINS_MAX)
            .map(|i| t.intern(key(&i.to_string())).1)
            .collect();
        let (_, _, forgotten) = t.intern(key("new"));
        assert!(forgotten.is_empty() && tokens.len() == IDLE_CHAINS_MAX);
    }

    #[test]
    fn scattered_is_a_miss_apart_from_the_held_pages() {
        // Nothing held: a first miss.
        assert!(!scattered(0, 0b100));
        // Everything needed is held: a hit.
        assert!(!scattered(0b110, 0b100));
        // The next page after the held ones, or the one before: a stream.
        assert!(!scattered(0b0110, 0b1000));
        assert!(!scattered(0b0110, 0b0001));
        // A request overlapping the held pages and going on: a stream.
        assert!(!scattered(0b0110, 0b1110));
        // A gap between the held pages and the missing ones.
        assert!(scattered(0b0001, 0b0100));
        assert!(scattered(1 << 63, 1));
        assert!(scattered(1, 1 << 63));
    }
}
