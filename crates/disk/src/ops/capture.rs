//! `capture`: a block device (`/dev/sda`) or a raw file into a new VHDX (or raw, or VHD) image.
//!
//! Only allocated extents are read (SEEK_DATA/SEEK_HOLE through [`RawDisk::map_layer`]; a block
//! device reports all data), and blocks that read as zeros stay unallocated in the output. The
//! copy runs through the shared pipeline of [`super::copy`]. With `verify`, both sides are
//! read again and compared through the same pipeline: the "writer" is a `Verifier` that
//! compares what it is given with the output instead of writing it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::copy::{self, Fill, Job, Outputs, PlanRun, ZeroPolicy};
use super::{CopyStats, Progress};
use crate::bytes::is_zero;
use crate::device::{self, BlockDevice, ExtentKind, Geometry};
use crate::open::{self, Format, OpenOptions};
use crate::raw::RawDisk;
use crate::vhdx::CreateOptions;
use crate::{Error, ErrorKind, FileStorage, Result, Storage};

/// Options of [`capture`].
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// VHDX block size of the output (default 32 MiB).
    pub block_size: u32,
    /// Read the source and the output again and compare them.
    pub verify: bool,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            block_size: CreateOptions::default().block_size,
            verify: false,
        }
    }
}

/// Captures `source` (a block device or a raw file) into the new file `dst` (VHDX unless its
/// extension says raw or VHD). Progress phases: "capturing", then "verifying".
///
/// # Errors
/// `Corrupt` naming the first differing offset when verification fails; `InvalidArgument` for
/// an empty source or one too large for the output format; `Io` (also when `dst` exists).
/// `dst` is removed on any error.
pub fn capture(
    source: &Path,
    dst: &Path,
    opts: &CaptureOptions,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    let format = Format::from_extension(dst).unwrap_or(Format::Vhdx);
    let (src, logical, physical) = open_source(source)?;
    let sector = u64::from(logical);
    let create = CreateOptions {
        size: src.size().div_ceil(sector) * sector,
        block_size: opts.block_size,
        logical_sector_size: logical,
        physical_sector_size: physical,
        ..CreateOptions::default()
    };
    if create.size == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{}: source is empty", source.display()),
        ));
    }
    progress.phase("capturing");
    progress.set_total(src.size());
    let plan = |offset: u64, len: u64| copy::resolved_plan(&src, offset, len, false);
    let job = Job {
        src: &src,
        plan: &plan,
        policy: ZeroPolicy::Skip,
        len: src.size(),
    };
    let mut outputs = Outputs::default();
    let (stats, _) = copy::copy_to_new(&job, dst, format, &create, &mut outputs, progress)?;
    if opts.verify {
        progress.phase("verifying");
        progress.set_total(src.size());
        let out = open::open_one(
            dst,
            OpenOptions {
                writable: false,
                format: Some(format),
            },
        )?;
        verify(&src, out.image.device(), progress).map_err(|e| e.context(dst.display()))?;
    }
    outputs.keep();
    Ok(stats)
}

/// Opens the source read-only: a raw disk whose size comes from seeking to the end (a block
/// device's `stat` length is 0), and its logical and physical sector sizes.
fn open_source(path: &Path) -> Result<(RawDisk, u32, u32)> {
    use std::io::{Seek, SeekFrom};
    let mut file = crate::file::open_file(path, false, crate::file::Accept::RegularOrBlock)?;
    let len = file
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::io(format!("seek to the end of {}", path.display()), e))?;
    let is_block = file.metadata().is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    let (logical, physical) = if is_block {
        let l = rustix::fs::ioctl_blksszget(&file).unwrap_or(512);
        let p = rustix::fs::ioctl_blkpbszget(&file).unwrap_or(4096);
        (
            if l == 4096 { 4096 } else { 512 },
            if p == 512 { 512 } else { 4096 },
        )
    } else {
        (512, 4096)
    };
    let storage = Arc::new(SourceStorage {
        inner: FileStorage::new(file),
        len,
    });
    Ok((RawDisk::open(storage, false)?, logical, physical))
}

/// A read-only store over a block device or file whose length was found by seeking.
#[derive(Debug)]
struct SourceStorage {
    inner: FileStorage,
    len: u64,
}

fn read_only() -> Error {
    Error::new(ErrorKind::ReadOnly, "capture source is read-only")
}

impl Storage for SourceStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(read_only())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.len)
    }

    fn set_len(&self, _len: u64) -> Result<()> {
        Err(read_only())
    }

    fn next_data(&self, offset: u64) -> Result<Option<u64>> {
        self.inner.next_data(offset)
    }

    fn next_hole(&self, offset: u64) -> Result<u64> {
        // FileStorage falls back to the stat length, which is 0 for a block device.
        let hole = self.inner.next_hole(offset)?;
        Ok(if hole <= offset {
            self.len
        } else {
            hole.min(self.len)
        })
    }
}

/// Compares `out` with `src` over `src`'s size: ranges where `src` has data are compared byte
/// for byte, ranges where only `out` has data must read as zeros, the rest is skipped.
///
/// # Errors
/// `Corrupt` naming the first differing offset; read errors.
pub(crate) fn verify(
    src: &dyn BlockDevice,
    out: Arc<dyn BlockDevice>,
    progress: &dyn Progress,
) -> Result<()> {
    let checker = Verifier {
        out,
        scratch: Mutex::new(Vec::new()),
    };
    let out = checker.out.as_ref();
    let plan = |offset: u64, len: u64| verify_plan(src, out, offset, len);
    let job = Job {
        src,
        plan: &plan,
        policy: ZeroPolicy::Shadow,
        len: src.size().min(out.size()),
    };
    let unit =
        u64::from(out.geometry().block_size).clamp(copy::RAW_UNIT_BYTES, copy::UNIT_BYTES_MAX);
    copy::run(&job, &checker, None, unit, progress)?;
    Ok(())
}

fn verify_plan(
    src: &dyn BlockDevice,
    out: &dyn BlockDevice,
    offset: u64,
    len: u64,
) -> Result<Vec<PlanRun>> {
    let a = device::extents(src, offset, len)?;
    let b = device::extents(out, offset, len)?;
    let (mut i, mut j, mut pos) = (0, 0, offset);
    let mut runs: Vec<PlanRun> = Vec::new();
    while pos < offset + len && i < a.len() && j < b.len() {
        let end = (a[i].offset + a[i].len).min(b[j].offset + b[j].len);
        let fill = match (a[i].kind, b[j].kind) {
            (ExtentKind::Data, _) => Fill::Data,
            (_, ExtentKind::Data) => Fill::Zero,
            _ => Fill::Skip,
        };
        match runs.last_mut() {
            Some(last) if last.fill == fill => last.len += end - pos,
            _ => runs.push(PlanRun {
                len: end - pos,
                fill,
            }),
        }
        pos = end;
        if pos == a[i].offset + a[i].len {
            i += 1;
        }
        if pos == b[j].offset + b[j].len {
            j += 1;
        }
    }
    Ok(runs)
}

/// A [`BlockDevice`] whose writes compare: `write_at` checks that the output holds the given
/// bytes, `write_zeroes` that it reads as zeros.
#[derive(Debug)]
struct Verifier {
    out: Arc<dyn BlockDevice>,
    /// Reused read buffer; only the pipeline's writer thread uses it.
    scratch: Mutex<Vec<u8>>,
}

impl Verifier {
    fn compare(&self, want: Option<&[u8]>, offset: u64, len: u64) -> Result<()> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let n = usize::try_from(len).expect("a pipeline unit fits in memory");
        scratch.resize(n, 0);
        self.out.read_at(&mut scratch[..n], offset)?;
        let got = &scratch[..n];
        let first = match want {
            Some(w) if got == w => None,
            Some(w) => got.iter().zip(w).position(|(x, y)| x != y),
            None if is_zero(got) => None,
            None => got.iter().position(|&x| x != 0),
        };
        match first {
            None => Ok(()),
            Some(i) => Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "verify failed: the output differs from the source at offset {:#x}",
                    offset + i as u64
                ),
            )),
        }
    }
}

impl BlockDevice for Verifier {
    fn fast_path(&self) -> Option<&dyn crate::FastPath> {
        None
    }

    fn geometry(&self) -> Geometry {
        self.out.geometry()
    }

    fn format(&self) -> &'static str {
        "verifier"
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.out.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.compare(Some(buf), offset, buf.len() as u64)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.compare(None, offset, len)
    }

    fn can_write(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory store whose every byte is data (it reports no holes).
    #[derive(Debug)]
    struct Mem(Mutex<Vec<u8>>);

    impl Storage for Mem {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            let m = self.0.lock().unwrap();
            buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
            Err(read_only())
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
        fn len(&self) -> Result<u64> {
            Ok(self.0.lock().unwrap().len() as u64)
        }
        fn set_len(&self, _len: u64) -> Result<()> {
            Err(read_only())
        }
    }

    fn disk(bytes: Vec<u8>) -> Arc<RawDisk> {
        Arc::new(RawDisk::open(Arc::new(Mem(Mutex::new(bytes))), false).unwrap())
    }

    #[test]
    fn verify_names_the_first_differing_offset() {
        // 3 MiB, equal but for two bytes; the first difference is at 0x12345.
        let a = vec![7u8; 3 << 20];
        let mut b = a.clone();
        b[0x12345] = 8;
        b[0x200000] = 9;
        let e = verify(disk(a).as_ref(), disk(b), &super::super::NoProgress).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.to_string().contains("0x12345"), "{e}");
    }

    #[test]
    fn verify_accepts_equal_disks() {
        let a = vec![5u8; 1 << 20];
        verify(disk(a.clone()).as_ref(), disk(a), &super::super::NoProgress).unwrap();
    }
}
