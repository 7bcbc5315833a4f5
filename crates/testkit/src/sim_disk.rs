//! [`SimDisk`]: a simulated file implementing [`disk::Storage`] that can crash, tear writes and
//! fail on command.
//!
//! # Design notes
//!
//! A real disk acknowledges a write once the data is in a volatile cache; only `flush` (fsync)
//! makes it survive power loss. The simulation keeps the two images that matter:
//!
//! ```text
//!   write_at / set_len / punch_hole ──► live  (what reads see)
//!                     │
//!                     └──► pending: [op, op, ...]   (acknowledged, not yet durable)
//!   flush ──► durable := durable + pending (== live), pending := []
//!   crash ──► new SimDisk := durable + some of pending  (see CrashModel)
//! ```
//!
//! `flush` applies the pending ops to `durable` rather than copying `live`, so its cost is the
//! bytes written since the last flush, not the image size. Afterwards `durable == live`.
//!
//! Faults, all counted in *mutating ops* (`write_at`, `flush`, `set_len`, `punch_hole`;
//! reads are not counted), numbered from 0 in the order issued:
//! * [`SimDisk::fail_after`]`(n)`: ops `n, n+1, ...` fail with [`ErrorKind::Io`] and change
//!   nothing (the first `n` succeed). Pending writes stay pending, so a later crash may or may
//!   not keep them, as after a real failed fsync.
//! * [`SimDisk::set_crash_at`]`(n)`: power is cut just before op `n`. Ops `n, n+1, ...` still
//!   return `Ok` and still show in `live` (the process does not know yet), but they are
//!   neither recorded as pending nor promoted by `flush`, so no crash image contains them.
//!
//! Modelled on redb's `CrashBackend` (`tests/crash_consistency.rs`) and TigerBeetle's
//! `src/testing/storage.zig`; the code is our own.

use std::fmt;
use std::sync::{Mutex, MutexGuard};

use disk::{Error, ErrorKind, Result, Storage};
use rand::Rng;

use crate::image::Image;

/// The sector size writes tear at: a crash keeps or loses whole 512-byte sectors.
pub const SECTOR_BYTES: u64 = 512;
/// The largest length a `SimDisk` accepts (1 TiB). Images are sparse, so only written blocks
/// cost memory, but `live_bytes` of a large image would not fit.
pub const LEN_MAX: u64 = 1 << 40;

/// Which unflushed operations a crash keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrashModel {
    /// Nothing unflushed survives: the crash image is exactly the durable image.
    LoseUnflushed,
    /// Each unflushed op independently survives whole or not at all (even odds), except the
    /// last unflushed write, which is lost, kept whole or torn (one third each). A torn write
    /// keeps only a prefix of its 512-byte sectors. This is redb's `CrashBackend` model.
    #[default]
    TornLast,
    /// Every 512-byte sector of every unflushed write independently survives or not (even
    /// odds), as a disk cache that reorders freely would allow. `set_len` and `punch_hole`
    /// survive whole or not at all.
    Sectors,
}

/// One acknowledged, not yet durable operation.
#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    PunchHole { offset: u64, len: u64 },
}

impl Op {
    fn apply(&self, image: &mut Image) {
        match self {
            Op::Write { offset, data } => image.write(data, *offset),
            Op::SetLen(len) => image.set_len(*len),
            Op::PunchHole { offset, len } => image.punch_hole(*offset, *len),
        }
    }
}

/// Splits a write at absolute 512-byte sector boundaries: `(start, end)` within `data`.
fn sector_pieces(offset: u64, len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut done = 0usize;
    while done < len {
        let pos = offset + done as u64;
        let room = (SECTOR_BYTES - pos % SECTOR_BYTES) as usize;
        let n = room.min(len - done);
        out.push((done, done + n));
        done += n;
    }
    out
}

/// Applies the pieces of a write for which `keep(i)` is true.
fn apply_pieces(image: &mut Image, offset: u64, data: &[u8], mut keep: impl FnMut(usize) -> bool) {
    for (i, (start, end)) in sector_pieces(offset, data.len()).into_iter().enumerate() {
        if keep(i) {
            image.write(&data[start..end], offset + start as u64);
        }
    }
}

/// The mutable state behind the mutex.
struct State {
    /// What reads see: every acknowledged op, including those past the crash point.
    live: Image,
    /// What survives any crash: the state as of the last successful flush.
    durable: Image,
    /// Ops acknowledged since the last flush and before the crash point, oldest first.
    pending: Vec<Op>,
    /// Mutating ops issued so far (failed ones included).
    ops: u64,
    /// Ops numbered at or past this fail with `ErrorKind::Io`.
    fail_from: Option<u64>,
    /// Ops numbered at or past this happen after the power cut.
    crash_at: Option<u64>,
}

impl State {
    fn from_image(image: Image) -> State {
        State {
            live: image.clone(),
            durable: image,
            pending: Vec::new(),
            ops: 0,
            fail_from: None,
            crash_at: None,
        }
    }
}

/// What a mutating op may do, decided when it is issued.
enum Admit {
    /// Apply to live and record as pending (or promote, for flush).
    Record,
    /// Past the crash point: apply to live only.
    LiveOnly,
}

/// A simulated file with separate live and durable images. See the module docs.
///
/// Cheap to create; all methods take `&self` (state sits behind a mutex), so it can be shared
/// as an `Arc<dyn Storage>` exactly like a real file.
pub struct SimDisk {
    state: Mutex<State>,
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::from_image(Image::default())
    }

    /// A disk holding `bytes`, already durable (as if written and flushed before the test).
    /// All-zero 4 KiB blocks start as holes.
    pub fn from_bytes(bytes: Vec<u8>) -> SimDisk {
        SimDisk::from_image(Image::from_bytes(&bytes))
    }

    fn from_image(image: Image) -> SimDisk {
        SimDisk {
            state: Mutex::new(State::from_image(image)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, so poisoning means a bug elsewhere.
        self.state.lock().expect("SimDisk mutex poisoned")
    }

    /// The bytes reads see now, as one vector.
    ///
    /// # Panics
    /// When the length does not fit in `usize`.
    pub fn live_bytes(&self) -> Vec<u8> {
        self.lock().live.to_vec()
    }

    /// The bytes as of the last successful flush, as one vector.
    ///
    /// # Panics
    /// When the length does not fit in `usize`.
    pub fn durable_bytes(&self) -> Vec<u8> {
        self.lock().durable.to_vec()
    }

    /// Mutating ops issued so far (`write_at`, `flush`, `set_len`, `punch_hole`), failed ones
    /// included. The next op gets this number.
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Unflushed ops that a crash could keep.
    pub fn pending_count(&self) -> usize {
        self.lock().pending.len()
    }

    /// Allocated 4 KiB blocks of the live image (holes do not count).
    pub fn allocated_blocks(&self) -> usize {
        self.lock().live.allocated_blocks()
    }

    /// Makes every mutating op numbered `n_ops` or later fail with [`ErrorKind::Io`]: the
    /// next `n_ops - op_count()` ops succeed. Failed ops change nothing.
    pub fn fail_after(&self, n_ops: u64) {
        self.lock().fail_from = Some(n_ops);
    }

    /// Stops injecting failures.
    pub fn clear_failures(&self) {
        self.lock().fail_from = None;
    }

    /// Cuts the power just before mutating op `n`: that op and later ones succeed and show in
    /// [`SimDisk::live_bytes`], but no crash image contains them and `flush` no longer makes
    /// anything durable.
    pub fn set_crash_at(&self, n: u64) {
        self.lock().crash_at = Some(n);
    }

    /// A new disk holding what survives a power cut now, under [`CrashModel::TornLast`]:
    /// everything flushed, plus a random subset of the unflushed ops, the last write maybe
    /// torn. The new disk has no pending ops, a zero op count and no faults armed.
    pub fn crash(&self, rng: &mut (impl Rng + ?Sized)) -> SimDisk {
        self.crash_with(rng, CrashModel::TornLast)
    }

    /// Like [`SimDisk::crash`] with an explicit model.
    pub fn crash_with(&self, rng: &mut (impl Rng + ?Sized), model: CrashModel) -> SimDisk {
        let state = self.lock();
        let mut image = state.durable.clone();
        let last_write = state
            .pending
            .iter()
            .rposition(|op| matches!(op, Op::Write { .. }));
        for (i, op) in state.pending.iter().enumerate() {
            match (model, op) {
                (CrashModel::LoseUnflushed, _) => {}
                (CrashModel::Sectors, Op::Write { offset, data }) => {
                    apply_pieces(&mut image, *offset, data, |_| rng.gen_bool(0.5));
                }
                (CrashModel::TornLast, Op::Write { offset, data }) if Some(i) == last_write => {
                    let sectors = sector_pieces(*offset, data.len()).len();
                    let kept = match rng.gen_range(0..3) {
                        0 => 0,
                        1 => sectors,
                        // A strict prefix when there are at least two sectors to tear between.
                        _ => rng.gen_range(1..sectors.max(2)).min(sectors),
                    };
                    apply_pieces(&mut image, *offset, data, |s| s < kept);
                }
                (_, op) => {
                    if rng.gen_bool(0.5) {
                        op.apply(&mut image);
                    }
                }
            }
        }
        SimDisk::from_image(image)
    }

    /// A new disk holding a chosen torn crash: everything flushed, every unflushed op except
    /// the last write, and the first `sectors_kept` 512-byte sectors of that last write (ops
    /// after it survive too). For deterministic tests such as "a torn header update opens from
    /// the other header".
    pub fn crash_torn(&self, sectors_kept: usize) -> SimDisk {
        let state = self.lock();
        let mut image = state.durable.clone();
        let last_write = state
            .pending
            .iter()
            .rposition(|op| matches!(op, Op::Write { .. }));
        for (i, op) in state.pending.iter().enumerate() {
            match op {
                Op::Write { offset, data } if Some(i) == last_write => {
                    apply_pieces(&mut image, *offset, data, |s| s < sectors_kept);
                }
                op => op.apply(&mut image),
            }
        }
        SimDisk::from_image(image)
    }

    /// Numbers the next mutating op and decides its fate.
    fn admit(state: &mut State, what: &str) -> Result<Admit> {
        let n = state.ops;
        state.ops += 1;
        if state.fail_from.is_some_and(|f| n >= f) {
            let source = std::io::Error::other("injected fault (EIO)");
            return Err(Error::io(format!("simulated {what} (op {n})"), source));
        }
        if state.crash_at.is_some_and(|c| n >= c) {
            return Ok(Admit::LiveOnly);
        }
        Ok(Admit::Record)
    }

    /// Applies a mutating op: to live always, and to pending unless past the crash point.
    fn mutate(&self, what: &str, op: Op) -> Result<()> {
        let mut state = self.lock();
        let admit = SimDisk::admit(&mut state, what)?;
        op.apply(&mut state.live);
        if let Admit::Record = admit {
            state.pending.push(op);
        }
        Ok(())
    }
}

/// Checks that `[offset, offset + len)` stays within [`LEN_MAX`].
fn check_range(offset: u64, len: u64) -> Result<u64> {
    offset
        .checked_add(len)
        .filter(|&end| end <= LEN_MAX)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::LimitExceeded,
                format!("range {offset:#x}+{len:#x} exceeds the simulated disk limit {LEN_MAX:#x}"),
            )
        })
}

impl Default for SimDisk {
    fn default() -> SimDisk {
        SimDisk::new()
    }
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("SimDisk")
            .field("live_len", &state.live.len())
            .field("durable_len", &state.durable.len())
            .field("pending", &state.pending.len())
            .field("ops", &state.ops)
            .field("fail_from", &state.fail_from)
            .field("crash_at", &state.crash_at)
            .finish()
    }
}

impl Storage for SimDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.lock().live.read(buf, offset);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(offset, buf.len() as u64)?;
        self.mutate(
            "write",
            Op::Write {
                offset,
                data: buf.to_vec(),
            },
        )
    }

    fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        if let Admit::Record = SimDisk::admit(&mut state, "flush")? {
            let State {
                durable, pending, ..
            } = &mut *state;
            pending.drain(..).for_each(|op| op.apply(durable));
        }
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.lock().live.len())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        check_range(0, len)?;
        self.mutate("set_len", Op::SetLen(len))
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len)?;
        self.mutate("punch_hole", Op::PunchHole { offset, len })
    }

    fn next_data(&self, offset: u64) -> Result<Option<u64>> {
        Ok(self.lock().live.next_data(offset))
    }

    fn next_hole(&self, offset: u64) -> Result<u64> {
        Ok(self.lock().live.next_hole(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_rng;

    /// Four sectors of old data (0x11), durable.
    fn four_old_sectors() -> SimDisk {
        SimDisk::from_bytes(vec![0x11; 4 * 512])
    }

    #[test]
    fn flushed_write_survives_crash() {
        let d = SimDisk::new();
        d.write_at(b"durable", 0).unwrap();
        d.flush().unwrap();
        let after = d.crash(&mut sim_rng(1));
        assert_eq!(after.live_bytes(), b"durable");
    }

    #[test]
    fn flush_makes_durable_equal_live() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 100], 700).unwrap();
        d.set_len(5000).unwrap();
        d.flush().unwrap();
        assert_eq!(d.durable_bytes(), d.live_bytes());
        assert_eq!(d.pending_count(), 0);
    }

    #[test]
    fn unflushed_write_is_lost_when_the_cache_is_lost() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 512], 0).unwrap();
        let after = d.crash_with(&mut sim_rng(1), CrashModel::LoseUnflushed);
        assert_eq!(after.live_bytes(), vec![0x11; 4 * 512]);
    }

    #[test]
    fn unflushed_write_is_visible_before_the_crash() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 512], 0).unwrap();
        assert_eq!(d.live_bytes()[..512], [0x22; 512]);
        assert_eq!(d.durable_bytes()[..512], [0x11; 512]);
    }

    #[test]
    fn torn_write_keeps_a_sector_prefix() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 4 * 512], 0).unwrap();
        // Two of the four new sectors reached the platter.
        let after = d.crash_torn(2);
        let expected = [vec![0x22; 2 * 512], vec![0x11; 2 * 512]].concat();
        assert_eq!(after.live_bytes(), expected);
    }

    #[test]
    fn torn_write_splits_at_absolute_sector_boundaries() {
        let d = four_old_sectors();
        // 600 bytes from 300: pieces [300, 512), [512, 900). Keep the first only.
        d.write_at(&[0x22; 600], 300).unwrap();
        let after = d.crash_torn(1).live_bytes();
        assert_eq!(after[299..301], [0x11, 0x22]);
        assert_eq!(after[511..513], [0x22, 0x11]);
    }

    #[test]
    fn random_crash_of_one_write_is_a_sector_prefix() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 4 * 512], 0).unwrap();
        let after = d.crash(&mut sim_rng(7)).live_bytes();
        let new = after.iter().take_while(|&&b| b == 0x22).count();
        assert_eq!(new % 512, 0, "tears only at sector boundaries");
        assert!(
            after[new..].iter().all(|&b| b == 0x11),
            "only a prefix is new"
        );
    }

    #[test]
    fn sector_model_keeps_only_written_or_old_sectors() {
        let d = four_old_sectors();
        d.write_at(&[0x22; 4 * 512], 0).unwrap();
        let after = d
            .crash_with(&mut sim_rng(3), CrashModel::Sectors)
            .live_bytes();
        assert!(
            after
                .chunks(512)
                .all(|s| s == [0x22; 512] || s == [0x11; 512])
        );
    }

    #[test]
    fn fail_after_fails_the_nth_op_and_later() {
        let d = SimDisk::new();
        d.fail_after(1);
        d.write_at(b"a", 0).unwrap();
        let write = d.write_at(b"b", 1).unwrap_err();
        let flush = d.flush().unwrap_err();
        assert_eq!((write.kind(), flush.kind()), (ErrorKind::Io, ErrorKind::Io));
        assert_eq!(d.op_count(), 3);
    }

    #[test]
    fn failed_write_changes_nothing() {
        let d = SimDisk::new();
        d.fail_after(0);
        let _ = d.write_at(b"lost", 0);
        assert_eq!((d.live_bytes().len(), d.pending_count()), (0, 0));
    }

    #[test]
    fn failed_flush_leaves_writes_pending() {
        let d = SimDisk::new();
        d.write_at(b"maybe", 0).unwrap();
        d.fail_after(1);
        assert!(d.flush().is_err());
        assert_eq!(d.pending_count(), 1);
        assert_eq!(d.durable_bytes(), b"");
    }

    #[test]
    fn ops_after_the_crash_point_never_become_durable() {
        let d = SimDisk::new();
        d.write_at(b"A", 0).unwrap(); // op 0
        d.flush().unwrap(); // op 1
        d.set_crash_at(2);
        d.write_at(b"B", 0).unwrap(); // op 2: after the power cut
        d.flush().unwrap(); // op 3
        assert_eq!(d.live_bytes(), b"B");
        assert_eq!(d.crash(&mut sim_rng(1)).live_bytes(), b"A");
    }

    #[test]
    fn reads_do_not_count_as_ops() {
        let d = SimDisk::from_bytes(vec![1; 10]);
        let mut buf = [0u8; 4];
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(d.op_count(), 0);
    }

    #[test]
    fn reads_past_the_end_are_zero() {
        let d = SimDisk::from_bytes(vec![1; 10]);
        let mut buf = [9u8; 4];
        d.read_at(&mut buf, 8).unwrap();
        assert_eq!(buf, [1, 1, 0, 0]);
    }

    #[test]
    fn punch_hole_reads_zero_and_frees_the_block() {
        let d = SimDisk::from_bytes(vec![1; 8192]);
        d.punch_hole(0, 4096).unwrap();
        assert_eq!(d.next_data(0).unwrap(), Some(4096));
        assert_eq!(d.live_bytes()[4095..4097], [0, 1]);
        assert_eq!(d.len().unwrap(), 8192);
    }

    #[test]
    fn write_past_the_limit_is_refused() {
        let d = SimDisk::new();
        let e = d.write_at(b"x", LEN_MAX).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitExceeded);
        assert_eq!(d.op_count(), 0);
    }

    #[test]
    fn crash_image_starts_fresh() {
        let d = SimDisk::new();
        d.fail_after(1);
        d.write_at(b"x", 0).unwrap();
        let after = d.crash_with(&mut sim_rng(1), CrashModel::LoseUnflushed);
        after.write_at(b"y", 0).unwrap();
        assert_eq!((after.op_count(), after.pending_count()), (1, 1));
    }

    #[test]
    fn debug_does_not_dump_bytes() {
        let d = SimDisk::from_bytes(vec![0xAB; 1 << 16]);
        let s = format!("{d:?}");
        assert!(s.starts_with("SimDisk {") && s.len() < 200, "{s}");
    }
}
