//! Creating new VHDX files: dynamic, fixed and differencing.

use std::sync::Arc;

use vhdx::bat::{self, Entry, Layout};
use vhdx::header::Header;
use vhdx::ident::Ident;
use vhdx::metadata::Metadata;
use vhdx::parent::ParentLocator;
use vhdx::region::{Region, RegionTable};
use vhdx::{Guid, MIB};

use crate::{Error, ErrorKind, Result, Storage};

/// The default payload block size (Hyper-V's for dynamic disks).
pub const DEFAULT_BLOCK_SIZE: u32 = 32 << 20;
/// The log length Ferry writes.
pub const LOG_LEN: u32 = 1 << 20;

/// The parent of a new differencing image.
#[derive(Debug, Clone)]
pub struct ParentSpec {
    /// The parent's DataWriteGuid.
    pub linkage: Guid,
    /// Path relative to the child's directory (written with backslashes).
    pub relative_path: String,
    /// Absolute path (written as `absolute_win32_path`).
    pub absolute_path: String,
}

/// Parameters of a new image.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Virtual size in bytes (a multiple of the logical sector size).
    pub size: u64,
    /// Payload block size.
    pub block_size: u32,
    /// Logical sector size (512 or 4096).
    pub logical_sector_size: u32,
    /// Physical sector size (512 or 4096).
    pub physical_sector_size: u32,
    /// Fixed: every block allocated up front.
    pub fixed: bool,
    /// Differencing: the parent.
    pub parent: Option<ParentSpec>,
    /// Creator string for the file identifier.
    pub creator: String,
    /// Page 83 identifier (random when `None`).
    pub page83: Option<Guid>,
    /// DataWriteGuid to start with (random when `None`; compaction keeps the old one).
    pub data_write_guid: Option<Guid>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            size: 0,
            block_size: DEFAULT_BLOCK_SIZE,
            logical_sector_size: 512,
            physical_sector_size: 4096,
            fixed: false,
            parent: None,
            creator: format!("Ferry {}", env!("CARGO_PKG_VERSION")),
            page83: None,
            data_write_guid: None,
        }
    }
}

/// A new random GUID.
pub fn random_guid() -> Guid {
    Guid::from_random(*uuid::Uuid::new_v4().as_bytes())
}

/// Writes a new, empty image into `storage` (which should be empty) and makes it durable.
///
/// # Errors
/// `InvalidArgument` for a size or geometry outside the spec; `Io`.
pub fn create(storage: &Arc<dyn Storage>, opts: &CreateOptions) -> Result<()> {
    let bad = |m: String| Error::new(ErrorKind::InvalidArgument, m);
    if opts.size == 0 || opts.size > vhdx::MAX_VIRTUAL_SIZE {
        return Err(bad(format!(
            "size {} must be between 1 byte and 64 TiB",
            opts.size
        )));
    }
    if !opts
        .size
        .is_multiple_of(u64::from(opts.logical_sector_size))
    {
        return Err(bad(format!(
            "size {} is not a multiple of the {}-byte logical sector",
            opts.size, opts.logical_sector_size
        )));
    }
    if !matches!(opts.physical_sector_size, 512 | 4096) {
        return Err(bad(format!(
            "physical sector size {} must be 512 or 4096",
            opts.physical_sector_size
        )));
    }
    if opts.fixed && opts.parent.is_some() {
        return Err(bad("a differencing image cannot be fixed".into()));
    }
    let has_parent = opts.parent.is_some();
    let layout = Layout::new(
        opts.block_size,
        opts.logical_sector_size,
        opts.size,
        has_parent,
    )
    .map_err(|e| Error::with_source(ErrorKind::InvalidArgument, "geometry", e))?;
    let locator = opts.parent.as_ref().map(|p| {
        ParentLocator::new(
            p.linkage,
            &[
                ("relative_path", p.relative_path.replace('/', "\\").as_str()),
                (
                    "absolute_win32_path",
                    p.absolute_path.replace('/', "\\").as_str(),
                ),
            ],
        )
        .to_bytes()
    });
    let meta = Metadata {
        block_size: opts.block_size,
        leave_blocks_allocated: opts.fixed,
        has_parent,
        virtual_size: opts.size,
        page83: opts.page83.unwrap_or_else(random_guid),
        logical_sector_size: opts.logical_sector_size,
        physical_sector_size: opts.physical_sector_size,
        parent_locator: locator,
    };
    let log_offset = MIB;
    let meta_region = Region {
        offset: 2 * MIB,
        length: MIB as u32,
        required: true,
    };
    let bat_len = layout.region_len();
    let bat_region = Region {
        offset: 3 * MIB,
        length: u32::try_from(bat_len).map_err(|_| bad("bat region too large".into()))?,
        required: true,
    };
    let data_start = bat_region.end();
    storage.set_len(0)?;
    let mut head = vec![0u8; MIB as usize];
    Ident {
        creator: opts.creator.clone(),
    }
    .encode(&mut head);
    let data_write_guid = opts.data_write_guid.unwrap_or_else(random_guid);
    let file_write_guid = random_guid();
    for (seq, at) in [(1u64, vhdx::HEADER1_OFFSET), (2, vhdx::HEADER2_OFFSET)] {
        let h = Header {
            sequence_number: seq,
            file_write_guid,
            data_write_guid,
            log_guid: Guid::ZERO,
            log_length: LOG_LEN,
            log_offset,
        };
        h.encode(&mut head[at as usize..]);
    }
    let regions = RegionTable {
        bat: bat_region,
        metadata: meta_region,
    };
    regions.encode(&mut head[vhdx::REGION1_OFFSET as usize..]);
    regions.encode(&mut head[vhdx::REGION2_OFFSET as usize..]);
    storage.write_at(&head, 0)?;
    let mut mbuf = vec![0u8; meta.encoded_len().max(MIB as usize)];
    meta.encode(&mut mbuf);
    storage.write_at(&mbuf[..MIB as usize], meta_region.offset)?;
    let mut batbuf = vec![0u8; bat_len as usize];
    let mut file_end = data_start;
    if opts.fixed {
        for block in 0..layout.data_blocks() {
            let i = layout.payload_index(block) as usize;
            let e = Entry::new(bat::PAYLOAD_BLOCK_FULLY_PRESENT, file_end);
            batbuf[i * 8..i * 8 + 8].copy_from_slice(&e.0.to_le_bytes());
            file_end += u64::from(opts.block_size);
        }
    }
    if has_parent {
        // Every chunk of a differencing image gets its (zero, sparse) sector bitmap block up
        // front. The spec allows SB_BLOCK_NOT_PRESENT for chunks without partial blocks, but
        // libvhdi 20210425 then reads the bitmap from file offset 0 and serves garbage for an
        // untouched version; 1 MiB of holes per 4 GiB chunk is a cheap price for interop.
        for chunk in 0..layout.bitmap_blocks() {
            let i = layout.bitmap_index(chunk) as usize;
            let e = Entry::new(bat::SB_BLOCK_PRESENT, file_end);
            batbuf[i * 8..i * 8 + 8].copy_from_slice(&e.0.to_le_bytes());
            file_end += bat::SECTOR_BITMAP_BLOCK_LEN;
        }
    }
    if cfg!(debug_assertions) {
        assert_created(&layout, &head, &batbuf, (data_start, file_end), opts.fixed);
    }
    storage.write_at(&batbuf, bat_region.offset)?;
    storage.set_len(file_end)?;
    if opts.fixed {
        storage.allocate(data_start, file_end - data_start)?;
    }
    storage.flush()
}

/// Debug builds only: the headers and the BAT `create` is about to write decode the way `open`
/// decodes them: the second header (sequence 2) is current and carries no log; the BAT parses,
/// and its present blocks (every payload block of a fixed image, every sector bitmap block of
/// a differencing one, nothing else) lie in `[data_start, file_end)`, 1 MiB aligned, one after
/// the other without overlap.
fn assert_created(
    layout: &Layout,
    head: &[u8],
    batbuf: &[u8],
    (data_start, file_end): (u64, u64),
    fixed: bool,
) {
    let current = vhdx::header::choose(
        &head[vhdx::HEADER1_OFFSET as usize..],
        &head[vhdx::HEADER2_OFFSET as usize..],
    )
    .expect("the new headers decode");
    assert_eq!(
        current.header.sequence_number, 2,
        "the second header is current"
    );
    assert!(
        current.header.log_guid.is_zero(),
        "a new image has no log to replay"
    );
    let entries = bat::parse(layout, batbuf).expect("the new bat decodes");
    let mut next = data_start;
    for (i, e) in entries.iter().enumerate() {
        let is_bitmap = bat::is_bitmap_index(layout, i as u64);
        let present = if is_bitmap {
            e.state() == bat::SB_BLOCK_PRESENT
        } else {
            e.state() == bat::PAYLOAD_BLOCK_FULLY_PRESENT
        };
        let want = if is_bitmap { layout.has_parent } else { fixed };
        assert_eq!(present, want, "bat entry {i} state {}", e.state());
        if !present {
            assert_eq!(e.0, 0, "bat entry {i} of a new image");
            continue;
        }
        let len = if is_bitmap {
            bat::SECTOR_BITMAP_BLOCK_LEN
        } else {
            u64::from(layout.block_size)
        };
        assert!(
            e.file_offset() >= next && e.file_offset().is_multiple_of(MIB),
            "bat entry {i} at {:#x}",
            e.file_offset()
        );
        next = e.file_offset() + len;
    }
    assert!(
        next <= file_end,
        "blocks end at {next:#x}, past the file's {file_end:#x}"
    );
}
