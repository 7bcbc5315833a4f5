//! Single-flight fills: at most one reader (the *claimant*) reads a block from the store
//! while every other reader of that block waits for it.
//!
//! A reader that finds a block absent, or ready without the pages it needs, *claims* it in
//! its shard: the shard's entry becomes `Loading(flight)` (or `Refilling(old, flight)`,
//! whose old pages stay readable meanwhile) and the reader gets a [`Claimed`]. Readers who
//! come later find the entry loading and wait on the [`Flight`]'s condvar. The claimant
//! then either publishes the filled entry into the shard or abandons the claim, and only
//! after that ends the flight, which wakes the waiters: a woken waiter looks again and
//! finds the entry ready (or absent after a failure, and claims it itself). Nothing caches
//! a failure. Dropping an unfinished [`Claimed`] (a panic in the store read) abandons it,
//! so waiters never hang.
//!
//! ```text
//!   Absent ──claim──► Loading(flight) ──publish──► Ready ──(hand)──► Absent
//!                          │  └──abandon──► Absent           │
//!   Ready (some pages) ──claim──► Refilling(old, flight) ──publish──► Ready (merged)
//!                          └──abandon──► Ready (old)
//!   then: flight.finish(Ready | Failed) ──notify_all──► waiters look again
//! ```

use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};

use disk::{Error, ErrorKind, Result};

use crate::entry::Cached;
use crate::shard::{Claim, Key, Lookup, Published, Shard};

/// A shard of the cache: its ready data is a block's [`Cached`] entry, its pending token
/// the fill's [`Flight`].
pub(crate) type CacheShard = Shard<Cached, Arc<Flight>>;

/// One fill in progress. The claimant finishes it; waiters block on `done`.
#[derive(Debug)]
pub(crate) struct Flight {
    state: Mutex<FlightState>,
    done: Condvar,
}

/// How a fill ended, or that it has not yet.
#[derive(Debug)]
pub(crate) enum FlightState {
    Pending,
    Ready(Cached),
    Failed(ErrorKind, String),
}

impl Flight {
    fn new() -> Arc<Flight> {
        Arc::new(Flight {
            state: Mutex::new(FlightState::Pending),
            done: Condvar::new(),
        })
    }

    /// Ends the flight with `outcome` and wakes its waiters. The claimant calls it once,
    /// after its entry was published or abandoned.
    fn finish(&self, outcome: FlightState) {
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            debug_assert!(
                matches!(*state, FlightState::Pending),
                "a flight ends once: it already ended as {:?}",
                *state
            );
            *state = outcome;
        }
        self.done.notify_all();
    }

    /// Waits for the flight to end: the filled entry, or the fill's error.
    ///
    /// # Errors
    /// The claimant's store read failed (or its fill was abandoned).
    pub(crate) fn wait(&self) -> Result<Cached> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while matches!(*g, FlightState::Pending) {
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        match &*g {
            FlightState::Ready(d) => Ok(d.clone()),
            FlightState::Failed(kind, msg) => Err(Error::new(*kind, msg.clone())),
            FlightState::Pending => unreachable!("the loop above waits until the flight ends"),
        }
    }
}

/// Ownership of one claimed block: `publish` or `fail` it; dropping it unfinished (a panic
/// in the store read) abandons the fill so waiters wake with an error instead of hanging.
pub(crate) struct Claimed<'a> {
    /// The shard holding the claim (`key`'s shard).
    shard: &'a RwLock<CacheShard>,
    /// The block claimed.
    pub(crate) key: Key,
    flight: Arc<Flight>,
    /// The entry this fill extends (a refill of more pages), if any.
    pub(crate) old: Option<Cached>,
    open: bool,
}

impl Claimed<'_> {
    /// Publishes `data` as the block's entry (`prefetched`: filled by read-ahead), then
    /// wakes the waiters.
    #[inline]
    pub(crate) fn publish(mut self, data: Cached, prefetched: bool) -> Published {
        let charge = data.charge_bytes();
        let p = {
            let mut shard = self.shard.write().unwrap_or_else(PoisonError::into_inner);
            debug_assert!(
                self.holds_claim(&shard),
                "{:?}: a fill publishes only the block it claimed",
                self.key
            );
            let p = shard.publish(self.key, data.clone(), charge, prefetched, data.group);
            debug_assert!(
                shard.pending(self.key).is_none(),
                "{:?}: published before its waiters wake",
                self.key
            );
            p
        };
        self.flight.finish(FlightState::Ready(data));
        self.open = false;
        p
    }

    /// Abandons the claim after a failed fill and wakes the waiters with the error.
    #[inline]
    pub(crate) fn fail(mut self, kind: ErrorKind, msg: String) {
        self.end(FlightState::Failed(kind, msg));
    }

    fn end(&mut self, outcome: FlightState) {
        {
            let mut shard = self.shard.write().unwrap_or_else(PoisonError::into_inner);
            debug_assert!(
                self.holds_claim(&shard),
                "{:?}: a fill abandons only the block it claimed",
                self.key
            );
            shard.abandon(self.key);
            debug_assert!(
                shard.pending(self.key).is_none(),
                "{:?}: abandoned before its waiters wake",
                self.key
            );
        }
        self.flight.finish(outcome);
        self.open = false;
    }

    /// True when `shard` (this claim's, locked) has the block pending on this claim's
    /// flight: nothing but the claimant ends a claim, and eviction of an entry being
    /// refilled keeps the claim.
    fn holds_claim(&self, shard: &CacheShard) -> bool {
        shard
            .pending(self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if self.open {
            self.end(FlightState::Failed(
                ErrorKind::Io,
                "block fill abandoned".into(),
            ));
        }
    }
}

/// What a reader found for a block.
pub(crate) enum Found<'a> {
    /// Ready with the pages needed, and whether this is the first demand use of a
    /// prefetched entry.
    Ready(Cached, bool),
    /// Being filled by someone else: wait on the flight, then look again.
    Wait(Arc<Flight>),
    /// The caller now fills it.
    Claimed(Claimed<'a>),
}

/// Looks `key` up in `shard` (its shard) under the read lock, and claims it when it is
/// absent or lacks pages of `need`.
pub(crate) fn find_or_claim(shard: &RwLock<CacheShard>, key: Key, need: u64) -> Found<'_> {
    let found = shard
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .lookup(key);
    match found {
        Lookup::Ready(c, first) | Lookup::Refilling(c, first, _) if c.covers(need) => {
            Found::Ready(c, first)
        }
        Lookup::Loading(f) | Lookup::Refilling(_, _, f) => Found::Wait(f),
        Lookup::Ready(..) | Lookup::Absent => claim(shard, key, need),
    }
}

/// Claims `key` in `shard` (its shard) unless it is loading or ready with every page of
/// `need`.
pub(crate) fn claim(shard: &RwLock<CacheShard>, key: Key, need: u64) -> Found<'_> {
    let flight = Flight::new();
    let claim = shard.write().unwrap_or_else(PoisonError::into_inner).claim(
        key,
        flight.clone(),
        |c: &Cached| c.covers(need),
    );
    match claim {
        Claim::Claimed { old } => Found::Claimed(Claimed {
            shard,
            key,
            flight,
            old,
            open: true,
        }),
        Claim::Ready(c) => Found::Ready(c, false),
        Claim::Loading(f) => Found::Wait(f),
    }
}
