//! The boot set model: [`Identity`], [`Extent`], [`BootSet`]; building one from reads
//! ([`Recorder`]); merging several ([`merge`]); and finding the extent that holds an offset
//! ([`OffsetIndex`]).

use std::collections::HashMap;

/// The granularity of a boot set: the server cache's page.
pub const PAGE_BYTES: u64 = 4096;
/// The most extents a set holds (16 bytes each encoded: 16 MiB).
pub const EXTENTS_MAX: usize = 1 << 20;
/// The longest extent; longer runs are split.
pub const EXTENT_BYTES_MAX: u64 = 1 << 30;
/// The most bytes a set covers.
pub const SET_BYTES_MAX: u64 = 1 << 36;
/// The most pages a recording or a merge keeps (4 GiB of distinct reads).
pub const RECORD_PAGES_MAX: usize = 1 << 20;
/// The most boots a set may say it came from.
pub const BOOTS_MAX: u32 = 1024;
/// The longest vDisk name a set carries, in bytes.
pub const NAME_BYTES_MAX: usize = 255;

/// The version a set belongs to; a set is applied only to a version with an equal identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The vDisk's name.
    pub vdisk: String,
    /// The version number.
    pub version: u32,
    /// The version's virtual size in bytes.
    pub size_bytes: u64,
    /// Changes whenever the version's bytes can (the VHDX DataWriteGuid, or a digest of the
    /// file's device, inode, length and mtime).
    pub stamp: [u8; 16],
}

/// One run of bytes a boot read, and when it first read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Byte offset (a multiple of [`PAGE_BYTES`]).
    pub offset: u64,
    /// Length in bytes (a multiple of [`PAGE_BYTES`] unless it ends at the virtual size).
    pub len: u32,
    /// First-read time, ms since the boot's first read.
    pub t_ms: u32,
}

impl Extent {
    /// The offset past the extent.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// A version's boot set (see the crate docs for its invariants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSet {
    /// The version it belongs to.
    pub identity: Identity,
    /// How many boots it was merged from (at least 1).
    pub boots: u32,
    /// The extents, by first-read time then offset; page-aligned and disjoint.
    pub extents: Vec<Extent>,
}

impl BootSet {
    /// The bytes the set covers.
    pub fn bytes(&self) -> u64 {
        self.extents.iter().map(|e| u64::from(e.len)).sum()
    }

    /// The pages the set covers.
    pub fn pages(&self) -> u64 {
        self.extents
            .iter()
            .map(|e| u64::from(e.len).div_ceil(PAGE_BYTES))
            .sum()
    }

    /// Each page of the set with its time, in set order.
    fn page_times(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.extents.iter().flat_map(|e| {
            let first = e.offset / PAGE_BYTES;
            let n = u64::from(e.len).div_ceil(PAGE_BYTES);
            (first..first + n).map(move |p| (p, e.t_ms))
        })
    }
}

/// Builds a boot set from a stream of reads (one boot of one version).
#[derive(Debug)]
pub struct Recorder {
    size_bytes: u64,
    pages_max: usize,
    /// First-read time of each page read.
    pages: HashMap<u64, u32>,
    full: bool,
}

impl Recorder {
    /// A recorder for a version of `size_bytes` that keeps at most `pages_max` pages
    /// (capped at [`RECORD_PAGES_MAX`]).
    pub fn new(size_bytes: u64, pages_max: usize) -> Recorder {
        Recorder {
            size_bytes,
            pages_max: pages_max.min(RECORD_PAGES_MAX),
            pages: HashMap::new(),
            full: false,
        }
    }

    /// Records a read of `len` bytes at `offset`, `t_ms` after the boot's first read. A page
    /// read again keeps its earliest time. Reads past the virtual size are clipped. Returns
    /// `false` once the recorder is full (it then ignores new pages).
    pub fn read(&mut self, offset: u64, len: u64, t_ms: u32) -> bool {
        let end = offset.saturating_add(len).min(self.size_bytes);
        if offset >= end {
            return !self.full;
        }
        for page in offset / PAGE_BYTES..end.div_ceil(PAGE_BYTES) {
            if let Some(t) = self.pages.get_mut(&page) {
                *t = (*t).min(t_ms);
            } else if self.pages.len() < self.pages_max {
                self.pages.insert(page, t_ms);
            } else {
                self.full = true;
            }
        }
        !self.full
    }

    /// Whether a page was dropped because the recorder was full.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// The distinct bytes recorded so far.
    pub fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES
    }

    /// The recorded set (one boot), or `None` if nothing was read.
    pub fn finish(self, identity: Identity) -> Option<BootSet> {
        if self.pages.is_empty() {
            return None;
        }
        let size = self.size_bytes;
        let extents = build_extents(self.pages.into_iter().collect(), size);
        Some(BootSet {
            identity,
            boots: 1,
            extents,
        })
    }
}

/// Why sets could not be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// The sets belong to different versions.
    #[error("boot sets of different versions ({a} and {b})")]
    DifferentVersions {
        /// The first set's vDisk@version.
        a: String,
        /// The other's.
        b: String,
    },
    /// Nothing to merge.
    #[error("no boot set to merge")]
    Empty,
    /// The merged set would cover more than [`RECORD_PAGES_MAX`] pages.
    #[error("merged boot set has {pages} pages (limit {max})")]
    TooManyPages {
        /// Pages it would cover.
        pages: usize,
        /// The limit.
        max: usize,
    },
}

/// Merges sets of one version: the union of their pages, each at the weighted lower median
/// of its times, ordered by time then offset; boots add up (capped at [`BOOTS_MAX`]).
///
/// # Errors
/// [`MergeError`].
pub fn merge(sets: &[BootSet]) -> Result<BootSet, MergeError> {
    let first = sets.first().ok_or(MergeError::Empty)?;
    let id = &first.identity;
    let mut times: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
    for s in sets {
        if s.identity != *id {
            return Err(MergeError::DifferentVersions {
                a: format!("{}@{}", id.vdisk, id.version),
                b: format!("{}@{}", s.identity.vdisk, s.identity.version),
            });
        }
        for (page, t) in s.page_times() {
            times.entry(page).or_default().push((t, s.boots.max(1)));
            if times.len() > RECORD_PAGES_MAX {
                return Err(MergeError::TooManyPages {
                    pages: times.len(),
                    max: RECORD_PAGES_MAX,
                });
            }
        }
    }
    let pages = times
        .into_iter()
        .map(|(page, mut ts)| (page, weighted_median(&mut ts)))
        .collect();
    let boots = sets
        .iter()
        .fold(0u32, |n, s| n.saturating_add(s.boots))
        .min(BOOTS_MAX);
    Ok(BootSet {
        identity: id.clone(),
        boots,
        extents: build_extents(pages, id.size_bytes),
    })
}

/// The lower weighted median of `(time, weight)` pairs (not empty).
fn weighted_median(ts: &mut [(u32, u32)]) -> u32 {
    ts.sort_unstable();
    let total: u64 = ts.iter().map(|&(_, w)| u64::from(w)).sum();
    let mut seen = 0u64;
    for &(t, w) in ts.iter() {
        seen += u64::from(w);
        if seen * 2 >= total {
            return t;
        }
    }
    ts.last().map_or(0, |&(t, _)| t)
}

/// Orders `(page, time)` by time then page and coalesces pages adjacent on disk and in
/// that order into extents (clipped at `size`, at most [`EXTENT_BYTES_MAX`] each).
fn build_extents(mut pages: Vec<(u64, u32)>, size: u64) -> Vec<Extent> {
    pages.sort_unstable_by_key(|&(p, t)| (t, p));
    let mut out: Vec<Extent> = Vec::new();
    for (page, t) in pages {
        let offset = page * PAGE_BYTES;
        // At most PAGE_BYTES: fits a u32.
        let len = u32::try_from(PAGE_BYTES.min(size.saturating_sub(offset))).unwrap_or(0);
        if len == 0 {
            continue;
        }
        if let Some(last) = out.last_mut()
            && last.end() == offset
            && u64::from(last.len) + u64::from(len) <= EXTENT_BYTES_MAX
        {
            // The sum fits in a u32: EXTENT_BYTES_MAX < 2^32.
            last.len += len;
            continue;
        }
        out.push(Extent {
            offset,
            len,
            t_ms: t,
        });
    }
    out
}

/// The extents of a set by offset, to find which extent (by its index in the set) holds a
/// byte.
#[derive(Debug, Clone, Default)]
pub struct OffsetIndex {
    /// `(offset, end, index in the set)`, by offset.
    runs: Vec<(u64, u64, usize)>,
}

impl OffsetIndex {
    /// The index of `set`'s extents.
    pub fn new(set: &BootSet) -> OffsetIndex {
        let mut runs: Vec<_> = set
            .extents
            .iter()
            .enumerate()
            .map(|(i, e)| (e.offset, e.end(), i))
            .collect();
        runs.sort_unstable();
        OffsetIndex { runs }
    }

    /// The index in the set of the extent holding byte `offset`, if any.
    pub fn find(&self, offset: u64) -> Option<usize> {
        let i = self.runs.partition_point(|&(o, _, _)| o <= offset);
        let &(o, end, idx) = self.runs.get(i.checked_sub(1)?)?;
        (o <= offset && offset < end).then_some(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(size: u64) -> Identity {
        Identity {
            vdisk: "golden".into(),
            version: 2,
            size_bytes: size,
            stamp: [7; 16],
        }
    }

    #[test]
    fn a_page_read_twice_keeps_its_first_time() {
        let mut r = Recorder::new(1 << 20, 100);
        r.read(0, 4096, 10);
        r.read(0, 4096, 50);
        let s = r.finish(id(1 << 20)).unwrap();
        assert_eq!(
            s.extents,
            vec![Extent {
                offset: 0,
                len: 4096,
                t_ms: 10
            }]
        );
    }

    #[test]
    fn a_large_read_is_one_extent() {
        let mut r = Recorder::new(1 << 20, 100);
        r.read(8192 + 100, 128 << 10, 3);
        let s = r.finish(id(1 << 20)).unwrap();
        // 128 KiB starting 100 bytes into page 2 touches 33 pages.
        assert_eq!(s.extents.len(), 1);
        assert_eq!(s.extents[0].offset, 8192);
        assert_eq!(s.extents[0].len, 33 * 4096);
    }

    #[test]
    fn the_last_extent_ends_at_the_virtual_size() {
        let size = 10_000;
        let mut r = Recorder::new(size, 100);
        r.read(8000, 5000, 0);
        let s = r.finish(id(size)).unwrap();
        assert_eq!(s.extents[0].end(), size);
    }

    #[test]
    fn a_full_recorder_keeps_its_first_pages() {
        let mut r = Recorder::new(1 << 20, 2);
        assert!(!r.read(0, 3 * 4096, 0));
        assert!(r.is_full());
        assert_eq!(r.bytes(), 2 * 4096);
    }

    #[test]
    fn merge_orders_pages_by_median_time() {
        let size = 1 << 20;
        let set = |a: u32, b: u32| BootSet {
            identity: id(size),
            boots: 1,
            extents: vec![
                Extent {
                    offset: 0,
                    len: 4096,
                    t_ms: a,
                },
                Extent {
                    offset: 65536,
                    len: 4096,
                    t_ms: b,
                },
            ],
        };
        // Page 0 at 10, 10, 90 (median 10); page 16 at 5, 50, 60 (median 50).
        let m = merge(&[set(10, 5), set(10, 50), set(90, 60)]).unwrap();
        assert_eq!(m.boots, 3);
        assert_eq!(m.extents[0].offset, 0);
        assert_eq!(m.extents[1].t_ms, 50);
    }

    #[test]
    fn merge_refuses_sets_of_different_versions() {
        let a = BootSet {
            identity: id(1 << 20),
            boots: 1,
            extents: vec![],
        };
        let mut b = a.clone();
        b.identity.version = 3;
        assert!(matches!(
            merge(&[a, b]),
            Err(MergeError::DifferentVersions { .. })
        ));
    }

    #[test]
    fn offset_index_finds_the_extent_holding_a_byte() {
        let s = BootSet {
            identity: id(1 << 20),
            boots: 1,
            extents: vec![
                Extent {
                    offset: 65536,
                    len: 8192,
                    t_ms: 0,
                },
                Extent {
                    offset: 0,
                    len: 4096,
                    t_ms: 1,
                },
            ],
        };
        let ix = OffsetIndex::new(&s);
        assert_eq!(ix.find(65536 + 8191), Some(0));
        assert_eq!(ix.find(100), Some(1));
        assert_eq!(ix.find(4096), None);
    }
}
