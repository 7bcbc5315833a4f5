//! Unit tests of the write cache through its `BlockDevice` face: partial writes, submitted
//! reads, ENOSPC, eviction, trims and zeroes, poisoning, and the inline (`try_*`) paths.

use std::sync::Arc;

use disk::device::{Geometry, Submitted, check_bounds};
use disk::{BlockDevice, ErrorKind, FastPath, Result};

use crate::cache::WriteCache;
use crate::config::{Config, ConfigError, Mode};
use crate::store::{MemStore, OverflowStore};

/// A read-only device whose byte at `i` is `i % 251`, so any misplaced byte shows.
#[derive(Debug)]
struct Golden(u64);

impl BlockDevice for Golden {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.0,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            block_size: 1 << 20,
        }
    }
    fn format(&self) -> &'static str {
        "golden"
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_bounds(self.0, offset, buf.len() as u64)?;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = ((offset + i as u64) % 251) as u8;
        }
        Ok(())
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for Golden {
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<()> {
        disk::device::read_each(self, bufs, offset)
    }

    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn try_read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn shares_reads(&self) -> bool {
        false
    }

    fn read_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<disk::device::Piece>>> {
        None
    }

    fn try_write_at(&self, _buf: &[u8], _offset: u64) -> Option<Result<()>> {
        None
    }

    fn submit_read(&self, offset: u64, len: usize) -> Option<Submitted<Vec<u8>>> {
        let mut data = vec![0u8; len];
        let r = self.read_at(&mut data, offset).map(|()| data);
        Some(Box::pin(std::future::ready(Some(r))))
    }

    fn submit_write(&self, _buf: &[u8], _offset: u64) -> Option<disk::device::Submitted<()>> {
        None
    }
}

/// The outcome of a submitted call that is already complete.
fn ready<T>(mut call: Submitted<T>) -> Option<Result<T>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match call.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => panic!("the golden device answers at once"),
    }
}

fn cache(mode: Mode, ram_blocks: u64, disk_blocks: u64) -> WriteCache {
    let config = Config {
        mode,
        block_bytes: 4096,
        ram_bytes_max: ram_blocks * 4096,
        overflow_bytes_max: disk_blocks * 4096,
    };
    let store: Arc<dyn OverflowStore> = Arc::new(MemStore::new(1 << 30));
    WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
}

#[test]
fn partial_write_keeps_the_rest_of_the_golden_block() {
    let c = cache(Mode::Ram, 4, 0);
    c.write_at(&[0xAA; 10], 4096 + 100).unwrap();
    let mut buf = [0u8; 3];
    c.read_at(&mut buf, 4096 + 99).unwrap();
    // Byte 4195 of the golden image is 4195 % 251 = 179.
    assert_eq!(buf, [179, 0xAA, 0xAA]);
}

/// A read of blocks the cache does not hold is submitted to the device below as it is;
/// one touching a block the cache holds is not (the blocking read merges the two).
#[test]
fn reads_of_blocks_not_held_are_submitted_below() {
    let c = cache(Mode::Ram, 4, 0);
    let data = ready(c.submit_read(8192 + 5, 8192).expect("no block held"))
        .unwrap()
        .unwrap();
    assert_eq!(data.len(), 8192);
    assert_eq!(data[0], ((8192 + 5) % 251) as u8);
    c.write_at(&[0xAA; 10], 4096 + 100).unwrap();
    assert!(c.submit_read(4096, 4096).is_none(), "held");
    assert!(c.submit_read(0, 8192).is_none(), "partly held");
    assert!(c.submit_read(1 << 20, 4096).is_none(), "past the end");
    assert!(c.submit_read(8192, 4096).is_some());
}

#[test]
fn ram_full_is_limit_exceeded() {
    let c = cache(Mode::Ram, 1, 0);
    c.write_at(&[1; 4096], 0).unwrap();
    let e = c.write_at(&[1; 4096], 8192).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    assert_eq!(c.usage().enospc, 1);
}

#[test]
fn ram_overflow_evicts_and_reads_back() {
    let c = cache(Mode::RamOverflow, 1, 4);
    c.write_at(&[1; 4096], 0).unwrap();
    c.write_at(&[2; 4096], 4096).unwrap();
    let mut buf = [0u8; 4096];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [1; 4096]);
    assert_eq!(c.usage().evictions, 1);
}

#[test]
fn overflow_full_is_limit_exceeded() {
    let c = cache(Mode::RamOverflow, 1, 1);
    c.write_at(&[1; 4096], 0).unwrap();
    c.write_at(&[2; 4096], 4096).unwrap();
    let e = c.write_at(&[3; 4096], 8192).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
}

#[test]
fn trim_frees_the_ram_block() {
    let c = cache(Mode::Ram, 1, 0);
    c.write_at(&[1; 4096], 0).unwrap();
    c.trim(0, 4096).unwrap();
    assert_eq!(c.usage().ram_bytes, 0);
}

#[test]
fn write_zeroes_reads_zeros_without_storage() {
    let c = cache(Mode::Disk, 0, 4);
    c.write_zeroes(0, 8192).unwrap();
    let mut buf = [1u8; 8192];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0; 8192]);
    assert_eq!(c.usage().overflow_bytes, 0);
}

/// A store whose writes fail with EIO (a dying disk).
#[derive(Debug)]
struct BrokenStore;

impl OverflowStore for BrokenStore {
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(5))
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(5))
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(5))
    }
}

fn broken(mode: Mode) -> WriteCache {
    let config = Config {
        mode,
        block_bytes: 4096,
        ram_bytes_max: 4096,
        overflow_bytes_max: 1 << 20,
    };
    let store: Arc<dyn OverflowStore> = Arc::new(BrokenStore);
    WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
}

#[test]
fn failed_overflow_write_poisons_the_cache() {
    let c = broken(Mode::Disk);
    assert_eq!(c.write_at(&[1; 4096], 0).unwrap_err().kind(), ErrorKind::Io);
    let mut buf = [0u8; 512];
    assert_eq!(
        c.read_at(&mut buf, 0).unwrap_err().kind(),
        ErrorKind::Poisoned
    );
}

#[test]
fn failed_flush_poisons_the_cache() {
    let c = broken(Mode::Disk);
    assert_eq!(c.flush().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(
        c.write_at(&[1; 512], 0).unwrap_err().kind(),
        ErrorKind::Poisoned
    );
}

#[test]
fn failed_eviction_write_keeps_the_victim_in_ram() {
    let c = broken(Mode::RamOverflow);
    c.write_at(&[7; 4096], 0).unwrap();
    // The second block needs the only RAM slot: the victim's write to the store fails.
    assert_eq!(
        c.write_at(&[8; 4096], 4096).unwrap_err().kind(),
        ErrorKind::Io
    );
    assert_eq!(c.usage().evictions, 0);
    assert_eq!(c.usage().ram_bytes, 4096);
}

#[test]
fn try_write_of_a_partial_new_block_defers_and_writes_nothing() {
    let c = cache(Mode::Ram, 4, 0);
    assert!(c.try_write_at(&[1; 512], 4096).is_none());
    assert_eq!(c.cached_blocks(), 0);
}

#[test]
fn try_write_with_ram_full_defers_instead_of_evicting() {
    let c = cache(Mode::RamOverflow, 1, 4);
    c.write_at(&[1; 4096], 0).unwrap();
    assert!(c.try_write_at(&[2; 4096], 4096).is_none());
    assert_eq!(c.usage().evictions, 0);
}

#[test]
fn try_write_of_a_whole_new_block_lands_in_ram() {
    let c = cache(Mode::Ram, 2, 0);
    assert!(matches!(c.try_write_at(&[3; 4096], 8192), Some(Ok(()))));
    let mut buf = [0u8; 4096];
    c.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, [3; 4096]);
}

fn cache_over(mode: Mode, store: Arc<dyn OverflowStore>) -> WriteCache {
    let config = Config {
        mode,
        block_bytes: 4096,
        ram_bytes_max: 4096,
        overflow_bytes_max: 1 << 20,
    };
    WriteCache::new(Arc::new(Golden(1 << 20)), config, Some(store)).unwrap()
}

#[test]
fn try_write_rewrites_a_disk_block_in_place() {
    let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
    c.write_at(&[1; 4096], 0).unwrap();
    assert!(matches!(c.try_write_at(&[2; 4096], 0), Some(Ok(()))));
    let mut buf = [0u8; 4096];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [2; 4096]);
    assert_eq!(c.usage().overflow_bytes, 4096);
}

#[test]
fn try_write_of_a_new_disk_block_defers_and_writes_nothing() {
    let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
    assert!(c.try_write_at(&[1; 4096], 0).is_none());
    assert_eq!(c.cached_blocks(), 0);
}

#[test]
fn try_read_of_an_overflow_block_defers_when_the_store_would_wait() {
    let c = cache_over(Mode::Disk, Arc::new(MemStore::without_inline(1 << 20)));
    c.write_at(&[1; 4096], 0).unwrap();
    let mut buf = [0u8; 4096];
    assert!(c.try_read_at(&mut buf, 0).is_none());
}

#[test]
fn try_read_of_an_overflow_block_reads_it_inline() {
    let c = cache_over(Mode::Disk, Arc::new(MemStore::new(1 << 20)));
    c.write_at(&[4; 4096], 4096).unwrap();
    let mut buf = [0u8; 4096];
    assert!(matches!(c.try_read_at(&mut buf, 4096), Some(Ok(()))));
    assert_eq!(buf, [4; 4096]);
}

/// A store whose blocking writes succeed and whose inline writes fail with EIO.
#[derive(Debug)]
struct FailsInline(MemStore);

impl OverflowStore for FailsInline {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn try_write_at(&self, _: &[u8], _: u64) -> Option<std::io::Result<()>> {
        Some(Err(std::io::Error::from_raw_os_error(5)))
    }
}

#[test]
fn failed_inline_overwrite_poisons_the_cache() {
    let c = cache_over(Mode::Disk, Arc::new(FailsInline(MemStore::new(1 << 20))));
    c.write_at(&[1; 4096], 0).unwrap();
    let r = c.try_write_at(&[2; 4096], 0);
    assert_eq!(r.unwrap().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(c.flush().unwrap_err().kind(), ErrorKind::Poisoned);
}

#[test]
fn overflow_store_missing_is_a_config_error() {
    let config = Config {
        mode: Mode::Disk,
        ..Config::default()
    };
    let e = WriteCache::new(Arc::new(Golden(4096)), config, None).unwrap_err();
    assert_eq!(e, ConfigError::MissingStore { mode: Mode::Disk });
}
