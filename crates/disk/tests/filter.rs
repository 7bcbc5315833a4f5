//! A [`disk::Filter`] that defines nothing but the device below passes every call on to
//! it: each `BlockDevice` call (answers and effects) and each fast path.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use disk::device::{Geometry, LayerRun, ParentRef, Source};
use disk::{BlockDevice, FastPath, Result};
use testkit::{Expect, FastProbe, check_fast_paths};
use vhdx::Guid;

/// A filter that changes nothing.
#[derive(Debug)]
struct Pass(Arc<dyn BlockDevice>);

impl disk::Filter for Pass {
    fn next(&self) -> &dyn BlockDevice {
        &*self.0
    }
}

/// A device each of whose answers is unlike the default's, and which records its effects.
#[derive(Debug, Default)]
struct Marked {
    calls: Mutex<Vec<&'static str>>,
}

impl Marked {
    fn call(&self, name: &'static str) -> Result<()> {
        self.calls.lock().unwrap().push(name);
        Ok(())
    }
}

/// The marks [`Marked`] answers with.
const SIZE: u64 = 1 << 20;
const OTHER_SIZE: u64 = 12345;
const LINKAGE: Guid = Guid([7; 16]);

impl BlockDevice for Marked {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: SIZE,
            logical_sector_size: 4096,
            physical_sector_size: 4096,
            block_size: 2 << 20,
        }
    }
    /// Unlike its geometry's, which shows that a filter passes `size` on too.
    fn size(&self) -> u64 {
        OTHER_SIZE
    }
    fn format(&self) -> &'static str {
        "marked"
    }
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> Result<()> {
        buf.fill(0x5a);
        self.call("read_at")
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        self.call("write_at")
    }
    fn flush(&self) -> Result<()> {
        self.call("flush")
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        self.call("trim")
    }
    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<()> {
        self.call("write_zeroes")
    }
    fn can_write(&self) -> bool {
        true
    }
    fn map_layer(&self, _offset: u64, len: u64) -> Result<Vec<LayerRun>> {
        Ok(vec![LayerRun {
            len,
            source: Source::Zero,
        }])
    }
    fn parent(&self) -> Option<Arc<dyn BlockDevice>> {
        Some(Arc::new(FastProbe::new(512)))
    }
    fn parent_ref(&self) -> Option<ParentRef> {
        Some(ParentRef {
            linkage: vec![LINKAGE],
            paths: vec![PathBuf::from("parent.vhdx")],
        })
    }
    fn linkage_id(&self) -> Option<Guid> {
        Some(LINKAGE)
    }
    fn allocated_bytes(&self) -> Result<u64> {
        Ok(777)
    }
    fn warnings(&self) -> Vec<String> {
        vec!["marked".to_string()]
    }
    fn fast_path(&self) -> Option<&dyn FastPath> {
        None
    }
}

#[test]
fn every_fast_path_reaches_the_device_below_through_filters_that_define_none() {
    let probe = Arc::new(FastProbe::new(1 << 20));
    let one = Pass(probe.clone());
    check_fast_paths(&one, &probe, |_| Expect::Passes);
    let two = Pass(Arc::new(Pass(probe.clone())));
    check_fast_paths(&two, &probe, |_| Expect::Passes);
}

#[test]
fn every_call_of_a_filter_that_defines_none_is_the_device_below_s() {
    let below = Arc::new(Marked::default());
    let dev = Pass(below.clone());
    let mut buf = [0u8; 8];

    dev.read_at(&mut buf, 0).unwrap();
    dev.write_at(&buf, 0).unwrap();
    dev.flush().unwrap();
    dev.trim(0, 4096).unwrap();
    dev.write_zeroes(0, 4096).unwrap();

    assert_eq!(buf, [0x5a; 8]);
    assert_eq!(
        *below.calls.lock().unwrap(),
        ["read_at", "write_at", "flush", "trim", "write_zeroes"]
    );
    assert_eq!(dev.geometry(), below.geometry());
    assert_eq!(dev.size(), OTHER_SIZE);
    assert_eq!(dev.format(), "marked");
    assert!(dev.can_write());
    assert_eq!(
        dev.map_layer(0, 4096).unwrap(),
        below.map_layer(0, 4096).unwrap()
    );
    assert_eq!(dev.parent().map(|p| p.format()), Some("probe"));
    assert_eq!(dev.parent_ref(), below.parent_ref());
    assert_eq!(dev.linkage_id(), Some(LINKAGE));
    assert_eq!(dev.allocated_bytes().unwrap(), 777);
    assert_eq!(dev.warnings(), ["marked"]);
    // A device below without fast paths: the filter's decline, as the device's would.
    let dyn_dev: &dyn BlockDevice = &dev;
    assert!(dyn_dev.try_read_at(&mut buf, 0).is_none());
    assert!(!dyn_dev.shares_reads());
    dyn_dev.read_vectored_at(&mut [&mut buf[..]], 0).unwrap();
    assert_eq!(below.calls.lock().unwrap().last(), Some(&"read_at"));
}
