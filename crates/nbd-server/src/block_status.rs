//! `NBD_CMD_BLOCK_STATUS`: the device's extents as `base:allocation` descriptors, bounded
//! by [`MAX_BLOCK_STATUS_QUERY`] per lookup and [`MAX_BLOCK_STATUS_EXTENTS`] per reply.

use disk::{BlockDevice, ExtentKind};
use nbd_proto::reply::Descriptor;
use nbd_proto::{NBD_EIO, NBD_STATE_HOLE, NBD_STATE_ZERO};

use crate::config::{MAX_BLOCK_STATUS_EXTENTS, MAX_BLOCK_STATUS_QUERY};
use crate::conn::Export;
use crate::frame::{Frame, disk_error, error};
use crate::valid::Valid;

/// The `base:allocation` flags of an extent kind.
fn allocation_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Data => 0,
        ExtentKind::Zero => NBD_STATE_ZERO,
        ExtentKind::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
    }
}

/// Answers `NBD_CMD_BLOCK_STATUS` for `base:allocation` (on the blocking pool).
///
/// # Panics
/// When the export has no metadata context: [`Valid::check`] refuses such a request.
pub(crate) fn block_status(dev: &dyn BlockDevice, req: &Valid, e: &Export) -> Frame {
    let context_id = e
        .meta_context
        .expect("Valid::check refuses block status without a metadata context");
    let len = req.len.min(MAX_BLOCK_STATUS_QUERY);
    let extents = match disk::device::extents(dev, req.offset, u64::from(len)) {
        Ok(x) => x,
        Err(err) => return disk_error(req, &err),
    };
    let limit = if req.flags.req_one() {
        1
    } else {
        MAX_BLOCK_STATUS_EXTENTS
    };
    // Each extent lies inside the query, so its length fits the request's 32 bits.
    let descriptors: Vec<Descriptor> = extents
        .iter()
        .filter(|x| x.len > 0)
        .take(limit)
        .map(|x| Descriptor {
            len: u32::try_from(x.len).unwrap_or(u32::MAX),
            flags: allocation_flags(x.kind),
        })
        .collect();
    if descriptors.is_empty() {
        return error(NBD_EIO, "no extents for a nonempty range");
    }
    Frame::BlockStatus {
        context_id,
        descriptors,
    }
}
