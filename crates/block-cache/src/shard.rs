//! One shard of the cache: a map from key to entry, plus a CLOCK ring over the ready entries.
//!
//! Pure: no I/O, no threads, no time. The caller holds the shard's lock (`&self` methods
//! under a read lock, `&mut self` under the write lock) and does the store reads itself, in
//! between [`Shard::claim`] and [`Shard::publish`] / [`Shard::abandon`].
//!
//! Generic over the ready data `D` and the pending token `P` (the cache stores its block
//! data and an `Arc<Flight>`), so the tests below use plain integers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a block entry is keyed by: the interned chain id and the block index in that chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The chain's id, unique for the cache's lifetime (never reused).
    pub chain: u64,
    /// The block index (virtual offset / block bytes).
    pub block: u64,
}

/// The state of a key as a reader finds it.
#[derive(Debug)]
pub(crate) enum Lookup<D, P> {
    /// Ready data, and whether this is the first demand use of a prefetched entry.
    Ready(D, bool),
    /// Someone is filling it; wait on the token.
    Loading(P),
    /// Ready data (and first use, as for `Ready`) that someone is extending: use it if it
    /// holds what the reader needs, else wait on the token.
    Refilling(D, bool, P),
    /// Neither.
    Absent,
}

/// The outcome of trying to become the one filler of a key.
#[derive(Debug)]
pub(crate) enum Claim<D, P> {
    /// The caller now owns the fill and must `publish` or `abandon` the key. `old` is the
    /// ready data the caller found insufficient (a refill), taken out of the cache.
    Claimed {
        /// The replaced entry's data, for a refill.
        old: Option<D>,
    },
    /// Already ready (and sufficient).
    Ready(D),
    /// Someone else is filling it.
    Loading(P),
}

/// What a `publish` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Published {
    /// False when the entry alone is larger than the shard's budget (served, not kept).
    pub inserted: bool,
    /// Entries evicted to make room.
    pub evicted: u64,
    /// Their charged bytes.
    pub evicted_bytes: u64,
}

#[derive(Debug)]
enum Entry<P> {
    /// Index into the ring.
    Ready(usize),
    Loading(P),
    /// Ready at the ring index, and being extended by a fill (a refill of more pages):
    /// readers of what it holds keep reading it meanwhile.
    Refilling(usize, P),
}

/// What [`Shard::retire_scanned`] did with a scan's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retired {
    /// Evicted: (entries, charged bytes).
    Evicted(u64, u64),
    /// Read again, so kept, with its data rehomed.
    Kept,
    /// Not there under that id any more (evicted, replaced, or being refilled).
    Gone,
}

/// Entries that share one buffer (consecutive blocks of one chain, read by one store read)
/// and therefore leave the cache together: evicting one alone would free no memory while
/// its charge was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    /// Identifies the group while it lives: the address of its first byte in its buffer
    /// (groups never share bytes, so no two live groups have the same id).
    pub id: usize,
    /// The first block of the group.
    pub first: u64,
    /// Its number of blocks.
    pub blocks: u64,
}

#[derive(Debug)]
struct Slot<D> {
    key: Key,
    data: D,
    group: Option<Group>,
    charge_bytes: u64,
    /// The CLOCK bit: set by hits (under the read lock, hence atomic), cleared by the hand.
    referenced: AtomicBool,
    /// Set when read-ahead filled the entry, cleared by its first demand hit (which the
    /// caller counts as read-ahead that paid off).
    prefetched: AtomicBool,
}

/// One shard. Invariants: `charged_bytes` is the sum of the ready slots' charges and never
/// exceeds `budget_bytes`; every `Entry::Ready(i)` points at `ring[i] == Some(slot)` with
/// `slot.key` its key, and every occupied slot has exactly one such entry.
#[derive(Debug)]
pub(crate) struct Shard<D, P> {
    map: HashMap<Key, Entry<P>>,
    ring: Vec<Option<Slot<D>>>,
    /// Empty ring positions, reused before the ring grows.
    free: Vec<usize>,
    hand: usize,
    charged_bytes: u64,
    budget_bytes: u64,
}

impl<D: Clone, P: Clone> Shard<D, P> {
    /// An empty shard that keeps at most `budget_bytes` of charged entries.
    pub fn new(budget_bytes: u64) -> Self {
        Shard {
            map: HashMap::new(),
            ring: Vec::new(),
            free: Vec::new(),
            hand: 0,
            charged_bytes: 0,
            budget_bytes,
        }
    }

    /// Looks `key` up; a ready hit sets its CLOCK bit.
    pub fn lookup(&self, key: Key) -> Lookup<D, P> {
        match self.map.get(&key) {
            Some(Entry::Ready(i)) => {
                debug_assert_eq!(self.slot(*i).key, key, "a ready entry's slot is its own");
                let (d, first_use) = self.hit(*i);
                Lookup::Ready(d, first_use)
            }
            Some(Entry::Refilling(i, p)) => {
                debug_assert_eq!(self.slot(*i).key, key, "a refilled entry's slot is its own");
                let (d, first_use) = self.hit(*i);
                Lookup::Refilling(d, first_use, p.clone())
            }
            Some(Entry::Loading(p)) => Lookup::Loading(p.clone()),
            None => Lookup::Absent,
        }
    }

    /// A hit on slot `i`: sets its CLOCK bit, returns its data and whether this is the first
    /// demand use of a prefetched entry.
    fn hit(&self, i: usize) -> (D, bool) {
        let slot = self.slot(i);
        let first_use = slot.prefetched.load(Ordering::Relaxed)
            && slot.prefetched.swap(false, Ordering::Relaxed);
        // The first demand read of a prefetched block is its first read: no second chance.
        // Load first: a hot block's bit is usually set already, and a plain load keeps its
        // cache line shared between the cores that read it.
        if !first_use && !slot.referenced.load(Ordering::Relaxed) {
            slot.referenced.store(true, Ordering::Relaxed);
        }
        (slot.data.clone(), first_use)
    }

    /// True when `key` is ready or loading; does not touch the CLOCK bit (read-ahead uses
    /// it, and a prefetch must not protect a block from eviction).
    pub fn contains(&self, key: Key) -> bool {
        self.map.contains_key(&key)
    }

    /// The token of the fill that `key` is pending on (loading, or ready and being
    /// refilled), if any. For assertions: only the claimant publishes or abandons a key.
    pub fn pending(&self, key: Key) -> Option<&P> {
        match self.map.get(&key) {
            Some(Entry::Loading(p) | Entry::Refilling(_, p)) => Some(p),
            Some(Entry::Ready(_)) | None => None,
        }
    }

    /// Makes the caller the filler of `key` unless it is loading, or ready with data that
    /// `enough` accepts. Ready data that `enough` refuses (a block with only some of its
    /// pages) stays readable while the caller extends it (`Refilling`), and a copy is handed
    /// back. Does not set the CLOCK bit (read-ahead claims too).
    pub fn claim(&mut self, key: Key, token: P, enough: impl Fn(&D) -> bool) -> Claim<D, P> {
        match self.map.get(&key) {
            Some(Entry::Ready(i)) => {
                let i = *i;
                let data = self.slot(i).data.clone();
                if enough(&data) {
                    return Claim::Ready(data);
                }
                self.map.insert(key, Entry::Refilling(i, token));
                Claim::Claimed { old: Some(data) }
            }
            Some(Entry::Refilling(i, p)) => {
                let data = self.slot(*i).data.clone();
                if enough(&data) {
                    Claim::Ready(data)
                } else {
                    Claim::Loading(p.clone())
                }
            }
            Some(Entry::Loading(p)) => Claim::Loading(p.clone()),
            None => {
                self.map.insert(key, Entry::Loading(token));
                Claim::Claimed { old: None }
            }
        }
    }

    /// Turns the claimed `key` into a ready entry charged `charge_bytes`, evicting by CLOCK
    /// until it fits. New entries start with a clear bit: a block read once is the first to
    /// go, and a block read again (a second connection, a second boot) earns a second chance.
    /// An entry of a `group` (all of whose blocks must be in this shard) is evicted with the
    /// rest of its group; publishing it evicts other entries of its group only if nothing
    /// else is left to evict.
    pub fn publish(
        &mut self,
        key: Key,
        data: D,
        charge_bytes: u64,
        prefetched: bool,
        group: Option<Group>,
    ) -> Published {
        let was = self.map.remove(&key);
        debug_assert!(
            matches!(was, Some(Entry::Loading(_) | Entry::Refilling(..))),
            "publish of a key that was not claimed"
        );
        if let Some(Entry::Refilling(i, _)) = was {
            // The new entry replaces the one it extends.
            self.free_slot(i);
        }
        let mut out = Published::default();
        if charge_bytes > self.budget_bytes {
            return out;
        }
        let protect = group.map(|g| g.id);
        let charged_before = self.charged_bytes;
        while self.charged_bytes + charge_bytes > self.budget_bytes {
            let Some((n, bytes)) = self.evict_one(protect).or_else(|| self.evict_one(None)) else {
                unreachable!("charged bytes exceed the budget with nothing to evict");
            };
            out.evicted += n;
            out.evicted_bytes += bytes;
        }
        // What eviction reports freeing is what left the charge (the callers count it).
        debug_assert_eq!(
            charged_before - self.charged_bytes,
            out.evicted_bytes,
            "evicted bytes disagree with the charge released"
        );
        let slot = Slot {
            key,
            data,
            group,
            charge_bytes,
            referenced: AtomicBool::new(false),
            prefetched: AtomicBool::new(prefetched),
        };
        let i = match self.free.pop() {
            Some(i) => {
                debug_assert!(self.ring[i].is_none(), "a free ring position is empty");
                self.ring[i] = Some(slot);
                i
            }
            None => {
                self.ring.push(Some(slot));
                self.ring.len() - 1
            }
        };
        self.map.insert(key, Entry::Ready(i));
        self.charged_bytes += charge_bytes;
        debug_assert!(self.charged_bytes <= self.budget_bytes);
        out.inserted = true;
        out
    }

    /// Drops the claim on `key` after a failed fill; later readers retry.
    pub fn abandon(&mut self, key: Key) {
        match self.map.get(&key) {
            Some(Entry::Loading(_)) => {
                self.map.remove(&key);
            }
            Some(Entry::Refilling(i, _)) => {
                // The entry being extended stays as it was.
                let i = *i;
                self.map.insert(key, Entry::Ready(i));
            }
            Some(Entry::Ready(_)) | None => {}
        }
    }

    /// Drops every ready entry of `chain`; returns (entries, charged bytes) dropped.
    /// Loading entries stay: their fillers publish them under the old id, which no new
    /// wrapper uses, and CLOCK ages them out.
    pub fn remove_chain(&mut self, chain: u64) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        for i in 0..self.ring.len() {
            if self.ring[i].as_ref().is_some_and(|s| s.key.chain == chain) {
                bytes += self.remove_slot(i);
                n += 1;
            }
        }
        // A whole pass over the ring already: check the shard's invariants while here.
        debug_assert!(self.consistent(), "shard invariants after remove_chain");
        (n, bytes)
    }

    /// The shard's invariants (see [`Shard`]), checked in full: `charged_bytes` is the sum
    /// of the ready slots' charges and within the budget, every ready or refilled map entry
    /// points at an occupied slot holding its key, every occupied slot has such an entry,
    /// and the free list holds exactly the empty positions. O(entries): for assertions at
    /// whole-shard operations and in tests.
    fn consistent(&self) -> bool {
        let charged: u64 = self.ring.iter().flatten().map(|s| s.charge_bytes).sum();
        let linked = self.map.iter().all(|(k, e)| match e {
            Entry::Ready(i) | Entry::Refilling(i, _) => self
                .ring
                .get(*i)
                .and_then(Option::as_ref)
                .is_some_and(|s| s.key == *k),
            Entry::Loading(_) => true,
        });
        let occupied = self.ring.iter().flatten().all(|s| {
            matches!(
                self.map.get(&s.key),
                Some(Entry::Ready(_) | Entry::Refilling(..))
            )
        });
        let empty = self.ring.iter().filter(|s| s.is_none()).count();
        charged == self.charged_bytes
            && charged <= self.budget_bytes
            && linked
            && occupied
            && empty == self.free.len()
            && self.free.iter().all(|&i| self.ring[i].is_none())
    }

    /// Charged bytes of the ready entries.
    pub fn charged_bytes(&self) -> u64 {
        self.charged_bytes
    }

    /// The number of ready entries.
    pub fn ready_len(&self) -> usize {
        self.ring.len() - self.free.len()
    }

    fn slot(&self, i: usize) -> &Slot<D> {
        match &self.ring[i] {
            Some(s) => s,
            None => unreachable!("a ready map entry points at an occupied ring slot"),
        }
    }

    /// One sweep of the hand: clears set bits and evicts the first clear one, with the rest
    /// of its group; entries of group `protect` are passed over. Two passes at most, since
    /// the first clears every bit it passes. Returns (entries, charged bytes) evicted.
    fn evict_one(&mut self, protect: Option<usize>) -> Option<(u64, u64)> {
        let n = self.ring.len();
        for _ in 0..2 * n {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            let Some(slot) = self.ring[i].as_mut() else {
                continue;
            };
            if protect.is_some() && slot.group.map(|g| g.id) == protect {
                continue;
            }
            if *slot.referenced.get_mut() {
                *slot.referenced.get_mut() = false;
                continue;
            }
            return Some(self.remove_with_group(i));
        }
        None
    }

    /// Retires a scan's group past the window, found by one of its blocks (`key`) and its
    /// id: evicted with the rest of its group if every member's CLOCK bit is clear (no
    /// second read touched it). If it was read again it stays, and `rehome` may give its
    /// entries new data (a copy into a buffer of their own, so the scan's shared buffer can
    /// be reused) and a new group: it gets the group's ready entries as (block, data) in
    /// block order and returns their data in the same order, or `None` to leave them as
    /// they are.
    pub fn retire_scanned(
        &mut self,
        key: Key,
        id: usize,
        rehome: impl FnOnce(&[(u64, &D)]) -> Option<(Vec<D>, Group)>,
    ) -> Retired {
        let Some(Entry::Ready(i)) = self.map.get(&key) else {
            return Retired::Gone;
        };
        let i = *i;
        let slot = self.slot(i);
        let Some(g) = slot.group.filter(|g| g.id == id) else {
            return Retired::Gone;
        };
        // Members being refilled are left alone: their refill replaces them.
        let members: Vec<usize> = (g.first..g.first + g.blocks)
            .filter_map(|block| match self.map.get(&Key { block, ..key }) {
                Some(Entry::Ready(j)) => Some(*j),
                _ => None,
            })
            .filter(|&j| self.slot(j).group.map(|x| x.id) == Some(id))
            .collect();
        if !members
            .iter()
            .any(|&j| self.slot(j).referenced.load(Ordering::Relaxed))
        {
            let (n, bytes) = self.remove_with_group(i);
            return Retired::Evicted(n, bytes);
        }
        let views: Vec<(u64, &D)> = members
            .iter()
            .map(|&j| (self.slot(j).key.block, &self.slot(j).data))
            .collect();
        let Some((data, group)) = rehome(&views) else {
            return Retired::Kept;
        };
        debug_assert_eq!(data.len(), members.len());
        // The new group must span every member, or evicting it would leave some behind.
        debug_assert!(
            members.iter().all(|&j| {
                let b = self.slot(j).key.block;
                (group.first..group.first + group.blocks).contains(&b)
            }),
            "a rehomed group spans its members"
        );
        for (j, d) in members.into_iter().zip(data) {
            if let Some(s) = self.ring[j].as_mut() {
                s.data = d;
                s.group = Some(group);
            }
        }
        Retired::Kept
    }

    /// Removes slot `i` and the other entries of its group; returns (entries, charged bytes).
    fn remove_with_group(&mut self, i: usize) -> (u64, u64) {
        let slot = self.slot(i);
        let (key, group) = (slot.key, slot.group);
        let mut out = (1, self.remove_slot(i));
        if let Some(g) = group {
            for block in (g.first..g.first + g.blocks).filter(|&b| b != key.block) {
                let k = Key {
                    chain: key.chain,
                    block,
                };
                let at = match self.map.get(&k) {
                    Some(Entry::Ready(j) | Entry::Refilling(j, _)) => *j,
                    Some(Entry::Loading(_)) | None => continue,
                };
                if self.slot(at).group.map(|x| x.id) == Some(g.id) {
                    out.0 += 1;
                    out.1 += self.remove_slot(at);
                }
            }
            debug_assert!(
                (g.first..g.first + g.blocks).all(|block| {
                    let k = Key { block, ..key };
                    !matches!(self.map.get(&k), Some(Entry::Ready(j) | Entry::Refilling(j, _))
                        if self.slot(*j).group.map(|x| x.id) == Some(g.id))
                }),
                "a group leaves the shard whole"
            );
        }
        out
    }

    /// Removes the slot at `i` and its map entry (a slot being refilled leaves its filler a
    /// plain `Loading` claim). Returns its charged bytes.
    fn remove_slot(&mut self, i: usize) -> u64 {
        let key = self.slot(i).key;
        match self.map.remove(&key) {
            Some(Entry::Refilling(_, p)) => {
                self.map.insert(key, Entry::Loading(p));
            }
            Some(Entry::Ready(_) | Entry::Loading(_)) | None => {}
        }
        self.free_slot(i)
    }

    /// Frees ring slot `i` (its map entry is the caller's business); returns its charge.
    fn free_slot(&mut self, i: usize) -> u64 {
        let Some(slot) = self.ring[i].take() else {
            unreachable!("free_slot is called on occupied slots only");
        };
        self.free.push(i);
        self.charged_bytes -= slot.charge_bytes;
        slot.charge_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(block: u64) -> Key {
        Key { chain: 1, block }
    }

    /// A shard of 3 entries of 10 bytes, holding blocks 0, 1, 2 (bits clear).
    fn full_shard() -> Shard<u64, u32> {
        let mut s = Shard::new(30);
        for b in 0..3 {
            assert!(matches!(
                s.claim(key(b), 0, |_| true),
                Claim::Claimed { old: None }
            ));
            s.publish(key(b), b * 100, 10, false, None);
        }
        s
    }

    #[test]
    fn claim_of_loading_key_returns_its_token() {
        let mut s: Shard<u64, u32> = Shard::new(100);
        s.claim(key(7), 42, |_| true);
        assert!(matches!(s.claim(key(7), 43, |_| true), Claim::Loading(42)));
    }

    #[test]
    fn publish_makes_lookup_ready() {
        let mut s: Shard<u64, u32> = Shard::new(100);
        s.claim(key(7), 1, |_| true);
        s.publish(key(7), 700, 10, false, None);
        assert!(matches!(s.lookup(key(7)), Lookup::Ready(700, _)));
    }

    #[test]
    fn publish_past_budget_evicts_oldest_unreferenced() {
        let mut s = full_shard();
        s.claim(key(3), 0, |_| true);
        let p = s.publish(key(3), 300, 10, false, None);
        assert_eq!(p.evicted, 1);
        assert!(matches!(s.lookup(key(0)), Lookup::Absent));
    }

    #[test]
    fn referenced_entry_gets_second_chance() {
        let mut s = full_shard();
        let _ = s.lookup(key(0)); // sets block 0's bit
        s.claim(key(3), 0, |_| true);
        s.publish(key(3), 300, 10, false, None);
        assert!(matches!(s.lookup(key(0)), Lookup::Ready(0, _)));
        assert!(matches!(s.lookup(key(1)), Lookup::Absent));
    }

    #[test]
    fn contains_does_not_set_the_bit() {
        let mut s = full_shard();
        assert!(s.contains(key(0)));
        s.claim(key(3), 0, |_| true);
        s.publish(key(3), 300, 10, false, None);
        assert!(!s.contains(key(0)));
    }

    #[test]
    fn entry_larger_than_budget_is_not_kept() {
        let mut s: Shard<u64, u32> = Shard::new(5);
        s.claim(key(1), 0, |_| true);
        let p = s.publish(key(1), 1, 10, false, None);
        assert!(!p.inserted);
        assert_eq!(s.charged_bytes(), 0);
    }

    #[test]
    fn abandon_lets_the_next_reader_claim() {
        let mut s: Shard<u64, u32> = Shard::new(100);
        s.claim(key(1), 5, |_| true);
        s.abandon(key(1));
        assert!(matches!(
            s.claim(key(1), 6, |_| true),
            Claim::Claimed { old: None }
        ));
    }

    #[test]
    fn remove_chain_drops_only_that_chain() {
        let mut s = full_shard();
        let other = Key { chain: 2, block: 0 };
        s.claim(other, 0, |_| true);
        s.publish(other, 9, 0, false, None);
        assert_eq!(s.remove_chain(1), (3, 30));
        assert_eq!((s.ready_len(), s.charged_bytes()), (1, 0));
    }

    #[test]
    fn freed_slots_are_reused() {
        let mut s = full_shard();
        for b in 3..10 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), b, 10, false, None);
        }
        assert_eq!(s.ring.len(), 3);
    }

    #[test]
    fn an_insufficient_entry_stays_readable_while_refilled() {
        let mut s = full_shard();
        let before = s.charged_bytes();
        assert!(matches!(
            s.claim(key(1), 9, |d| *d > 1000),
            Claim::Claimed { old: Some(100) }
        ));
        assert!(matches!(s.lookup(key(1)), Lookup::Refilling(100, _, 9)));
        // Another reader content with the old data gets it; one that is not waits.
        assert!(matches!(s.claim(key(1), 10, |_| true), Claim::Ready(100)));
        assert!(matches!(
            s.claim(key(1), 10, |d| *d > 1000),
            Claim::Loading(9)
        ));
        s.publish(key(1), 2000, 10, false, None);
        assert!(matches!(s.lookup(key(1)), Lookup::Ready(2000, false)));
        assert_eq!(s.charged_bytes(), before);
        assert_eq!(s.ready_len(), 3);
        assert!(s.consistent());
    }

    #[test]
    fn an_abandoned_refill_keeps_the_old_entry() {
        let mut s = full_shard();
        s.claim(key(2), 9, |_| false);
        s.abandon(key(2));
        assert!(matches!(s.lookup(key(2)), Lookup::Ready(200, false)));
    }

    #[test]
    fn evicting_an_entry_being_refilled_leaves_the_filler_a_claim() {
        let mut s = full_shard();
        s.claim(key(0), 9, |_| false);
        // Blocks 0..2 have clear bits; a new block evicts block 0, the one being refilled.
        s.claim(key(3), 1, |_| true);
        s.publish(key(3), 300, 10, false, None);
        assert!(matches!(s.lookup(key(0)), Lookup::Loading(9)));
        s.publish(key(0), 7, 10, false, None);
        assert!(matches!(s.lookup(key(0)), Lookup::Ready(7, false)));
        assert_eq!(s.charged_bytes(), 30);
        assert!(s.consistent());
    }

    #[test]
    fn a_prefetched_entry_reports_its_first_use_once() {
        let mut s: Shard<u64, u32> = Shard::new(100);
        s.claim(key(4), 0, |_| true);
        s.publish(key(4), 4, 10, true, None);
        assert!(matches!(s.lookup(key(4)), Lookup::Ready(4, true)));
        assert!(matches!(s.lookup(key(4)), Lookup::Ready(4, false)));
    }

    #[test]
    fn the_first_use_of_a_prefetched_entry_earns_no_second_chance() {
        let mut s: Shard<u64, u32> = Shard::new(30);
        for b in 0..3 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), b, 10, b == 0, None);
        }
        // Block 0 was prefetched and then read once; block 1 was read twice.
        let _ = s.lookup(key(0));
        let _ = s.lookup(key(1));
        s.claim(key(3), 0, |_| true);
        s.publish(key(3), 3, 10, false, None);
        assert!(matches!(s.lookup(key(0)), Lookup::Absent));
        assert!(matches!(s.lookup(key(1)), Lookup::Ready(1, false)));
    }

    #[test]
    fn retire_scanned_evicts_the_group_unless_read_again_then_rehomes_it() {
        let mut s: Shard<u64, u32> = Shard::new(100);
        for b in 0..3 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), 7, 10, false, group(1, 0, 3));
        }
        for b in 5..7 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), 8, 10, false, group(2, 5, 2));
        }
        let never =
            |_: &[(u64, &u64)]| -> Option<(Vec<u64>, Group)> { panic!("nothing to rehome") };
        // Another group under the key (the buffer was replaced): left alone.
        assert_eq!(s.retire_scanned(key(1), 9, never), Retired::Gone);
        // Neither read again nor replaced: the whole group goes.
        assert_eq!(s.retire_scanned(key(1), 1, never), Retired::Evicted(3, 30));
        assert_eq!((s.ready_len(), s.charged_bytes()), (2, 20));
        assert_eq!(s.retire_scanned(key(1), 1, never), Retired::Gone);
        // Read again: kept, every member rehomed into the new group, charges unchanged.
        let _ = s.lookup(key(6));
        let r = s.retire_scanned(key(5), 2, |members| {
            assert_eq!(members.iter().map(|m| m.0).collect::<Vec<_>>(), [5, 6]);
            assert!(members.iter().all(|m| *m.1 == 8));
            Some((
                vec![50, 60],
                Group {
                    id: 3,
                    first: 5,
                    blocks: 2,
                },
            ))
        });
        assert_eq!(r, Retired::Kept);
        // Nothing to copy: kept as it was (and still under its id).
        let none = |_: &[(u64, &u64)]| -> Option<(Vec<u64>, Group)> { None };
        assert_eq!(s.retire_scanned(key(5), 3, none), Retired::Kept);
        assert!(matches!(s.lookup(key(5)), Lookup::Ready(50, false)));
        assert!(matches!(s.lookup(key(6)), Lookup::Ready(60, false)));
        assert_eq!((s.ready_len(), s.charged_bytes()), (2, 20));
        // The old id is gone; the new group leaves whole.
        assert_eq!(s.retire_scanned(key(5), 2, never), Retired::Gone);
        assert_eq!(s.evict_one(None), Some((2, 20)));
        assert_eq!(s.ready_len(), 0);
        // Being loaded: left alone.
        s.claim(key(8), 0, |_| true);
        assert_eq!(s.retire_scanned(key(8), 3, never), Retired::Gone);
    }

    fn group(id: usize, first: u64, blocks: u64) -> Option<Group> {
        Some(Group { id, first, blocks })
    }

    #[test]
    fn a_group_is_evicted_whole() {
        let mut s: Shard<u64, u32> = Shard::new(50);
        for b in 0..3 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), b, 10, false, group(1, 0, 3));
        }
        for b in [10, 11] {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), b, 10, false, None);
        }
        // Full: the hand is at block 0, whose group goes with it.
        s.claim(key(12), 0, |_| true);
        let p = s.publish(key(12), 12, 10, false, None);
        assert_eq!((p.evicted, p.evicted_bytes), (3, 30));
        for b in 0..3 {
            assert!(matches!(s.lookup(key(b)), Lookup::Absent), "block {b}");
        }
        assert_eq!((s.ready_len(), s.charged_bytes()), (3, 30));
        assert!(s.consistent());
    }

    #[test]
    fn publishing_a_group_evicts_others_first_then_its_own_if_nothing_else() {
        let mut s: Shard<u64, u32> = Shard::new(30);
        s.claim(key(9), 0, |_| true);
        s.publish(key(9), 9, 10, false, None);
        for b in 0..2 {
            s.claim(key(b), 0, |_| true);
            s.publish(key(b), b, 10, false, group(1, 0, 3));
        }
        // Block 9 goes, not the group's first blocks (the hand passes them).
        s.claim(key(2), 0, |_| true);
        let p = s.publish(key(2), 2, 10, false, group(1, 0, 3));
        assert_eq!(p.evicted, 1);
        assert!(matches!(s.lookup(key(9)), Lookup::Absent));
        assert_eq!(s.ready_len(), 3);
        // A shard holding only one group: a new member evicts the group (no panic).
        let mut t: Shard<u64, u32> = Shard::new(20);
        for b in 0..3 {
            t.claim(key(b), 0, |_| true);
            t.publish(key(b), b, 10, false, group(2, 0, 3));
        }
        assert!(t.charged_bytes() <= 20);
        assert!(s.consistent() && t.consistent());
    }
}
